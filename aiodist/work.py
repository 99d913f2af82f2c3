"""What a started operation hands back: :class:`Work`, and the record a collective keeps of itself.

A collective runs as a task owned by its group (see :mod:`aiodist.group`),
but its outcome does not travel through that task: the operation writes it
into its :class:`OpRecord` as it ends and hands it to the futures its
awaiters wait on. So a finished collective costs no done-callbacks and no
extra loop pass, and its task never ends with an exception nobody retrieved
(it returns None, or is cancelled).

Point-to-point operations still report through their task (``Work`` falls
back to the task's result when it has no record).

Every Work is booked in its rank's ledger of operations not awaited yet
(:mod:`aiodist.unawaited`) until it is awaited or its result is looked at;
one collected before that warns (RuntimeWarning at the user's call site).

Cancellation. Cancelling a task that awaits a Work (``asyncio.wait_for``
timing out, a TaskGroup sibling failing, ``task.cancel()``) cancels the
*awaiter*; what happens to the *operation* depends on what it is:

* a collective or a send goes on: the other ranks expect its messages (a
  collective left half done would hang or mismatch them; a send was numbered
  when it was called, and the receiver delivers in that order). It ends on its
  own, bounded by its timeout, or when its group is destroyed. To stop waiting
  for it, stop awaiting it. (A send that gives up at its timeout tells the
  receiver to skip its number, unless its message came: later messages to
  that rank with that tag do not wait for it.)
* a receive is withdrawn, as cancelling any asyncio operation would: a
  message that arrives later is left for the next receive instead of landing
  in an abandoned buffer, so ``asyncio.wait_for(aiodist.recv(x), t)`` and
  ``aiodist.recv(x, timeout=t)`` leave the same state behind. No message is
  lost: one the receive had got already (it was done, but its awaiter was
  cancelled before taking it) or was getting (its payload still arriving:
  the buffer may be written until it is complete) goes to the next receive,
  first in line, and the Work ends cancelled (it never returns that message
  too). Every awaiter of that Work then sees the cancellation. To wait for
  a receive with a time limit *without* withdrawing it, use
  ``await work.wait(timeout=t)`` (it bounds only that wait) or
  ``asyncio.shield(work)``.

Destroying the group cancels every operation still running; their awaiters
get GroupError (AbortedError after ``abort``), never a cancellation of their own.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from .arguments import optional_seconds
from .collectives.buffers import TASKS as STAGING, UNCLAIMED, claim, register_task, release
from .errors import GroupError, InvalidArgumentError, WaitTimeoutError, anew
from .future import Future
from .polls import polled
from .unawaited import MAX_ENTRIES, OVERFLOW, UnawaitedOperationError, call_site, clear_unawaited, ledger, unawaited_operations

__all__ = ["OpRecord", "UnawaitedOperationError", "Work", "clear_unawaited", "unawaited_operations"]

T = TypeVar("T")
U = TypeVar("U")


class OpRecord:
    """One collective on this rank: its identity, its deadline, and (once ``finished``) its outcome.

    The group's monitor reads ``deadline``/``start`` to expire it or to start its
    fingerprint check; ``waiters`` are the futures of tasks awaiting it.
    """

    __slots__ = ("op", "seq", "sig", "task", "start", "deadline", "expired", "check", "waiters", "finished", "value", "error",
                 "after")

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
        self.after = ""  # the earlier collectives on the same memory it waits for to start (buffer_order)

    def __repr__(self) -> str:
        state = "running" if not self.finished else "failed" if self.error is not None else "done"
        return f"<OpRecord {self.op} seq={self.seq} {state}>"

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome and hand it to the awaiters' futures (once, in order).

        Staging copies of the operation's arrays (:mod:`aiodist.collectives.buffers`)
        are written back first, so an awaiter sees the result in its own objects.
        """
        if STAGING and self.task in STAGING:
            release(self.task, ok=error is None)
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
    """An operation in flight: awaitable, ``.wait()``, ``.done()`` (torch's ``is_completed()``), ``.get_future()``.

    Await it (``await w`` or ``await w.wait()``: the same): a Work whose result is never
    looked at (``await``, ``wait``, ``result``, ``exception``, ``is_success``, ``get_future``)
    is reported as an operation never awaited (see :mod:`aiodist.unawaited`).
    Static checkers catch a dropped one too: mypy with
    ``--enable-error-code unused-awaitable``.

    Cancelling a task that awaits a Work cancels a receive and leaves a
    collective or a send running (see the module doc).
    """

    __slots__ = ("_task", "_map", "_rec", "op", "seq", "group", "_book", "_key", "_withdraw", "_give_back")

    def __init__(
        self,
        task: asyncio.Future[Any],
        *,
        op: str,
        seq: int | None,
        map: Callable[[Any], T] | None = None,
        record: OpRecord | None = None,
        group: str | None = None,
        cancel_with_awaiter: bool = False,
        give_back: Callable[[], bool] | None = None,
        booked: bool = True,
    ) -> None:
        self._key: int | None = None  # (first: __del__ reads it even if this raises)
        self._withdraw = cancel_with_awaiter  # a receive: an awaiter's cancellation cancels the operation
        # A receive that ended with its message as its awaiter was cancelled gives the message back (True if it
        # had one): the next receive gets it, and this Work is then withdrawn (see _withdrawn).
        self._give_back = give_back
        self._task = task
        self._map = map
        self._rec = record
        self.op = op
        self.seq = seq
        self.group = group
        if record is None:
            register_task(task)  # (a point-to-point operation may stage its arrays in its task too)
            task.add_done_callback(_mark_retrieved)
        if UNCLAIMED and claim(task) and record is not None and record.finished:
            release(task, ok=record.error is None)  # it finished in its eager first step
        # booked in the rank's ledger until awaited (Ledger.note, inlined: this is on every operation's path)
        book = self._book = ledger()
        live = book.live
        if not booked:  # an operation that does nothing (a non-member's): not awaiting it loses nothing
            return
        if len(live) < MAX_ENTRIES:
            code, line = call_site(1)
            key = self._key = book.next
            book.next = key + 1
            live[key] = (op, seq, group, code, line)
        else:
            self._key = OVERFLOW  # (counted only: awaiting it takes it off the count)
            book.overflow += 1

    def __del__(self) -> None:
        key = self._key
        if key is not None:
            self._key = None
            try:
                if self._task.get_loop().is_closed():
                    return  # collected after its loop closed (a simulated world at its end: a crashed rank's)
                self._book.collected(key)
            except Exception:  # interpreter shutdown: modules half torn down
                pass

    def _settle(self) -> None:
        """The result is being looked at: the operation no longer counts as never awaited."""
        key = self._key
        if key is not None:
            self._key = None
            self._book.settle(key)

    def abandon(self) -> None:
        """(aiodist's own) The caller never got this Work: it is not reported as never awaited, and a receive is
        withdrawn (as an awaiter's cancellation would); a collective or a send goes on."""
        self._settle()
        if self._withdraw and not self._task.done():
            self._task.cancel()

    def then(self, fn: Callable[[T], U]) -> Work[U]:
        """A Work of the same operation whose result is ``fn(result)`` (awaiting either one counts)."""
        inner = self._map
        composed = fn if inner is None else (lambda r: fn(inner(r)))
        w: Work[U] = Work.__new__(Work)
        w._key = None
        w._task, w._map, w._rec = self._task, composed, self._rec
        w.op, w.seq, w.group, w._withdraw, w._give_back = self.op, self.seq, self.group, self._withdraw, self._give_back
        w._book, w._key = self._book, self._key  # the new Work carries the booking
        self._key = None
        return w

    def _result(self, value: Any) -> T:
        return value if self._map is None else self._map(value)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        of = "" if self.group is None else f" of {self.group}"
        return f"<Work {self.op} seq={self.seq}{of} {state}{'' if self._key is None else ' not awaited'}>"

    def __await__(self) -> Generator[Any, None, T]:
        key = self._key
        if key is not None:  # (_settle, inlined)
            self._key = None
            if key >= 0:
                self._book.live.pop(key, None)
            else:
                self._book.settle(key)
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
            _mark_retrieved(task)
            return self._result(task.result())
        try:
            value = yield from asyncio.shield(task).__await__()
        except asyncio.CancelledError:
            self._raise_if_operation_cancelled()
            if self._withdraw:
                self._withdrawn()
            raise
        except Exception as e:  # the operation's error: raised anew (see _fresh)
            if task.done() and not task.cancelled() and task.exception() is e:
                raise _fresh(e, here=sys._getframe()) from e.__cause__
            raise
        _mark_retrieved(task)
        return self._result(value)

    def _recorded(self) -> T:
        rec = self._rec
        assert rec is not None and rec.finished
        if rec.error is not None:
            if isinstance(rec.error, asyncio.CancelledError):
                raise GroupError(f"{self.op} was cancelled: its process group was destroyed") from None
            raise _fresh(rec.error)
        return self._result(rec.value)

    async def wait(self, timeout: Any = None) -> T:
        """Wait for the result; ``timeout`` (seconds or a timedelta) bounds only this wait, not the operation.

        A wait that times out raises :class:`~aiodist.WaitTimeoutError` (a TimeoutError and a
        RuntimeError, as torch's "Operation timed out!" is) and leaves the operation running.
        ``await work.wait()`` is ``await work``, except that a cancellation
        coming while a receive is awaited this way withdraws it only if it is not
        the timeout's own (see the module doc).
        """
        self._settle()
        rec = self._rec
        if rec is not None and rec.finished:
            return self._recorded()
        seconds = optional_seconds(timeout)
        if seconds is not None and not seconds >= 0:
            raise InvalidArgumentError(f"wait: timeout must be >= 0 or None, got {timeout!r}")
        try:
            async with asyncio.timeout(seconds) as cm:
                value = await asyncio.shield(self._task)
        except asyncio.CancelledError:
            self._raise_if_operation_cancelled()
            if self._withdraw and not cm.expired():
                self._withdrawn()
            raise
        except TimeoutError:
            if not cm.expired():  # the operation's own (a CollectiveTimeoutError)
                raise
            of = "" if self.group is None else f" of {self.group}"
            seq = "" if self.seq is None else f" (seq {self.seq})"
            raise WaitTimeoutError(
                f"waiting for {self.op}{seq}{of} timed out after {seconds:g}s; the operation goes on "
                "(await the Work again for its result)", op=self.op, seq=self.seq, timeout=float(seconds or 0.0),
            ) from None
        if rec is None:
            _mark_retrieved(self._task)
        return self._recorded() if rec is not None else self._result(value)

    def drop_give_back(self) -> None:
        """(aiodist's own) The receive failed: there is no message to give back (the hook and what it holds go)."""
        if self._give_back is not _given:
            self._give_back = None

    def _withdrawn(self) -> None:
        """A receive's awaiter was cancelled: so is the receive. If it had ended with its message already,
        the message goes back for the next receive and this Work ends cancelled too (nothing is lost, and
        nothing is received twice)."""
        task = self._task
        if not task.done():
            if self._give_back is not None:
                self._give_back()  # (now, not at the task's next step: the awaiter may post the next receive first)
            task.cancel()
        elif (not task.cancelled() and task.exception() is None and self._give_back is not None
              and self._give_back()):
            withdrawn: asyncio.Future[Any] = task.get_loop().create_future()
            withdrawn.cancel()
            self._task = withdrawn
            self._give_back = _given

    def _raise_if_operation_cancelled(self) -> None:
        # The operation itself was cancelled (its group was destroyed), not our
        # awaiter: report that as an error rather than cancelling the awaiter.
        rec = self._rec
        if self._give_back is _given:  # (withdrawn with its awaiter: a cancellation, as asyncio's)
            return
        if self._task.cancelled() or (rec is not None and isinstance(rec.error, asyncio.CancelledError)):
            raise GroupError(f"{self.op} was cancelled: its process group was destroyed") from None

    def done(self) -> bool:
        """Whether the operation ended (a poll that cannot end raises BlockedLoopError: see :mod:`aiodist.polls`)."""
        rec = self._rec
        finished = rec.finished if rec is not None else self._task.done()
        if not finished:
            polled(self, f"{self.op} #{self.seq} of {self.group}" if self.seq is not None else self.op)
        return finished

    def is_completed(self) -> bool:
        """torch's name for :meth:`done`; a finished operation that succeeded counts as awaited.

        torch code polls ``req.is_completed()`` and then reads the tensor: that
        consumed the result. One that failed stays booked as never awaited until
        its error is looked at (``await``, ``result()``, ``exception()``), so the
        error is not lost.

        It only reports: it does not run the event loop, and the operation progresses
        only while the loop runs. A torch-style ``while not w.is_completed(): time.sleep(0.01)``
        therefore could never end (the blocking sleep holds the loop): such polling raises
        :class:`~aiodist.errors.BlockedLoopError` after a second (:mod:`aiodist.polls`). Yield to
        the loop between polls (``await asyncio.sleep(0.01)``), or ``await w``.
        """
        if not self.done():
            return False
        if self._succeeded():
            self._settle()
        return True

    def source_rank(self) -> int:
        """torch's ``Work.source_rank()``: the sender of a finished receive (what awaiting it returns).

        Raises the receive's error if it failed; InvalidStateError while it runs; GroupError for an
        operation that is not a receive (torch raises there too). Looking at it counts as awaiting it.
        """
        if self.op != "recv":
            raise GroupError(f"source_rank() is for a receive's Work, not {self.op}'s")
        if not self.done():
            raise asyncio.InvalidStateError(f"{self.op} is still running: await it first")
        source: Any = self.result()
        return int(source)

    _source_rank = source_rank

    def get_future(self) -> Future[T]:
        """A future of the operation's result (or error), resolved when it ends (torch's ``get_future``).

        An asyncio future (``await fut`` gives what awaiting the Work gives) with torch's ``value()``,
        ``wait()`` and ``then()`` in torch's shapes: see :mod:`aiodist.future`. The Work counts as
        awaited once the future is consumed (awaited, waited on, its value or result read, ``then()``):
        a future nobody looks at is reported as a forgotten Work is. Cancelling the future does not
        cancel the operation.
        """
        fut: Future[T] = Future(loop=self._task.get_loop(), torch_shape=True, consumed=self._settle)
        if self.done():
            self._resolve(fut)
        else:
            self._task.add_done_callback(lambda _: self._resolve(fut))
        return fut

    def _resolve(self, fut: asyncio.Future[T]) -> None:
        if fut.done():
            return
        rec = self._rec
        try:
            if rec is not None:
                value = self._recorded()
            elif self._task.cancelled():
                self._raise_if_operation_cancelled()
                raise asyncio.CancelledError
            else:
                _mark_retrieved(self._task)
                value = self._result(self._task.result())
        except asyncio.CancelledError:
            fut.cancel()
            return
        except BaseException as e:
            fut.set_exception(e)
            return
        fut.set_result(value)

    def result(self) -> T:
        """The result of a finished operation (raises its error; InvalidStateError while running)."""
        rec = self._rec
        if self.done():
            self._settle()
        if rec is None:
            if self._task.done():
                _mark_retrieved(self._task)
            return self._result(self._task.result())
        if not rec.finished:
            raise asyncio.InvalidStateError(f"{self.op} (seq {self.seq}) is still running")
        return self._recorded()

    def exception(self) -> BaseException | None:
        """The error of a finished operation (None if it succeeded; InvalidStateError while running)."""
        rec = self._rec
        if self.done():
            self._settle()
        if rec is None:
            return self._task.exception()
        if not rec.finished:
            raise asyncio.InvalidStateError(f"{self.op} (seq {self.seq}) is still running")
        return rec.error

    def is_success(self) -> bool:
        """True when it finished without an error (looking at a finished one counts as awaiting it)."""
        if self.done():
            self._settle()
        return self._succeeded()

    def _succeeded(self) -> bool:
        rec = self._rec
        if rec is not None:
            return rec.finished and rec.error is None
        return self._task.done() and not self._task.cancelled() and self._task.exception() is None


