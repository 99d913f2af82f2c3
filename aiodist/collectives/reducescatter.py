"""reduce_scatter and reduce_scatter_tensor, and the ring reduce-scatter they share with reduce.

The ring here never writes the caller's input blocks: partial sums travel
through two scratch buffers (one being sent while the next is received), and
the last step writes the finished block straight into the output.

reduce_scatter's blocks may differ in size (as torch's gloo allows: block
``i`` has the same size on every rank, and is rank ``i``'s output). Uneven
blocks never take the intra-node engine (its rounds assume equal blocks);
by the total size, which every rank agrees on, small ones take the
all_reduce of their concatenation and large ones the ring over the blocks
themselves or, when they are lopsided enough
(:func:`~aiodist.collectives.tuning.choose_uneven_reduce_scatter`),
:func:`rebalanced_reduce_scatter`: the ring over p equal parts of their
concatenation, then each part's owner sends every rank the piece of its
block it holds. (The ring over uneven blocks moves the largest block at each
of its p-1 steps: with one block of n and the others empty that is (p-1) n
per rank where rebalancing moves about 2 n.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import intranode, intranode_ops, tuning
from .allreduce import all_reduce_flat
from .buffers import as_flat, as_flat_list, byte_view, check_dtype, check_own_chunk, unaliased
from .ops import Combiner, ReduceOp, avg_accumulator, check_op_dtype, combiner, finish_avg
from .schedules import partition, ring
from .transfer import recv_into, run_all, send, sendrecv
from ..channel import Channel
from ..errors import InvalidArrayError

__all__ = ["rebalanced_reduce_scatter", "reduce_scatter", "reduce_scatter_tensor", "ring_reduce_scatter"]


async def ring_reduce_scatter(
    ch: Channel, key_prefix: tuple[Any, ...], blocks: Sequence[np.ndarray], out: np.ndarray, combine: Combiner
) -> None:
    """Reduce block ``i`` of every rank's ``blocks`` into rank ``i``'s ``out``, around the ring.

    ``blocks[i]`` are this rank's 1-D inputs (sizes agreed by all ranks);
    ``out`` (size of ``blocks[rank]``, may alias it) receives the result.
    Inputs are only read. p-1 steps, keys ``key_prefix + (step,)``.
    Cancellation leaves ``out`` unspecified.
    """
    p, rank = ch.size, ch.rank
    if p == 1:
        np.copyto(out, blocks[0])
        return
    plan = ring(p, rank)
    size = max(b.size for b in blocks)
    bufs = (np.empty(size, dtype=out.dtype), np.empty(size, dtype=out.dtype))
    sending = blocks[plan.reduce_scatter[0][0]]
    last = p - 2
    for s, (_, rb) in enumerate(plan.reduce_scatter):
        mine = blocks[rb]
        tmp = bufs[s % 2][: mine.size]
        key = key_prefix + (s,)
        await sendrecv(ch, plan.right, key, byte_view(sending), plan.left, key, byte_view(tmp))
        target = out if s == last else tmp
        combine(target, tmp, mine)
        sending = tmp


async def rebalanced_reduce_scatter(
    ch: Channel,
    ring_prefix: tuple[Any, ...],
    move_key: tuple[Any, ...],
    blocks: Sequence[np.ndarray],
    out: np.ndarray,
    combine: Combiner,
) -> None:
    """What :func:`ring_reduce_scatter` computes, for blocks of any sizes, at the cost of equal ones.

    The ring reduces p equal parts of the blocks' concatenation (part ``i``
    to rank ``i``); then the owner of each part sends rank ``j`` the piece
    of it that lies in block ``j`` (pairs with nothing in common exchange
    nothing: both ends know it from the sizes). Inputs are only read;
    ``out`` (size of ``blocks[rank]``) may alias ``blocks[rank]``. Keys
    ``ring_prefix + (step,)`` (those of :func:`ring_reduce_scatter`: ranks
    that disagree on the sizes, one of them taking that ring, still match
    frames, and their signatures differ at once) and ``move_key``.
    Cancellation leaves ``out`` unspecified.
    """
    p, rank = ch.size, ch.rank
    starts = [0] * (p + 1)  # block i is [starts[i], starts[i + 1]) of the concatenation
    for i, b in enumerate(blocks):
        starts[i + 1] = starts[i] + b.size
    whole = np.empty(starts[p], dtype=out.dtype)
    for i, b in enumerate(blocks):
        whole[starts[i] : starts[i + 1]] = b
    parts = partition(starts[p], p)  # part i is [parts[i], parts[i + 1]), reduced by rank i
    held = np.empty(parts[rank + 1] - parts[rank], dtype=out.dtype)
    await ring_reduce_scatter(ch, ring_prefix, [whole[parts[i] : parts[i + 1]] for i in range(p)], held, combine)
    moves = []
    for j in range(p):
        lo, hi = max(parts[rank], starts[j]), min(parts[rank + 1], starts[j + 1])  # held piece of block j
        if lo < hi:
            piece = held[lo - parts[rank] : hi - parts[rank]]
            if j == rank:
                out[lo - starts[rank] : hi - starts[rank]] = piece
            else:
                moves.append(send(ch, j, move_key, byte_view(piece)))
        lo, hi = max(parts[j], starts[rank]), min(parts[j + 1], starts[rank + 1])  # rank j's piece of our block
        if j != rank and lo < hi:
            moves.append(recv_into(ch, j, move_key, byte_view(out[lo - starts[rank] : hi - starts[rank]])))
    await run_all(moves)


async def reduce_scatter(ch: Channel, seq: int, out: Any, in_list: Sequence[Any], op: Any = ReduceOp.SUM, *,
                         algorithm: str | None = None) -> Any:
    """Reduce ``in_list[i]`` over all ranks into rank ``i``'s ``out``; return ``out``.

    ``in_list`` has one array per rank, of ``out``'s dtype; ``in_list[i]``
    has the same size on every rank (they may differ between ``i``s), and
    ``out`` that of ``in_list[rank]``. It is not modified. Cancellation leaves
    ``out`` unspecified.
    """
    out_flat = as_flat(out, "out", writable=True)
    rop = check_op_dtype(op, out_flat.dtype)
    blocks = as_flat_list(in_list, "in_list", count=ch.size, dtype=out_flat.dtype, size=None, writable=False)
    check_own_chunk(out_flat, [b.size for b in blocks], ch.rank)
    blocks = unaliased(blocks, [out_flat], in_place=(ch.rank, out_flat))
    await _reduce_scatter_blocks(ch, seq, out_flat, blocks, rop, algorithm)
    return out


async def reduce_scatter_tensor(ch: Channel, seq: int, out: Any, arr: Any, op: Any = ReduceOp.SUM, *,
                                algorithm: str | None = None) -> Any:
    """Reduce ``arr`` over all ranks and leave block ``rank`` (``arr`` cut in p equal parts) in ``out``.

    ``arr`` has ``p * out.size`` elements of ``out``'s dtype and is not
    modified. Returns ``out``. Cancellation leaves ``out`` unspecified.
    """
    out_flat = as_flat(out, "out", writable=True)
    rop = check_op_dtype(op, out_flat.dtype)
    flat = as_flat(arr, "arr", writable=False)
    check_dtype(flat, out_flat.dtype, "arr")
    m = out_flat.size
    if flat.size != m * ch.size:
        raise InvalidArrayError(
            f"arr has {flat.size} elements, expected world size {ch.size} x out's {m}", argument="arr", reason="size"
        )
    blocks = [flat[i * m : (i + 1) * m] for i in range(ch.size)]
    if np.may_share_memory(flat, out_flat):
        blocks = unaliased(blocks, [out_flat], in_place=(ch.rank, out_flat))
    await _reduce_scatter_blocks(ch, seq, out_flat, blocks, rop, algorithm)
    return out


async def _reduce_scatter_blocks(
    ch: Channel, seq: int, out: np.ndarray, blocks: list[np.ndarray], op: ReduceOp, algorithm: str | None
) -> None:
    p, rank = ch.size, ch.rank
    wide = avg_accumulator(out.dtype) if op is ReduceOp.AVG and p > 1 else None
    if wide is not None:  # (a narrow sum would overflow where the average fits: sum a wider copy)
        acc = np.empty(out.size, dtype=wide)
        await _reduce_scatter_blocks(ch, seq, acc, [b.astype(wide) for b in blocks], op, algorithm)
        np.copyto(out, acc, casting="unsafe")
        return
    m = out.size
    even = all(b.size == m for b in blocks)
    total = m * p if even else sum(b.size for b in blocks)  # (the same on every rank of a well-formed call)
    if even:
        eng = intranode.engine_for(ch, total * out.itemsize, algorithm)
        if eng is not None and await eng.run(ch, intranode_ops.reduce_scatter, out, blocks, op):
            return  # (AVG included)
    algo = tuning.choose_reduce_scatter(p, total * out.itemsize, algorithm)
    if algo == "all_reduce" and p > 1:
        scratch = np.empty(total, dtype=out.dtype)
        start = mine = 0
        for i, b in enumerate(blocks):
            if i == rank:
                mine = start
            scratch[start : start + b.size] = b
            start += b.size
        await all_reduce_flat(ch, seq, scratch, ReduceOp.SUM if op is ReduceOp.AVG else op, algorithm="recursive_doubling")
        out[:] = scratch[mine : mine + m]
    elif even or tuning.choose_uneven_reduce_scatter([b.size for b in blocks]) == "ring":
        await ring_reduce_scatter(ch, (seq, 0), blocks, out, combiner(op, out.dtype))
    else:
        await rebalanced_reduce_scatter(ch, (seq, 0), (seq, 1), blocks, out, combiner(op, out.dtype))
    if op is ReduceOp.AVG:
        finish_avg(out, p)

