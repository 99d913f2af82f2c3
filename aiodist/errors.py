"""The one error hierarchy of aiodist, rooted at :class:`AiodistError`.

Data lives in attributes (``.rank``, ``.key``, ...), never only in the message.
Errors say whose fault it is: :class:`ConnectionClosedLocally` (you closed it)
versus :class:`ConnectionLost` (the peer or the network broke it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class AiodistError(Exception):
    """Base class of every error aiodist raises on purpose."""


# --------------------------------------------------------------------- wire / net


class ProtocolError(AiodistError):
    """The bytes on a connection do not follow the aiodist wire protocol.

    Raised by the pure codec; the connection that produced them is closed.
    """


class FrameTooLargeError(ProtocolError):
    """A frame announced a size above the configured maximum (nothing was allocated)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class ConnectionClosedError(AiodistError, ConnectionError):
    """Base class: the connection can no longer carry frames."""


class ConnectionClosedLocally(ConnectionClosedError):
    """This side closed the connection (your code called ``close()``)."""


class ConnectionLost(ConnectionClosedError):
    """The peer closed the connection or the network broke it (not your doing)."""


# --------------------------------------------------------------------- store


class StoreError(AiodistError):
    """The store refused a request (bad key, bad value, unknown operation...)."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A blocking store call did not complete in time.

    ``.keys`` names the key(s) waited for, ``.timeout`` the seconds waited.
    The connection stays usable afterwards.
    """

    def __init__(self, keys: Sequence[str], timeout: float, op: str = "wait") -> None:
        self.keys = list(keys)
        self.key = self.keys[0] if len(self.keys) == 1 else None
        self.timeout = timeout
        self.op = op
        super().__init__(f"store {op} timed out after {timeout:g}s waiting for key(s) {self.keys!r}")


# --------------------------------------------------------------------- groups


class PeerFailureError(AiodistError):
    """A peer rank died or became unreachable.

    ``.rank`` is the culprit in the group's numbering (``None`` if unknown),
    ``.global_rank`` in the world's numbering, ``.op`` and ``.seq`` name the
    operation it interrupted, ``.how`` says how the failure was detected.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        global_rank: int | None = None,
        op: str | None = None,
        seq: int | None = None,
        how: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.global_rank = global_rank if global_rank is not None else rank
        self.op = op
        self.seq = seq
        self.how = how


class CollectiveTimeoutError(AiodistError, TimeoutError):
    """A collective or point-to-point operation did not complete in time.

    ``.op``, ``.seq`` and ``.waiting_for`` (the peer ranks it still waited on).
    """

    def __init__(self, message: str, *, op: str, seq: int | None, waiting_for: Sequence[int], timeout: float) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.waiting_for = list(waiting_for)
        self.timeout = timeout


class CollectiveMismatchError(AiodistError):
    """Ranks called different collectives at the same sequence number.

    ``.calls`` maps rank -> description of what that rank called.
    """

    def __init__(self, message: str, *, calls: dict[int, Any] | None = None, seq: int | None = None) -> None:
        super().__init__(message)
        self.calls = dict(calls or {})
        self.seq = seq


class GroupError(AiodistError):
    """Misuse of a process group (not initialized, destroyed, rank not a member...)."""


class RendezvousError(AiodistError):
    """Rendezvous failed: bad environment, world size disagreement, duplicate rank..."""