def _mark_retrieved(task: asyncio.Future[Any]) -> None:
    """A task-based operation ended: its staging copies go back (idempotent; also its done callback).

    An operation nobody awaited must not log "exception was never retrieved":
    its error is still raised to whoever awaits the Work later.
    """
    ok = not task.cancelled() and task.exception() is None
    if task in STAGING:
        release(task, ok=ok)


def _given() -> bool:
    """The ``give_back`` of a receive's Work that gave its message back (its awaiter was cancelled): nothing more."""
    return False


def _fresh(e: BaseException, *, here: Any = None) -> BaseException:
    """A new exception like ``e``, the error the operation ended with, for one awaiter to raise.

    Raising the kept object itself would chain the awaiter's frames (this module's, which hold the Work
    and its task or record, which hold ``e``) onto it: a reference cycle that keeps every frame's locals
    (the operation's buffers) alive until a full collection, which a long simulated run may never make.
    ``here``: a frame of this module ``e`` passed through already: its entry is taken off ``e``'s traceback.
    """
    tb = e.__traceback__
    while tb is not None and tb.tb_frame is here:
        tb = tb.tb_next
    e.__traceback__ = tb
    try:
        new = anew(e)
    except Exception:  # noqa: BLE001 - an exception type that cannot be made so (e.g. a group): raise it as is
        return e
    new.__context__ = e.__context__
    return new.with_traceback(tb)
