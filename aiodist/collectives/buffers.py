"""Array arguments of collectives: validation, zero-copy views, and staging copies for what has no such view.

Collectives work in place. A C-contiguous array (or a tensor whose memory is
one: torch CPU tensors through ``.numpy()``, ``.detach()`` for one that
requires grad, a same-size integer view re-typed by ``ml_dtypes`` for
bfloat16 and float8) is used without a copy. Anything else that is still
plain memory (a Fortran-order array, a strided slice, a transposed or
non-contiguous tensor) is *staged*: copied into a contiguous array in C
order when the operation starts, and, where the operation writes, copied
back into the caller's object when it succeeds, before its ``Work`` reports
the result. What cannot be viewed at all (a GPU tensor, a dtype numpy has no
equivalent for) is refused with :class:`~aiodist.errors.InvalidArrayError`
before any communication.

Staging, in detail: the collectives validate their arguments with
:func:`as_flat` before they take a sequence number, and their drivers call
it again on the same objects; one staging copy per object and operation is
shared by those calls (looked up by the object's identity). The copies made
while an operation is being started are *claimed* by its :class:`~aiodist.work.Work`
(:func:`claim`), which releases them (:func:`release`) when the operation
ends: written back on success, dropped either way. A copy made in a call that
then failed its validation is dropped at the loop's next turn (:func:`_sweep`),
and is not reused before that unless the object still holds what was copied. Copies
made inside a point-to-point operation's task belong to that task
(:func:`register_task`).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..eager import running_task
from ..errors import InvalidArrayError

__all__ = ["as_flat", "as_flat_list", "byte_view", "check_own_chunk", "unaliased", "claim", "register_task", "release",
           "callers_memory", "memory_view", "restage", "EMPTY_OUT", "TASKS", "UNCLAIMED", "abandon"]

EMPTY_OUT = memoryview(bytearray())
"""A writable zero-byte buffer, for receiving empty (barrier) messages."""

_EXTRA_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
"""torch's dtypes that numpy has no type of its own for (``ml_dtypes`` has them)."""
_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


@functools.lru_cache(maxsize=1)
def _extra_dtypes() -> dict[str, np.dtype[Any]]:
    """torch dtype name -> numpy dtype from ``ml_dtypes``, for :data:`_EXTRA_NAMES` (empty without the package).

    Imported on first need, not with aiodist: importing ml_dtypes takes ~0.7 s,
    which every process (each rank, each CLI call, each sweep) paid before.
    """
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - a declared dependency; numpy's own dtypes work without it
        return {}
    return {name: np.dtype(getattr(ml_dtypes, name)) for name in _EXTRA_NAMES if hasattr(ml_dtypes, name)}


def as_flat(arr: Any, argument: str, *, writable: bool) -> np.ndarray:
    """Validate ``arr`` and return a 1-D C-order array of its elements: a view, or a staging copy (see the module doc).

    Accepts numpy arrays, objects exporting the buffer protocol, and tensors
    (torch CPU tensors, or anything with torch's ``numpy()``/``detach()``/
    ``view(dtype)``). Raises InvalidArrayError for what cannot be viewed, or is
    read-only when ``writable``.
    """
    view = arr
    if type(arr) is not np.ndarray:
        # subclasses (np.matrix keeps 2-D on reshape) and foreign objects: a plain view
        view = np.asarray(arr) if isinstance(arr, np.ndarray) else _shared_view(arr, argument)
    if writable and not view.flags.writeable:
        raise InvalidArrayError(f"{argument} is read-only but receives the result", argument=argument, reason="read_only")
    dt = view.dtype
    if dt.hasobject or not dt.isnative:
        _refuse_dtype(dt, argument)
    if not view.flags.c_contiguous:
        return _stage(arr, view, argument, writable)
    flat: np.ndarray = view.reshape(-1)
    return flat


def _refuse_dtype(dt: np.dtype[Any], argument: str) -> None:
    if dt.hasobject:
        raise InvalidArrayError(
            f"{argument} has dtype {dt} (Python objects): only their references could be sent; send the objects "
            "with the *_object collectives, or use a numeric dtype", argument=argument, reason="dtype")
    raise InvalidArrayError(
        f"{argument} has dtype {dt.str}, not in this machine's byte order ({sys.byteorder}-endian): its bytes would be read as "
        f"native numbers on the other side; convert it first (arr.astype(arr.dtype.newbyteorder('=')))",
        argument=argument, reason="byte_order")


