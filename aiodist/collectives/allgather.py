"""all_gather and all_gather_into_tensor: recursive doubling, Bruck, ring.

Small outputs use a latency-bound algorithm on one contiguous buffer (the
output itself when it is one tensor); large ones a ring that receives every
block straight into its final place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import intranode, intranode_ops, tuning
from .buffers import as_flat, as_flat_list, byte_view, check_dtype, unaliased
from .schedules import bruck_allgather, recursive_doubling_allgather, ring
from .transfer import sendrecv
from ..channel import Channel
from ..errors import InvalidArrayError

__all__ = ["all_gather", "all_gather_into_tensor"]

_RING, _RD, _BRUCK = 0, 1, 2


async def all_gather(
    ch: Channel, seq: int, out_list: Sequence[Any], arr: Any, *, algorithm: str | None = None
) -> list[Any]:
    """Fill ``out_list[i]`` with rank ``i``'s ``arr`` on every rank; return ``out_list``.

    ``out_list`` has one writable array per rank, each of ``arr``'s size and
    dtype. Cancellation leaves ``out_list`` partly written.
    """
    flat = as_flat(arr, "arr", writable=False)
    outs = as_flat_list(out_list, "out_list", count=ch.size, dtype=flat.dtype, size=flat.size, writable=True)
    (flat,) = unaliased([flat], outs, in_place=(0, outs[ch.rank]))
    await _all_gather(ch, seq, outs, None, flat, algorithm)
    return list(out_list)


async def all_gather_into_tensor(ch: Channel, seq: int, out: Any, arr: Any, *, algorithm: str | None = None) -> Any:
    """Concatenate every rank's ``arr`` (in rank order) into ``out``; return ``out``.

    ``out`` has ``p * arr.size`` elements of ``arr``'s dtype (any shape,
    e.g. ``(p, *arr.shape)`` or ``(p * len(arr), ...)``). Cancellation leaves
    ``out`` partly written.
    """
    flat = as_flat(arr, "arr", writable=False)
    out_flat = as_flat(out, "out", writable=True)
    check_dtype(out_flat, flat.dtype, "out")
    m, p = flat.size, ch.size
    if out_flat.size != m * p:
        raise InvalidArrayError(
            f"out has {out_flat.size} elements, expected world size {p} x arr's {m}", argument="out", reason="size"
        )
    outs = [out_flat[i * m : (i + 1) * m] for i in range(p)]
    (flat,) = unaliased([flat], [out_flat], in_place=(0, outs[ch.rank]))
    await _all_gather(ch, seq, outs, out_flat, flat, algorithm)
    return out


async def _all_gather(
    ch: Channel, seq: int, outs: list[np.ndarray], whole: np.ndarray | None, flat: np.ndarray, algorithm: str | None
) -> None:
    p, rank = ch.size, ch.rank
    m = flat.size
    if outs[rank].ctypes.data != flat.ctypes.data:  # arr may already be the output slice
        np.copyto(outs[rank], flat)
    if p == 1:
        return
    eng = intranode.engine_for(ch, m * p * flat.itemsize, algorithm)
    if eng is not None and await eng.run(ch, intranode_ops.all_gather, outs, flat):
        return
    algo = tuning.choose_all_gather(p, m * p * flat.itemsize, algorithm)
    if algo == "ring":
        plan = ring(p, rank)
        for s, (sb, rb) in enumerate(plan.allgather):
            key = (seq, _RING, s)
            await sendrecv(ch, plan.right, key, byte_view(outs[sb]), plan.left, key, byte_view(outs[rb]))
        return
    if algo == "recursive_doubling":
        buf = whole if whole is not None else np.empty(m * p, dtype=flat.dtype)
        if whole is None:
            buf[rank * m : (rank + 1) * m] = flat
        for st in recursive_doubling_allgather(p, rank):
            key = (seq, _RD, st.step)
            await sendrecv(
                ch,
                st.partner,
                key,
                byte_view(buf[st.send_lo * m : st.send_hi * m]),
                st.partner,
                key,
                byte_view(buf[st.recv_lo * m : st.recv_hi * m]),
            )
        if whole is None:
            for i in range(p):
                if i != rank:
                    outs[i][:] = buf[i * m : (i + 1) * m]
        return
    # Bruck: rotated scratch, block i holds rank (rank + i) % p
    tmp = np.empty(m * p, dtype=flat.dtype)
    tmp[:m] = flat
    for bst in bruck_allgather(p, rank):
        key = (seq, _BRUCK, bst.step)
        await sendrecv(
            ch,
            bst.dst,
            key,
            byte_view(tmp[: bst.count * m]),
            bst.src,
            key,
            byte_view(tmp[bst.offset * m : (bst.offset + bst.count) * m]),
        )
    if whole is not None:
        head = (p - rank) * m
        whole[rank * m :] = tmp[:head]
        whole[: rank * m] = tmp[head:]
    else:
        for i in range(1, p):
            outs[(rank + i) % p][:] = tmp[i * m : (i + 1) * m]
