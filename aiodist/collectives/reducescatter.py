"""reduce_scatter and reduce_scatter_tensor, and the ring reduce-scatter they share with reduce.

The ring here never writes the caller's input blocks: partial sums travel
through two scratch buffers (one being sent while the next is received), and
the last step writes the finished block straight into the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import intranode, intranode_ops, tuning
from .allreduce import all_reduce_flat
from .buffers import as_flat, as_flat_list, byte_view, check_dtype, unaliased
from .ops import Combiner, ReduceOp, check_op_dtype, combiner, finish_avg
from .schedules import ring
from .transfer import sendrecv
from ..channel import Channel
from ..errors import InvalidArrayError

__all__ = ["reduce_scatter", "reduce_scatter_tensor", "ring_reduce_scatter"]


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


async def reduce_scatter(ch: Channel, seq: int, out: Any, in_list: Sequence[Any], op: Any = ReduceOp.SUM, *,
                         algorithm: str | None = None) -> Any:
    """Reduce ``in_list[i]`` over all ranks into rank ``i``'s ``out``; return ``out``.

    ``in_list`` has one array per rank, each the size and dtype of ``out``;
    it is not modified. Cancellation leaves ``out`` unspecified.
    """
    out_flat = as_flat(out, "out", writable=True)
    rop = check_op_dtype(op, out_flat.dtype)
    blocks = as_flat_list(in_list, "in_list", count=ch.size, dtype=out_flat.dtype, size=out_flat.size, writable=False)
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
    m = out.size
    eng = intranode.engine_for(ch, m * p * out.itemsize, algorithm)
    if eng is not None and await eng.run(ch, intranode_ops.reduce_scatter, out, blocks, op):
        return  # (AVG included)
    algo = tuning.choose_reduce_scatter(p, m * p * out.itemsize, algorithm)
    if algo == "all_reduce" and p > 1:
        scratch = np.empty(m * p, dtype=out.dtype)
        for i, b in enumerate(blocks):
            scratch[i * m : (i + 1) * m] = b
        await all_reduce_flat(ch, seq, scratch, ReduceOp.SUM if op is ReduceOp.AVG else op, algorithm="recursive_doubling")
        out[:] = scratch[rank * m : (rank + 1) * m]
    else:
        await ring_reduce_scatter(ch, (seq, 0), blocks, out, combiner(op, out.dtype))
    if op is ReduceOp.AVG:
        finish_avg(out, p)

