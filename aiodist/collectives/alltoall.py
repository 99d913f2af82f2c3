"""all_to_all and all_to_all_single (uneven splits along dim 0); the barrier.

all_to_all: with small messages every send is posted, then every receive
(linear, as gloo: about one latency in total); with large ones every
send and receive is posted at once (receives first), in pairwise order
(step s sends to rank+s, receives from rank-s). Every pair exchanges a message even
when it is empty, so a size disagreement is reported, never skipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import intranode, intranode_ops
from .buffers import EMPTY_OUT, as_flat, as_flat_list, byte_view, check_dtype, unaliased
from .schedules import dissemination, pairwise_alltoall
from .transfer import SMALL_SEND_BYTES, recv_into, run_all, send, sendrecv
from ..channel import Channel
from ..errors import InvalidArrayError

__all__ = ["all_to_all", "all_to_all_single", "barrier", "exchange_blocks", "single_blocks"]


async def all_to_all(ch: Channel, seq: int, out_list: Sequence[Any], in_list: Sequence[Any]) -> list[Any]:
    """Send ``in_list[i]`` to rank ``i``, receive rank ``i``'s into ``out_list[i]``; return ``out_list``.

    Sizes may differ per peer but must agree pairwise (a disagreement raises
    CollectiveMismatchError). Cancellation leaves ``out_list`` partly written.
    """
    p = ch.size
    ins = as_flat_list(in_list, "in_list", count=p, dtype=None, size=None, writable=False)
    outs = as_flat_list(out_list, "out_list", count=p, dtype=ins[0].dtype, size=None, writable=True)
    await exchange_blocks(ch, seq, outs, unaliased(ins, outs, in_place=(ch.rank, outs[ch.rank])))
    return list(out_list)


async def all_to_all_single(
    ch: Channel,
    seq: int,
    out: Any,
    arr: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
) -> Any:
    """all_to_all on one array split along dim 0; return ``out``.

    Rows ``input_split_sizes[i]`` of ``arr`` (in order) go to rank ``i``;
    rank ``i``'s rows land in ``out``'s ``output_split_sizes[i]`` rows. ``None``
    splits dim 0 evenly (it must be divisible by the world size). ``out`` and
    ``arr`` need the same dtype and row size. Cancellation leaves ``out``
    partly written.
    """
    outs, ins = single_blocks(out, arr, ch.size, output_split_sizes, input_split_sizes, rank=ch.rank)
    await exchange_blocks(ch, seq, outs, ins)
    return out


def single_blocks(
    out: Any,
    arr: Any,
    p: int,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    *,
    rank: int,
    arg: str = "arr",
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The blocks :func:`all_to_all_single` exchanges among ``p`` ranks: (``out``'s, ``arr``'s), one per rank.

    Validates everything first (InvalidArrayError; ``arg`` names ``arr`` in the messages). ``arr``'s blocks
    that share memory with ``out`` are copies (see :func:`unaliased`; ``rank``'s own block may be in place).
    """
    flat = as_flat(arr, arg, writable=False)
    out_flat = as_flat(out, "out", writable=True)
    check_dtype(out_flat, flat.dtype, "out")
    arr_shape, out_shape = np.shape(arr), np.shape(out)
    if not arr_shape or not out_shape:
        raise InvalidArrayError("all_to_all_single needs arrays with at least one dimension", argument=arg, reason="size")
    row_in = math.prod(arr_shape[1:])
    row_out = math.prod(out_shape[1:])
    if row_in != row_out:
        raise InvalidArrayError(
            f"out rows have {row_out} elements but {arg} rows have {row_in}", argument="out", reason="size"
        )
    in_splits = _splits(input_split_sizes, arr_shape[0], p, "input_split_sizes")
    out_splits = _splits(output_split_sizes, out_shape[0], p, "output_split_sizes")
    outs, ins = _cut(out_flat, out_splits, row_out), _cut(flat, in_splits, row_in)
    if np.may_share_memory(flat, out_flat):  # (x may be out: read as it is now)
        ins = unaliased(ins, outs, in_place=(rank, outs[rank]))
    return outs, ins


