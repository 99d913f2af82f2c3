"""Array arguments of collectives: validation and zero-copy byte views.

Collectives work in place on C-contiguous arrays. Anything that would force a
hidden copy (and so a result written somewhere the caller never sees) is
refused with :class:`~aiodist.errors.InvalidArrayError` before any
communication.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArrayError

__all__ = ["as_flat", "as_flat_list", "byte_view", "EMPTY_OUT"]

EMPTY_OUT = memoryview(bytearray())
"""A writable zero-byte buffer, for receiving empty (barrier) messages."""


def as_flat(arr: Any, argument: str, *, writable: bool) -> np.ndarray:
    """Validate ``arr`` and return a 1-D view of it (no copy).

    Accepts numpy arrays, objects exporting the buffer protocol, and tensors
    whose ``.numpy()`` shares their memory (torch CPU tensors), all viewed
    through numpy without a copy. Raises InvalidArrayError for anything
    that is not C-contiguous, or read-only when ``writable``.
    """
    if type(arr) is not np.ndarray:
        # subclasses (np.matrix keeps 2-D on reshape) and foreign objects: a plain view
        arr = np.asarray(arr) if isinstance(arr, np.ndarray) else _shared_view(arr, argument)
    if not arr.flags.c_contiguous:
        raise InvalidArrayError(
            f"{argument} is not C-contiguous (shape {arr.shape}, strides {arr.strides}); "
            "collectives work in place, pass np.ascontiguousarray(x) and use the result",
            argument=argument,
            reason="not_contiguous",
        )
    if writable and not arr.flags.writeable:
        raise InvalidArrayError(f"{argument} is read-only but receives the result", argument=argument, reason="read_only")
    return arr.reshape(-1)


def _shared_view(obj: Any, argument: str) -> np.ndarray:
    """A numpy array sharing ``obj``'s memory: buffers, and tensors with a ``.numpy()`` view (torch CPU)."""
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    to_numpy = getattr(obj, "numpy", None)
    if callable(to_numpy):
        try:
            view = to_numpy()
        except Exception as e:  # torch: GPU tensors, requires_grad, bfloat16...
            raise InvalidArrayError(
                f"{argument}: {type(obj).__name__}.numpy() failed ({e}); pass a CPU tensor or a numpy array",
                argument=argument,
                reason="type",
            ) from e
        if isinstance(view, np.ndarray):
            return view
    raise InvalidArrayError(
        f"{argument} must be a numpy array or a buffer, not {type(obj).__name__}", argument=argument, reason="type"
    )


def as_flat_list(
    arrs: Sequence[Any], argument: str, *, count: int, dtype: np.dtype[Any], size: int | None, writable: bool
) -> list[np.ndarray]:
    """Validate a list of ``count`` arrays of ``dtype`` (each of ``size`` elements if given)."""
    if isinstance(arrs, np.ndarray) or not isinstance(arrs, Sequence):
        raise InvalidArrayError(f"{argument} must be a list of arrays", argument=argument, reason="type")
    if len(arrs) != count:
        raise InvalidArrayError(
            f"{argument} has {len(arrs)} entries, the group has {count} ranks", argument=argument, reason="length"
        )
    out = []
    for i, a in enumerate(arrs):
        name = f"{argument}[{i}]"
        flat = as_flat(a, name, writable=writable)
        check_dtype(flat, dtype, name)
        if size is not None:
            check_size(flat, size, name)
        out.append(flat)
    return out


def check_dtype(flat: np.ndarray, dtype: np.dtype[Any], argument: str) -> None:
    """Raise InvalidArrayError unless ``flat`` has ``dtype``."""
    if flat.dtype != dtype:
        raise InvalidArrayError(
            f"{argument} has dtype {flat.dtype.name}, expected {np.dtype(dtype).name}", argument=argument, reason="dtype"
        )


def check_size(flat: np.ndarray, size: int, argument: str) -> None:
    """Raise InvalidArrayError unless ``flat`` has ``size`` elements."""
    if flat.size != size:
        raise InvalidArrayError(
            f"{argument} has {flat.size} elements, expected {size}", argument=argument, reason="size"
        )


def byte_view(flat: np.ndarray) -> memoryview:
    """A byte-format memoryview of a contiguous 1-D array (shares memory)."""
    return memoryview(flat.view(np.uint8))
