"""Reduction operators: which ones apply to which dtype, and applying them in place.

Every operator is commutative and associative on exact types, so the ring,
halving and tree algorithms may combine contributions in any fixed order.
Floating-point results depend on that order; each collective reduces every
element exactly once and copies the result, so all ranks get the same bits.

Semantics (matching torch.distributed where it defines them):

* ``SUM`` on bool is logical or, ``PRODUCT`` on bool is logical and,
  ``MIN``/``MAX`` on bool are and/or.
* ``MIN``/``MAX`` are not defined on complex numbers.
* ``BAND``/``BOR``/``BXOR`` apply to integers and bool only.
* ``AVG`` sums, then divides by the number of ranks once, at the end. Floats
  and complex use true division. Integers use division truncating toward
  zero (C semantics, what NCCL's ``ncclAvg`` does for integer types):
  ``[-7, 7]`` averaged over 2 ranks of zeros gives ``[-3, 3]``. (torch's gloo
  backend refuses integer AVG outright -- checked with torch 2.13: "result
  type Float can't be cast to ... Int" -- so this is an extension, not a
  divergence.) ``AVG`` on bool is refused. The sum of a narrow dtype is
  taken in a wider one (:func:`avg_accumulator`: integers of up to 32 bits in
  64, float16 in float32, bfloat16 in float64), so an average that fits its dtype is
  what it gets (four int8 ranks of 100 average to 100, not a wrapped sum
  divided); 64-bit integers, float32/float64 and complex sum in their own
  dtype.

Integer overflow wraps around silently, as in torch; floating-point overflow
gives inf without a warning.

bfloat16 and the float8 types come from ``ml_dtypes`` (numpy has none of its
own; numpy reports their kind as ``"V"``): they reduce as floats, in their own
precision (as torch does for bfloat16).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import UnsupportedReduceOpError

__all__ = [
    "ReduceOp",
    "PremulSum",
    "make_premul_sum",
    "avg_accumulator",
    "reduce_op",
    "Combiner",
    "check_op_dtype",
    "combiner",
    "reduce_into",
    "finish_avg",
]


class ReduceOp(enum.Enum):
    """The reduction applied by all_reduce, reduce and reduce_scatter."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    # Enum hashes members by name in Python code; members are singletons compared by
    # identity, so the object hash (in C) is as good and keeps the per-call table and
    # cache lookups of every reduction cheap.
    __hash__ = object.__hash__


reduce_op = ReduceOp
"""torch's deprecated spelling of :class:`ReduceOp` (``torch.distributed.reduce_op``)."""


class PremulSum:
    """``ReduceOp.PREMUL_SUM`` with its factor: every rank multiplies its input by ``factor``, then the inputs are summed.

    Made by :func:`make_premul_sum` (torch's ``_make_nccl_premul_sum(factor)``).
    Each rank may pass its own factor (as with NCCL); the operation is matched
    across ranks by its name, not its factor. Floating-point and complex
    arrays only. ``ReduceOp.PREMUL_SUM`` itself has no factor and is refused.
    """

    __slots__ = ("factor",)
    name = "PREMUL_SUM"

    def __init__(self, factor: float | None) -> None:
        self.factor = factor

    def __repr__(self) -> str:
        return "ReduceOp.PREMUL_SUM" if self.factor is None else f"PremulSum({self.factor!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is PremulSum and other.factor == self.factor

    def __hash__(self) -> int:
        return hash(("PREMUL_SUM", self.factor))


def make_premul_sum(factor: Any) -> PremulSum:
    """torch's ``_make_nccl_premul_sum(factor)``: SUM of every rank's input multiplied by ``factor`` (a number, or a
    one-element array or tensor)."""
    try:
        value = float(factor)
    except (TypeError, ValueError):
        raise TypeError(f"the PREMUL_SUM factor must be a number or a one-element array, not {factor!r}") from None
    return PremulSum(value)


_make_nccl_premul_sum = make_premul_sum  # (torch's name)

ReduceOp.PREMUL_SUM = PremulSum(None)  # type: ignore[attr-defined]  # (not a member: iterating ReduceOp skips it)


