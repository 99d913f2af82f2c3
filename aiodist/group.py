"""Process groups: the collectives and point-to-point operations of a set of ranks.

Every operation is *started* when it is called: it validates its arguments
(raising at once, before any communication), takes the group's next sequence
number, and runs as a task owned by the group. The call returns a
:class:`Work` to await. So ``h1 = pg.all_reduce(a); h2 =
pg.all_reduce(b); await h2; await h1`` matches across ranks, and many
operations may be in flight.

Ranks: a group's methods take and return *group* ranks (``0..size-1``); the
module-level functions of :mod:`aiodist.api` take global ranks, as torch does.

Every operation has a timeout (the group's default from
``init_process_group(timeout=...)``, or ``timeout=`` per call) and raises
:class:`CollectiveTimeoutError` naming the operation, its sequence number and
the peers it still waited for. A dead peer raises :class:`PeerFailureError`;
a peer that called a different collective at the same sequence number raises
:class:`CollectiveMismatchError`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from . import flight, p2p
from .collectives.allreduce import all_reduce_flat
from .collectives.alltoall import exchange_blocks, single_blocks
from .collectives.buffers import as_flat
from .collectives.ops import ReduceOp, check_op_dtype
from .comm import GroupComm, OpChannel, Transport
from .errors import (
    AbortedError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    GroupError,
    InvalidArrayError,
    InvalidRankError,
    PeerFailureError,
)
from .eager import running_task, start_eager
from .inflight import begin_entry, end_entry
from .work import OpRecord, Work

T = TypeVar("T")

WORLD_GROUP_ID = 0

MISMATCH_CHECK_AFTER = 0.3
"""Seconds a collective may wait before its fingerprint is compared with the other ranks' (0: never).