def _shared_view(obj: Any, argument: str) -> np.ndarray:
    """A numpy array sharing ``obj``'s memory: buffers, and tensors with a ``.numpy()`` view (torch CPU)."""
    try:
        return np.asarray(memoryview(obj))
    except TypeError:
        pass
    if callable(getattr(obj, "numpy", None)):
        return _tensor_view(obj, argument)
    raise InvalidArrayError(
        f"{argument} must be a numpy array or a buffer, not {type(obj).__name__}", argument=argument, reason="type"
    )


def memory_view(obj: Any) -> np.ndarray | None:
    """A numpy view of ``obj``'s memory as :func:`as_flat` would take it (a buffer, a CPU tensor), or None."""
    try:
        return _shared_view(obj, "x")
    except (InvalidArrayError, TypeError, ValueError, AttributeError):
        return None


def _tensor_view(t: Any, argument: str) -> np.ndarray:
    """The numpy view of a CPU tensor's memory (torch's rules; no copy)."""
    device = getattr(t, "device", None)
    kind = getattr(device, "type", "cpu")
    if kind != "cpu":
        raise InvalidArrayError(
            f"{argument} is a tensor on {device}: aiodist moves host memory; pass x.cpu() and copy the result back",
            argument=argument,
            reason="device",
        )
    if getattr(t, "requires_grad", False) and callable(getattr(t, "detach", None)):
        t = t.detach()  # same memory, out of autograd's sight (what torch.distributed does too)
    dtype_name = str(getattr(t, "dtype", "")).rpartition(".")[2]
    extra = _extra_dtypes().get(dtype_name) if dtype_name in _EXTRA_NAMES else None
    try:
        if extra is not None:  # numpy has no such dtype: view the memory as same-size ints, re-typed
            view = t.view(_torch_dtype(t, _SAME_SIZE_INT[extra.itemsize])).numpy().view(extra)
        else:
            view = t.numpy()
    except Exception as e:
        if dtype_name == "bfloat16" and not _extra_dtypes():
            why = "numpy has no bfloat16 without the ml_dtypes package: pip install ml_dtypes"
        else:
            why = f"{type(t).__name__}.numpy() failed: {e}"
        raise InvalidArrayError(
            f"{argument}: a tensor of dtype {getattr(t, 'dtype', '?')} has no numpy view ({why})",
            argument=argument,
            reason="type",
        ) from e
    if not isinstance(view, np.ndarray):
        raise InvalidArrayError(
            f"{argument}: {type(t).__name__}.numpy() returned {type(view).__name__}, not a numpy array",
            argument=argument,
            reason="type",
        )
    return view


def _torch_dtype(t: Any, name: str) -> Any:
    """The dtype ``name`` of ``t``'s own library (``torch.int16`` for a torch tensor)."""
    lib = sys.modules.get(type(t).__module__.partition(".")[0])
    dtype = getattr(lib, name, None)
    if dtype is None:
        raise TypeError(f"{type(t).__module__} has no dtype {name}")
    return dtype


# ------------------------------------------------------------------ staging


class _Staged:
    """A contiguous copy of ``obj``'s elements (``view``: a numpy view of its memory) for one operation."""

    __slots__ = ("obj", "view", "flat", "dirty", "owner", "claimed")

    def __init__(self, obj: Any, view: np.ndarray, flat: np.ndarray, dirty: bool, owner: Any) -> None:
        self.obj = obj
        self.view = view
        self.flat = flat
        self.dirty = dirty  # the operation writes into it: copy back on success
        self.owner = owner  # the task it was made in, then the operation's task
        self.claimed = False

    def __repr__(self) -> str:
        return f"<staged {self.view.dtype.name}{list(self.view.shape)} {'written' if self.dirty else 'read'}>"


_STAGED: dict[int, list[_Staged]] = {}  # id(obj) -> its staging copies in use (looked up, never iterated)
UNCLAIMED: list[_Staged] = []
"""Staging copies made since the last :func:`claim` (an operation being started)."""
TASKS: dict[Any, list[_Staged]] = {}
"""An operation's task -> its staging copies (empty when nothing is staged: the common case)."""