def premultiply(op: PremulSum, flat: np.ndarray, *, in_place: bool) -> np.ndarray:
    """``flat`` times ``op``'s factor (into ``flat`` itself if ``in_place``, else a new array); refuses what it cannot scale."""
    if op.factor is None:
        raise UnsupportedReduceOpError(
            "ReduceOp.PREMUL_SUM needs a factor: pass aiodist._make_nccl_premul_sum(factor)", op="PREMUL_SUM",
            dtype=flat.dtype.name,
        )
    if dtype_kind(flat.dtype) not in "fc":
        raise UnsupportedReduceOpError(
            f"ReduceOp.PREMUL_SUM is not defined for dtype {flat.dtype.name}; it applies to: floating, complex",
            op="PREMUL_SUM", dtype=flat.dtype.name,
        )
    factor = op.factor
    if dtype_kind(flat.dtype) == "c" and not np.iscomplexobj(factor):  # a real factor scales each component
        scaled = flat if in_place else flat.copy()
        _componentwise(np.multiply, scaled, factor)
        return scaled
    with np.errstate(all="ignore"):
        if in_place:
            np.multiply(flat, np.asarray(factor, dtype=flat.dtype), out=flat)
            return flat
        result: np.ndarray = np.multiply(flat, np.asarray(factor, dtype=flat.dtype))
        return result


