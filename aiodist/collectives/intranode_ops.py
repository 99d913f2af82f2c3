"""The collectives of the intra-node engine: all_reduce, reduce_scatter, all_gather, broadcast, reduce.

Each runs as :meth:`GroupEngine.run`'s body (see :mod:`.intranode` for the
rules: who may write which buffer when, and why the messages make it safe).
Every operation starts with a *hello* to its peers, which says where the
rank's array lies if it is in shared memory (and, like every engine message,
how far the rank has read the others' buffers). A rank whose array is not
shared knows the data will go through the staging buffers: it publishes the
first round at once if that buffer is free, and says so in its hello, which
saves a message.

* all arrays in shared memory: every rank reads its peers' arrays in place
  (all_reduce: rank r reduces block r of every array, in rank order, and
  writes the result into every array), then a *done* from every peer says
  nobody touches anyone's array any more;
* otherwise in rounds of :data:`.intranode.ROUND_BYTES`, using the staging
  buffers in turn: publish (copy what the others need into my buffer), a
  message, then read the peers' buffers (reduce my block from them, or copy
  theirs out). A buffer is published again only once every reader said (in a
  later message) that it finished reading it (:meth:`GroupEngine.publishing`
  checks it).

The steps they are made of (messages, start, rounds, arrays in place) are
:mod:`.intranode_steps`.

Results are bit-identical on every rank: each element is reduced once, by the
owner of its block, with operands in rank order, and copied to the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from ..comm.channel import OpChannel
from ..errors import CollectiveMismatchError
from .buffers import EMPTY_OUT
from .intranode import NBUF, ROUND_BYTES, GroupEngine, key
from .intranode_steps import (
    _ACK,
    _DONE,
    _HELLO,
    _PUB,
    _RED,
    Kernel,
    _Array,
    _copier,
    _direct,
    _done,
    _exchange,
    _kernel,
    _others,
    _published_rounds,
    _reduce_chunks,
    _round0,
    _rounds,
    _start,
)
from .ops import ReduceOp, finish_avg
from .schedules import partition

__all__ = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "exchange_in_place"]


# ------------------------------------------------------------------ all_reduce and reduce


async def all_reduce(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, op: ReduceOp) -> None:
    await _reduce(eng, ch, flat, None, op)


async def reduce(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, root: int, op: ReduceOp) -> None:
    """Reduce every rank's ``flat`` into the root's; the others' arrays are only read."""
    await _reduce(eng, ch, flat, root, op)


