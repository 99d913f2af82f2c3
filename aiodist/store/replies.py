"""What the store's state machine answers: :class:`Reply` objects, a :class:`Failure` with its code.

The error codes travel in replies (and in ``StoreRequestError.code`` on the client).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, NamedTuple

# Error codes carried in replies (and in StoreRequestError.code on the client).
NOT_INTEGER: Final = "not_integer"
OVERFLOW: Final = "overflow"
HOLDS_QUEUE: Final = "holds_queue"  # get/multi_get of a key that holds a queue, not a value
KEY_TOO_LARGE: Final = "key_too_large"
VALUE_TOO_LARGE: Final = "value_too_large"
DUPLICATE_REQUEST: Final = "duplicate_request"
BAD_REQUEST: Final = "bad_request"
REQUEST_TOO_LARGE: Final = "request_too_large"  # a request, or the reply it asks for, over the per-frame bound
WAITER_QUOTA_EXCEEDED: Final = "waiter_quota_exceeded"  # a blocking request over max_waiter_bytes (see :mod:`.waiters`)


class Failure(NamedTuple):
    """Why a request was refused: a stable ``code`` and a human ``message``.

    ``limit`` and ``maximum``: the server limit that refused it (its
    :class:`~aiodist.store.limits.StoreLimits` name) and that limit's value,
    when a limit did.
    """

    code: str
    message: str
    key: str | None = None
    limit: str | None = None
    maximum: int | None = None
    missing: list[str] | None = None  # (a timeout of several keys: those that did not exist)


class Reply(NamedTuple):
    """The answer to request ``request`` of ``client``: a ``value`` or a ``failure``."""

    client: Hashable
    request: int
    value: Any = None
    failure: Failure | None = None