async def barrier(ch: Channel, seq: int) -> None:
    """Return once every rank of ``ch`` has entered the barrier (dissemination, ceil(lg p) rounds).

    Cancellation may leave peers waiting for this rank's remaining rounds.
    """
    for k, (dst, src) in enumerate(dissemination(ch.size, ch.rank)):
        key = (seq, k)
        await ch.send(dst, key, b"")
        await ch.recv_into(src, key, EMPTY_OUT)


# ------------------------------------------------------------------ internals


def _splits(splits: Sequence[int] | None, rows: int, p: int, argument: str) -> list[int]:
    if splits is None:
        if rows % p:
            raise InvalidArrayError(
                f"dim 0 ({rows}) is not divisible by the world size {p}; pass {argument}",
                argument=argument,
                reason="splits",
            )
        return [rows // p] * p
    out = [int(s) for s in splits]
    if len(out) != p:
        raise InvalidArrayError(
            f"{argument} has {len(out)} entries, the group has {p} ranks", argument=argument, reason="splits"
        )
    if any(s < 0 for s in out) or sum(out) != rows:
        raise InvalidArrayError(
            f"{argument}={list(splits)!r} must be {p} non-negative sizes summing to dim 0 ({rows})",
            argument=argument,
            reason="splits",
        )
    return out


def _cut(flat: np.ndarray, splits: list[int], row: int) -> list[np.ndarray]:
    blocks = []
    at = 0
    for s in splits:
        blocks.append(flat[at * row : (at + s) * row])
        at += s
    return blocks


async def exchange_blocks(ch: Channel, seq: int, outs: list[np.ndarray], ins: list[np.ndarray]) -> None:
    """Send ``ins[i]`` to rank ``i`` and receive rank ``i``'s block into ``outs[i]`` (sizes agree pairwise)."""
    p, rank = ch.size, ch.rank
    if outs[rank].size != ins[rank].size:
        raise InvalidArrayError(
            f"this rank sends itself {ins[rank].size} elements but expects {outs[rank].size}",
            argument="out",
            reason="size",
        )
    np.copyto(outs[rank], ins[rank])
    pairs = pairwise_alltoall(p, rank)
    key = (seq, 0)
    eng = intranode.engine_on(ch)
    least = intranode.PAIR_MIN_BYTES
    if eng is not None and any(max(ins[j].nbytes, outs[j].nbytes) >= least for j in range(p) if j != rank):
        # Ranks of one host: large blocks are read straight out of their sender's array (each pair
        # decides by the size of its own block, which both ends know); the others go as messages.
        await intranode_ops.exchange_in_place(eng, ch, key, outs, ins, least)  # type: ignore[arg-type]
        sends = [send(ch, dst, key, byte_view(ins[dst])) for dst, _ in pairs if ins[dst].nbytes < least]
        recvs = [recv_into(ch, src, key, byte_view(outs[src])) for _, src in pairs if outs[src].nbytes < least]
        await run_all([*recvs, *sends])
        return
    if len(pairs) == 1:  # two ranks: one step, no task (see sendrecv)
        ((dst, src),) = pairs
        await sendrecv(ch, dst, key, byte_view(ins[dst]), src, key, byte_view(outs[src]))
        return
    if max((b.nbytes for b in ins), default=0) <= SMALL_SEND_BYTES:
        for dst, _ in pairs:
            await send(ch, dst, key, byte_view(ins[dst]))
        for _, src in pairs:
            await recv_into(ch, src, key, byte_view(outs[src]))
        return
    # Every send and receive at once: a payload that arrives before its receive is
    # posted waits in the transport (large ones in the socket), so no link is
    # idle while an earlier pair is still busy. Each output block is written by
    # exactly one receive: results do not depend on the order of arrival.
    sends = [send(ch, dst, key, byte_view(ins[dst])) for dst, _ in pairs]
    recvs = [recv_into(ch, src, key, byte_view(outs[src])) for _, src in pairs]
    await run_all([*recvs, *sends])
