"""The one error hierarchy of aiodist, rooted at :class:`AiodistError`.

Data lives in attributes (``.rank``, ``.key``, ...), never only in the message.
Errors say whose fault it is: :class:`ConnectionClosedLocally` (you closed it)
versus :class:`ConnectionLost` (the peer or the network broke it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

from .shown import first_few


class AiodistError(RuntimeError):
    """Base class of every error aiodist raises on purpose.

    A ``RuntimeError``, as torch's ``DistError`` is: a torch program's ``except RuntimeError:`` around a
    collective or a store call catches aiodist's errors too. (It is torch's ``DistError`` under that name.)

    A class that is also an OSError (``TimeoutError``, ``ConnectionError``) names that base first, so
    that OSError makes and prints its instances (``Class.__new__`` would otherwise be RuntimeError's).
    """


class DistBackendError(AiodistError):
    """An operation failed in the communication itself: a peer failed, a timeout, a mismatch (torch's name)."""


class DistNetworkError(AiodistError):
    """A connection failed or could not be made (torch's name)."""


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


class ConnectionClosedError(ConnectionError, DistNetworkError):
    """Base class: the connection can no longer carry frames."""


class ListenError(OSError, DistNetworkError):
    """Could not listen on an address: already in use, not one of this machine's, or refused by the OS
    (an ``OSError``, as the socket's own error is). ``.address``: (host, port)."""

    def __init__(self, message: str, *, address: tuple[str, int] | None = None) -> None:
        super().__init__(message)
        self.address = address


class ConnectionClosedLocally(ConnectionClosedError):
    """This side closed the connection (your code called ``close()``)."""


class ConnectionLost(ConnectionClosedError):
    """The peer closed the connection or the network broke it (not your doing).

    ``.detail``: what broke it (the OS's or TLS's error, or the peer's bytes that did not follow the
    protocol: ``"protocol error: ..."``), None for an orderly close by the peer. ``.refused``: a connect
    that nothing listened for at that address (its process is gone, or never listened there).
    """

    detail: str | None = None
    refused: bool = False

    @classmethod
    def refusal(cls, message: str) -> ConnectionLost:
        """A connect that nothing listened for (``.refused``)."""
        lost = cls(message)
        lost.refused = True
        return lost

    @classmethod
    def protocol_error(cls, peer: object, e: BaseException) -> ConnectionLost:
        """The end of a connection whose peer sent bytes that do not follow the protocol (``e`` says how)."""
        lost = cls(f"protocol error from {peer}: {e}")
        lost.detail = f"protocol error: {e}"
        return lost


_E = TypeVar("_E", bound=BaseException)


def innermost(exc: BaseException) -> BaseException:
    """What an exception group (a TaskGroup's) stands for: its first leaf that is not a cancellation (else ``exc``).

    A rank's failure is reported by that error and the user's line it came from, not by the group's
    ``async with`` line: two different bugs in one TaskGroup are two failures.
    """
    stack: list[BaseException] = [exc]
    for _ in range(10_000):  # (bounded: groups nest, and a leaf may be listed more than once)
        if not stack:
            break
        e = stack.pop(0)
        if isinstance(e, BaseExceptionGroup):
            stack[:0] = list(e.exceptions)
        elif not isinstance(e, asyncio.CancelledError):
            return e
    return exc


def anew(exc: _E) -> _E:
    """A new exception like ``exc`` (its type, arguments, attributes and cause), to raise in its place.

    An ended connection keeps its error and raises it to every later call. Raising the kept object
    itself would chain each raiser's traceback onto it, so the frames of every refused call (and the
    buffers they hold) would live as long as the connection, and the callers would share one object.
    """
    new = type(exc).__new__(type(exc))
    if isinstance(exc, OSError):  # (its class's own __init__ would set these: give them as they are)
        for field in ("errno", "strerror", "filename", "filename2"):
            if getattr(exc, field) is not None:  # (setting None would change how it prints)
                setattr(new, field, getattr(exc, field))
    new.args = exc.args
    new.__dict__.update(exc.__dict__)
    new.__cause__ = exc.__cause__
    new.__suppress_context__ = exc.__suppress_context__
    return new


# --------------------------------------------------------------------- store


class StoreError(AiodistError):
    """The store refused a request (bad key, bad value, unknown operation...)."""


class StoreTimeoutError(TimeoutError, StoreError):
    """A blocking store call did not complete in time.

    ``.keys`` names the key(s) of the call, ``.timeout`` the seconds waited;
    ``.waiting``: the call waited for its key(s) to be set (``get``, ``wait``...);
    otherwise the store did not answer in time (a stopped or overloaded server).
    ``.missing``: of several keys, those that did not exist when it timed out (as
    the store said; None: not known). The connection stays usable afterwards.
    """

    def __init__(self, keys: Sequence[str], timeout: float, op: str = "wait", *, waiting: bool = True,
                 missing: Sequence[str] | None = None) -> None:
        self.keys = list(keys)
        self.key = self.keys[0] if len(self.keys) == 1 else None
        self.timeout = timeout
        self.op = op
        self.waiting = waiting
        self.missing = list(missing) if missing is not None else None
        keys_ = first_few(self.keys)
        if waiting and self.missing is not None and len(self.keys) > 1:
            super().__init__(f"store {op} timed out after {timeout:g}s waiting for key(s) {keys_}: missing "
                             f"{first_few(self.missing)}")
        elif waiting:
            super().__init__(f"store {op} timed out after {timeout:g}s waiting for key(s) {keys_}")
        else:
            super().__init__(f"store {op} of key(s) {keys_} timed out after {timeout:g}s: the store did not answer")


class QueueEmptyError(StoreError):
    """``queue_pop(key, block=False)`` found queue ``.key`` empty (torch's ``QueueEmptyError``, a store error)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"queue_pop(block=False): queue {key!r} is empty")


# --------------------------------------------------------------------- groups


class PeerFailureError(DistBackendError):
    """A peer rank died or became unreachable.

    ``.rank`` is the culprit in the group's numbering (``None`` if unknown),
    ``.global_rank`` in the world's numbering, ``.op`` and ``.seq`` name the
    operation it interrupted, ``.how`` says how the failure was detected.
    When that rank said, as it left, which failure it left after (its own
    error, or another rank's that it learned of or that its launcher stopped
    it for), ``.culprit`` is the global rank whose failure that was and
    ``.cause`` how it failed (else both are None): the root cause, which may
    be a rank this one never talked to.
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
        culprit: int | None = None,
        cause: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.global_rank = global_rank if global_rank is not None else rank
        self.op = op
        self.seq = seq
        self.how = how
        self.culprit = culprit
        self.cause = cause


class PeerCallFailedError(DistBackendError):
    """A collective failed here because another member's call of it failed there.

    That rank's call raised (an argument only it got wrong, an object it
    could not pickle...): it tells the other members, whose part of the
    operation fails at once instead of waiting for data that will never
    come. ``.global_rank``: that rank (the world's numbering); ``.seq``: the
    operation's sequence number in the group; the message says what it
    raised. The group stays usable: every member's call at that sequence
    number has ended (some may have completed: a broadcast root does not
    wait for anyone).
    """

    def __init__(self, message: str, *, global_rank: int, seq: int | None) -> None:
        super().__init__(message)
        self.global_rank = global_rank
        self.seq = seq


class PeerAbandonedError(PeerCallFailedError):
    """This rank reached another member's array in place (ranks of one host) after that member's call had
    ended there: it gave up on the operation (a timeout, a cancellation, an error) and may reuse its memory.

    So nothing this rank read of that array can be trusted, and it wrote nothing more into it.
    ``.rank`` is that member in the group's numbering, ``.global_rank`` in the world's (the one to
    blame), ``.op`` and ``.seq`` the operation.
    """

    def __init__(self, message: str, *, rank: int, global_rank: int, op: str, seq: int | None) -> None:
        super().__init__(message, global_rank=global_rank, seq=seq)
        self.rank = rank
        self.op = op


class CollectiveTimeoutError(TimeoutError, DistBackendError):
    """A collective or point-to-point operation did not complete in time.

    ``.op``, ``.seq`` and ``.waiting_for`` (the peer ranks it still waited on).
    ``.absent``: the members (global ranks) the store showed no sign of in this
    call (see :mod:`aiodist.mismatch`): in a collective whose every rank's part
    needs every rank (all_reduce, barrier...), those had not reached it.
    ``.unmatched``: for a point-to-point receive, the (rank, tag) of a few messages
    waiting on this rank that it did not match (another tag from its source, or its
    tag from another source: a mistaken ``tag`` or ``src``?); else empty.
    """

    def __init__(self, message: str, *, op: str, seq: int | None, waiting_for: Sequence[int], timeout: float,
                 absent: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.waiting_for = list(waiting_for)
        self.timeout = timeout
        self.absent = list(absent)
        self.unmatched: list[tuple[int, int]] = []


class WaitTimeoutError(TimeoutError, AiodistError):
    """``work.wait(timeout=...)`` gave up waiting: the operation itself goes on (await the Work again).

    torch raises a RuntimeError ("Operation timed out!") there; this is one too, and a
    TimeoutError. ``.op`` and ``.seq`` name the operation (``.seq`` None for point-to-point),
    ``.timeout`` is the seconds waited.
    """

    def __init__(self, message: str, *, op: str, seq: int | None, timeout: float) -> None:
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.timeout = timeout


class CallbackError(AiodistError):
    """A ``fut.then(callback)`` callback raised something that is not a RuntimeError: the chained future fails
    with this (a RuntimeError, as torch's does: "Got the following error when running the callback"),
    caused by it (``.error`` and ``__cause__``). RuntimeErrors (aiodist's own errors among them) are kept as
    they are."""

    def __init__(self, message: str, *, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


class CollectiveMismatchError(DistBackendError):
    """Ranks called different collectives at the same sequence number.

    ``.calls`` maps rank -> description of what that rank called. ``.found_by``:
    the global rank that found the mismatch when this rank learnt of it from
    that rank's report (None: this rank found it), and ``.finding``: that
    rank's own words. ``.group`` names the group and ``.ranks`` lists its
    members' global ranks when known (then :attr:`global_calls` has the calls
    by global rank: the launcher puts every rank's together to name the odd one out).
    """

    def __init__(
        self,
        message: str,
        *,
        calls: dict[int, Any] | None = None,
        seq: int | None = None,
        found_by: int | None = None,
        finding: str | None = None,
        group: str | None = None,
        ranks: Sequence[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.calls = dict(calls or {})
        self.seq = seq
        self.found_by = found_by
        self.finding = finding
        self.group = group
        self.ranks = list(ranks) if ranks is not None else None

    @property
    def global_calls(self) -> dict[int, str]:
        """:attr:`calls` by global rank (empty when the group's ranks are not known)."""
        ranks = self.ranks
        if ranks is None:
            return {}
        return {ranks[r]: str(c) for r, c in self.calls.items() if type(r) is int and 0 <= r < len(ranks)}


class GroupError(AiodistError):
    """Misuse of a process group (not initialized, destroyed, rank not a member...)."""


class RendezvousError(AiodistError):
    """Rendezvous failed: bad environment, world size disagreement, duplicate rank..."""


# --------------------------------------------------------------------- launcher


class LaunchError(AiodistError):
    """The launcher or ``aiodist.spawn`` could not run the job as asked."""


class RankFailedError(LaunchError):
    """A launched rank exited with a non-zero code or was killed by a signal.

    ``.rank`` (global rank), ``.pid``, ``.exitcode`` (``None`` if killed by a
    signal), ``.signal`` (the signal number, else ``None``) and ``.remote_traceback``
    (the rank's formatted exception when it reported one, else ``None``).
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        pid: int | None,
        exitcode: int | None,
        signal: int | None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.pid = pid
        self.exitcode = exitcode
        self.signal = signal
        self.remote_traceback = remote_traceback


class LaunchTimeoutError(TimeoutError, LaunchError):
    """The whole job did not finish within its time limit; its ranks were stopped.

    ``.timeout`` is the limit in seconds.
    """

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


# --------------------------------------------------------------------- store (appended)


class StoreRequestError(StoreError):
    """The store refused one request; the connection stays usable.

    ``.code`` is a stable reason (``"not_integer"``, ``"overflow"``,
    ``"key_too_large"``, ``"value_too_large"``, ``"bad_request"``,
    ``"waiter_quota_exceeded"``...), ``.op`` the operation and ``.key`` the
    key concerned (``None`` if none). When a server limit refused it,
    ``.limit`` names that limit (a field of
    :class:`~aiodist.store.limits.StoreLimits`, e.g. ``"max_waiter_bytes"``)
    and ``.limit_value`` is its value; both are ``None`` otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        op: str | None = None,
        key: str | None = None,
        limit: str | None = None,
        limit_value: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.op = op
        self.key = key
        self.limit = limit
        self.limit_value = limit_value


class StoreConnectionLost(ConnectionLost):
    """The store server closed (or lost) the client's connection.

    ``.host`` and ``.port`` name the server. Every pending and later call on
    that client raises it. When the server closed because the rank hosting
    it left the job after a failure, it said so: ``.host_rank`` is that
    rank, ``.culprit`` the global rank whose failure it was (None: unknown)
    and ``.cause`` how it failed (else all three are None).
    """

    def __init__(self, message: str, *, host: str, port: int, host_rank: int | None = None,
                 culprit: int | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.host = host
        self.port = port
        self.host_rank = host_rank
        self.culprit = culprit
        self.cause = cause


# --------------------------------------------------------------------- arguments


class InvalidArgumentError(AiodistError, ValueError):
    """An argument has a value the call cannot take (raised before anything is sent); also a ValueError."""


class InvalidArgumentTypeError(AiodistError, TypeError):
    """An argument is of a type the call cannot take (raised before anything is sent); also a TypeError."""


# --------------------------------------------------------------------- collectives (appended)


class UnsupportedReduceOpError(InvalidArgumentTypeError, ValueError):
    """A reduction operator does not apply to an array's dtype (e.g. BXOR on floats).

    Raised before any communication. ``.op`` is the operator's name
    (``"BXOR"``), ``.dtype`` the numpy dtype's name (``"float32"``). Also a
    TypeError, a RuntimeError and a ValueError: torch raises ValueError for some
    of these (MAX on complex tensors) and RuntimeError for others, and code
    ported from it catches either.
    """

    def __init__(self, message: str, *, op: str, dtype: str) -> None:
        super().__init__(message)
        self.op = op
        self.dtype = dtype


class InvalidArrayError(InvalidArgumentError):
    """An array argument of a collective cannot be used as given.

    Non-contiguous, read-only where the result is written, wrong size or
    dtype for the collective, wrong list length, a root's list (``gather_list``)
    passed on another rank. Raised before any communication. ``.argument``
    names the parameter (``"out_list[2]"``), ``.reason`` is a stable code
    (``"not_contiguous"``, ``"read_only"``, ``"size"``, ``"dtype"``,
    ``"byte_order"``, ``"length"``, ``"type"``, ``"splits"``, ``"not_root"``).
    """

    def __init__(self, message: str, *, argument: str, reason: str) -> None:
        super().__init__(message)
        self.argument = argument
        self.reason = reason


# --------------------------------------------------------------------- groups (appended)


class PeerRefusedError(PeerFailureError):
    """A peer refused this rank's connection (wrong job id, bad rank, world size...).

    ``.reason`` is the peer's explanation, as it sent it.
    """

    def __init__(self, message: str, *, rank: int | None = None, how: str | None = None, reason: str = "") -> None:
        super().__init__(message, rank=rank, how=how)
        self.reason = reason


class EvictedError(PeerFailureError):
    """The other ranks declared *this* rank failed (it was silent too long: stopped, cut off, or its
    event loop blocked), so its groups are broken.

    ``.rank`` / ``.global_rank`` name this rank itself; ``.how`` says what the
    others reported. Raised by every operation of a broken group on the rank
    that was declared failed, instead of blaming the peer that hung up on it.
    """


class RendezvousTimeoutError(TimeoutError, RendezvousError):
    """Rendezvous did not complete in time.

    ``.missing`` lists the ranks that had not joined, ``.timeout`` the seconds waited.
    """

    def __init__(self, message: str, *, missing: Sequence[int], timeout: float) -> None:
        super().__init__(message)
        self.missing = list(missing)
        self.timeout = timeout


class StoreConnectTimeoutError(TimeoutError, StoreError, DistNetworkError):
    """The store server at ``.host``:``.port`` could not be reached within ``.timeout`` seconds."""

    def __init__(self, message: str, *, host: str, port: int, timeout: float) -> None:
        super().__init__(message)
        self.host = host
        self.port = port
        self.timeout = timeout


class InvalidRankError(GroupError, InvalidArgumentError):
    """A root/source/destination rank is outside the group (``0 <= rank < size`` fails).

    ``.rank`` is the rank given, ``.size`` the group's size, ``.argument`` the parameter.
    """

    def __init__(self, message: str, *, rank: int, size: int, argument: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.size = size
        self.argument = argument


class NotInitializedError(GroupError, ValueError):
    """The calling rank has no default process group (``init_process_group`` not called yet, or destroyed).

    Also a ValueError, as torch's "Default process group has not been initialized" is.
    """


class NotMemberError(GroupError, InvalidArgumentError):
    """An operation that torch refuses on a group this rank is not a member of (the caller passed a group
    this rank is not in): the module-level ``send``, ``send_object_list`` and ``recv_object_list``, as
    torch.distributed's raise ``ValueError("Invalid process group specified")``. (Their ``isend``,
    ``irecv``, ``recv`` and the collectives do nothing there, with a warning, and so do aiodist's.)

    ``.op``: the operation; ``.group``: the group's name; ``.ranks``: its global ranks;
    ``.global_rank``: this rank (the world's numbering). Also a ValueError.
    """

    def __init__(self, message: str, *, op: str, group: str, ranks: Sequence[int], global_rank: int) -> None:
        super().__init__(message)
        self.op = op
        self.group = group
        self.ranks = list(ranks)
        self.global_rank = global_rank


class AbortedError(GroupError):
    """The operation's process group was aborted (``aiodist.abort``) while it ran, or before it started."""


class UnawaitedOperationError(AiodistError):
    """Operations this rank started were never awaited (``.operations``: one line each, with the user's call site).

    Raised by :func:`aiodist.api.finish_rank` (the end of a launched or
    simulated rank) and ``destroy_process_group()``; see :mod:`aiodist.unawaited`.
    """

    def __init__(self, message: str, *, operations: Sequence[str]) -> None:
        super().__init__(message)
        self.operations = list(operations)


class OutsideLoopError(AiodistError):
    """An operation (``.op``) was called where no event loop runs: a worker thread, or synchronous code.

    Operations start on the rank's event loop; from a worker thread, hand the
    call to the loop (``asyncio.run_coroutine_threadsafe(coro, loop)``, where
    ``coro`` awaits the operation). Nothing was started.
    """

    def __init__(self, op: str) -> None:
        super().__init__(
            f"aiodist.{op}() was called outside the event loop (no event loop runs in this thread: a worker "
            "thread, e.g. asyncio.to_thread or run_in_executor, or synchronous code); operations start on the "
            "rank's event loop: from a thread, use asyncio.run_coroutine_threadsafe(coro, loop) with a coroutine "
            f"that awaits aiodist.{op}(...)")
        self.op = op


class BlockedLoopError(AiodistError):
    """An operation (``.op``) was polled again and again by code that never let the event loop run: it cannot finish.

    Operations progress only while the rank's event loop runs. torch's
    ``while not work.is_completed(): time.sleep(0.01)`` holds the loop (the
    sleep blocks it), so the operation never ends and the loop would spin
    forever; after :data:`aiodist.polls.STUCK_POLLS` polls over
    :data:`aiodist.polls.STUCK_SECONDS` without a step of the loop in between,
    the poll raises this instead. Yield between polls (``await
    asyncio.sleep(0.01)``) or ``await work``. The operation itself goes on.
    """

    def __init__(self, op: str, *, polls: int, seconds: float) -> None:
        super().__init__(
            f"{op} was polled {polls} times over {seconds:.1f}s without the event loop running in between (a "
            "blocking time.sleep, or a loop that never awaits?): it progresses only while the loop runs, so it "
            "could never finish. Yield between polls (await asyncio.sleep(0.01)), or await the operation")
        self.op = op
        self.polls = polls
        self.seconds = seconds


DistError = AiodistError
"""torch's ``torch.distributed.DistError``: aiodist's base error (a ``RuntimeError``)."""

DistStoreError = StoreError
"""torch's ``torch.distributed.DistStoreError``: a store call failed (timeouts included)."""
