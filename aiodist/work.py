"""What a started operation hands back: :class:`Work`, and the record a collective keeps of itself.

A collective runs as a task owned by its group (see :mod:`aiodist.group`),
but its outcome does not travel through that task: the operation writes it
into its :class:`OpRecord` as it ends and hands it to the futures its
awaiters wait on. So a finished collective costs no done-callbacks and no
extra loop pass, and its task never ends with an exception nobody retrieved
(it returns None, or is cancelled).

Point-to-point operations still report through their task (``Work`` falls
back to the task's result when it has no record).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from .context import rank_scope
from .errors import GroupError

__all__ = ["OpRecord", "Work", "unawaited_operations", "clear_unawaited"]

T = TypeVar("T")
U = TypeVar("U")


class OpRecord:
    """One collective on this rank: its identity, its deadline, and (once ``finished``) its outcome.

    The group's monitor reads ``deadline``/``start`` to expire it or to start its
    fingerprint check; ``waiters`` are the futures of tasks awaiting it.
    """

    __slots__ = ("op", "seq", "sig", "task", "start", "deadline", "expired", "check", "waiters", "finished", "value", "error")

    def __init__(self, op: str, seq: int, sig: str) -> None:
        self.op = op
        self.seq = seq
        self.sig = sig
        self.task: asyncio.Task[Any] | None = None
        self.start = 0.0
        self.deadline = 0.0
        self.expired = False
        self.check: Any = None
        self.waiters: list[asyncio.Future[Any]] = []
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = "running" if not self.finished else "failed" if self.error is not None else "done"
        return f"<OpRecord {self.op} seq={self.seq} {state}>"

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome and hand it to the awaiters' futures (once, in order)."""
        self.finished = True
        self.value = value
        self.error = error
        pending, self.waiters = self.waiters, []
        for fut in pending:
            if fut.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                fut.cancel()
            elif error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(value)


class Work(Generic[T]):
    """An operation in flight: awaitable, ``.wait()``, ``.done()``.

    Cancelling a task that awaits a Work does *not* cancel the operation: it
    keeps running in its group (bounded by its own timeout) so the other ranks
    are not left waiting for a half-finished collective. Destroying the group
    cancels it.
    """

    __slots__ = ("_task", "_map", "_rec", "op", "seq", "_key")

    def __init__(
        self,
        task: asyncio.Future[Any],
        *,
        op: str,
        seq: int | None,
        map: Callable[[Any], T] | None = None,
        record: OpRecord | None = None,
    ) -> None:
        self._task = task
        self._map = map
        self._rec = record
        self.op = op
        self.seq = seq
        self._key: int | None = _track(op, seq)
        if record is None:
            task.add_done_callback(_mark_retrieved)

    def then(self, fn: Callable[[T], U]) -> Work[U]:
        """A Work of the same operation whose result is ``fn(result)``."""
        inner = self._map
        composed = fn if inner is None else (lambda r: fn(inner(r)))
        w: Work[U] = Work.__new__(Work)
        w._task, w._map, w._rec = self._task, composed, self._rec
        w.op, w.seq, w._key = self.op, self.seq, self._key
        return w

    def _result(self, value: Any) -> T:
        return value if self._map is None else self._map(value)

    def __repr__(self) -> str:
        return f"<Work {self.op} seq={self.seq} {'done' if self.done() else 'running'}>"

    def __await__(self) -> Generator[Any, None, T]:
        if self._key is not None:
            _awaited(self._key)
        rec = self._rec
        if rec is None:
            return (yield from self._await_task())
        if rec.finished:  # no loop pass
            return self._recorded()
        fut = self._task.get_loop().create_future()
        rec.waiters.append(fut)
        try:
            value = yield from fut.__await__()
        except asyncio.CancelledError:
            if fut in rec.waiters:
                rec.waiters.remove(fut)
            elif fut.done() and not fut.cancelled():
                fut.exception()  # resolved as we were cancelled: no "never retrieved" log
            self._raise_if_operation_cancelled()
            raise
        return self._result(value)

    def _await_task(self) -> Generator[Any, None, T]:
        task = self._task
        if task.done() and not task.cancelled():  # finished already: no shield, no loop pass
            return self._result(task.result())
        try:
            value = yield from asyncio.shield(task).__await__()
        except asyncio.CancelledError:
            self._raise_if_operation_cancelled()
            raise
        return self._result(value)

    def _recorded(self) -> T:
        rec = self._rec
        assert rec is not None and rec.finished
        if rec.error is not None:
            if isinstance(rec.error, asyncio.CancelledError):
                raise GroupError(f"{self.op} was cancelled: its process group was destroyed") from None
            raise rec.error
        return self._result(rec.value)

    async def wait(self, timeout: float | None = None) -> T:
        """Wait for the result; ``timeout`` bounds only this wait (TimeoutError), not the operation."""
        if self._key is not None:
            _awaited(self._key)
        rec = self._rec
        if rec is not None and rec.finished:
            return self._recorded()
        try:
            async with asyncio.timeout(timeout):
                value = await asyncio.shield(self._task)
        except asyncio.CancelledError:
            self._raise_if_operation_cancelled()
            raise
        return self._recorded() if rec is not None else self._result(value)

    def _raise_if_operation_cancelled(self) -> None:
        # The operation itself was cancelled (its group was destroyed), not our
        # awaiter: report that as an error rather than cancelling the awaiter.
        rec = self._rec
        if self._task.cancelled() or (rec is not None and isinstance(rec.error, asyncio.CancelledError)):
            raise GroupError(f"{self.op} was cancelled: its process group was destroyed") from None

    def done(self) -> bool:
        rec = self._rec
        return rec.finished if rec is not None else self._task.done()

    def result(self) -> T:
        """The result of a finished operation (raises its error; InvalidStateError while running)."""
        rec = self._rec
        if self._key is not None and (rec.finished if rec is not None else self._task.done()):
            _awaited(self._key)
        if rec is None:
            return self._result(self._task.result())
        if not rec.finished:
            raise asyncio.InvalidStateError(f"{self.op} (seq {self.seq}) is still running")
        return self._recorded()

    def exception(self) -> BaseException | None:
        rec = self._rec
        if self._key is not None and (rec.finished if rec is not None else self._task.done()):
            _awaited(self._key)
        if rec is None:
            return self._task.exception()
        if not rec.finished:
            raise asyncio.InvalidStateError(f"{self.op} (seq {self.seq}) is still running")
        return rec.error

    def is_success(self) -> bool:
        """True when it finished without an error."""
        rec = self._rec
        if rec is not None:
            return rec.finished and rec.error is None
        return self._task.done() and not self._task.cancelled() and self._task.exception() is None


