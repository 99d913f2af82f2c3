"""The steps the intra-node collectives are made of (see :mod:`.intranode_ops`).

The messages of an operation (hello, publish, reduced, acknowledge, done),
its start (the hellos, with round 0 published early when it can be), the
staging path's rounds (publish, a message, then read the peers' buffers),
and reading or writing a peer's array in place (:class:`_Array`: shared
memory, or the peer process's memory through the kernel), where a peer that
vanished under a copy becomes the transport's failure of it, and one that
gave up on the operation meanwhile a PeerAbandonedError (:mod:`.intranode_fence`).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..comm.channel import OpChannel
from ..errors import GroupError, PeerAbandonedError, PeerFailureError
from ..net import shmpeer
from .intranode import CHUNK_BYTES, GroupEngine, key
from .intranode_fence import Abandoned, Fence
from .ops import Combiner, ReduceOp, combiner, finish_avg

_HELLO, _PUB, _RED, _ACK, _DONE, _NEVER = 0, 1, 2, 3, 4, 5

Kernel = tuple[Combiner, int, np.ndarray]

_PIECE_BYTES = 16 * CHUNK_BYTES
"""A peer's array is copied out in pieces of this many bytes, its epoch checked between them."""


def _others(p: int, me: int) -> list[int]:
    return [j for j in range(p) if j != me]


def _reduce_chunks(
    combine: Combiner, srcs: Sequence[np.ndarray], outs: Sequence[np.ndarray], avg: int, tmp: np.ndarray
) -> None:
    """outs[...] = srcs[0] op srcs[1] op ... (rank order), chunk by chunk through ``tmp`` (in cache)."""
    n = srcs[0].size
    step = tmp.size
    rest = srcs[2:]
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        acc = tmp[: hi - lo]
        combine(acc, srcs[0][lo:hi], srcs[1][lo:hi])
        for s in rest:
            combine(acc, acc, s[lo:hi])
        if avg:
            finish_avg(acc, avg)
        for o in outs:
            o[lo:hi] = acc


def _kernel(eng: GroupEngine, op: ReduceOp, dtype: np.dtype[Any], p: int) -> Kernel:
    """(combine, divisor for AVG or 0, the chunk scratch) for reducing ``dtype`` with ``op``."""
    combine = combiner(ReduceOp.SUM if op is ReduceOp.AVG else op, dtype)
    return combine, (p if op is ReduceOp.AVG else 0), eng.scratch(dtype, 0)