def _stage(obj: Any, view: np.ndarray, argument: str, writable: bool) -> np.ndarray:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:  # not inside an operation: nobody could copy the result back
        if writable:
            raise InvalidArrayError(
                f"{argument} is not C-contiguous (shape {view.shape}, strides {view.strides}); outside a running "
                "operation it cannot be written in place: pass np.ascontiguousarray(x) and use the result",
                argument=argument,
                reason="not_contiguous",
            )
        return np.ascontiguousarray(view).reshape(-1)
    task = running_task(loop)
    for st in _STAGED.get(id(obj), ()):
        if st.obj is not obj:
            continue
        if st.owner is task and st.claimed:  # the operation of this task, looking at its argument again
            st.dirty = st.dirty or writable
            return st.flat
        if not st.claimed:  # made while this operation is being started, or by a call that failed since
            if np.array_equal(st.flat.reshape(view.shape), view):
                st.dirty = st.dirty or writable
                return st.flat
            _forget(st)  # stale: the object changed after a call that failed its validation
            UNCLAIMED.remove(st)
            break
    if writable and _called_by_a_driver():
        raise InvalidArrayError(
            f"{argument} is not C-contiguous (shape {view.shape}, strides {view.strides}); a collective's "
            "algorithm called directly writes in place only into contiguous memory: pass np.ascontiguousarray(x) "
            "and use the result (the group API, e.g. aiodist.all_reduce, copies it back for you)",
            argument=argument,
            reason="not_contiguous",
        )
    flat = np.ascontiguousarray(view).reshape(-1)  # (not C-contiguous: always a copy)
    st = _Staged(obj, view, flat, writable, task)
    _STAGED.setdefault(id(obj), []).append(st)
    mine = TASKS.get(task)
    if mine is not None:
        st.claimed = True
        mine.append(st)
    else:
        if not UNCLAIMED:
            loop.call_soon(_sweep)
        UNCLAIMED.append(st)
    return flat


_HERE = os.path.abspath(__file__)
_DRIVERS = os.path.dirname(_HERE) + os.sep


def _called_by_a_driver() -> bool:
    """Whether as_flat was called by an algorithm of this package rather than while an operation is started.

    Staging copies are written back by the operation's Work; an algorithm
    called on its own (with a channel, no Work) would write into a copy
    nobody looks at. (Slow path only: arrays that need a copy.)
    """
    f: Any = sys._getframe(3)  # _stage <- as_flat <- its caller
    while f is not None and os.path.abspath(f.f_code.co_filename) == _HERE:  # (as_flat_list)
        f = f.f_back
    return f is not None and os.path.abspath(f.f_code.co_filename).startswith(_DRIVERS)


def _forget(st: _Staged) -> None:
    same = _STAGED.get(id(st.obj))
    if same is not None:
        if st in same:
            same.remove(st)
        if not same:
            del _STAGED[id(st.obj)]


def _sweep() -> None:
    """The loop turned: copies nobody claimed belonged to a call that failed its validation."""
    for st in UNCLAIMED:
        _forget(st)
    UNCLAIMED.clear()


def claim(task: Any) -> list[_Staged] | None:
    """The staging copies made while starting the operation that runs as ``task`` (None: none).

    Called by the operation's Work as it is made: the copies made in this
    synchronous stretch (in the caller's task, or in ``task``'s eager first step).
    """
    if not UNCLAIMED:
        return None
    try:
        caller = running_task(asyncio.get_running_loop())
    except RuntimeError:
        caller = None
    mine = [st for st in UNCLAIMED if st.owner is caller or st.owner is task]
    if not mine:
        return None
    UNCLAIMED[:] = [st for st in UNCLAIMED if st.owner is not caller and st.owner is not task]
    for st in mine:
        st.owner, st.claimed = task, True
    TASKS.setdefault(task, []).extend(mine)
    return mine


def register_task(task: Any) -> None:
    """Copies made inside ``task`` from now on belong to it (a point-to-point operation stages in its task)."""
    TASKS.setdefault(task, [])


