"""The operation runner of a process group: sequence numbers, eager start, one monitor timer, and how operations end.

Every collective takes the group's next sequence number when it is called
and runs as a task owned by the runner, started eagerly (its first sends go
out and its first receives are posted before the call returns; see
:mod:`aiodist.eager`). Its outcome goes to an :class:`~aiodist.work.OpRecord`
that its :class:`~aiodist.work.Work` reads. One timer per group (the
*monitor*) expires the collectives past their deadline and starts the
fingerprint check (:mod:`aiodist.mismatch`) of those running long.

How an operation that did not complete fails (:meth:`OpRunner._failure`):

* cancelled by the monitor only: :class:`CollectiveTimeoutError` naming the
  peers it still waited for;
* cancelled by its fingerprint check: the mismatch found;
* cancelled because the group was destroyed or aborted: GroupError /
  AbortedError for its awaiters (the task itself ends with the error);
* any other cancellation goes on as a cancellation.

When an operation ends, the router is told (``settle``): what arrived for it
that no receive took is dropped, and a message among those from a rank that
called something else is a mismatch.

A call that fails on this rank alone -- its body raised an error of its own
(an object that cannot be pickled), or the call was refused for its
arguments before it started (:meth:`OpRunner.refused`: it takes its sequence
number all the same) -- is reported to the other members: their part of the
operation fails at once with :class:`~aiodist.errors.PeerCallFailedError`,
and the members stay in step (the group remains usable). So is a call that
timed out here: a member that comes to it later fails too, rather than
completing with the contributions that were waiting for it (the ranks would
disagree on whether the collective happened). Likewise the operations a
member failed when it declared a rank failed are named in its notice to
that rank (see :mod:`aiodist.comm.mismatch_reports`). Such news voids an
operation whose every message came with it, before the operation's task
resumed; an operation that returned already stays completed. A rank whose
loop ran late past a heartbeat interval (stopped, or blocked: its peers may
have declared it failed) reads what came meanwhile before an operation
starts and before it completes, so that news waiting unread (it was
declared failed; the operations that voids) is heard before it acts.

An operation on a group this rank is not a member of does nothing: its
Work is finished at once (:meth:`OpRunner.absent`, torch's semantics), and
the first one warns. The module-level ``send``, ``send_object_list`` and
``recv_object_list`` raise instead, as torch's do
(:meth:`OpRunner.refuse_not_member`).

Cancellation: :meth:`OpRunner.close` cancels the operations still running
and awaits them; their output buffers are left partly written.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
import math
import os
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, NoReturn, ParamSpec, Protocol, TypeVar

from . import flight
from .arguments import seconds, with_ranks
from .buffer_order import HeldArrays, arrays_of, elsewhere, memory_of, register, wait_for_earlier
from .collectives.buffers import callers_memory, restage
from .comm import GroupComm, OpChannel, Transport
from .comm.router import Receive
from .deadline import about_to_resume
from .eager import running_task, start_eager
from .errors import (
    AbortedError,
    AiodistError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    GroupError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NotMemberError,
    PeerCallFailedError,
    PeerFailureError,
)
from .inflight import begin_entry, end_entry
from .mismatch import MismatchChecker
from .unawaited import call_site
from .work import OpRecord, Work

T = TypeVar("T")
P = ParamSpec("P")

BODY_RESULT: Any = object()
"""(:meth:`OpRunner.collective`: the operation's result is what its body returns.)"""


class OpRunner:
    """Runs the operations of one group on this rank (see the module doc).

    ``timeout``: the default timeout of an operation (seconds). ``checker``:
    the group's :class:`~aiodist.mismatch.MismatchChecker`. ``destroyed`` /
    ``aborted``: the group ended (no operation starts any more).
    """

    __slots__ = ("comm", "transport", "name", "checker", "timeout", "seq", "destroyed", "aborted", "tasks", "running",
                 "monitor", "_monitor_at", "_dumped", "_absent_warned", "held", "_warned_overlap", "touching", "_hb",
                 "_voids")

    def __init__(self, comm: GroupComm, checker: MismatchChecker, *, timeout: float) -> None:
        self.comm = comm
        self.transport: Transport = comm.transport
        self._hb = self.transport.heartbeats  # (is this rank's loop stalled? see _run)
        self._voids = self.transport.router.voids
        self.name = comm.name
        self.checker = checker
        self.timeout = timeout
        self.seq = 0  # the next operation's sequence number
        self.destroyed = False
        self.aborted = False
        self.tasks: dict[asyncio.Future[Any], None] = {}
        self.running: dict[int, OpRecord] = {}  # collectives in flight, by seq (in seq order)
        self.held = HeldArrays(comm.name)  # their arrays: a new collective on overlapping memory waits (buffer_order)
        register(self.held)
        self._warned_overlap: dict[str, None] = {}  # the other groups warned of (buffer_order.elsewhere)
        self.touching: tuple[Any, ...] | None = None  # what the group method being called was given (in_step)
        self.monitor: asyncio.TimerHandle | None = None
        self._monitor_at = math.inf
        self._dumped = False
        self._absent_warned = False

    def __repr__(self) -> str:
        return f"<OpRunner {self.name} seq={self.seq} running={len(self.running)} tasks={len(self.tasks)}>"

    # ------------------------------------------------------------------ starting

    def check_usable(self, op: str) -> None:
        """Raise if ``op`` cannot start: the group was aborted or destroyed, or this rank is not a member."""
        if self.aborted:
            raise AbortedError(f"{op} on {self.name}: the process group was aborted")
        if self.destroyed:
            raise GroupError(f"{op} on {self.name}: the process group was destroyed")
        if self.comm.rank < 0:
            raise GroupError(
                f"{op} on {with_ranks(self.name, self.comm.ranks)}: global rank {self.transport.rank} is not a member "
                "of this group"
            )

    def timeout_of(self, timeout: Any) -> float:
        """An operation's timeout: ``timeout`` (seconds or a timedelta, >= 0: 0 is a deadline reached already, as
        in a retry loop's ``deadline - now``), or the group's default if None."""
        t = self.timeout if timeout is None else seconds(timeout, "timeout")
        if not t >= 0:
            raise InvalidArgumentError(f"timeout must be >= 0, got {timeout!r}")
        return t

    def refuse_not_member(self, op: str) -> NoReturn:
        """Raise for ``op`` on a group this rank is not a member of, where torch.distributed raises too
        (its ``send``, ``send_object_list``, ``recv_object_list``: ValueError "Invalid process group specified").
        A destroyed or aborted group raises as it always does."""
        if self.aborted or self.destroyed:
            self.check_usable(op)  # raises
        raise NotMemberError(
            f"{op} on {with_ranks(self.name, self.comm.ranks)}: Invalid process group specified: global rank "
            f"{self.transport.rank} (this rank) is not a member of this group, so it cannot {op} on it; the caller "
            f"passed a group this rank is not in. torch.distributed's {op} raises ValueError here too (its isend, "
            "irecv, recv and collectives do nothing on such a group, with a warning, as aiodist's do)",
            op=op, group=self.name, ranks=self.comm.ranks, global_rank=self.transport.rank,
        )

    def absent(self, op: str, result: Any = None) -> Work[Any]:
        """``op`` on a group this rank is not a member of: nothing to do; a finished Work returning ``result``.

        torch's semantics (its collectives, isend, irecv and recv return at once on a non-member, with a
        warning); the first such call on the group warns (UserWarning at the caller's line). A destroyed or
        aborted group still raises. (Where torch raises instead, the module-level calls use
        :meth:`refuse_not_member`.)
        """
        if self.aborted or self.destroyed:
            self.check_usable(op)  # raises
        if not self._absent_warned:
            self._absent_warned = True
            code, line = call_site(1)
            message = (
                f"Running {op} on global rank {self.transport.rank} which does not belong to the given group: "
                f"{with_ranks(self.name, self.comm.ranks)}; this rank is not a member of it, so the call does "
                "nothing here (as torch.distributed's collectives, isend, irecv and recv do); so does every later "
                "operation of this rank on the group"
            )
            if code is None:
                warnings.warn(message, UserWarning, stacklevel=3)
            else:
                module = os.path.splitext(os.path.basename(code.co_filename))[0]
                warnings.warn_explicit(message, UserWarning, code.co_filename, line, module=module)
        rec = OpRecord(op, -1, "")
        rec.finish(result)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(result)
        return Work(fut, op=op, seq=None, record=rec, group=self.name, booked=False)

    def collective(
        self,
        op: str,
        sig: str,
        body: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        timeout: float | None,
        result: Any = BODY_RESULT,
        prepare: Callable[[], tuple[Any, ...]] | None = None,
    ) -> Work[Any]:
        """Take the next sequence number now and start ``body(channel, seq, *args)`` as a task.

        The operation's result is ``result``, or what ``body`` returns if none is given.
        Started eagerly: an operation that never waits (a broadcast root) is finished
        when this returns. One whose memory overlaps that of an earlier collective of the
        group still in flight starts once that one ended (see :mod:`aiodist.buffer_order`):
        its memory is what the group method was called with (:func:`in_step` notes it),
        else the arrays in ``args``. ``prepare``: what makes ``args`` from the caller's
        arrays as they are when the operation starts (copies, scaling): for an operation that
        waits, called when it starts; else now, unless ``args`` were made already.
        """
        if self.aborted or self.destroyed or self.comm.rank < 0:
            self.check_usable(op)  # raises
        t = self.timeout if timeout is None else self.timeout_of(timeout)
        seq = self.seq
        self.seq += 1
        rec = OpRecord(op, seq, sig)
        loop = asyncio.get_running_loop()
        touched = self.touching
        # (the caller's memory; a staging copy stands for the caller's strided array)
        arrays = memory_of(touched) if touched is not None else callers_memory(arrays_of(args))
        if arrays:
            self._warn_overlap(op, arrays)
        seqs = self.held.overlapping(arrays)
        earlier = tuple(self.held.task(s) for s in seqs)
        if earlier:
            rec.after = ", ".join(self.held.describe(s) for s in seqs)
        if prepare is not None and not earlier:
            args, prepare = args or prepare(), None
        task, _ = start_eager(self._run(rec, body, args, result, t, loop, earlier, prepare), loop)
        if not rec.finished:
            self.tasks[task] = None  # (_run forgets it as it ends)
            self.held.hold(seq, arrays, task, op)  # (and releases it)
        return Work(task, op=op, seq=seq, record=rec, group=self.name)

    def _warn_overlap(self, op: str, arrays: tuple[Any, ...]) -> None:
        """A RuntimeWarning (once per other group) if ``arrays`` overlap those of a collective of another group
        of this rank still in flight: those are not ordered (see :mod:`aiodist.buffer_order`)."""
        for other, seq in elsewhere(self.held, arrays):
            if other.name in self._warned_overlap:
                continue
            self._warned_overlap[other.name] = None
            code, line = call_site(2)
            message = (f"{op} on {self.name} uses memory that {other.describe(seq)}, still in flight, uses too: "
                       "collectives of different groups do not wait for each other (those of one group run in call "
                       "order), so both read and write it at once; await the first before starting the second")
            if code is None:
                warnings.warn(message, RuntimeWarning, stacklevel=4)
            else:
                module = os.path.splitext(os.path.basename(code.co_filename))[0]
                warnings.warn_explicit(message, RuntimeWarning, code.co_filename, line, module=module)

    def refused(self, op: str, e: BaseException) -> None:
        """A call of ``op`` raised ``e`` here before it started (its arguments): it takes its sequence number
        all the same, and the other members are told (their part fails at once; everyone stays in step).

        Nothing on a group that cannot run operations (destroyed, aborted, not a member).
        """
        if self.aborted or self.destroyed or self.comm.rank < 0:
            return
        seq = self.seq
        self.seq += 1
        self._tell_failed(op, seq, e)
        self.transport.router.settle(self.comm.gid, seq, "", self.comm.members, next(iter(self.running), self.seq))

    def _tell_failed(self, op: str, seq: int, e: BaseException, *, void: bool = False) -> None:
        comm = self.comm
        me = self.transport.rank
        text = f"{op} (seq {seq}) of {self.name} raised there: {type(e).__name__}: {e}"
        for r in comm.ranks:
            if r != me:
                self.transport.report_call_failed(r, comm.gid, seq, text, void=void)  # connects if needed
        if not void:
            self.transport.remember_call_failed(comm.gid, seq, text)

    def spawn(self, start: Callable[[], Awaitable[T]], *, op: str, withdraw: Receive | None = None) -> Work[T]:
        """Run a point-to-point operation (no sequence number) as a task owned here: ``start()``, called in the task.

        ``start`` makes the operation's coroutine only when the task runs: a task cancelled, or
        dropped with its loop, before its first step leaves no coroutine that was never awaited
        (a coroutine made here and handed over would be one, with a RuntimeWarning naming it).
        ``withdraw``: the receive the operation posted; cancelling the task (even
        before it started) withdraws it, and so does cancelling a task that
        awaits the Work (see :class:`~aiodist.work.Work`).
        """
        guard = self._guard(start, op)
        try:
            task: asyncio.Task[T] = asyncio.get_running_loop().create_task(guard)
        except BaseException:  # (no running loop, or a closed one): the operation never runs
            guard.close()
            if withdraw is not None:
                self.transport.router.withdraw(withdraw)
            raise
        self.tasks[task] = None
        task.add_done_callback(self._forget)
        if withdraw is None:
            return Work(task, op=op, seq=None, group=self.name)
        work: Work[T] = Work(task, op=op, seq=None, group=self.name, cancel_with_awaiter=True,
                             give_back=functools.partial(self.transport.router.withdraw, withdraw))

        def ended(t: asyncio.Future[Any]) -> None:
            if t.cancelled():
                self.transport.router.withdraw(withdraw)
            elif (error := t.exception()) is not None:
                # A receive that failed (timed out...) holds nothing any more: its buffer must not live on in
                # its error's traceback (the frames' locals) or in its Work, which the awaiter's frames and
                # that error hold in a reference cycle, freed only by a full collection (a polling loop with
                # a fresh buffer per attempt grew by a buffer per timeout in the simulator).
                _clear_frames(error)
                work.drop_give_back()

        task.add_done_callback(ended)
        return work

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self.tasks.pop(task, None)

    async def _guard(self, start: Callable[[], Awaitable[T]], op: str) -> T:
        try:
            return await start()
        except asyncio.CancelledError:
            err = self._group_ended(op)
            if err is not None:
                raise err from None
            raise
        except (CollectiveTimeoutError, PeerFailureError, CollectiveMismatchError) as e:
            self._dump_first(e)
            raise

    # ------------------------------------------------------------------ running

    async def _run(
        self,
        rec: OpRecord,
        body: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        result: Any,
        timeout: float,
        loop: asyncio.AbstractEventLoop,
        earlier: tuple[asyncio.Future[Any], ...] = (),
        prepare: Callable[[], tuple[Any, ...]] | None = None,
    ) -> None:
        """Run one collective; its outcome goes to ``rec`` (see :mod:`aiodist.work`), not to the task.

        ``earlier``: the collectives in flight on overlapping arrays: the body starts once they ended.

        The task returns None, or is cancelled (and then ``rec`` holds the
        CancelledError). One coroutine from start to end: every step of the
        collective resumes through it.
        """
        me = rec.task = running_task(loop)
        assert me is not None
        op, seq, sig = rec.op, rec.seq, rec.sig
        entry: dict[str, Any] | None = None
        token: Any = None
        ch: OpChannel | None = None
        comm = self.comm
        hit: tuple[int, str] | None = None
        hb = self._hb
        try:
            if hb.stalled():  # what came meanwhile is read first (see the module doc)
                await asyncio.sleep(0)
            failure = self.transport.group_failure(comm.gid)
            if failure is not None:
                raise self._broken(failure, op, seq)
            if self.checker.first is not None:
                raise self.checker.unusable(op, seq)
            now = loop.time()
            entry = {"op": op, "seq": seq, "group": self.name}
            token = begin_entry(entry, now)
            ch = OpChannel(comm, op=op, seq=seq, sig=sig, entry=entry, loop=loop)
            rec.start = now
            rec.deadline = due = now + timeout
            self.running[seq] = rec
            after = self.checker.check_after
            if after and comm.size > 1 and now + after < due:
                due = now + after
            if due < self._monitor_at:
                self._arm_monitor(due)
            try:
                if earlier:
                    await wait_for_earlier(earlier)
                    rec.after = ""
                    restage(me)  # (copies of strided arrays were taken at the call: take them again now)
                    if prepare is not None:
                        args = prepare()
                value = await body(ch, seq, *args)
                if hb.stalled():  # (see the module doc)
                    await asyncio.sleep(0)
                if self._voids:  # news that came with its last messages voids it (see the module doc)
                    void = self.transport.router.void_error(comm.gid, seq)
                    if void is not None:
                        raise comm.localize(void, op=op, seq=seq) if isinstance(void, PeerFailureError) else void
                if result is not BODY_RESULT:
                    value = result
            except PeerFailureError:
                reported = self._reported(seq)  # (looked up before settle() below forgets it)
                if reported is None:
                    raise
                raise reported from None
            finally:
                del self.running[seq]  # from here on, the monitor leaves it alone
                self.held.release(seq)
                # every operation below the lowest one still running has ended here
                hit = self.transport.router.settle(comm.gid, seq, sig, comm.members, next(iter(self.running), self.seq))
            if hit is not None:
                raise self.checker.leftover(seq, sig, hit)
        except BaseException as e:
            if hit is not None and isinstance(e, PeerFailureError):
                # A rank that called something else at ``seq`` sent its message, then left: the mismatch is
                # the cause (this rank's part failed on its departure before any receive took the message).
                e = self.checker.leftover(seq, sig, hit)
            error = self._failure(rec, me, ch, timeout, e)
            if rec.check is not None:
                rec.check.stop()
            if entry is not None:  # (a group's own end shows as "cancelled" there)
                end_entry(token, entry, e if isinstance(error, GroupError) else error or e)
            self.tasks.pop(me, None)
            if error is None:  # a plain cancellation: the task ends cancelled
                rec.finish(error=e)
                raise
            timed_out = isinstance(error, CollectiveTimeoutError)  # (void everywhere: see the module doc)
            if timed_out or _own(error):
                self._tell_failed(op, seq, error, void=timed_out)
            rec.finish(error=error)
            return
        if rec.check is not None:
            rec.check.stop()
        end_entry(token, entry, None, loop.time())
        self.tasks.pop(me, None)
        rec.finish(value)

    def _broken(self, failure: PeerFailureError, op: str, seq: int) -> PeerFailureError:
        """A fresh error for operation ``seq`` of a group that ``failure`` broke, blaming its rank if it names one."""
        g = failure.global_rank
        if g is None:
            e = PeerFailureError(str(failure), how=failure.how)
        else:
            e = self.transport.peer_error(g)
        return self.comm.localize(e, op=op, seq=seq)

    # ------------------------------------------------------------------ how operations end

    def _failure(
        self, rec: OpRecord, me: asyncio.Task[Any], ch: OpChannel | None, timeout: float, e: BaseException
    ) -> BaseException | None:
        """What a collective that raised ``e`` fails with (None: a plain cancellation, which goes on)."""
        if isinstance(e, asyncio.CancelledError):
            check = rec.check
            if rec.expired and ch is not None and me.uncancel() == 0:  # only the monitor cancelled it
                e = self._timed_out(rec.op, rec.seq, ch, timeout, after=rec.after, check=rec.check)
            elif check is not None and check.found is not None and not self.destroyed:
                me.uncancel()  # the cancellation was the checker's, not a caller's
                self.checker.note(check.found, rec.seq)
                e = check.found
            else:
                return self._group_ended(rec.op)
        elif isinstance(e, PeerFailureError):
            e = self._voided(rec.op, rec.seq, rec.sig) or self._reported(rec.seq) or e
        if isinstance(e, CollectiveMismatchError):
            self.checker.note(e, rec.seq)
        if isinstance(e, (CollectiveTimeoutError, PeerFailureError, CollectiveMismatchError)):
            self._dump_first(e)
        return e

    def _voided(self, op: str, seq: int, sig: str | None = None) -> CollectiveMismatchError | None:
        """The mismatch that voids operation ``seq``, if this rank found one before it or was told of one at it or before.

        An operation that fails because a peer left or failed is reported as
        that mismatch instead when there is one: the peer most likely left
        because of it (e.g. a rank slow to start ``seq`` sends to a peer that
        already left after reporting it).
        """
        if self.checker.first is not None and self.checker.first.seq is not None and self.checker.first.seq < seq:
            return self.checker.unusable(op, seq)
        e = self.transport.router.voided(self.comm.gid, seq)
        if not isinstance(e, CollectiveMismatchError):
            return None
        return self.comm.restate_mismatch(e, op=op, seq=seq, mine=sig)  # (what this rank called there, too)

    def _reported(self, seq: int) -> BaseException | None:
        """A member's report that its call at ``seq`` failed there, if one came (in this group's numbering).

        An operation that fails because a peer left (a send to it, a receive from it) is reported as
        that call's failure instead: the peer most likely left because of it, having learned of it
        before this rank did (e.g. a rank slow to start ``seq`` sends to a peer already gone).
        """
        e = self.transport.router.reported(self.comm.gid, seq)
        return e if isinstance(e, PeerCallFailedError) else None

    def _group_ended(self, op: str) -> GroupError | None:
        """What an operation cancelled because its group ended fails with (None: another cancellation).

        Its awaiters get an error, not a cancellation of their own task.
        """
        if self.aborted:
            return AbortedError(f"{op} on {self.name} failed: the process group was aborted")
        if self.destroyed:
            return GroupError(f"{op} on {self.name} was cancelled: the process group was destroyed")
        return None

    def _dump_first(self, e: BaseException) -> None:
        """Write the flight recorder out on the group's first failure: the telling one."""
        if not self._dumped:
            self._dumped = True
            flight.dump(f"{type(e).__name__}: {e}", rank=self.transport.rank, world_size=self.transport.world_size)

    def _timed_out(self, op: str, seq: int, ch: OpChannel, timeout: float, *, after: str = "",
                   check: Any = None) -> CollectiveTimeoutError:
        waiting = ch.waiting_for()
        who = ", ".join(f"rank {r} (global {self.comm.ranks[r]})" for r in waiting) or (
            f"{after} to end first (the same memory; it had not started)" if after
            else "nobody (its own part had not ended: the timeout was shorter than its local work)")
        me = self.comm.rank
        here = f"rank {me}" if self.comm.ranks[me] == me else f"rank {me} (global {self.comm.ranks[me]})"
        # A rank waited for may itself wait for another: the store's fingerprints (a rank in a call for
        # longer than the check's delay notes it there) show who had not reached the call at all.
        # Those are named first: the rank waited for is often on time, waiting for them in turn.
        absent = check.absent() if check is not None else []
        if absent:
            named = [f"rank {r} (global {self.comm.ranks[r]})" for r in absent]
            missing = ", ".join(named[:8]) + (f" and {len(named) - 8} more" if len(named) > 8 else "")
            indirect = [r for r in waiting if r not in absent]
            said = (
                f"the store shows no sign of {missing} in this call (not reached yet, or "
                f"{'their' if len(absent) > 1 else 'its'} part ended); this rank was still waiting for {who}"
                + (" (which may be waiting for it in turn)" if indirect and len(absent) == 1 else
                   " (which may be waiting for them in turn)" if indirect else "")
            )
        else:
            said = f"still waiting for {who}"
        return CollectiveTimeoutError(
            f"{op} (seq {seq}) of {self.name} timed out after {timeout:g}s on {here}; {said}",
            op=op,
            seq=seq,
            waiting_for=waiting,
            timeout=timeout,
            absent=[self.comm.ranks[r] for r in absent],
        )

    # ------------------------------------------------------------------ the monitor

    def _arm_monitor(self, at: float) -> None:
        if self.monitor is not None:
            self.monitor.cancel()
        self._monitor_at = at
        self.monitor = asyncio.get_running_loop().call_at(at, self._watch, at)

    def _watch(self, at: float) -> None:
        """The monitor's timer: expire the collectives past their deadline, start due fingerprint checks.

        One timer per group instead of one per operation: an operation only
        records its deadline (a dict entry). The timer is re-armed for the
        earliest time still ahead, and not at all once nothing runs (a timer
        armed for an operation that has finished since just finds nothing due).
        """
        self.monitor = None
        self._monitor_at = math.inf
        if self.destroyed:
            return
        now = max(asyncio.get_running_loop().time(), at)  # (a loop may run a timer a hair early)
        after = self.checker.check_after if self.comm.size > 1 else 0
        nxt = math.inf
        for rec in list(self.running.values()):
            if not rec.expired:
                if rec.deadline <= now:
                    if about_to_resume(rec.task):
                        # What it waited for came in together with its deadline (the process was
                        # not running while both came due): its step goes first, and the deadline
                        # is looked at again after it (the operation may have ended).
                        nxt = now
                        continue
                    rec.expired = True
                    if rec.task is not None:
                        rec.task.cancel()
                    continue
                nxt = min(nxt, rec.deadline)
            if after and rec.check is None and rec.task is not None:
                if rec.start + after <= now:
                    rec.check = self.checker.check(rec.op, rec.seq, rec.sig, rec.task)
                else:
                    nxt = min(nxt, rec.start + after)
        if nxt < math.inf:
            self._arm_monitor(nxt)

    # ------------------------------------------------------------------ the end

    async def close(self, *, aborted: bool) -> None:
        """The group ends: cancel and await its operations (they fail with GroupError, or AbortedError)."""
        self.aborted = self.aborted or aborted
        self.destroyed = True
        if self.monitor is not None:
            self.monitor.cancel()
            self.monitor = None
        if not self.aborted:
            await self.checker.wait_notes()  # mismatch notes on their way: a moment for them
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.checker.close()



def _own(e: BaseException) -> bool:
    """Is ``e`` an error of this rank's own call (its arguments, its objects), not of the group's?"""
    if not isinstance(e, Exception):  # (GeneratorExit as a dropped world closes the task, KeyboardInterrupt...)
        return False
    return not isinstance(e, AiodistError) or isinstance(e, (InvalidArgumentError, InvalidArgumentTypeError))


class _RunsOperations(Protocol):
    _runner: OpRunner


G = TypeVar("G", bound=_RunsOperations)


def in_step(method: Callable[Concatenate[G, P], T]) -> Callable[Concatenate[G, P], T]:
    """Decorate a group's collective (the method's name is the operation's): a call refused for its arguments
    (ValueError, TypeError) still takes its sequence number and tells the other members
    (:meth:`OpRunner.refused`), then raises as it did.

    Without it, a rank that alone got an argument wrong (a read-only buffer, a bad ``scatter_list`` on the
    source) left the others waiting for the operation's whole timeout, and its next call was matched with
    the one it failed (a mismatch that made the group unusable).
    """

    op = method.__name__

    walked = "object" not in op  # (an object collective's objects, maybe very many, are not walked: see buffer_order)

    @functools.wraps(method)
    def call(self: G, /, *args: P.args, **kwargs: P.kwargs) -> T:
        runner = self._runner
        if walked:  # (the caller's memory, for the order of collectives on it: see OpRunner.collective)
            runner.touching = (args, tuple(kwargs.values()))
        try:
            return method(self, *args, **kwargs)
        except (ValueError, TypeError) as e:
            runner.refused(op, e)
            raise
        finally:
            runner.touching = None

    return call


def _clear_frames(error: BaseException) -> None:
    """Clear the locals of the (finished) frames in ``error``'s traceback and in those of its causes and contexts."""
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(seen) < 8 and not any(e is s for s in seen):
        seen.append(e)
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