class _PeerGone(Exception):
    """Copying from or to group rank ``rank``'s memory failed because its process is gone."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.rank = rank


class _Array:
    """A member's array reached in place: a view of it (our own, or mapped shared memory), or its
    process's memory through the kernel (:mod:`aiodist.net.shmpeer`), by element.

    Only views are written: another process's own memory is only ever *read*.
    A peer's array has its :class:`Fence` (None: our own): the caller holds it
    around the copies (:func:`_direct`); :meth:`write` checks it before each
    chunk and :meth:`read_into` between pieces, so that a rank that gave up on
    the operation gets its array back soon (see :mod:`.intranode_fence`).
    """

    __slots__ = ("rank", "view", "pid", "addr", "itemsize", "fence")

    def __init__(self, eng: GroupEngine, rank: int, desc: Any, dtype: np.dtype[Any], count: int) -> None:
        self.rank = rank
        self.itemsize = dtype.itemsize
        self.view: np.ndarray | None = None
        self.pid = self.addr = 0
        self.fence: Fence | None = None
        if isinstance(desc, np.ndarray):
            self.view = desc
            return
        if not (isinstance(desc, list) and len(desc) == 4 and type(desc[3]) is int):
            raise GroupError(f"{eng.name}: rank {rank} described its array as {desc!r}")
        if desc[0] == "s":
            self.view = eng.peer_array(desc[1], desc[2], dtype, count)
        elif desc[0] == "p" and desc[1] == eng.pid_of(rank) and type(desc[2]) is int:
            self.pid, self.addr = desc[1], desc[2]  # (only ever the member's own process)
        else:
            raise GroupError(f"{eng.name}: rank {rank} described its array as {desc!r}")
        self.fence = eng.fence(rank, desc[3])

    def read(self, lo: int, hi: int, scratch: np.ndarray) -> np.ndarray:
        """Elements ``lo:hi``: a view, or a copy in ``scratch``."""
        if self.view is not None:
            return self.view[lo:hi]
        out = scratch[: hi - lo]
        self._copy(shmpeer.read, lo, out)
        return out

    def read_into(self, lo: int, out: np.ndarray) -> None:
        """Copy elements ``lo : lo + out.size`` into ``out`` (a peer's: in pieces, its epoch checked between)."""
        if self.fence is None:
            assert self.view is not None
            out[:] = self.view[lo : lo + out.size]
            return
        step = max(1, _PIECE_BYTES // self.itemsize)
        for a in range(0, out.size, step):
            if a:
                self.fence.check()
            piece = out[a : a + step]
            if self.view is not None:
                piece[:] = self.view[lo + a : lo + a + piece.size]
            else:
                self._copy(shmpeer.read, lo + a, piece)

    @property
    def writable(self) -> bool:
        return self.view is not None

    def write(self, lo: int, src: np.ndarray) -> None:
        assert self.view is not None  # (see the class doc)
        if self.fence is not None:
            self.fence.check()  # (the owner may have given up: then not one more chunk)
        self.view[lo : lo + src.size] = src

    def _copy(self, fn: Callable[[int, int, np.ndarray], None], lo: int, buf: np.ndarray) -> None:
        try:
            fn(self.pid, self.addr + lo * self.itemsize, buf)  # (reads only: see the class doc)
        except shmpeer.PeerMemoryError as e:
            if e.errno == errno.ESRCH:
                raise _PeerGone(self.rank) from None
            raise GroupError(f"cannot reach the array of rank {self.rank} in place: {e}") from None


async def _direct(
    eng: GroupEngine, ch: OpChannel, body: Callable[[], None], peers: Sequence[int], arrays: Sequence[_Array]
) -> None:
    """Run ``body`` (copies from and to ``arrays``, the members' arrays in place), then *done* with ``peers``.

    The peers' arrays are fenced (:mod:`.intranode_fence`) around ``body``:
    their owners' locks held, and their epochs checked before and after. A
    member that gave up on the operation meanwhile is the operation's failure
    (PeerAbandonedError: what was read of its array cannot be trusted); so is
    a member whose process vanished under a copy: its PeerFailureError comes
    from the transport, which notices the same. No lock is held past the
    synchronous part, so a cancellation leaves none behind.
    """
    fences = [arr.fence for arr in arrays if arr.fence is not None]
    try:
        held: dict[int, Fence] = {}  # per owner: the fence whose lock we hold
        try:
            for fence in fences:
                if fence.rank in held:
                    fence.check()
                else:
                    fence.enter()
                    held[fence.rank] = fence
            body()
            for fence in fences:
                fence.check()
        finally:
            for fence in held.values():
                fence.leave()
    except _PeerGone as gone:
        await ch.recv_bytes(gone.rank, key(0, _NEVER))  # raises once the transport declares it failed
        raise AssertionError("unreachable: nobody sends this message") from None
    except Abandoned as left:
        raise await _why_abandoned(eng, ch, left.rank) from None
    await _done(eng, ch, peers)


ABANDON_GRACE = 0.5
"""Seconds a rank that found a member gone from a call listens for the failure that most likely made it go
(another member's death, which the one that gave up heard of first), before blaming that member."""


async def _why_abandoned(eng: GroupEngine, ch: OpChannel, rank: int) -> BaseException:
    """What this rank's part fails with when group rank ``rank`` gave up on it: the failure of a member this rank
    hears of within :data:`ABANDON_GRACE` (the root cause), else the abandonment (PeerAbandonedError)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ABANDON_GRACE
    while True:  # (bounded: the deadline)
        known = _known_failure(ch)
        if known is not None:
            return known
        if loop.time() >= deadline:
            return _abandoned(eng, ch, rank)
        await asyncio.sleep(0.01)


def _known_failure(ch: OpChannel) -> PeerFailureError | None:
    """The failure of a member this rank knows of already: most likely why the one that gave up did (its
    death is the root cause to report, not the abandonment it caused)."""
    comm = ch.comm
    for g in comm.transport.failed_peers():
        if g in comm.members and g != comm.transport.rank:
            return comm.localize(comm.transport.peer_error(g), op=ch.op, seq=ch.seq)
    return None


def _abandoned(eng: GroupEngine, ch: OpChannel, rank: int) -> PeerAbandonedError:
    """The error of this rank's part of ``ch``'s operation: group rank ``rank`` gave up on it first."""
    g = ch.comm.ranks[rank]
    return PeerAbandonedError(
        f"{ch.op} (seq {ch.seq}) of {eng.name}: rank {rank} (global {g}) ended its call of it (it gave up: a "
        f"timeout, a cancellation or an error there) while this rank was copying from or into its array in "
        f"place; this rank's result is not valid",
        rank=rank,
        global_rank=g,
        op=ch.op,
        seq=ch.seq,
    )


class _Start:
    """What an operation's hellos said: each peer's shared-array description, and who published round 0."""

    __slots__ = ("first", "descs", "early", "published")

    def __init__(self, first: int, descs: dict[int, Any], early: dict[int, bool], published: bool) -> None:
        self.first = first  # the operation's first round
        self.descs = descs
        self.early = early  # per peer: it published round 0 before its hello
        self.published = published  # so did this rank

    def in_place(self, desc: Any) -> bool:
        """Every member's array can be reached in place (shared memory or directly)."""
        return desc is not None and all(d is not None for d in self.descs.values())


async def _start(
    eng: GroupEngine,
    ch: OpChannel,
    to: Sequence[int],
    frm: Sequence[int],
    desc: Any,
    publish0: Callable[[int], None] | None,
) -> _Start:
    """Say hello to ``to`` (publishing round 0 first when we can: see the module doc), hear ``frm``'s."""
    first = eng.begin()
    early = publish0 is not None and desc is None and eng.clean(first)
    if early:
        publish0(eng.publishing(first))  # type: ignore[misc]
    heard = await _exchange(eng, ch, to, frm, key(0, _HELLO), [desc, early])
    return _Start(first, {j: v[0] for j, v in heard.items()}, {j: v[1] is True for j, v in heard.items()}, early)


async def _round0(eng: GroupEngine, ch: OpChannel, start: _Start, peers: Sequence[int], publish0: Callable[[int], None]) -> None:
    """The staging path's round 0: publish it if the hello did not, and hear from those whose hello did not."""
    if not start.published:
        publish0(eng.publishing(start.first))
        await eng.tell(ch, peers, key(0, _PUB))
    await eng.hear(ch, [j for j in peers if not start.early[j]], key(0, _PUB))


async def _exchange(
    eng: GroupEngine, ch: OpChannel, to: Sequence[int], frm: Sequence[int], k: tuple[Any, ...], extra: Any = None
) -> dict[int, Any]:
    await eng.tell(ch, to, k, extra)
    return await eng.hear(ch, frm, k)


async def _done(eng: GroupEngine, ch: OpChannel, peers: Sequence[int]) -> None:
    """Arrays in place: tell ``peers`` this rank no longer touches theirs, and hear the same from them."""
    await _exchange(eng, ch, peers, peers, key(0, _DONE))


async def _published_rounds(
    eng: GroupEngine,
    ch: OpChannel,
    start: _Start,
    peers: Sequence[int],
    count: int,
    publish: Callable[[int], Callable[[int], None]],
    consume: Callable[[int, int], None],
) -> None:
    """The staging path of reduce_scatter and all_gather: each round k is published, a message, then
    ``consume(k, round)`` reads the peers' buffers."""
    await _round0(eng, ch, start, peers, publish(0))
    for k in range(count):
        g = start.first + k
        if k > 0:
            publish(k)(eng.publishing(g))
            await _exchange(eng, ch, peers, peers, key(k, _PUB))
        consume(k, g)
        eng.read_through(g)
    eng.end(start.first, count)


def _rounds(n: int, per_round: int) -> list[tuple[int, int]]:
    """(start, length) of each round for ``n`` elements, ``per_round`` at a time (one round for none)."""
    return [(start, min(per_round, n - start)) for start in range(0, n, per_round)] or [(0, 0)]


def _copier(eng: GroupEngine, me: int, data: np.ndarray, rounds: list[tuple[int, int]]) -> Callable[[int], Callable[[int], None]]:
    """publish(k)(round_): copy round k's part of ``data`` (bytes) to the start of my buffer of ``round_``."""

    def publish(k: int) -> Callable[[int], None]:
        begin, length = rounds[k]

        def write(round_: int) -> None:
            eng.staging(me, round_, np.uint8, 0, length)[:] = data[begin : begin + length]

        return write

    return publish
