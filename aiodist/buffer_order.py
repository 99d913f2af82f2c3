"""Collectives of one group whose arrays overlap run in call order.

Several collectives may be in flight at once (call order defines matching),
but two in flight on the same memory (``h1 = all_reduce(x); h2 =
all_reduce(x)``, or an all_to_all of views of ``x`` issued while ``x`` is
being reduced) would read and write it at the same time: each rank would
get some mix of the two, a different one on each rank. So a collective
whose arrays overlap those of an earlier one of its group still in flight
starts only once that one ended (whatever its outcome), which is the order
torch's stream-ordered backends give. Collectives on separate memory still
run at once. The memory looked at is what the group method was called with
(:func:`memory_of`: arrays, buffers, CPU tensors, in lists of lists); for
the object collectives, whose objects are not walked (there may be very
many), the numpy arrays among their arguments and in their lists
(:func:`arrays_of`). Overlap is decided by :func:`numpy.shares_memory`,
within a bounded amount of work (past it, the arrays count as overlapping).

Every member orders its own collectives the same way (they are called in
the same order on every member), so waiting for an earlier collective of
the same group cannot deadlock. Collectives of different groups are not
ordered (two ranks may call them in different orders: waiting could
deadlock); one on memory that a collective of another group of the same
rank still works on is warned of instead (:func:`elsewhere`), once per
pair of groups.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .collectives.buffers import memory_view
from .context import rank_scope

__all__ = ["HeldArrays", "arrays_of", "elsewhere", "memory_of", "register", "wait_for_earlier"]

_MAX_WORK = 1000
"""numpy.shares_memory's bound on the work of deciding an overlap (strided views); past it: overlapping."""


def memory_of(objects: Sequence[Any], *, depth: int = 4) -> tuple[np.ndarray, ...]:
    """The memory a collective's caller handed it: numpy views of the arrays, buffers (``memoryview``,
    ``bytearray``) and CPU tensors among ``objects``, in lists and tuples up to ``depth`` levels (the
    coalesced operations' lists of lists). Other values (ranks, ops, ``None``) are skipped."""
    out: list[np.ndarray] = []
    _walk(objects, depth, out)
    return tuple(out)


_NOT_MEMORY = (int, float, complex, str, bytes, enum.Enum)


def _walk(obj: Any, level: int, out: list[np.ndarray]) -> None:
    """(:func:`memory_of`'s; a function of the module: a nested one calling itself would be a reference cycle
    holding the arrays until the garbage collector's next pass, and shared arrays' memory with them)"""
    if isinstance(obj, np.ndarray):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        if level > 0:
            for item in obj:
                _walk(item, level - 1, out)
    elif obj is not None and not isinstance(obj, _NOT_MEMORY):
        view = memory_view(obj)
        if view is not None:
            out.append(view)


def arrays_of(args: Sequence[Any]) -> tuple[np.ndarray, ...]:
    """The numpy arrays among ``args`` and in the lists and tuples among them (one level)."""
    out: list[np.ndarray] = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [x for x in a if isinstance(x, np.ndarray)]
    return tuple(out)


def _span(a: np.ndarray) -> tuple[int, int]:
    """The bytes ``a`` touches, as ``[lo, hi)`` addresses (a non-empty array)."""
    data: int = a.__array_interface__["data"][0]
    if a.flags.c_contiguous:
        return data, data + a.nbytes
    lo = hi = data
    for n, stride in zip(a.shape, a.strides):
        extent = (n - 1) * stride
        if extent < 0:
            lo += extent
        else:
            hi += extent
    return lo, hi + a.itemsize


def _lattice(a: np.ndarray, lo: int) -> tuple[int, int, int] | None:
    """``(period, residue, width)`` when every byte of ``a`` lies in ``lo + k * period + [0, width)`` for
    some ``k`` with ``width < period`` — a column ``m[:, j]``, a block of columns, ``z[::2]``: then modulo
    the period its bytes are within ``[residue, residue + width)``, and two arrays of one period whose
    such intervals do not meet share no byte. None for contiguous memory and for other strides."""
    if a.flags.c_contiguous:
        return None
    period = outer = 0  # the largest step so far, and its dimension's extent
    inner = a.itemsize  # the bytes the other dimensions span
    for n, stride in zip(a.shape, a.strides):
        if n > 1:
            step = abs(stride)
            extent = (n - 1) * step
            if step > period:
                inner += outer  # (the outer dimension so far is an inner one now)
                period, outer = step, extent
            else:
                inner += extent
    if period == 0 or inner >= period:
        return None
    return period, lo % period, inner


