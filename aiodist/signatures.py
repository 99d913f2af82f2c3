"""What a collective's signature says about its arrays: the dtype's name, the reduction (checked against the dtype)
and the sizes of a list's chunks.

The first two are on every collective's path, so both are remembered per key
(numpy computes ``dtype.name`` in Python, ~15 us).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .collectives.ops import PremulSum, ReduceOp, check_op_dtype, dtype_kind, premultiply

__all__ = ["chunk_sizes", "dtype_name", "reduction"]

CHUNK_SIZES_LISTED = 16
"""At most this many uneven chunk sizes are listed in a signature; more are summed up by a digest."""

_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dt: np.dtype[Any]) -> str:
    """``dt.name``, remembered."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = dt.name
        if len(_DTYPE_NAMES) < 256:  # structured dtypes could be endless; the common ones are few
            _DTYPE_NAMES[dt] = name
    return name


_REDUCTIONS: dict[Any, tuple[ReduceOp, str]] = {}


def reduction(op: Any, flat: np.ndarray) -> tuple[ReduceOp, str]:
    """``check_op_dtype(op, flat.dtype)`` and "OP dtype" for the signature, remembered per (op, dtype).

    PREMUL_SUM (a :class:`~aiodist.collectives.ops.PremulSum`) runs as SUM of
    the inputs times its factor: its kernel is SUM's, its signature says PREMUL_SUM.
    """
    key = (op, flat.dtype)
    try:
        hit = _REDUCTIONS.get(key)
    except TypeError:  # an unhashable op object (anything with a matching .name is accepted)
        rop = check_op_dtype(op, flat.dtype)
        return rop, f"{rop.name} {dtype_name(flat.dtype)}"
    if hit is None:
        if type(op) is PremulSum:
            if op.factor is None or dtype_kind(flat.dtype) not in "fc":
                premultiply(op, flat[:0], in_place=False)  # raises, saying why
            hit = (ReduceOp.SUM, f"PREMUL_SUM {dtype_name(flat.dtype)}")
        else:
            rop = check_op_dtype(op, flat.dtype)  # raises for a bad pair: nothing is remembered then
            hit = (rop, f"{rop.name} {dtype_name(flat.dtype)}")
        if len(_REDUCTIONS) < 1024:
            _REDUCTIONS[key] = hit
    return hit


def chunk_sizes(sizes: Sequence[int]) -> str:
    """The ``n=`` part of a signature for a list whose chunks have ``sizes`` elements (the same on every rank).

    Equal chunks: ``n=<size>`` (what signatures said before uneven lists were
    accepted). Uneven ones: ``n=[1,2,3,4]``, or past :data:`CHUNK_SIZES_LISTED`
    chunks their total and a digest of the list (``n=[10 in 32 chunks #<hex>]``),
    so that a frame's header stays short; ranks that disagree on any size
    still have different signatures.
    """
    first = sizes[0] if sizes else 0
    if all(s == first for s in sizes):
        return f"n={first}"
    text = ",".join(str(s) for s in sizes)
    if len(sizes) <= CHUNK_SIZES_LISTED:
        return f"n=[{text}]"
    digest = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    return f"n=[{sum(sizes)} in {len(sizes)} chunks #{digest}]"