async def _reduce(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, root: int | None, op: ReduceOp) -> None:
    """all_reduce (``root`` None: every rank gets the result) or reduce (only ``root`` does).

    Rank r reduces block r of every round (the blocks of each round are the
    partition of its elements). Staging path, one message to every peer per
    round: after reducing my block of round k (into my array and/or my buffer,
    where the others fetch it) and publishing round k+1, "red k"; then I copy
    the others' blocks of round k out.
    """
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    kernel = _kernel(eng, op, flat.dtype, p)
    rounds = _rounds(flat.size, ROUND_BYTES // flat.itemsize)

    def publish(k: int) -> Callable[[int], None]:
        start, length = rounds[k]
        mine = flat[start : start + length]
        offs = partition(length, p)

        def write(round_: int) -> None:
            stage = eng.staging(me, round_, flat.dtype, 0, length)
            stage[: offs[me]] = mine[: offs[me]]
            stage[offs[me + 1] :] = mine[offs[me + 1] :]

        return write

    desc = eng.describe(flat)
    start = await _start(eng, ch, peers, peers, desc, publish(0))
    if start.in_place(desc):
        await _reduce_in_place(eng, ch, flat, start.descs, kernel, into=root)
        return
    await _round0(eng, ch, start, peers, publish(0))
    combine, avg, tmp = kernel
    for k, (begin, length) in enumerate(rounds):
        g = start.first + k
        mine = flat[begin : begin + length]
        offs = partition(length, p)
        lo, hi = offs[me], offs[me + 1]
        srcs = [mine[lo:hi] if j == me else eng.staging(j, g, flat.dtype, lo, hi - lo) for j in range(p)]
        outs = [] if root is not None and me != root else [mine[lo:hi]]
        if root is None or me != root:
            outs.append(eng.staging(me, g, flat.dtype, lo, hi - lo))  # where the others fetch my block
        _reduce_chunks(combine, srcs, outs, avg, tmp)
        if k + 1 < len(rounds):
            publish(k + 1)(eng.publishing(g + 1))
        await _exchange(eng, ch, peers, peers, key(k, _RED))
        if root is None or me == root:
            for j in peers:
                mine[offs[j] : offs[j + 1]] = eng.staging(j, g, flat.dtype, offs[j], offs[j + 1] - offs[j])
        eng.read_through(g)
    eng.end(start.first, len(rounds))


async def _reduce_in_place(
    eng: GroupEngine, ch: OpChannel, flat: np.ndarray, descs: dict[int, Any], kernel: Kernel, *, into: int | None
) -> None:
    """Every array is reachable in place: all_reduce (``into`` None) or reduce into rank ``into``'s array.

    all_reduce: rank r reduces block r of every array, chunk by chunk, into
    its own array and into every array it can write (those in shared memory);
    then, if some rank's array is not in shared memory, a message ("red") and
    every such rank copies the other blocks out of their owners' arrays. reduce:
    each rank writes its block into the root's array if that is in shared
    memory; otherwise the root reduces every block itself. Then *done*.
    """
    p, me, n, dt = ch.size, ch.rank, flat.size, flat.dtype
    peers = _others(p, me)
    arrays = [_Array(eng, j, flat if j == me else descs[j], dt, n) for j in range(p)]
    shared = [descs[j][0] == "s" if j != me else eng.describe(flat)[0] == "s" for j in range(p)]  # type: ignore[index]
    offs = partition(n, p)
    combine, avg, tmp = kernel
    scratch = [eng.scratch(dt, 1 + j) for j in range(p)]

    def reduce_block(block: int, targets: list[_Array]) -> None:
        lo, hi = offs[block], offs[block + 1]
        # Straight into our own array when it is a target and one of the first two operands (it is
        # only read before it is written then): one pass over memory fewer than through ``tmp``.
        direct = me < 2 and arrays[me] in targets
        others = [arr for arr in targets if not (direct and arr is arrays[me])]
        for a in range(lo, hi, tmp.size):
            b = min(hi, a + tmp.size)
            srcs = [arr.read(a, b, scratch[j]) for j, arr in enumerate(arrays)]
            acc = flat[a:b] if direct else tmp[: b - a]
            combine(acc, srcs[0], srcs[1])
            for src in srcs[2:]:
                combine(acc, acc, src)
            if avg:
                finish_avg(acc, avg)
            for arr in others:
                arr.write(a, acc)

    if into is not None:
        if shared[into]:
            await _direct(eng, ch, lambda: reduce_block(me, [arrays[into]]), peers, arrays)
        elif me == into:

            def every_block() -> None:
                for blk in range(p):
                    reduce_block(blk, [arrays[me]])

            await _direct(eng, ch, every_block, peers, arrays)
        else:
            await _done(eng, ch, peers)  # the root reads our array meanwhile
        return

    def pull() -> None:
        for j in peers:
            arrays[j].read_into(offs[j], flat[offs[j] : offs[j + 1]])

    await _direct(eng, ch, lambda: reduce_block(me, [arr for arr in arrays if arr.writable]), [], arrays)
    if not all(shared):
        await _exchange(eng, ch, peers, peers, key(0, _RED))
        if not shared[me]:
            await _direct(eng, ch, pull, [], arrays)
    await _done(eng, ch, peers)


# ------------------------------------------------------------------ reduce_scatter


async def reduce_scatter(
    eng: GroupEngine, ch: OpChannel, out: np.ndarray, blocks: Sequence[np.ndarray], op: ReduceOp
) -> None:
    """Reduce block r of every rank's ``blocks`` into rank r's ``out``; round k covers the same part of each block."""
    p, me, m, dt = ch.size, ch.rank, out.size, out.dtype
    peers = _others(p, me)
    combine, avg, tmp = _kernel(eng, op, dt, p)
    per_block = max(1, ROUND_BYTES // dt.itemsize // p)
    rounds = _rounds(m, per_block)

    def publish(k: int) -> Callable[[int], None]:
        begin, length = rounds[k]

        def write(round_: int) -> None:
            for j in peers:
                eng.staging(me, round_, dt, j * per_block, length)[:] = blocks[j][begin : begin + length]

        return write

    descs_mine = [eng.describe(b) for b in blocks]
    desc = descs_mine if all(d is not None for d in descs_mine) else None
    start = await _start(eng, ch, peers, peers, desc, publish(0))
    if start.in_place(desc):
        arrays = [_Array(eng, j, blocks[me] if j == me else start.descs[j][me], dt, m) for j in range(p)]
        scratch = [eng.scratch(dt, 1 + j) for j in range(p)]

        def body() -> None:
            for a in range(0, m, tmp.size):
                b = min(m, a + tmp.size)
                _reduce_chunks(combine, [arr.read(a, b, scratch[j]) for j, arr in enumerate(arrays)], [out[a:b]], avg, tmp)

        await _direct(eng, ch, body, peers, arrays)
        return

    def consume(k: int, g: int) -> None:
        begin, length = rounds[k]
        srcs = [
            blocks[me][begin : begin + length] if j == me else eng.staging(j, g, dt, me * per_block, length)
            for j in range(p)
        ]
        _reduce_chunks(combine, srcs, [out[begin : begin + length]], avg, tmp)

    await _published_rounds(eng, ch, start, peers, len(rounds), publish, consume)


# ------------------------------------------------------------------ all_gather


async def all_gather(eng: GroupEngine, ch: OpChannel, outs: Sequence[np.ndarray], flat: np.ndarray) -> None:
    """Fill ``outs[j]`` with rank j's ``flat`` (``outs[rank]`` is already filled), as bytes."""
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    data = flat.view(np.uint8)
    targets = [o.view(np.uint8) for o in outs]
    n = data.size
    rounds = _rounds(n, ROUND_BYTES)

    publish = _copier(eng, me, data, rounds)

    desc = eng.describe(flat)
    start = await _start(eng, ch, peers, peers, desc, publish(0))
    if start.in_place(desc):
        sources = {j: _Array(eng, j, start.descs[j], data.dtype, n) for j in peers}

        def body() -> None:
            for j in peers:
                sources[j].read_into(0, targets[j])

        await _direct(eng, ch, body, peers, list(sources.values()))
        return

    def consume(k: int, g: int) -> None:
        begin, length = rounds[k]
        for j in peers:
            targets[j][begin : begin + length] = eng.staging(j, g, np.uint8, 0, length)

    await _published_rounds(eng, ch, start, peers, len(rounds), publish, consume)


# ------------------------------------------------------------------ broadcast


async def broadcast(eng: GroupEngine, ch: OpChannel, flat: np.ndarray, root: int) -> None:
    """The root says hello first: where its array is (the others copy it out directly, then say
    *done*), or that it publishes it in rounds. Then the others say hello (how far they read), and
    the root publishes round after round; the others copy each out and acknowledge it when needed:
    round k goes into a buffer last used NBUF rounds before, so the root waits for the
    acknowledgement of round k - NBUF, and the others send only those.
    """
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    data = flat.view(np.uint8)
    n = data.size
    rounds = _rounds(n, ROUND_BYTES)
    publish = _copier(eng, me, data, rounds)
    first = eng.begin()
    if me == root:
        desc = eng.describe(flat)
        early = desc is None and eng.clean(first)
        if early:
            publish(0)(eng.publishing(first))
        await eng.tell(ch, peers, key(0, _HELLO), [desc, early])
        if desc is not None:
            await eng.hear(ch, peers, key(0, _DONE))  # they copy straight out of our array
            return
        await eng.hear(ch, peers, key(0, _HELLO))
        if not early:
            publish(0)(eng.publishing(first))
            await eng.tell(ch, peers, key(0, _PUB))
        for k in range(1, len(rounds)):
            if k >= NBUF:  # (before that, the hellos said the buffer is free)
                await eng.hear(ch, peers, key(k - NBUF, _ACK))
            publish(k)(eng.publishing(first + k))
            await eng.tell(ch, peers, key(k, _PUB))
        eng.end(first, len(rounds))
        return
    desc, early = (await eng.hear(ch, [root], key(0, _HELLO)))[root]
    if desc is not None:
        source = _Array(eng, root, desc, data.dtype, n)
        await _direct(eng, ch, lambda: source.read_into(0, data), [], [source])
        await eng.tell(ch, [root], key(0, _DONE))
        return
    await eng.tell(ch, [root], key(0, _HELLO))
    for k, (begin, length) in enumerate(rounds):
        if k > 0 or early is not True:
            await eng.hear(ch, [root], key(k, _PUB))
        data[begin : begin + length] = eng.staging(root, first + k, np.uint8, 0, length)
        eng.read_through(first + k)
        if k + NBUF < len(rounds):  # the root waits for this before it writes that buffer again
            await eng.tell(ch, [root], key(k, _ACK))
    eng.end(first, len(rounds))


# ------------------------------------------------------------------ all_to_all


async def exchange_in_place(
    eng: GroupEngine, ch: OpChannel, key_: tuple[Any, ...], outs: list[np.ndarray], ins: list[np.ndarray], minimum: int
) -> None:
    """all_to_all's large blocks: each receiver reads its block straight out of the sender's array.

    A pair whose block has at least ``minimum`` bytes (both ends know its size)
    sends, under ``key_``, where the block is instead of the block itself; the
    receiver copies it in place and answers *done* (``key_ + (1,)``), which the
    sender waits for before it returns (its array must stay as it is till then).
    A disagreement on the size shows as a message of the wrong size, as for a
    block sent whole. The smaller blocks are left to the caller.

    This is not an engine operation (:meth:`GroupEngine.run`): failing here
    leaves the engine as it was, but fences the receivers off this rank's
    blocks first (:meth:`GroupEngine.abandon`), cancellation included.
    """
    p, me = ch.size, ch.rank
    peers = _others(p, me)
    send_in_place = [j for j in peers if ins[j].nbytes >= minimum]
    recv_in_place = [j for j in peers if outs[j].nbytes >= minimum]
    try:
        for j in send_in_place:
            await ch.send(j, key_, msgpack.packb([eng.describe(ins[j]), ins[j].nbytes]))
        for j in recv_in_place:
            raw = await ch.recv_bytes(j, key_)
            desc = _unpack_block(raw, outs[j].nbytes, ch, j)
            block = _Array(eng, j, desc, np.dtype(np.uint8), outs[j].nbytes)
            await _direct(eng, ch, lambda: block.read_into(0, outs[j].view(np.uint8)), [], [block])
            await ch.send(j, key_ + (1,), b"")
        for j in send_in_place:
            await ch.recv_into(j, key_ + (1,), EMPTY_OUT)
    except BaseException:
        if send_in_place:
            eng.abandon()
        raise


def _unpack_block(raw: memoryview, expected: int, ch: OpChannel, src: int) -> Any:
    """The description of the block ``src`` sends in place; CollectiveMismatchError if it sent another size."""
    try:
        desc, nbytes = msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException):
        desc, nbytes = None, raw.nbytes  # it sent its block whole: it expects another size than we do
    if nbytes != expected or desc is None:
        raise CollectiveMismatchError(
            f"all_to_all: rank {src} sends this rank {nbytes} bytes but this rank expects {expected}",
            calls={src: f"sends {nbytes} bytes", ch.rank: f"expects {expected} bytes"},
            seq=ch.seq,
        )
    return desc