def _meets(r1: int, w1: int, r2: int, w2: int, period: int) -> bool:
    """Whether ``[r1, r1 + w1)`` and ``[r2, r2 + w2)`` meet modulo ``period``."""
    d = (r2 - r1) % period
    return d < w1 or d > period - w2


def _shares(x: np.ndarray, y: np.ndarray) -> bool:
    try:
        return bool(np.shares_memory(x, y, max_work=_MAX_WORK))  # type: ignore[arg-type]  # (a bound: documented, not in the stubs)
    except RuntimeError:  # (numpy's TooHardError: the bound was reached)
        return True


class _Lattices:
    """The held arrays of one period (see :func:`_lattice`), sorted by residue: the arrays of that period
    that may overlap a new one of the same period are found by a bisection, not by a look at each (2,000
    columns of one matrix in flight at once)."""

    __slots__ = ("period", "entries", "widest", "lo", "hi")

    def __init__(self, period: int) -> None:
        self.period = period
        self.entries: list[tuple[int, int, int, int, int]] = []  # (residue, seq, width, lo, hi), sorted
        self.widest = 0  # the widest width held since the last time none was
        self.lo = self.hi = 0  # the bytes every entry held since then lies in, [lo, hi)

    def add(self, entry: tuple[int, int, int, int, int]) -> None:
        if not self.entries:
            self.widest, self.lo, self.hi = 0, entry[3], entry[4]
        bisect.insort(self.entries, entry)
        self.widest = max(self.widest, entry[2])
        self.lo, self.hi = min(self.lo, entry[3]), max(self.hi, entry[4])

    def remove(self, entry: tuple[int, int, int, int, int]) -> None:
        del self.entries[bisect.bisect_left(self.entries, entry)]

    def near(self, residue: int, width: int) -> list[tuple[int, int, int, int, int]]:
        """The entries whose residue interval may meet ``[residue, residue + width)``."""
        entries, period = self.entries, self.period
        first = residue - self.widest + 1  # (an entry starting here or later may reach ``residue``)
        last = residue + width  # (... and one starting before this)
        if last - first >= period:
            return entries
        first %= period
        last %= period
        if first < last:
            return entries[bisect.bisect_left(entries, (first,)):bisect.bisect_left(entries, (last,))]
        return entries[bisect.bisect_left(entries, (first,)):] + entries[:bisect.bisect_left(entries, (last,))]


