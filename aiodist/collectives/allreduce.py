"""all_reduce: recursive doubling, Rabenseifner, pipelined ring.

All three reduce every element once per combination and copy results, with
the operands of each combination in a fixed (lower rank first) order, so
every rank ends with the same bits. See :mod:`.tuning` for the choice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import intranode, intranode_ops, tuning
from .buffers import as_flat, byte_view
from .ops import Combiner, ReduceOp, avg_accumulator, check_op_dtype, combiner, finish_avg
from .schedules import fold, partition, recursive_doubling, recursive_halving, ring
from .transfer import recv_into, run_all, send, sendrecv
from ..channel import Channel

__all__ = ["all_reduce", "all_reduce_flat"]

# Key phases (keys are (seq, phase, step)).
_FOLD, _UNFOLD, _RD, _RS, _AG = 0, 1, 2, 3, 4


async def all_reduce(
    ch: Channel,
    seq: int,
    arr: Any,
    op: Any = ReduceOp.SUM,
    *,
    algorithm: str | None = None,
    block_bytes: int | None = None,
    lanes: int | None = None,
) -> Any:
    """Reduce ``arr`` across all ranks of ``ch`` with ``op``, in place; return ``arr``.

    ``arr`` must be C-contiguous and writable; its dtype must suit ``op``
    (checked before any communication). ``algorithm`` forces one of
    ``tuning.ALGORITHMS["all_reduce"]``; ``block_bytes``/``lanes`` override the
    ring's segment size and pipelining depth. Cancellation leaves ``arr``
    partly reduced (unspecified contents) and the peers of this collective
    without their messages.
    """
    flat = as_flat(arr, "arr", writable=True)
    rop = check_op_dtype(op, flat.dtype)
    await all_reduce_flat(ch, seq, flat, rop, algorithm=algorithm, block_bytes=block_bytes, lanes=lanes)
    return arr


async def all_reduce_flat(
    ch: Channel,
    seq: int,
    flat: np.ndarray,
    op: ReduceOp,
    *,
    algorithm: str | None = None,
    block_bytes: int | None = None,
    lanes: int | None = None,
) -> None:
    """:func:`all_reduce` on an already validated 1-D array and operator."""
    p = ch.size
    if p == 1:
        return
    wide = avg_accumulator(flat.dtype) if op is ReduceOp.AVG else None
    if wide is not None:  # (a narrow sum would overflow where the average fits: sum a wider copy)
        acc = flat.astype(wide)
        await all_reduce_flat(ch, seq, acc, op, algorithm=algorithm, block_bytes=block_bytes, lanes=lanes)
        np.copyto(flat, acc, casting="unsafe")
        return
    eng = intranode.engine_for(ch, flat.nbytes, algorithm)
    if eng is not None and await eng.run(ch, intranode_ops.all_reduce, flat, op):
        return  # (AVG included)
    combine = combiner(op, flat.dtype)
    algo = tuning.choose_all_reduce(p, flat.nbytes, algorithm)
    if algo == "recursive_doubling":
        await _recursive_doubling(ch, seq, flat, combine)
    elif algo == "rabenseifner":
        await _rabenseifner(ch, seq, flat, combine)
    else:
        await _ring(
            ch,
            seq,
            flat,
            combine,
            block_bytes=tuning.RING_BLOCK_BYTES if block_bytes is None else block_bytes,
            lanes=tuning.RING_LANES if lanes is None else lanes,
        )
    if op is ReduceOp.AVG:
        finish_avg(flat, p)


def _combine_ordered(combine: Combiner, mine: np.ndarray, theirs: np.ndarray, they_are_lower: bool) -> None:
    # Same operand order on both sides of an exchange: bit-identical results
    # even where the kernel is not exactly commutative.
    if they_are_lower:
        combine(mine, theirs, mine)
    else:
        combine(mine, mine, theirs)


async def _recursive_doubling(ch: Channel, seq: int, flat: np.ndarray, combine: Combiner) -> None:
    rank = ch.rank
    f = fold(ch.size, rank)
    buf = byte_view(flat)
    if f.role == "extra":
        assert f.partner is not None
        await send(ch, f.partner, (seq, _FOLD, 0), buf)
        await recv_into(ch, f.partner, (seq, _UNFOLD, 0), buf)
        return
    scratch = np.empty_like(flat)
    sbuf = byte_view(scratch)
    if f.role == "absorber":
        assert f.partner is not None
        await recv_into(ch, f.partner, (seq, _FOLD, 0), sbuf)
        combine(flat, scratch, flat)  # the extra is the lower rank
    for step, partner in recursive_doubling(ch.size, rank):
        key = (seq, _RD, step)
        await sendrecv(ch, partner, key, buf, partner, key, sbuf)
        if partner < rank:  # (_combine_ordered, inlined: the same operand order on both sides)
            combine(flat, scratch, flat)
        else:
            combine(flat, flat, scratch)
    if f.role == "absorber":
        assert f.partner is not None
        await send(ch, f.partner, (seq, _UNFOLD, 0), buf)


async def _rabenseifner(ch: Channel, seq: int, flat: np.ndarray, combine: Combiner) -> None:
    rank = ch.rank
    f = fold(ch.size, rank)
    buf = byte_view(flat)
    if f.role == "extra":
        assert f.partner is not None
        await send(ch, f.partner, (seq, _FOLD, 0), buf)
        await recv_into(ch, f.partner, (seq, _UNFOLD, 0), buf)
        return
    n = flat.size
    offs = partition(n, f.p2)
    steps = recursive_halving(ch.size, rank)
    need = n if f.role == "absorber" else (offs[steps[0].keep_hi] - offs[steps[0].keep_lo] if steps else 0)
    scratch = np.empty(need, dtype=flat.dtype)
    if f.role == "absorber":
        assert f.partner is not None
        await recv_into(ch, f.partner, (seq, _FOLD, 0), byte_view(scratch))
        combine(flat, scratch, flat)
    for st in steps:
        a, b = offs[st.send_lo], offs[st.send_hi]
        c, d = offs[st.keep_lo], offs[st.keep_hi]
        tmp = scratch[: d - c]
        key = (seq, _RS, st.step)
        await sendrecv(ch, st.partner, key, byte_view(flat[a:b]), st.partner, key, byte_view(tmp))
        _combine_ordered(combine, flat[c:d], tmp, st.partner < rank)
    for st in reversed(steps):
        a, b = offs[st.send_lo], offs[st.send_hi]
        c, d = offs[st.keep_lo], offs[st.keep_hi]
        key = (seq, _AG, st.step)
        await sendrecv(ch, st.partner, key, byte_view(flat[c:d]), st.partner, key, byte_view(flat[a:b]))
    if f.role == "absorber":
        assert f.partner is not None
        await send(ch, f.partner, (seq, _UNFOLD, 0), buf)


async def _ring(ch: Channel, seq: int, flat: np.ndarray, combine: Combiner, *, block_bytes: int, lanes: int) -> None:
    p = ch.size
    n = flat.size
    block_elems = max(1, block_bytes // flat.itemsize)
    nseg = max(1, -(-n // (block_elems * p)))
    segs = partition(n, nseg)
    nlanes = max(1, min(lanes, nseg))
    plan = ring(p, ch.rank)
    max_block = -(-(segs[1] - segs[0]) // p)  # the first segment and block are the largest

    async def lane(first: int) -> None:
        scratch = np.empty(max_block, dtype=flat.dtype)
        for j in range(first, nseg, nlanes):
            await _ring_segment(ch, seq, j, flat[segs[j] : segs[j + 1]], scratch, combine, plan)

    if nlanes == 1:
        await lane(0)
    else:
        await run_all([lane(i) for i in range(nlanes)])


async def _ring_segment(
    ch: Channel, seq: int, j: int, seg: np.ndarray, scratch: np.ndarray, combine: Combiner, plan: Any
) -> None:
    p = ch.size
    offs = partition(seg.size, p)
    left, right = plan.left, plan.right
    for s, (sb, rb) in enumerate(plan.reduce_scatter):
        dst = seg[offs[rb] : offs[rb + 1]]
        tmp = scratch[: dst.size]
        key = (seq, j, s)
        await sendrecv(ch, right, key, byte_view(seg[offs[sb] : offs[sb + 1]]), left, key, byte_view(tmp))
        combine(dst, tmp, dst)
    for s, (sb, rb) in enumerate(plan.allgather, start=p - 1):
        key = (seq, j, s)
        await sendrecv(
            ch,
            right,
            key,
            byte_view(seg[offs[sb] : offs[sb + 1]]),
            left,
            key,
            byte_view(seg[offs[rb] : offs[rb + 1]]),
        )