Every frame of a collective carries its fingerprint (operation, dtype,
element count, root), and a receive that gets a frame of another call fails
at once: most mismatches are caught that way, for free. Some are not (two
calls whose frames never cross, e.g. ranks waiting on each other in opposite
directions). So a collective still running after this long appends its
fingerprint to a key of the store (``fp/<group>/<seq>``) and reads the
others'; any disagreement (or a member that already found one) fails it with
CollectiveMismatchError listing what each rank called (a rank whose part of
the call completed without noticing, e.g. a broadcast root, learns it at its
next collective: the first rank to find a mismatch records it in
``fp/<group>/bad``, and the group is unusable from then on). Fast collectives
never get there: the group's one monitor timer (see ``ProcessGroup._watch``)
starts the check of a collective still running this long after its start;
an operation only records its start and deadline (a dict entry).
"""
MISMATCH_RECHECK = 0.3
HELPERS_GRACE = 1.0


_DRIVERS: dict[str, Callable[..., Awaitable[Any]]] = {}


def _driver(name: str) -> Callable[..., Awaitable[Any]]:
    """The algorithm of collective ``name`` from :mod:`aiodist.collectives`."""
    fn = _DRIVERS.get(name)
    if fn is None:
        from . import collectives

        fn = getattr(collectives, name, None)
        if fn is None:
            raise GroupError(f"the collective {name!r} is not available in aiodist.collectives")
        _DRIVERS[name] = fn
    return fn


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(flat: np.ndarray) -> str:
    # numpy computes dtype.name in Python (~15 us); the signature of every collective needs it
    dt = flat.dtype
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = dt.name
        if len(_DTYPE_NAMES) < 256:  # structured dtypes could be endless; the common ones are few
            _DTYPE_NAMES[dt] = name
    return name


_REDUCTIONS: dict[Any, tuple[ReduceOp, str]] = {}


def _reduction(op: Any, flat: np.ndarray) -> tuple[ReduceOp, str]:
    """``check_op_dtype(op, flat.dtype)`` and "OP dtype" for the signature, remembered per (op, dtype)."""
    key = (op, flat.dtype)
    try:
        hit = _REDUCTIONS.get(key)
    except TypeError:  # an unhashable op object (anything with a matching .name is accepted)
        rop = check_op_dtype(op, flat.dtype)
        return rop, f"{rop.name} {_dtype_name(flat)}"
    if hit is None:
        rop = check_op_dtype(op, flat.dtype)  # raises for a bad pair: nothing is remembered then
        hit = (rop, f"{rop.name} {_dtype_name(flat)}")
        if len(_REDUCTIONS) < 1024:
            _REDUCTIONS[key] = hit
    return hit


_BODY_RESULT: Any = object()  # (_collective: the result is what the body returns)


class ProcessGroup:
    """A set of ranks that run collectives together (see the module doc).

    ``rank`` is this rank's number in the group (-1 on a rank that is not a
    member: such a group refuses every operation with GroupError), ``size``
    the number of ranks, ``ranks`` their global ranks, ``store`` the store the
    job rendezvoused through, ``timeout`` the default timeout in seconds,
    ``job_id`` the rendezvous' job id, ``local_rank``/``local_world_size``
    from the environment (None if not set).

    Cancellation: an operation runs as the group's task, so cancelling whoever
    awaits its :class:`Work` leaves it running (its peers still get their
    messages); :meth:`destroy` cancels the operations still running, which
    leaves their output buffers partly written.
    """

    def __init__(
        self,
        transport: Transport,
        gid: Any,
        ranks: Sequence[int],
        *,
        store: Any,
        timeout: float,
        name: str,
    ) -> None:
        self._transport = transport
        self._comm = GroupComm(transport, gid, tuple(ranks), name=name)
        self.store = store
        self.timeout = float(timeout)
        self.name = name
        self.group_id = gid
        self._seq = 0
        self._tasks: dict[asyncio.Future[Any], None] = {}
        self._destroyed = False
        self._dumped = False
        self.job_id: str | None = None
        self.local_rank: int | None = None
        self.local_world_size: int | None = None
        self.mismatch_check_after = MISMATCH_CHECK_AFTER
        self._aborted = False
        self._mismatch: CollectiveMismatchError | None = None  # the first mismatch: the group is unusable since
        self._mismatch_told: set[int] = set()
        self._helpers: dict[asyncio.Future[Any], None] = {}
        # Collectives in flight, by seq, and the one timer that watches them all (see _watch).
        self._running: dict[int, OpRecord] = {}
        self._monitor: asyncio.TimerHandle | None = None
        self._monitor_at = math.inf
        # Set by the rendezvous for the world group: what destroy() must close.
        self._on_destroy: list[Callable[[], Awaitable[None]]] = []

    def __repr__(self) -> str:
        state = " destroyed" if self._destroyed else "" if self.is_member else " (not a member)"
        return f"<ProcessGroup {self.name} rank={self.rank}/{self.size}{state}>"

    # ------------------------------------------------------------------ properties

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def size(self) -> int:
        return self._comm.size

    @property
    def ranks(self) -> list[int]:
        """The global ranks of the members, in group-rank order."""
        return list(self._comm.ranks)

    @property
    def is_member(self) -> bool:
        return self._comm.rank >= 0

    @property
    def transport(self) -> Transport:
        return self._transport

    def group_rank(self, global_rank: int) -> int:
        """The group rank of ``global_rank`` (-1 if not a member)."""
        return self._comm.group_rank(global_rank)

    def global_rank(self, group_rank: int) -> int:
        """The global rank of ``group_rank``."""
        self._check_peer(group_rank, "rank")
        return self._comm.ranks[group_rank]

    # ------------------------------------------------------------------ running operations

    def _check_usable(self, op: str) -> None:
        if self._aborted:
            raise AbortedError(f"{op} on {self.name}: the process group was aborted")
        if self._destroyed:
            raise GroupError(f"{op} on {self.name}: the process group was destroyed")
        if not self.is_member:
            raise GroupError(
                f"{op} on {self.name}: global rank {self._transport.rank} is not a member of this group "
                f"(ranks {self.ranks})"
            )

    def _check_peer(self, peer: Any, what: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
            raise TypeError(f"{what} must be an int rank, not {type(peer).__name__}")
        if not 0 <= int(peer) < self.size:
            raise InvalidRankError(
                f"{what}={peer} is out of range for {self.name} of {self.size} ranks",
                rank=int(peer),
                size=self.size,
                argument=what,
            )
        return int(peer)

    def _timeout(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else float(timeout)
        if not t > 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        return t

    def _spawn(self, coro: Awaitable[T], *, op: str, seq: int | None) -> Work[T]:
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(self._guard(coro, op))
        if hasattr(coro, "close"):  # cancelled before it started: no "never awaited" warning
            task.add_done_callback(lambda t: coro.close() if t.cancelled() else None)  # type: ignore[union-attr]
        self._tasks[task] = None
        task.add_done_callback(self._forget)
        return Work(task, op=op, seq=seq, group=self.name)

    async def _guard(self, coro: Awaitable[T], op: str) -> T:
        try:
            return await coro
        except asyncio.CancelledError:
            err = self._group_ended(op)
            if err is not None:
                raise err from None
            raise
        except (CollectiveTimeoutError, PeerFailureError, CollectiveMismatchError) as e:
            self._dump_first(e)
            raise

    def _group_ended(self, op: str) -> GroupError | None:
        """What an operation cancelled because its group ended fails with (None: another cancellation).

        Its awaiters get an error, not a cancellation of their own task.
        """
        if self._aborted:
            return AbortedError(f"{op} on {self.name} failed: the process group was aborted")
        if self._destroyed:
            return GroupError(f"{op} on {self.name} was cancelled: the process group was destroyed")
        return None

    def _dump_first(self, e: BaseException) -> None:
        """Write the flight recorder out on the group's first failure: the telling one."""
        if not self._dumped:
            self._dumped = True
            flight.dump(f"{type(e).__name__}: {e}", rank=self._transport.rank, world_size=self._transport.world_size)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._tasks.pop(task, None)

    def _collective(
        self,
        op: str,
        sig: str,
        body: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        timeout: float | None,
        result: Any = _BODY_RESULT,
    ) -> Work[Any]:
        """Take the next sequence number now and start ``body(channel, seq, *args)`` as a task.

        The operation's result is ``result``, or what ``body`` returns if none is given.

        Started eagerly: the first sends go out and the first receives are
        posted before this returns, not one loop iteration later; an operation
        that never waits (a broadcast root) is finished when this returns.
        """
        if self._aborted or self._destroyed or self._comm.rank < 0:
            self._check_usable(op)  # raises
        t = self.timeout if timeout is None else self._timeout(timeout)
        seq = self._seq
        self._seq += 1
        rec = OpRecord(op, seq, sig)
        loop = asyncio.get_running_loop()
        task, _ = start_eager(self._run(rec, body, args, result, t, loop), loop)
        if not rec.finished:
            self._tasks[task] = None  # (_run forgets it as it ends)
        return Work(task, op=op, seq=seq, record=rec, group=self.name)

    async def _run(
        self,
        rec: OpRecord,
        body: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        result: Any,
        timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Run one collective; its outcome goes to ``rec`` (see :mod:`aiodist.work`), not to the task.

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
        try:
            failure = self._transport.group_failure(self.group_id)
            if failure is not None:
                raise self._comm.localize(self._transport.peer_error(failure.global_rank or 0), op=op, seq=seq)
            if self._mismatch is not None:
                raise CollectiveMismatchError(
                    f"{op} (seq {seq}) of {self.name}: the group is unusable after a collective mismatch "
                    f"at seq {self._mismatch.seq}: {self._mismatch}",
                    calls=self._mismatch.calls,
                    seq=seq,
                )
            now = loop.time()
            entry = {"op": op, "seq": seq, "group": self.name}
            token = begin_entry(entry, now)
            ch = OpChannel(self._comm, op=op, seq=seq, sig=sig, entry=entry, loop=loop)
            rec.start = now
            rec.deadline = due = now + timeout
            self._running[seq] = rec
            if self.mismatch_check_after and self._comm.size > 1 and now + self.mismatch_check_after < due:
                due = now + self.mismatch_check_after
            if due < self._monitor_at:
                self._arm_monitor(due)
            try:
                value = await body(ch, seq, *args)
                if result is not _BODY_RESULT:
                    value = result
            finally:
                del self._running[seq]  # from here on, the monitor leaves it alone
            self._check_leftovers(op, seq, sig)
        except BaseException as e:
            error = self._failure(rec, me, ch, timeout, e)
            if rec.check is not None:
                rec.check.stop()
            if entry is not None:  # (a group's own end shows as "cancelled" there)
                end_entry(token, entry, e if isinstance(error, GroupError) else error or e)
            self._tasks.pop(me, None)
            if error is None:  # a plain cancellation: the task ends cancelled
                rec.finish(error=e)
                raise
            rec.finish(error=error)
            return
        if rec.check is not None:
            rec.check.stop()
        end_entry(token, entry, None, loop.time())  # type: ignore[arg-type]
        self._tasks.pop(me, None)
        rec.finish(value)

    def _failure(
        self, rec: OpRecord, me: asyncio.Task[Any], ch: OpChannel | None, timeout: float, e: BaseException
    ) -> BaseException | None:
        """What a collective that raised ``e`` fails with (None: a plain cancellation, which goes on)."""
        if isinstance(e, asyncio.CancelledError):
            check = rec.check
            if rec.expired and ch is not None and me.uncancel() == 0:  # only the monitor cancelled it
                e = self._timed_out(rec.op, rec.seq, ch, timeout)
            elif check is not None and check.found is not None and not self._destroyed:
                me.uncancel()  # the cancellation was the checker's, not a caller's
                self._note_mismatch(check.found, rec.seq, reported=False)
                e = check.found
            else:
                return self._group_ended(rec.op)
        elif isinstance(e, CollectiveMismatchError):
            self._note_mismatch(e, rec.seq, reported=getattr(e, "reported", False))
        if isinstance(e, (CollectiveTimeoutError, PeerFailureError, CollectiveMismatchError)):
            self._dump_first(e)
        return e

    def _arm_monitor(self, at: float) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
        self._monitor_at = at
        self._monitor = asyncio.get_running_loop().call_at(at, self._watch, at)

    def _watch(self, at: float) -> None:
        """The monitor's timer: expire the collectives past their deadline, start due fingerprint checks.

        One timer per group instead of one per operation: an operation only
        records its deadline (a dict entry). The timer is re-armed for the
        earliest time still ahead, and not at all once nothing runs (a timer
        armed for an operation that has finished since just finds nothing due).
        """
        self._monitor = None
        self._monitor_at = math.inf
        if self._destroyed:
            return
        now = max(asyncio.get_running_loop().time(), at)  # (a loop may run a timer a hair early)
        after = self.mismatch_check_after if self.size > 1 else 0
        nxt = math.inf
        for rec in list(self._running.values()):
            if not rec.expired:
                if rec.deadline <= now:
                    rec.expired = True
                    if rec.task is not None:
                        rec.task.cancel()
                    continue
                nxt = min(nxt, rec.deadline)
            if after and rec.check is None and rec.task is not None:
                if rec.start + after <= now:
                    rec.check = _FingerprintCheck(self, rec.op, rec.seq, rec.sig, rec.task, rec.start)
                    rec.check.begin()
                else:
                    nxt = min(nxt, rec.start + after)
        if nxt < math.inf:
            self._arm_monitor(nxt)

    def _timed_out(self, op: str, seq: int, ch: OpChannel, timeout: float) -> CollectiveTimeoutError:
        waiting = ch.waiting_for()
        who = ", ".join(f"rank {r} (global {self._comm.ranks[r]})" for r in waiting) or "nobody (stuck locally)"
        return CollectiveTimeoutError(
            f"{op} (seq {seq}) of {self.name} timed out after {timeout:g}s on rank {self.rank}; "
            f"still waiting for {who}",
            op=op,
            seq=seq,
            waiting_for=waiting,
            timeout=timeout,
        )

    def _check_leftovers(self, op: str, seq: int, sig: str) -> None:
        """Frames of this seq that no receive took, from a peer that called something else: a mismatch.

        (A call whose part completes without hearing from the mismatched peers, e.g. a broadcast
        whose roots differ, would otherwise leave them behind silently.)
        """
        hit = self._transport.router.conflicting_arrival(self.group_id, seq, sig, self._comm.members)
        if hit is None:
            return
        src, other = hit
        peer = self._comm.group_rank(src)
        raise CollectiveMismatchError(
            f"collective mismatch in {self.name} at seq {seq}: rank {self.rank} called {sig!r} "
            f"but rank {peer} called {other!r}",
            calls={self.rank: sig, peer: other},
            seq=seq,
        )

    def _note_mismatch(self, e: CollectiveMismatchError, seq: int, *, reported: bool) -> None:
        """A collective of this group mismatched: the group is unusable; make sure every member learns it.

        Tells every other member (not only the peers it exchanged frames with):
        their operation at ``seq`` fails at once instead of waiting for one
        that will never come, and leaves a mark in the store for members that
        check their fingerprints later.
        """
        first = self._mismatch is None
        if first:
            self._mismatch = e
        if seq in self._mismatch_told:
            return
        self._mismatch_told.add(seq)
        calls = {self._comm.ranks[k]: v for k, v in e.calls.items() if isinstance(k, int) and 0 <= k < self.size}
        if not reported:
            header = {"t": "x", "g": self.group_id, "s": seq, "m": str(e), "c": [[int(k), str(v)] for k, v in calls.items()]}
            for r in self._comm.ranks:
                if r != self._transport.rank:
                    self._spawn_quiet(_tell(self._transport, r, header))
        if self.mismatch_check_after:
            self._spawn_quiet(_mark_mismatch(self, seq, e.calls))

    def _spawn_quiet(self, coro: Coroutine[Any, Any, Any]) -> None:
        # Started eagerly: a mismatch notice is on the wire before the caller sees the error
        # (and perhaps exits at once).
        task, _ = start_eager(coro, asyncio.get_running_loop())
        self._helpers[task] = None
        task.add_done_callback(lambda t: (self._helpers.pop(t, None), t.cancelled() or t.exception()))

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, x: Any, op: Any = ReduceOp.SUM, *, timeout: float | None = None) -> Work[Any]:
        """Reduce ``x`` over the group in place; the Work returns ``x``."""
        flat = as_flat(x, "x", writable=True)
        rop, what = _reduction(op, flat)
        sig = f"all_reduce {what} n={flat.size}"

        return self._collective("all_reduce", sig, all_reduce_flat, (flat, rop), timeout, result=x)

    def broadcast(self, x: Any, src: int = 0, *, timeout: float | None = None) -> Work[Any]:
        """Copy ``x`` of rank ``src`` into ``x`` of every rank; the Work returns ``x``."""
        root = self._check_peer(src, "src")
        flat = as_flat(x, "x", writable=self.rank != root)
        sig = f"broadcast src={root} {_dtype_name(flat)} n={flat.size}"

        return self._collective("broadcast", sig, _driver("broadcast"), (x, root), timeout, result=x)

    def reduce(self, x: Any, dst: int = 0, op: Any = ReduceOp.SUM, *, timeout: float | None = None) -> Work[Any]:
        """Reduce ``x`` into rank ``dst``'s ``x`` (others' ``x`` may be used as scratch); returns ``x``."""
        root = self._check_peer(dst, "dst")
        flat = as_flat(x, "x", writable=self.rank == root)
        rop, what = _reduction(op, flat)
        sig = f"reduce dst={root} {what} n={flat.size}"

        return self._collective("reduce", sig, _driver("reduce"), (x, root, rop), timeout, result=x)

    def all_gather(self, out_list: Sequence[Any], x: Any, *, timeout: float | None = None) -> Work[Any]:
        """Fill ``out_list[i]`` with rank i's ``x``; returns ``out_list``."""
        flat = as_flat(x, "x", writable=False)
        self._check_list(out_list, "out_list", flat, size=flat.size, writable=True)
        sig = f"all_gather {_dtype_name(flat)} n={flat.size}"

        return self._collective("all_gather", sig, _driver("all_gather"), (out_list, x), timeout, result=out_list)

    def all_gather_into_tensor(self, out: Any, x: Any, *, timeout: float | None = None) -> Work[Any]:
        """Concatenate every rank's ``x`` into ``out`` (``size`` times larger); returns ``out``."""
        flat = as_flat(x, "x", writable=False)
        oflat = as_flat(out, "out", writable=True)
        self._check_same_dtype(oflat, flat, "out")
        if oflat.size != flat.size * self.size:
            raise InvalidArrayError(
                f"out has {oflat.size} elements, expected {self.size} x {flat.size}", argument="out", reason="size"
            )
        sig = f"all_gather_into_tensor {_dtype_name(flat)} n={flat.size}"

        return self._collective(
            "all_gather_into_tensor",
            sig,
            _driver("all_gather_into_tensor"),
            (out, x),
            timeout,
            result=out,
        )

    def gather(
        self, x: Any, gather_list: Sequence[Any] | None = None, dst: int = 0, *, timeout: float | None = None
    ) -> Work[Any]:
        """Collect every rank's ``x`` into ``gather_list`` on rank ``dst``; returns ``gather_list`` there, else None."""
        flat = as_flat(x, "x", writable=False)
        root = self._check_peer(dst, "dst")
        if self.rank == root:
            if gather_list is None:
                raise ValueError(f"gather: rank {root} is dst and must pass gather_list")
            self._check_list(gather_list, "gather_list", flat, size=flat.size, writable=True)
        else:
            gather_list = None
        sig = f"gather dst={root} {_dtype_name(flat)} n={flat.size}"

        return self._collective(
            "gather",
            sig,
            _driver("gather"),
            (x, gather_list, root),
            timeout,
            result=gather_list,
        )

    def scatter(
        self, x: Any, scatter_list: Sequence[Any] | None = None, src: int = 0, *, timeout: float | None = None
    ) -> Work[Any]:
        """Rank ``src`` sends ``scatter_list[i]`` to rank i's ``x``; returns ``x``."""
        flat = as_flat(x, "x", writable=True)
        root = self._check_peer(src, "src")
        if self.rank == root:
            if scatter_list is None:
                raise ValueError(f"scatter: rank {root} is src and must pass scatter_list")
            self._check_list(scatter_list, "scatter_list", flat, size=flat.size, writable=False)
        else:
            scatter_list = None
        sig = f"scatter src={root} {_dtype_name(flat)} n={flat.size}"

        return self._collective("scatter", sig, _driver("scatter"), (x, scatter_list, root), timeout, result=x)

    def reduce_scatter(
        self, out: Any, in_list: Sequence[Any], op: Any = ReduceOp.SUM, *, timeout: float | None = None
    ) -> Work[Any]:
        """``out`` = the reduction over ranks of their ``in_list[rank]``; returns ``out``."""
        oflat = as_flat(out, "out", writable=True)
        rop, what = _reduction(op, oflat)
        self._check_list(in_list, "in_list", oflat, size=oflat.size, writable=False)
        sig = f"reduce_scatter {what} n={oflat.size}"

        return self._collective(
            "reduce_scatter",
            sig,
            _driver("reduce_scatter"),
            (out, in_list, rop),
            timeout,
            result=out,
        )

    def reduce_scatter_tensor(self, out: Any, x: Any, op: Any = ReduceOp.SUM, *, timeout: float | None = None) -> Work[Any]:
        """``out`` = the reduction over ranks of their chunk ``rank`` of ``x``; returns ``out``."""
        oflat = as_flat(out, "out", writable=True)
        flat = as_flat(x, "x", writable=False)
        rop, what = _reduction(op, oflat)
        self._check_same_dtype(flat, oflat, "x")
        if flat.size != oflat.size * self.size:
            raise InvalidArrayError(
                f"x has {flat.size} elements, expected {self.size} x {oflat.size}", argument="x", reason="size"
            )
        sig = f"reduce_scatter_tensor {what} n={oflat.size}"

        return self._collective(
            "reduce_scatter_tensor",
            sig,
            _driver("reduce_scatter_tensor"),
            (out, x, rop),
            timeout,
            result=out,
        )

    def all_to_all(self, out_list: Sequence[Any], in_list: Sequence[Any], *, timeout: float | None = None) -> Work[Any]:
        """Rank i's ``in_list[j]`` lands in rank j's ``out_list[i]``; returns ``out_list``."""
        if not isinstance(in_list, Sequence) or not in_list:
            raise InvalidArrayError("in_list must be a non-empty list of arrays", argument="in_list", reason="type")
        first = as_flat(in_list[0], "in_list[0]", writable=False)
        self._check_list(in_list, "in_list", first, size=None, writable=False)
        self._check_list(out_list, "out_list", first, size=None, writable=True)
        sig = f"all_to_all {_dtype_name(first)}"

        return self._collective(
            "all_to_all",
            sig,
            _driver("all_to_all"),
            (out_list, in_list),
            timeout,
            result=out_list,
        )

    def all_to_all_single(
        self,
        out: Any,
        x: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> Work[Any]:
        """all_to_all on single arrays split along their first dimension; returns ``out``."""
        # validated (splits too: one size per rank) and cut now (errors before a sequence number is taken); the task only exchanges
        outs, ins = single_blocks(out, x, self.size, output_split_sizes, input_split_sizes, arg="x")
        sig = f"all_to_all_single {_dtype_name(ins[0])}"
        return self._collective("all_to_all_single", sig, exchange_blocks, (outs, ins), timeout, result=out)

    def barrier(self, *, timeout: float | None = None) -> Work[None]:
        """Wait until every rank of the group reached its barrier."""

        return self._collective("barrier", "barrier", _driver("barrier"), (), timeout, result=None)

    def monitored_barrier(self, timeout: float | None = None, wait_all_ranks: bool = False) -> Work[None]:
        """A barrier through rank 0 that names the ranks that did not arrive in time.

        Rank 0 waits for every other rank, then releases them. On timeout rank
        0 raises CollectiveTimeoutError whose ``waiting_for`` lists the missing
        ranks (all of them; ``wait_all_ranks`` is accepted for torch compatibility).
        """

        def body(ch: OpChannel, seq: int) -> Awaitable[None]:
            return _monitored_barrier(ch, wait_all_ranks=wait_all_ranks)

        return self._collective("monitored_barrier", "monitored_barrier", body, (), timeout, result=None)

    # ------------------------------------------------------------------ object collectives

    def all_gather_object(self, obj: Any, *, timeout: float | None = None) -> Work[list[Any]]:
        """Every rank's (picklable) ``obj``, as a list indexed by group rank."""

        return self._collective(
            "all_gather_object",
            "all_gather_object",
            _driver("all_gather_object"),
            (obj,),
            timeout,
        )

    def broadcast_object_list(self, object_list: list[Any], src: int = 0, *, timeout: float | None = None) -> Work[list[Any]]:
        """Replace the entries of ``object_list`` with rank ``src``'s; returns ``object_list``."""
        root = self._check_peer(src, "src")
        if not isinstance(object_list, list):
            raise TypeError(f"object_list must be a list, not {type(object_list).__name__}")

        return self._collective(
            "broadcast_object_list",
            f"broadcast_object_list src={root}",
            _driver("broadcast_object_list"),
            (object_list, root),
            timeout,
            result=object_list,
        )

    def gather_object(self, obj: Any, dst: int = 0, *, timeout: float | None = None) -> Work[list[Any] | None]:
        """Every rank's ``obj`` as a list on rank ``dst`` (None elsewhere)."""
        root = self._check_peer(dst, "dst")

        return self._collective(
            "gather_object",
            f"gather_object dst={root}",
            _driver("gather_object"),
            (obj, root),
            timeout,
        )

    def scatter_object_list(
        self, out: list[Any], in_list: Sequence[Any] | None = None, src: int = 0, *, timeout: float | None = None
    ) -> Work[list[Any]]:
        """Rank ``src`` sends ``in_list[i]`` to rank i, which stores it as ``out[0]``; returns ``out``."""
        root = self._check_peer(src, "src")
        if not isinstance(out, list) or not out:
            raise ValueError("out must be a list with at least one entry (the received object goes in out[0])")
        if self.rank == root:
            if in_list is None or len(in_list) != self.size:
                raise ValueError(f"scatter_object_list: rank {root} must pass in_list of {self.size} objects")

        return self._collective(
            "scatter_object_list",
            f"scatter_object_list src={root}",
            _driver("scatter_object_list"),
            (out, in_list if self.rank == root else None, root),
            timeout,
            result=out,
        )

    # ------------------------------------------------------------------ point to point

    def send(self, x: Any, dst: int, tag: int = 0, *, timeout: float | None = None) -> Work[None]:
        """Send ``x`` to group rank ``dst`` with ``tag`` (messages per (src, tag) arrive in order)."""
        self._check_usable("send")
        peer = self._check_peer(dst, "dst")
        if peer == self.rank:
            raise InvalidRankError(f"send: dst={dst} is this rank", rank=peer, size=self.size, argument="dst")
        coro = p2p.send(self._comm, x, peer, tag, timeout=self._timeout(timeout))
        return self._spawn(coro, op="send", seq=None)

    def recv(self, x: Any, src: int | None = None, tag: int = 0, *, timeout: float | None = None) -> Work[int]:
        """Receive into ``x`` from group rank ``src`` (None: any source); the Work returns the sender."""
        self._check_usable("recv")
        peer = None if src is None else self._check_peer(src, "src")
        if peer is not None and peer == self.rank:
            raise InvalidRankError(f"recv: src={src} is this rank", rank=peer, size=self.size, argument="src")
        coro = p2p.recv(self._comm, x, peer, tag, timeout=self._timeout(timeout))
        return self._spawn(coro, op="recv", seq=None)

    isend = send
    irecv = recv

    # ------------------------------------------------------------------ helpers

    def _check_same_dtype(self, a: np.ndarray, b: np.ndarray, argument: str) -> None:
        if a.dtype != b.dtype:
            raise InvalidArrayError(
                f"{argument} has dtype {a.dtype.name}, expected {b.dtype.name}", argument=argument, reason="dtype"
            )

    def _check_list(self, arrs: Any, argument: str, like: np.ndarray, *, size: int | None, writable: bool) -> None:
        if isinstance(arrs, np.ndarray) or not isinstance(arrs, Sequence):
            raise InvalidArrayError(f"{argument} must be a list of arrays", argument=argument, reason="type")
        if len(arrs) != self.size:
            raise InvalidArrayError(
                f"{argument} has {len(arrs)} entries, {self.name} has {self.size} ranks", argument=argument, reason="length"
            )
        for i, a in enumerate(arrs):
            flat = as_flat(a, f"{argument}[{i}]", writable=writable)
            self._check_same_dtype(flat, like, f"{argument}[{i}]")
            if size is not None and flat.size != size:
                raise InvalidArrayError(
                    f"{argument}[{i}] has {flat.size} elements, expected {size}", argument=f"{argument}[{i}]", reason="size"
                )

    # ------------------------------------------------------------------ teardown

    async def abort(self) -> None:
        """Fail every operation of this group at once (AbortedError) and destroy it, waiting for nobody.

        Its connections are shared with the job's other groups: :func:`aiodist.abort` of the
        world drops them all (peers see this rank fail); aborting a subgroup only ends it here.
        """
        self._aborted = True
        await self.destroy()

    async def destroy(self) -> None:
        """Cancel and await this group's operations, then release what it owns.

        Operations still running fail with GroupError for their awaiters.
        Idempotent.
        """
        if self._destroyed:
            return
        self._destroyed = True
        if self._monitor is not None:
            self._monitor.cancel()
            self._monitor = None
        if self._helpers and not self._aborted:  # mismatch reports on their way: give them a moment
            await asyncio.wait(list(self._helpers), timeout=HELPERS_GRACE)
        tasks = list(self._tasks) + list(self._helpers)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._transport.unregister_group(self.group_id)
        for fn in reversed(self._on_destroy):
            await fn()
        self._on_destroy.clear()


async def _monitored_barrier(ch: OpChannel, *, wait_all_ranks: bool) -> None:
    # Rank 0 waits for all ranks at once, so its timeout names every missing
    # rank whatever ``wait_all_ranks`` says (it is accepted for torch parity).
    del wait_all_ranks
    empty = memoryview(bytearray())
    if ch.rank != 0:
        await ch.send(0, ("in",), b"")
        await ch.recv_into(0, ("out",), empty)
        return

    async def arrive(r: int) -> None:
        await ch.recv_into(r, ("in",), memoryview(bytearray()))

    async with asyncio.TaskGroup() as tg:
        for r in range(1, ch.size):
            tg.create_task(arrive(r))
    for r in range(1, ch.size):
        await ch.send(r, ("out",), b"")


def _fingerprint_key(pg: ProcessGroup, seq: int) -> str:
    return f"{pg.transport.key_prefix}fp/{pg.group_id}/{seq}"


class _FingerprintCheck:
    """Compare a stalled collective's fingerprint with the other members' through the store."""

    __slots__ = ("pg", "op", "seq", "sig", "task", "start", "checker", "found")

    def __init__(self, pg: ProcessGroup, op: str, seq: int, sig: str, task: asyncio.Task[Any], start: float) -> None:
        self.pg = pg
        self.op = op
        self.seq = seq
        self.sig = sig
        self.task = task  # the operation's task, started at ``start`` (loop time)
        self.start = start
        self.found: CollectiveMismatchError | None = None
        self.checker: asyncio.Task[None] | None = None

    def begin(self) -> None:
        self.checker = asyncio.get_running_loop().create_task(self._run())
        self.checker.add_done_callback(lambda t: t.cancelled() or t.exception())

    def stop(self) -> None:
        if self.checker is not None and not self.checker.done():
            self.checker.cancel()

    async def _run(self) -> None:
        pg = self.pg
        key = _fingerprint_key(pg, self.seq)
        try:
            await pg.store.append(key, f"{pg.rank}={self.sig}\n".encode())
            bad = _bad_key(pg)
            earlier = None
            while True:
                calls, marked = _parse_fingerprints(bytes(await pg.store.get(key, timeout=pg.timeout)))
                calls[pg.rank] = self.sig
                if marked or len(set(calls.values())) > 1:
                    break
                if await pg.store.check([bad]):
                    head, _, rest = bytes(await pg.store.get(bad, timeout=pg.timeout)).partition(b"\n")
                    earlier = int(head)
                    if earlier < self.seq:  # we got through a call the others found mismatched
                        calls = _parse_fingerprints(rest)[0]
                        break
                await asyncio.sleep(MISMATCH_RECHECK)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store is gone: no verdict (a failure of the store host is reported elsewhere)
            return
        listing = "; ".join(f"rank {r} called {c!r}" for r, c in sorted(calls.items()))
        why = "another member found a mismatch; " if marked and len(set(calls.values())) <= 1 else ""
        if earlier is not None and earlier < self.seq:
            why = (
                f"the group is unusable: its members found a mismatch at seq {earlier} "
                f"(this rank's part of that call completed without noticing) where "
            )
        self.found = CollectiveMismatchError(
            f"collective mismatch in {pg.name} at seq {self.seq}: {why}{listing}",
            calls=calls,
            seq=self.seq,
        )
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _parse_fingerprints(raw: bytes) -> tuple[dict[int, str], bool]:
    calls: dict[int, str] = {}
    marked = False
    for line in raw.decode(errors="replace").splitlines():
        rank, sep, call = line.partition("=")
        if line == "!":
            marked = True
        elif sep and rank.isdigit():
            calls[int(rank)] = call
    return calls, marked


def _bad_key(pg: ProcessGroup) -> str:
    return f"{pg.transport.key_prefix}fp/{pg.group_id}/bad"


async def _mark_mismatch(pg: ProcessGroup, seq: int, calls: dict[int, Any]) -> None:
    try:
        await pg.store.append(_fingerprint_key(pg, seq), b"!\n")
        listing = "".join(f"{r}={c}\n" for r, c in sorted(calls.items()))
        await pg.store.compare_set(_bad_key(pg), b"", f"{seq}\n{listing}".encode())
    except Exception:
        pass


async def _tell(transport: Transport, dst: int, header: dict[str, Any]) -> None:
    """Send a mismatch report to global rank ``dst`` (connecting if needed); errors are ignored."""
    try:
        async with asyncio.timeout(HELPERS_GRACE):
            await transport.send(dst, header)
    except Exception:
        pass