class HeldArrays:
    """The arrays of a group's collectives in flight on this rank, by sequence number.

    Their spans of memory are kept sorted, so that finding those a new array may overlap takes a bisection,
    not a look at every array in flight (a step that issues hundreds of bucket all_reduces at once). Strided
    arrays whose bytes repeat with a period (columns of a matrix, :func:`_lattice`) are kept apart, per
    period, sorted by where in the period they lie: their spans cover the whole matrix, so a bisection over
    spans would rule none of them out.
    """

    __slots__ = ("name", "_held", "_spans", "_widest", "_lattices", "_ops", "__weakref__")

    def __init__(self, name: str = "") -> None:
        self.name = name  # (the group's, for warnings)
        # seq -> (arrays, where each is kept: (0, (lo, hi, seq)) or (period, lattice entry), task)
        self._held: dict[int, tuple[tuple[np.ndarray, ...], tuple[tuple[int, Any], ...], asyncio.Future[Any]]] = {}
        self._spans: list[tuple[int, int, int]] = []  # (lo, hi, seq), sorted: the arrays with no period
        self._widest = 0  # the widest span held since the last time none was (bounds the bisection's reach)
        self._lattices: dict[int, _Lattices] = {}  # period -> the arrays of that period
        self._ops: dict[int, str] = {}  # seq -> the operation's name

    def __repr__(self) -> str:
        return f"<HeldArrays {self.name} seqs={list(self._held)}>"

    def __bool__(self) -> bool:
        """Whether a collective is in flight on some memory."""
        return bool(self._held)

    def task(self, seq: int) -> asyncio.Future[Any]:
        """The task of collective ``seq`` (held)."""
        return self._held[seq][2]

    def describe(self, seq: int) -> str:
        return f"{self._ops.get(seq, 'a collective')} (seq {seq}) of {self.name}"

    def earlier(self, arrays: tuple[np.ndarray, ...]) -> tuple[asyncio.Future[Any], ...]:
        """The collectives in flight whose arrays overlap ``arrays``: the new one waits for them to end."""
        return tuple(self._held[seq][2] for seq in self.overlapping(arrays))

    def overlapping(self, arrays: tuple[np.ndarray, ...]) -> list[int]:
        """The sequence numbers of the collectives in flight whose arrays overlap ``arrays``, in order."""
        if not arrays or not self._held:
            return []
        spans = self._spans
        found: dict[int, None] = {}
        for x in arrays:
            if x.size == 0:
                continue
            lo, hi = _span(x)
            if spans:
                first = bisect.bisect_left(spans, (lo - self._widest,))
                last = bisect.bisect_left(spans, (hi,))
                for k in range(first, last):
                    held_lo, held_hi, seq = spans[k]
                    if held_hi > lo and seq not in found and self._shares_with(x, seq):
                        found[seq] = None
            if self._lattices:
                self._lattice_overlaps(x, lo, hi, found)
        return sorted(found)

    def _lattice_overlaps(self, x: np.ndarray, lo: int, hi: int, found: dict[int, None]) -> None:
        mine = _lattice(x, lo)
        for period, group in self._lattices.items():
            if group.hi <= lo or group.lo >= hi:
                continue  # (nothing held of this period lies where ``x`` does)
            if mine is not None and mine[0] == period:
                _, residue, width = mine
                for r, seq, w, held_lo, held_hi in group.near(residue, width):
                    if (held_hi > lo and held_lo < hi and seq not in found and _meets(residue, width, r, w, period)
                            and self._shares_with(x, seq)):
                        found[seq] = None
            else:
                for r, seq, w, held_lo, held_hi in group.entries:
                    if held_hi > lo and held_lo < hi and seq not in found and self._shares_with(x, seq):
                        found[seq] = None

    def _shares_with(self, x: np.ndarray, seq: int) -> bool:
        return any(_shares(x, y) for y in self._held[seq][0])

    def hold(self, seq: int, arrays: tuple[np.ndarray, ...], task: asyncio.Future[Any], op: str = "") -> None:
        """Collective ``seq`` (``op``, run by ``task``) is in flight on ``arrays``."""
        arrays = tuple(a for a in arrays if a.size)
        if not arrays:
            return
        kept: list[tuple[int, Any]] = []
        for a in arrays:
            lo, hi = _span(a)
            lattice = _lattice(a, lo)
            if lattice is None:
                entry: Any = (lo, hi, seq)
                bisect.insort(self._spans, entry)
                self._widest = max(self._widest, hi - lo)
                kept.append((0, entry))
            else:
                period, residue, width = lattice
                entry = (residue, seq, width, lo, hi)
                group = self._lattices.get(period)
                if group is None:
                    group = self._lattices[period] = _Lattices(period)
                group.add(entry)
                kept.append((period, entry))
        self._held[seq] = (arrays, tuple(kept), task)
        self._ops[seq] = op

    def release(self, seq: int) -> None:
        """Collective ``seq`` ended (idempotent)."""
        held = self._held.pop(seq, None)
        if held is None:
            return
        del self._ops[seq]
        for period, entry in held[1]:
            if period == 0:
                del self._spans[bisect.bisect_left(self._spans, entry)]
            else:
                group = self._lattices[period]
                group.remove(entry)
                if not group.entries:
                    del self._lattices[period]
        if not self._spans:
            self._widest = 0


def register(held: HeldArrays) -> None:
    """``held`` is a group's of the calling rank (see :func:`elsewhere`)."""
    _rank_groups().append(weakref.ref(held))


def _rank_groups() -> list[weakref.ref[HeldArrays]]:
    groups: list[weakref.ref[HeldArrays]] = rank_scope().setdefault("buffer_order", [])
    return groups


def elsewhere(held: HeldArrays, arrays: tuple[np.ndarray, ...]) -> list[tuple[HeldArrays, int]]:
    """The collectives of other groups of this rank, still in flight, whose arrays overlap ``arrays`` (not
    waited for: see the module doc): (that group's arrays, the first such seq), per group."""
    found: list[tuple[HeldArrays, int]] = []
    if not arrays:
        return found
    refs = _rank_groups()
    for ref in list(refs):
        other = ref()
        if other is None:
            refs.remove(ref)
        elif other is not held and other:
            seqs = other.overlapping(arrays)
            if seqs:
                found.append((other, seqs[0]))
    return found


async def wait_for_earlier(earlier: tuple[asyncio.Future[Any], ...]) -> None:
    """Wait until every collective of ``earlier`` has ended, whatever its outcome (they are not cancelled
    when this wait is)."""
    await asyncio.wait(earlier)