Combiner = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""``combine(out, a, b)`` writes ``a op b`` into ``out`` (which may be ``a`` or ``b``)."""

_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex

# op -> (ufunc for numbers, ufunc for bool or None if refused, kinds allowed)
_TABLE: dict[ReduceOp, tuple[np.ufunc, np.ufunc | None, frozenset[str]]] = {
    ReduceOp.SUM: (np.add, np.logical_or, frozenset("biufc")),
    ReduceOp.AVG: (np.add, None, frozenset("iufc")),
    ReduceOp.PRODUCT: (np.multiply, np.logical_and, frozenset("biufc")),
    ReduceOp.MIN: (np.minimum, np.minimum, frozenset("biuf")),
    ReduceOp.MAX: (np.maximum, np.maximum, frozenset("biuf")),
    ReduceOp.BAND: (np.bitwise_and, np.bitwise_and, frozenset("biu")),
    ReduceOp.BOR: (np.bitwise_or, np.bitwise_or, frozenset("biu")),
    ReduceOp.BXOR: (np.bitwise_xor, np.bitwise_xor, frozenset("biu")),
}

_KIND_NAMES = {"b": "bool", "i": "signed integer", "u": "unsigned integer", "f": "floating", "c": "complex"}

_ML_FLOATS = frozenset(
    ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
     "float8_e3m4", "float8_e4m3", "float8_e8m0fnu")
)


def dtype_kind(dt: np.dtype[Any]) -> str:
    """numpy's ``dtype.kind``, with ``"f"`` for ml_dtypes' floats (bfloat16, float8...), which numpy calls ``"V"``."""
    kind = dt.kind
    if kind == "V" and dt.name in _ML_FLOATS:
        return "f"
    return kind


def _coerce_op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if type(op) is PremulSum or (isinstance(op, str) and op.upper() == "PREMUL_SUM"):
        raise UnsupportedReduceOpError(
            f"{op!r}: PREMUL_SUM is applied by the group operations (all_reduce, reduce, reduce_scatter), "
            "not by the reduction kernels", op="PREMUL_SUM", dtype="?",
        )
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    # torch.distributed.ReduceOp members and look-alikes expose a name.
    name = getattr(op, "name", None)
    if isinstance(name, str) and name.upper() in ReduceOp.__members__:
        return ReduceOp[name.upper()]
    raise UnsupportedReduceOpError(
        f"{op!r} is not a reduction operator; use aiodist.ReduceOp (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)",
        op=repr(op),
        dtype="?",
    )


def check_op_dtype(op: Any, dtype: np.dtype[Any] | type | str) -> ReduceOp:
    """Validate that ``op`` applies to ``dtype``; return it as a :class:`ReduceOp`.

    Accepts a ReduceOp, its name as a string (``"sum"``) or an object with a
    matching ``.name``. Raises :class:`~aiodist.errors.UnsupportedReduceOpError`
    (a ``TypeError``) naming the operator and dtype otherwise. Pure: call it
    before any communication.
    """
    rop = _coerce_op(op)
    dt = np.dtype(dtype)
    kind = dtype_kind(dt)
    if kind not in _NUMERIC_KINDS:
        raise UnsupportedReduceOpError(
            f"cannot reduce arrays of dtype {dt.name}: collectives take numeric, bool or complex arrays",
            op=rop.name,
            dtype=dt.name,
        )
    allowed = _TABLE[rop][2]
    if kind not in allowed:
        what = ", ".join(_KIND_NAMES[k] for k in "biufc" if k in allowed)
        raise UnsupportedReduceOpError(
            f"ReduceOp.{rop.name} is not defined for dtype {dt.name} ({_KIND_NAMES[kind]}); it applies to: {what}",
            op=rop.name,
            dtype=dt.name,
        )
    return rop


@functools.lru_cache(maxsize=256)
def combiner(op: ReduceOp, dtype: np.dtype[Any]) -> Combiner:
    """The in-place binary kernel of ``op`` for ``dtype`` (validate with :func:`check_op_dtype` first).

    ``combine(out, a, b)`` computes ``a op b`` elementwise into ``out`` with one
    numpy ufunc call and no temporaries. For AVG it is the sum; divide once at
    the end with :func:`finish_avg`.
    """
    number_ufunc, bool_ufunc, _ = _TABLE[op]
    kind = dtype_kind(np.dtype(dtype))
    ufunc = bool_ufunc if kind == "b" else number_ufunc
    assert ufunc is not None
    floating = kind in "fc"

    if floating:
        return _quiet(ufunc)
    else:

        def combine(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            ufunc(a, b, out=out)

    return combine


def _quiet(ufunc: Any) -> Combiner:
    """``ufunc(a, b, out=out)`` with floating-point warnings off (overflow gives inf, silently).

    ``np.errstate`` costs about a microsecond per call, on the path of every
    small collective; with the numpy internals it is built on (a context
    variable holding the error mode) it is a set and a reset. Another numpy:
    ``np.errstate`` itself.
    """
    try:
        from numpy._core._ufunc_config import _extobj_contextvar  # type: ignore[attr-defined]  # numpy-private, not in its stubs; if absent, the except below
        from numpy._core.umath import _make_extobj

        quiet = _make_extobj(all="ignore")
    except (ImportError, AttributeError, TypeError):

        def combine(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            with np.errstate(all="ignore"):
                ufunc(a, b, out=out)

        return combine
    enter, leave = _extobj_contextvar.set, _extobj_contextvar.reset

    def combine_quietly(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        token = enter(quiet)
        try:
            ufunc(a, b, out=out)
        finally:
            leave(token)

    return combine_quietly


def reduce_into(dst: np.ndarray, src: np.ndarray, op: Any) -> None:
    """``dst = dst op src`` elementwise, in place (validates ``op`` for ``dst.dtype``).

    ``src`` must have ``dst``'s dtype and shape. For AVG this is the sum;
    use :func:`finish_avg` once all contributions are in.
    """
    rop = check_op_dtype(op, dst.dtype)
    if src.dtype != dst.dtype:
        raise UnsupportedReduceOpError(
            f"cannot reduce {src.dtype.name} into {dst.dtype.name}: dtypes must match",
            op=rop.name,
            dtype=dst.dtype.name,
        )
    combiner(rop, dst.dtype)(dst, dst, src)


def _componentwise(ufunc: np.ufunc, arr: np.ndarray, k: Any) -> None:
    """``arr = ufunc(arr, k)`` in place on the real and imaginary parts apart, ``k`` real (as torch scales a
    complex tensor): as complex numbers, ``(inf+1j) / 2`` is ``(inf+nanj)``."""
    with np.errstate(all="ignore"):
        for part in (arr.real, arr.imag):
            ufunc(part, np.asarray(k, dtype=part.dtype), out=part)


def avg_accumulator(dtype: np.dtype[Any]) -> np.dtype[Any] | None:
    """The dtype that AVG sums ``dtype`` in, when wider than ``dtype`` itself (None: its own)."""
    kind = dtype_kind(dtype)
    if kind in "iu" and dtype.itemsize < 8:
        return np.dtype(np.int64 if kind == "i" else np.uint64)
    if kind == "f" and dtype.itemsize < 4:  # float16 in float32; bfloat16 (float32's range) and ml_dtypes' float8s in float64
        return np.dtype(np.float32 if dtype == np.float16 else np.float64)
    return None


def finish_avg(arr: np.ndarray, world_size: int) -> None:
    """Divide the summed ``arr`` by ``world_size`` in place (the second half of AVG).

    Floats and complex: true division in their own dtype. Integers: division
    truncating toward zero. ``world_size == 1`` leaves ``arr`` untouched.
    """
    if world_size == 1 or arr.size == 0:
        return
    kind = dtype_kind(arr.dtype)
    if kind == "f":
        with np.errstate(all="ignore"):
            np.divide(arr, world_size, out=arr)
    elif kind == "c":  # each component by the (real) count
        _componentwise(np.divide, arr, world_size)
    elif kind == "u":
        np.floor_divide(arr, world_size, out=arr)
    elif kind == "i":
        # floor division, then step the negative non-exact quotients up by one.
        # Done without negating (which overflows at the dtype's minimum).
        remainder = np.remainder(arr, world_size)
        np.floor_divide(arr, world_size, out=arr)
        fix = remainder != 0
        np.logical_and(fix, arr < 0, out=fix)
        np.add(arr, 1, out=arr, where=fix)
    else:
        raise UnsupportedReduceOpError(
            f"ReduceOp.AVG is not defined for dtype {arr.dtype.name}", op="AVG", dtype=arr.dtype.name
        )
