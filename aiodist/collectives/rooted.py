"""Rooted collectives: broadcast, reduce, gather, scatter.

broadcast: binomial tree, or for large arrays scatter down the tree + ring
allgather (van de Geijn). reduce: binomial tree (non-root arrays are only
read), or for large arrays ring reduce-scatter + gather at the root.
gather/scatter: linear, the root talks to every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import intranode, intranode_ops, tuning
from .buffers import as_flat, as_flat_list, byte_view, unaliased
from .ops import ReduceOp, avg_accumulator, check_op_dtype, combiner, finish_avg
from .reducescatter import ring_reduce_scatter
from .schedules import binomial_tree, partition, ring
from .transfer import SMALL_SEND_BYTES, recv_into, run_all, send, sendrecv
from ..channel import Channel
from ..errors import InvalidRankError

__all__ = ["broadcast", "reduce", "gather", "scatter", "check_root"]

# Key phases (keys are (seq, phase, step)).
_TREE, _SCATTER, _ALLGATHER, _RS, _GATHER = 0, 1, 2, 3, 4


def check_root(root: int, size: int, argument: str = "root") -> int:
    """Validate a root rank; raise InvalidRankError outside ``0..size-1``."""
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < size:
        raise InvalidRankError(
            f"{argument}={root!r} is not a rank of this group of {size}", rank=root, size=size, argument=argument
        )
    return int(root)


async def _sends(ch: Channel, items: list[tuple[int, tuple[Any, ...], memoryview]]) -> None:
    """Send each (peer, key, payload); concurrently when they are large."""
    if sum(mv.nbytes for _, _, mv in items) <= SMALL_SEND_BYTES:
        for peer, key, mv in items:
            await send(ch, peer, key, mv)
    else:
        await run_all([send(ch, peer, key, mv) for peer, key, mv in items])


async def _recvs(ch: Channel, items: list[tuple[int, tuple[Any, ...], memoryview]]) -> None:
    """Receive each (peer, key, out); all posted at once when large (zero-copy receives)."""
    if sum(mv.nbytes for _, _, mv in items) <= SMALL_SEND_BYTES:
        for peer, key, mv in items:
            await recv_into(ch, peer, key, mv)
    else:
        await run_all([recv_into(ch, peer, key, mv) for peer, key, mv in items])


# ------------------------------------------------------------------ broadcast


async def broadcast(ch: Channel, seq: int, arr: Any, root: int, *, algorithm: str | None = None) -> Any:
    """Copy ``root``'s ``arr`` into every rank's ``arr`` (same size and dtype); return ``arr``.

    Cancellation leaves a non-root ``arr`` partly written.
    """
    p, rank = ch.size, ch.rank
    root = check_root(root, p)
    flat = as_flat(arr, "arr", writable=rank != root)
    if p == 1:
        return arr
    eng = intranode.engine_for(ch, flat.nbytes, algorithm)
    if eng is not None and await eng.run(ch, intranode_ops.broadcast, flat, root):
        return arr
    algo = tuning.choose_broadcast(p, flat.nbytes, algorithm)
    tree = binomial_tree(p, rank, root)
    if algo == "binomial":
        buf = byte_view(flat)
        if tree.parent is not None:
            await recv_into(ch, tree.parent, (seq, _TREE, tree.parent_step), buf)
        await _sends(ch, [(c, (seq, _TREE, step), buf) for c, step in tree.children])
        return arr
    # scatter + allgather: block i of the array belongs to relative rank i
    offs = partition(flat.size, p)

    def blk(lo: int, hi: int) -> memoryview:
        return byte_view(flat[offs[lo] : offs[hi]])

    if tree.parent is not None:
        await recv_into(ch, tree.parent, (seq, _SCATTER, tree.parent_step), blk(*tree.subtree))
    await _sends(
        ch, [(c, (seq, _SCATTER, step), blk(lo, hi)) for (c, step), (lo, hi) in zip(tree.children, tree.child_subtrees)]
    )
    v = (rank - root) % p
    plan = ring(p, v)  # relative ring: neighbours are rank -+ 1 as well
    left, right = (rank - 1) % p, (rank + 1) % p
    for s, (sb, rb) in enumerate(plan.allgather):
        key = (seq, _ALLGATHER, s)
        await sendrecv(ch, right, key, blk(sb, sb + 1), left, key, blk(rb, rb + 1))
    return arr


# ------------------------------------------------------------------ reduce


async def reduce(
    ch: Channel, seq: int, arr: Any, root: int, op: Any = ReduceOp.SUM, *, algorithm: str | None = None
) -> Any:
    """Reduce every rank's ``arr`` with ``op`` into ``root``'s ``arr``; return ``arr``.

    Non-root arrays are only read (left unchanged). Cancellation leaves the
    root's ``arr`` unspecified.
    """
    p, rank = ch.size, ch.rank
    root = check_root(root, p)
    flat = as_flat(arr, "arr", writable=rank == root)
    rop = check_op_dtype(op, flat.dtype)
    if p == 1:
        return arr
    wide = avg_accumulator(flat.dtype) if rop is ReduceOp.AVG else None
    if wide is not None:  # (a narrow sum would overflow where the average fits: sum a wider copy)
        acc = flat.astype(wide)
        await reduce(ch, seq, acc, root, rop, algorithm=algorithm)
        if rank == root:
            np.copyto(flat, acc, casting="unsafe")
        return arr
    eng = intranode.engine_for(ch, flat.nbytes, algorithm)
    if eng is not None and await eng.run(ch, intranode_ops.reduce, flat, root, rop):
        return arr  # (AVG included)
    combine = combiner(rop, flat.dtype)
    algo = tuning.choose_reduce(p, flat.nbytes, algorithm)
    if algo == "binomial":
        tree = binomial_tree(p, rank, root)
        acc = flat
        if tree.children:
            tmp = np.empty_like(flat)
            if rank != root:
                acc = np.empty_like(flat)
            first = True
            # smallest subtree first: the order children finish in
            for child, step in reversed(tree.children):
                await recv_into(ch, child, (seq, _TREE, step), byte_view(tmp))
                combine(acc, flat if first else acc, tmp)
                first = False
        if tree.parent is not None:
            await send(ch, tree.parent, (seq, _TREE, tree.parent_step), byte_view(acc))
    else:
        offs = partition(flat.size, p)
        blocks = [flat[offs[i] : offs[i + 1]] for i in range(p)]
        mine = blocks[rank] if rank == root else np.empty_like(blocks[rank])
        await ring_reduce_scatter(ch, (seq, _RS), blocks, mine, combine)
        if rank == root:
            await _recvs(
                ch, [(i, (seq, _GATHER, 0), byte_view(blocks[i])) for i in range(p) if i != root]
            )
        else:
            await send(ch, root, (seq, _GATHER, 0), byte_view(mine))
    if rank == root and rop is ReduceOp.AVG:
        finish_avg(flat, p)
    return arr


# ------------------------------------------------------------------ gather / scatter


async def gather(ch: Channel, seq: int, arr: Any, gather_list: Sequence[Any] | None, root: int) -> None:
    """Collect every rank's ``arr`` into ``root``'s ``gather_list`` (one array per rank).

    ``gather_list`` is ignored on other ranks. Cancellation leaves the
    root's ``gather_list`` partly written.
    """
    p, rank = ch.size, ch.rank
    root = check_root(root, p)
    flat = as_flat(arr, "arr", writable=False)
    if rank != root:
        await send(ch, root, (seq, _GATHER, 0), byte_view(flat))
        return
    outs = as_flat_list([] if gather_list is None else gather_list, "gather_list", count=p, dtype=flat.dtype, size=flat.size, writable=True)
    (flat,) = unaliased([flat], outs, in_place=(0, outs[root]))
    np.copyto(outs[root], flat)
    await _recvs(ch, [(i, (seq, _GATHER, 0), byte_view(outs[i])) for i in range(p) if i != root])


async def scatter(ch: Channel, seq: int, arr: Any, scatter_list: Sequence[Any] | None, root: int) -> Any:
    """Give rank ``i`` the root's ``scatter_list[i]`` in its ``arr``; return ``arr``.

    ``scatter_list`` is ignored on other ranks. Cancellation leaves a
    non-root ``arr`` partly written.
    """
    p, rank = ch.size, ch.rank
    root = check_root(root, p)
    flat = as_flat(arr, "arr", writable=True)
    if rank != root:
        await recv_into(ch, root, (seq, _SCATTER, 0), byte_view(flat))
        return arr
    ins = as_flat_list([] if scatter_list is None else scatter_list, "scatter_list", count=p, dtype=flat.dtype, size=flat.size, writable=False)
    ins = unaliased(ins, [flat], in_place=(root, flat))
    np.copyto(flat, ins[root])
    await _sends(ch, [(i, (seq, _SCATTER, 0), byte_view(ins[i])) for i in range(p) if i != root])
    return arr
