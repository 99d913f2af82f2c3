"""What the store's state machine answers: :class:`Reply` objects, a :class:`Failure` with its code.

The error codes travel in replies (and in ``StoreRequestError.code`` on the client).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Final, NamedTuple

# Error codes carried in replies (and in StoreRequestError.code on the client).
NOT_INTEGER: Final = "not_integer"
OVERFLOW: Final = "overflow"
KEY_TOO_LARGE: Final = "key_too_large"
VALUE_TOO_LARGE: Final = "value_too_large"
DUPLICATE_REQUEST: Final = "duplicate_request"
BAD_REQUEST: Final = "bad_request"


class Failure(NamedTuple):
    """Why a request was refused: a stable ``code`` and a human ``message``."""

    code: str
    message: str
    key: str | None = None


class Reply(NamedTuple):
    """The answer to request ``request`` of ``client``: a ``value`` or a ``failure``."""

    client: Hashable
    request: int
    value: Any = None
    failure: Failure | None = None