def callers_memory(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """``arrays`` (of an operation being started) with each staging copy made for it replaced by the caller's
    memory it copies: what the operation reads and writes, as far as other operations are concerned."""
    if not UNCLAIMED:
        return arrays
    sources = {id(st.flat): st.view for st in UNCLAIMED}  # (looked up, never iterated)
    return tuple(sources.get(id(a), a) for a in arrays)


def restage(task: Any) -> None:
    """The operation of ``task`` starts later than it was called (it waited for an earlier one on the same
    memory, see :mod:`aiodist.buffer_order`): its staging copies take the callers' objects as they are now,
    as they would have had it started now."""
    for st in TASKS.get(task, ()):
        np.copyto(st.flat.reshape(st.view.shape), st.view)


def abandon(task: Any) -> None:
    """``task`` will never end: its loop is dropped with it unfinished (the simulator's world at the end of a
    run). Its copies go, nothing is written back, and nothing here keeps it (and through it its loop) alive."""
    release(task, ok=False)


def release(task: Any, *, ok: bool) -> None:
    """The operation of ``task`` ended: its written copies go back into the callers' objects if ``ok``; all are dropped."""
    stages = TASKS.pop(task, None)
    if not stages:
        return
    for st in stages:
        if ok and st.dirty:
            np.copyto(st.view, st.flat.reshape(st.view.shape))
        _forget(st)


def as_flat_list(
    arrs: Sequence[Any], argument: str, *, count: int, dtype: np.dtype[Any] | None, size: int | None, writable: bool
) -> list[np.ndarray]:
    """Validate a list of ``count`` arrays of ``dtype`` (None: the first one's; each of ``size`` elements if given)."""
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
        if dtype is None:
            dtype = flat.dtype
        check_dtype(flat, dtype, name)
        if size is not None:
            check_size(flat, size, name)
        out.append(flat)
    return out


def _span(a: np.ndarray) -> tuple[int, int]:
    start: int = a.__array_interface__["data"][0]
    return start, start + a.nbytes


def unaliased(ins: list[np.ndarray], outs: list[np.ndarray], *,
              in_place: tuple[int, np.ndarray] | None = None) -> list[np.ndarray]:
    """``ins`` with a private copy of every input that shares memory with an output (flat C-order arrays).

    A collective writes its outputs while it still reads its inputs (its own
    or a peer's, through shared memory too), so an input that is also an
    output, or part of one, would be read after it was overwritten. Copied,
    it is read as it was when the call started, as torch's gloo reads it.
    ``in_place=(i, slot)``: ``ins[i]`` being exactly ``slot`` (where its data
    must land, inside the outputs) is the operation's in-place form: not
    copied, unless it also overlaps an output that does not hold the slot.
    Cost without any overlap: a bounds check (in C) per pair when one side is
    a single array, else a sort of the outputs' extents and a bisect per input.
    """
    keep = -1 if in_place is None else in_place[0]
    result = ins
    if len(ins) == 1 or len(outs) == 1:
        for k, a in enumerate(ins):
            hits = [o for o in outs if np.may_share_memory(a, o)]
            if hits and not (k == keep and _is_slot(a, in_place, hits)):
                result = _copied(result, ins, k)
        return result
    spans = [_span(o) for o in outs if o.nbytes]
    if not spans:
        return ins
    spans.sort()
    starts = [x for x, _ in spans]
    ends: list[int] = []  # the largest end of the outputs up to each (in start order)
    top = 0
    for _, x in spans:
        top = max(top, x)
        ends.append(top)
    for k, a in enumerate(ins):
        s, e = _span(a)
        n = bisect.bisect_left(starts, e)  # outputs starting before this input ends
        if s == e or n == 0 or ends[n - 1] <= s:
            continue
        if k == keep and _is_slot(a, in_place, [o for o in outs if np.may_share_memory(a, o)]):
            continue
        result = _copied(result, ins, k)
    return result


def _is_slot(a: np.ndarray, in_place: Any, hits: list[np.ndarray]) -> bool:
    """Is ``a`` exactly the in-place slot, and does every output it overlaps hold that slot whole?"""
    s, e = _span(in_place[1])
    return _span(a) == (s, e) and all(x <= s and e <= y for x, y in map(_span, hits))


def _copied(result: list[np.ndarray], ins: list[np.ndarray], k: int) -> list[np.ndarray]:
    if result is ins:
        result = list(ins)
    result[k] = ins[k].copy()
    return result


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


def check_own_chunk(out: np.ndarray, sizes: Sequence[int], rank: int) -> None:
    """Raise InvalidArrayError unless ``out`` has as many elements as this rank's chunk (``sizes[rank]``)."""
    if out.size != sizes[rank]:
        raise InvalidArrayError(
            f"out has {out.size} elements, expected {sizes[rank]} (the size of in_list[{rank}], this rank's chunk)",
            argument="out",
            reason="size",
        )


def byte_view(flat: np.ndarray) -> memoryview:
    """A byte-format memoryview of a contiguous 1-D array (shares memory)."""
    return flat.view(np.uint8).data