def _mark_retrieved(task: asyncio.Future[Any]) -> None:
    # An operation nobody awaited must not log "exception was never retrieved":
    # its error is still raised to whoever awaits the Work later.
    if not task.cancelled():
        task.exception()


# ---------------------------------------------------------------------------------------------------
# Operations never awaited. MINIMAL STAND-IN for the runtime's implementation (CONTRACTS.md, owner:
# "torch"): it lists the calling rank's Works that were neither awaited, waited nor read, with the
# user's call site; it does not warn when such a Work is garbage-collected.

_UNAWAITED = "aiodist_unawaited"
_COUNT = "aiodist_works"
_SKIP = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.dirname(asyncio.__file__) + os.sep)


def _track(op: str, seq: int | None) -> int:
    frame = sys._getframe(2)
    site = None
    for _ in range(64):  # the first frame outside aiodist and asyncio: the user's call
        if frame is None:
            break
        code = frame.f_code
        if not code.co_filename.startswith(_SKIP):
            site = (code.co_filename, frame.f_lineno, code.co_name)
            break
        frame = frame.f_back
    scope = rank_scope()
    key: int = scope.get(_COUNT, 0) + 1
    scope[_COUNT] = key
    scope.setdefault(_UNAWAITED, {})[key] = (op, seq, site)
    return key


def _awaited(key: int) -> None:
    table = rank_scope().get(_UNAWAITED)
    if table is not None:
        table.pop(key, None)


def unawaited_operations() -> list[str]:
    """For the calling rank: one description per operation whose Work was never awaited (or waited)."""
    out = []
    for op, seq, site in (rank_scope().get(_UNAWAITED) or {}).values():
        where = f" ({os.path.basename(site[0])}:{site[1]} in {site[2]})" if site else ""
        out.append(f"{op}{'' if seq is None else f' #{seq}'}{where}")
    return out


def clear_unawaited() -> None:
    """Forget the calling rank's un-awaited operations."""
    rank_scope().pop(_UNAWAITED, None)
