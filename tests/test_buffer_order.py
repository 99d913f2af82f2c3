"""Which collectives in flight a new one must wait for: overlap of their arrays (no sockets, no loop running)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from aiodist.buffer_order import HeldArrays, arrays_of


class Task:
    """A stand-in for an operation's task (only its identity matters here)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def held(*ops: tuple[int, tuple[np.ndarray, ...]]) -> tuple[HeldArrays, dict[int, Any]]:
    h = HeldArrays()
    tasks: dict[int, Any] = {}
    for seq, arrays in ops:
        tasks[seq] = Task(f"op{seq}")
        h.hold(seq, arrays, tasks[seq])
    return h, tasks


def test_the_arrays_of_an_operations_arguments() -> None:
    a, b, c = np.zeros(2), np.zeros(3), np.zeros(4)
    assert arrays_of((a, 3, [b, "x", c], (a,), {"k": b})) == (a, b, c, a)


def test_the_same_array_a_view_of_it_or_its_base_overlap_separate_slices_do_not() -> None:
    flat = np.zeros(1000, np.float32)
    h, t = held((0, (flat[:500],)), (1, (flat[500:],)))
    assert h.earlier((flat[:500],)) == (t[0],)
    assert h.earlier((flat[490:510],)) == (t[0], t[1])  # (straddles both, in seq order)
    assert h.earlier((flat,)) == (t[0], t[1])
    assert h.earlier((np.zeros(500, np.float32),)) == ()
    assert h.earlier((flat[:0],)) == ()  # (no memory)


def test_interleaved_views_share_bounds_but_not_memory() -> None:
    z = np.zeros(64)
    h, t = held((0, (z[::2],)))
    assert h.earlier((z[1::2],)) == ()
    assert h.earlier((z[2:10:4],)) == (t[0],)
    assert h.earlier((z[::-1][1::2],)) == (t[0],)  # (reversed strides: z[62], z[60]... z[0])
    assert h.earlier((z[::-1][::2],)) == ()  # (z[63], z[61]... z[1])
    m = np.zeros((8, 8))
    h2, t2 = held((0, (m[:, 0],)))  # a column
    assert h2.earlier((m[:, 1],)) == () and h2.earlier((m[3, :],)) == (t2[0],)


def test_a_wide_array_held_early_is_found_from_a_small_one_far_inside_it() -> None:
    big = np.zeros(1 << 16, np.uint8)
    h, t = held((0, (big,)), (1, (np.zeros(8),)), (2, (np.zeros(8),)))
    assert h.earlier((big[40000:40008],)) == (t[0],)


def test_released_operations_are_forgotten() -> None:
    x = np.zeros(10)
    h, t = held((0, (x,)), (1, (x[2:4], x[2:4])))  # (an array twice in one operation, as all_to_all(l, l))
    h.release(1)
    assert h.earlier((x[3:4],)) == (t[0],)
    h.release(0)
    h.release(0)  # (idempotent)
    assert h.earlier((x,)) == () and h._spans == [] and h._widest == 0


async def test_waiting_for_earlier_operations_does_not_cancel_them() -> None:
    from aiodist.buffer_order import wait_for_earlier

    ev = asyncio.Event()
    first = asyncio.ensure_future(ev.wait())
    waiter = asyncio.ensure_future(wait_for_earlier((first,)))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert not first.done()
    ev.set()
    await first


def test_columns_of_a_matrix_in_flight_are_told_apart_by_where_in_a_row_they_lie() -> None:
    m = np.zeros((16, 40), np.float32)
    h, t = held(*[(j, (m[:, j],)) for j in range(40)])
    assert h.earlier((m[:, 7],)) == (t[7],)
    assert h.earlier((m[:, 6:9],)) == (t[6], t[7], t[8])  # (a block of columns)
    assert h.earlier((m[:, 6:9].T,)) == (t[6], t[7], t[8])  # (the same bytes, dimensions swapped)
    assert h.earlier((m[2, 38:],)) == (t[38], t[39])  # (a piece of a row: another period)
    assert h.earlier((m[::-1, 39],)) == (t[39],)  # (negative strides)
    assert h.earlier((np.zeros(3),)) == ()
    h.release(7)
    assert h.earlier((m[:, 7],)) == () and h.earlier((m,)) == tuple(t[j] for j in range(40) if j != 7)
    for j in range(40):
        h.release(j)
    assert h.earlier((m,)) == () and not h and h._lattices == {}


def test_which_views_overlap_agrees_with_numpy_on_random_views() -> None:
    """Every view the bisections rule out shares no memory (exact numpy), and every one they keep does."""
    rng = np.random.default_rng(7)
    base = np.zeros((12, 10, 6), np.int16)

    def view() -> np.ndarray:
        v = base
        for axis in range(3):
            n = v.shape[axis]
            start, stop = sorted(int(i) for i in rng.integers(0, n + 1, 2))
            step = int(rng.integers(1, 4)) * (1 if rng.random() < 0.7 else -1)
            index = [slice(None)] * 3
            index[axis] = slice(start, stop, step) if step > 0 else slice(stop - 1 if stop else None, start - 1 if start else None, step)
            v = v[tuple(index)]
        if rng.random() < 0.3:
            v = v.transpose(tuple(int(i) for i in rng.permutation(3)))
        if rng.random() < 0.2 and v.ndim == 3:
            v = v[:, int(rng.integers(0, v.shape[1])) if v.shape[1] else slice(None)]
        return v

    for _ in range(40):
        views = [view() for _ in range(30)]
        h = HeldArrays()
        for seq, v in enumerate(views):
            h.hold(seq, (v,), Task(f"op{seq}"))
        for _ in range(20):
            x = view()
            want = [seq for seq, v in enumerate(views) if x.size and v.size and np.shares_memory(x, v)]
            assert h.overlapping((x,)) == want, (x.shape, x.strides)
