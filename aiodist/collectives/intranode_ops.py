"""The collectives of the intra-node engine: all_reduce, reduce_scatter, all_gather, broadcast, reduce.

Each runs as :meth:`GroupEngine.run`'s body (see :mod:`.intranode` for the
rules: who may write which buffer when, and why the messages make it safe).
Every operation starts with a *hello* from its peers (sent once they are done
with every earlier operation of the group, so every buffer is free again),
which also says where each rank's array lies if it is in shared memory:

* all arrays in shared memory: every rank reads its peers' arrays in place
  (all_reduce: rank r reduces block r of every array, in rank order, and
  writes the result into every array), then a *done* from every peer says
  nobody touches anyone's array any more;
* otherwise in rounds of :data:`.intranode.ROUND_BYTES`, using the staging
  buffers in turn: publish (copy what the others need into my buffer), a
  message, then read the peers' buffers (reduce my block from them, or copy
  theirs out). A buffer is published again only after every reader's later
  message said it finished reading it.

Results are bit-identical on every rank: each element is reduced once, by the
owner of its block, with operands in rank order, and copied to the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from ..comm.channel import OpChannel
from .intranode import CHUNK_BYTES, NBUF, ROUND_BYTES, GroupEngine, key, signal, wait
from .ops import Combiner, ReduceOp, combiner, finish_avg
from .schedules import partition

__all__ = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"]

_HELLO, _PUB, _RED, _ACK, _DONE = 0, 1, 2, 3, 4


def _others(p: int, me: int) -> list[int]:
    return [j for j in range(p) if j != me]


async def _hello(
    eng: GroupEngine, ch: OpChannel, peers: Sequence[int], to: Sequence[int], desc: Any
) -> dict[int, Any]:
    """Send ``desc`` to ``to``; return the descriptions ``peers`` sent (their hello)."""
    payload = msgpack.packb(desc)
    await signal(ch, to, key(0, _HELLO), payload)
    descs = {}
    for j in peers:
        descs[j] = msgpack.unpackb(await ch.recv_bytes(j, key(0, _HELLO)))
        eng.heard_from(j)
    return descs


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


def _kernel(op: ReduceOp, dtype: np.dtype[Any], p: int) -> tuple[Combiner, int, np.ndarray]:
    """(combine, divisor for AVG or 0, the chunk scratch) for reducing ``dtype`` with ``op``."""
    combine = combiner(ReduceOp.SUM if op is ReduceOp.AVG else op, dtype)
    tmp = np.empty(max(1, CHUNK_BYTES // dtype.itemsize), dtype=dtype)
    return combine, (p if op is ReduceOp.AVG else 0), tmp


def _rounds(flat: np.ndarray, p: int) -> Iterator[tuple[int, np.ndarray, tuple[int, ...]]]:
    """(round, the round's part of ``flat``, its p block offsets): one staging buffer per round."""
    per_round = ROUND_BYTES // flat.itemsize
    for k, start in enumerate(range(0, flat.size, per_round)):
        mine = flat[start : start + per_round]
        yield k, mine, partition(mine.size, p)


def _publish(eng: GroupEngine, me: int, k: int, mine: np.ndarray, offs: tuple[int, ...]) -> None:
    """Round ``k``: copy the blocks of ``mine`` that the others reduce into my staging buffer."""
    lo, hi = offs[me], offs[me + 1]
    stage = eng.staging(me, k % NBUF, mine.dtype, 0, mine.size)
    stage[:lo] = mine[:lo]
    stage[hi:] = mine[hi:]


async def _reduce_rounds(
    eng: GroupEngine, ch: OpChannel, flat: np.ndarray, kernel: tuple[Combiner, int, np.ndarray], *, root: int | None
) -> None:
    """The staging path of all_reduce (``root`` None: every rank gets the result) and reduce (only ``root``).

    One message to every peer per round: after reducing my block of round k
    (into my array and/or my buffer) and publishing round k+1, "red k, pub
    k+1"; then I copy the others' blocks of round k out. Three buffers: the
    one published for k+1 was last read in round k-2, whose copies every
    peer finished before its "red k-1, pub k".
    """
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    combine, avg, tmp = kernel
    rounds = list(_rounds(flat, p))
    _publish(eng, me, *rounds[0])
    await signal(ch, peers, key(0, _PUB))
    await wait(ch, peers, key(0, _PUB))
    for k, mine, offs in rounds:
        buf, dt = k % NBUF, mine.dtype
        lo, hi = offs[me], offs[me + 1]
        srcs = [mine[lo:hi] if j == me else eng.staging(j, buf, dt, lo, hi - lo) for j in range(p)]
        outs = [] if root is not None and me != root else [mine[lo:hi]]
        if root is None or me != root:
            outs.append(eng.staging(me, buf, dt, lo, hi - lo))  # where the others fetch my block
        _reduce_chunks(combine, srcs, outs, avg, tmp)
        if k + 1 < len(rounds):
            _publish(eng, me, *rounds[k + 1])
        await signal(ch, peers, key(k, _RED))
        await wait(ch, peers, key(k, _RED))
        if root is None or me == root:
            for j in peers:
                mine[offs[j] : offs[j + 1]] = eng.staging(j, buf, dt, offs[j], offs[j + 1] - offs[j])


async def _reduce_shared(
    eng: GroupEngine,
    ch: OpChannel,
    flat: np.ndarray,
    descs: dict[int, Any],
    kernel: tuple[Combiner, int, np.ndarray],
    *,
    into: int | None,
) -> None:
    """Every rank's array is in shared memory: reduce my block of all of them in place, then *done*.

    The result goes into every array (``into`` None: all_reduce) or into rank ``into``'s (reduce).
    """
    p, me, n = ch.size, ch.rank, flat.size
    arrays = [flat if j == me else eng.peer_array(descs[j], flat.dtype, n) for j in range(p)]
    offs = partition(n, p)
    lo, hi = offs[me], offs[me + 1]
    mine = [a[lo:hi] for a in arrays]
    combine, avg, tmp = kernel
    _reduce_chunks(combine, mine, mine if into is None else [mine[into]], avg, tmp)
    await _done(ch, _others(p, me))


async def _done(ch: OpChannel, peers: Sequence[int]) -> None:
    """Tell ``peers`` this rank no longer touches their arrays, and wait until they say the same."""
    await signal(ch, peers, key(0, _DONE))
    await wait(ch, peers, key(0, _DONE))


# ------------------------------------------------------------------ all_reduce


async def all_reduce(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, op: ReduceOp) -> None:
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    combine, avg, tmp = _kernel(op, flat.dtype, p)
    desc = eng.shared_desc(flat)
    descs = await _hello(eng, ch, peers, peers, desc)
    if desc is not None and all(d is not None for d in descs.values()):
        await _reduce_shared(eng, ch, flat, descs, (combine, avg, tmp), into=None)
        return
    await _reduce_rounds(eng, ch, flat, (combine, avg, tmp), root=None)


# ------------------------------------------------------------------ reduce_scatter


async def reduce_scatter(
    eng: GroupEngine, ch: OpChannel, out: np.ndarray, blocks: Sequence[np.ndarray], op: ReduceOp
) -> None:
    p, me, m, dt = ch.size, ch.rank, out.size, out.dtype
    peers = _others(p, me)
    combine, avg, tmp = _kernel(op, dt, p)
    descs_mine = [eng.shared_desc(b) for b in blocks]
    desc = descs_mine if all(d is not None for d in descs_mine) else None
    descs = await _hello(eng, ch, peers, peers, desc)
    if desc is not None and all(d is not None for d in descs.values()):
        srcs = [blocks[me] if j == me else eng.peer_array(descs[j][me], dt, m) for j in range(p)]
        _reduce_chunks(combine, srcs, [out], avg, tmp)
        await _done(ch, peers)
        return
    per_block = max(1, ROUND_BYTES // dt.itemsize // p)
    for k, start in enumerate(range(0, m, per_block)):
        length = min(per_block, m - start)
        buf = k % NBUF
        for j in peers:
            eng.staging(me, buf, dt, j * per_block, length)[:] = blocks[j][start : start + length]
        await signal(ch, peers, key(k, _PUB))
        await wait(ch, peers, key(k, _PUB))
        srcs = [
            blocks[me][start : start + length] if j == me else eng.staging(j, buf, dt, me * per_block, length)
            for j in range(p)
        ]
        _reduce_chunks(combine, srcs, [out[start : start + length]], avg, tmp)


# ------------------------------------------------------------------ all_gather


async def all_gather(eng: GroupEngine, ch: OpChannel, outs: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """Fill ``outs[j]`` with rank j's ``flat`` (``outs[rank]`` is already filled), as bytes."""
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    data = flat.view(np.uint8)
    targets = [o.view(np.uint8) for o in outs]
    n = data.size
    desc = eng.shared_desc(flat)
    descs = await _hello(eng, ch, peers, peers, desc)
    if desc is not None and all(d is not None for d in descs.values()):
        for j in peers:
            targets[j][:] = eng.peer_array(descs[j], np.uint8, n)
        await _done(ch, peers)
        return
    for k, start in enumerate(range(0, n, ROUND_BYTES)):
        length = min(ROUND_BYTES, n - start)
        buf = k % NBUF
        eng.staging(me, buf, np.uint8, 0, length)[:] = data[start : start + length]
        await signal(ch, peers, key(k, _PUB))
        await wait(ch, peers, key(k, _PUB))
        for j in peers:
            targets[j][start : start + length] = eng.staging(j, buf, np.uint8, 0, length)


# ------------------------------------------------------------------ broadcast


async def broadcast(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, root: int) -> None:
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    data = flat.view(np.uint8)
    n = data.size
    if me == root:
        desc = eng.shared_desc(flat)
        await _hello(eng, ch, peers, peers, desc)
        if desc is not None:
            await wait(ch, peers, key(0, _DONE))  # they copy straight out of our array
            return
        rounds = range(0, n, ROUND_BYTES)
        for k, start in enumerate(rounds):
            if k >= NBUF:
                await wait(ch, peers, key(k - NBUF, _ACK))  # everyone finished reading this buffer
            length = min(ROUND_BYTES, n - start)
            eng.staging(me, k % NBUF, np.uint8, 0, length)[:] = data[start : start + length]
            await signal(ch, peers, key(k, _PUB))
        return
    desc = (await _hello(eng, ch, [root], [root], None))[root]
    if desc is not None:
        data[:] = eng.peer_array(desc, np.uint8, n)
        await signal(ch, [root], key(0, _DONE))
        return
    last = -(-n // ROUND_BYTES) - 1
    for k, start in enumerate(range(0, n, ROUND_BYTES)):
        length = min(ROUND_BYTES, n - start)
        await wait(ch, [root], key(k, _PUB))
        data[start : start + length] = eng.staging(root, k % NBUF, np.uint8, 0, length)
        if k <= last - NBUF:  # the root waits for this one before it publishes into the buffer again
            await signal(ch, [root], key(k, _ACK))


# ------------------------------------------------------------------ reduce


async def reduce(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, root: int, op: ReduceOp) -> None:
    """Reduce every rank's ``flat`` into the root's; the others' arrays are only read."""
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    combine, avg, tmp = _kernel(op, flat.dtype, p)
    desc = eng.shared_desc(flat)
    descs = await _hello(eng, ch, peers, peers, desc)
    if desc is not None and all(d is not None for d in descs.values()):
        await _reduce_shared(eng, ch, flat, descs, (combine, avg, tmp), into=root)
        return
    await _reduce_rounds(eng, ch, flat, (combine, avg, tmp), root=root)
