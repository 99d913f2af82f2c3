"""The collective drivers, run as p in-process ranks over the in-memory Channel.

Messages are delivered after a seeded random number of event-loop turns, so
receives are posted before or after arrival and messages overtake each other.
Every run also checks that no message was left unreceived.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiodist.collectives import (
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    tuning,
)
from aiodist.collectives.memory import MemoryChannel, MemoryFabric
from aiodist.errors import CollectiveMismatchError, InvalidArrayError, InvalidRankError, UnsupportedReduceOpError

PS = [1, 2, 3, 4, 5, 7, 8, 13]


async def run_ranks(
    p: int,
    fn: Callable[[MemoryChannel], Awaitable[Any]],
    *,
    seed: int = 0,
    timeout: float = 20.0,
    eager_limit: int | None = None,
) -> tuple[list[Any], MemoryFabric]:
    fabric = MemoryFabric(p, rng=random.Random(seed), eager_limit=eager_limit)
    async with asyncio.timeout(timeout):
        results = await asyncio.gather(*[fn(ch) for ch in fabric.channels()])
    assert fabric.undelivered() == []
    return list(results), fabric


# ------------------------------------------------------------------ data and references


def make_input(dtype: str, op: ReduceOp, n: int, rank: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n])
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if op is ReduceOp.PRODUCT:
        if kind in "iu":
            return rng.integers(1 if kind == "u" else -2, 3, n).astype(dtype)
        vals = rng.uniform(0.75, 1.25, n)
    elif kind == "u":
        return rng.integers(0, 10, n).astype(dtype)
    elif kind == "i":
        return rng.integers(-9, 10, n).astype(dtype)
    else:
        vals = rng.standard_normal(n)
    if kind == "c":
        vals = vals + 1j * rng.standard_normal(n)
    return vals.astype(dtype)


def reference(op: ReduceOp, inputs: list[np.ndarray]) -> np.ndarray:
    """The reduction computed in float64/complex128/int64 (exact for the small integers used)."""
    dt = inputs[0].dtype
    kind = dt.kind
    if kind == "b":
        stack = np.stack(inputs)
        fn = {
            ReduceOp.SUM: np.any,
            ReduceOp.MAX: np.any,
            ReduceOp.BOR: np.any,
            ReduceOp.PRODUCT: np.all,
            ReduceOp.MIN: np.all,
            ReduceOp.BAND: np.all,
        }.get(op)
        if fn is not None:
            return fn(stack, axis=0)
        assert op is ReduceOp.BXOR
        return np.bitwise_xor.reduce(stack, axis=0)
    wide = np.int64 if kind in "iu" else (np.complex128 if kind == "c" else np.float64)
    stack = np.stack([x.astype(wide) for x in inputs])
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        out = stack.sum(axis=0)
        if op is ReduceOp.AVG:
            p = len(inputs)
            out = (np.sign(out) * (np.abs(out) // p)) if kind in "iu" else out / p
    elif op is ReduceOp.PRODUCT:
        out = stack.prod(axis=0)
    elif op is ReduceOp.MIN:
        out = stack.min(axis=0)
    elif op is ReduceOp.MAX:
        out = stack.max(axis=0)
    else:
        ufunc = {ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}[op]
        out = ufunc.reduce(stack, axis=0)
    return out


def assert_close(got: np.ndarray, want: np.ndarray, op: ReduceOp) -> None:
    kind = got.dtype.kind
    if kind in "biu" or op in (ReduceOp.MIN, ReduceOp.MAX):
        np.testing.assert_array_equal(got, want.astype(got.dtype))
        return
    rtol = {2: 2e-2, 4: 1e-4, 8: 1e-10, 16: 1e-10}[got.dtype.itemsize if kind == "f" else got.dtype.itemsize // 2]
    np.testing.assert_allclose(got.astype(want.dtype), want, rtol=rtol, atol=rtol * 4)


def assert_same_bits(arrays: list[np.ndarray]) -> None:
    first = arrays[0].view(np.uint8)
    for r, a in enumerate(arrays[1:], start=1):
        assert np.array_equal(a.view(np.uint8), first), f"rank {r} differs from rank 0 in its bits"


DTYPE_OPS = [
    (dt, op)
    for dt in ["float32", "float64", "float16", "int32", "int64", "uint8", "bool", "complex64"]
    for op in ReduceOp
    if not (dt == "bool" and op is ReduceOp.AVG)
    and not (dt == "complex64" and op in (ReduceOp.MIN, ReduceOp.MAX))
    and not (np.dtype(dt).kind in "fc" and op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR))
]


# ------------------------------------------------------------------ all_reduce


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner", "ring"])
async def test_all_reduce_each_algorithm_any_p_any_size(p: int, algorithm: str) -> None:
    for n in (0, 1, 2, p - 1, p + 1, 37, 257):
        inputs = [make_input("float64", ReduceOp.SUM, n, r) for r in range(p)]
        arrays = [x.copy() for x in inputs]

        async def body(ch: MemoryChannel) -> None:
            out = await all_reduce(ch, 5, arrays[ch.rank], ReduceOp.SUM, algorithm=algorithm, block_bytes=48, lanes=3)
            assert out is arrays[ch.rank]

        await run_ranks(p, body, seed=n)
        assert_close(arrays[0], reference(ReduceOp.SUM, inputs), ReduceOp.SUM)
        assert_same_bits(arrays)


@pytest.mark.parametrize("p", [3, 4, 5])
@pytest.mark.parametrize("dtype,op", DTYPE_OPS)
async def test_all_reduce_dtypes_and_ops(p: int, dtype: str, op: ReduceOp) -> None:
    for algorithm, n in (("recursive_doubling", 11), ("rabenseifner", 23), ("ring", 50)):
        inputs = [make_input(dtype, op, n, r, seed=p) for r in range(p)]
        arrays = [x.copy() for x in inputs]
        await run_ranks(
            p, lambda ch: all_reduce(ch, 1, arrays[ch.rank], op, algorithm=algorithm, block_bytes=32), seed=p
        )
        assert_close(arrays[0], reference(op, inputs), op)
        assert_same_bits(arrays)


@pytest.mark.parametrize("p", [2, 3, 8])
@pytest.mark.parametrize(
    "nbytes",
    [4, tuning.ALLREDUCE_RD_MAX_BYTES, tuning.ALLREDUCE_RD_MAX_BYTES + 4, tuning.ALLREDUCE_RING_MIN_BYTES + 12],
)
async def test_all_reduce_default_selection_across_thresholds(p: int, nbytes: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(tuning, "RING_BLOCK_BYTES", 64 * 1024)  # several pipelined segments
    n = nbytes // 4
    inputs = [make_input("float32", ReduceOp.SUM, n, r) for r in range(p)]
    arrays = [x.copy() for x in inputs]
    await run_ranks(p, lambda ch: all_reduce(ch, 0, arrays[ch.rank]))
    assert_close(arrays[0], reference(ReduceOp.SUM, inputs), ReduceOp.SUM)
    assert_same_bits(arrays)


async def test_all_reduce_keeps_shape_and_works_on_2d() -> None:
    arrays = [np.full((3, 4), r + 1, dtype=np.int32) for r in range(3)]
    await run_ranks(3, lambda ch: all_reduce(ch, 0, arrays[ch.rank], ReduceOp.MAX))
    for a in arrays:
        assert a.shape == (3, 4) and (a == 3).all()


@pytest.mark.parametrize(
    "p,algorithm,expected",
    [
        (2, "recursive_doubling", [1, 1]),  # one exchange
        (4, "recursive_doubling", [2] * 4),  # lg p
        (3, "recursive_doubling", [1, 2, 1]),  # 0 folds into 1; 1 and 2 exchange; 1 unfolds to 0
        (4, "rabenseifner", [4] * 4),  # 2 lg p
        (4, "ring", [6] * 4),  # 2 (p - 1) per segment
    ],
)
async def test_all_reduce_message_counts_match_the_schedules(p: int, algorithm: str, expected: list[int]) -> None:
    arrays = [np.ones(64, np.float32) for _ in range(p)]
    _, fabric = await run_ranks(p, lambda ch: all_reduce(ch, 0, arrays[ch.rank], algorithm=algorithm))
    assert fabric.messages == expected


async def test_all_reduce_ring_segments_bound_message_size() -> None:
    p, n = 3, 3000
    arrays = [np.ones(n, np.float64) for _ in range(p)]
    block = 800  # bytes: 100 float64 per message at most
    _, fabric = await run_ranks(p, lambda ch: all_reduce(ch, 0, arrays[ch.rank], algorithm="ring", block_bytes=block))
    nseg = -(-n // (100 * p))
    assert fabric.messages == [2 * (p - 1) * nseg] * p
    assert all((a == p).all() for a in arrays)


async def test_all_reduce_p1_avg_no_communication() -> None:
    a = np.array([3, -3, 7], np.int16)
    _, fabric = await run_ranks(1, lambda ch: all_reduce(ch, 0, a, ReduceOp.AVG))
    np.testing.assert_array_equal(a, [3, -3, 7])
    assert fabric.messages == [0]


@pytest.mark.parametrize("seed", range(6))
async def test_concurrent_collectives_started_in_different_orders(seed: int) -> None:
    p = 5
    a = [np.full(300, r, np.int64) for r in range(p)]
    b = [np.full(7, 10 * r, np.int64) for r in range(p)]
    c = [np.zeros(4, np.float32) if r else np.arange(4, dtype=np.float32) for r in range(p)]

    async def body(ch: MemoryChannel) -> None:
        r = ch.rank
        ops = [
            all_reduce(ch, 1, a[r], algorithm="ring", block_bytes=64),
            all_reduce(ch, 2, b[r], ReduceOp.MAX),
            broadcast(ch, 3, c[r], 0),
        ]
        rnd = random.Random(seed * 100 + r)
        rnd.shuffle(ops)
        await asyncio.gather(*ops)

    await run_ranks(p, body, seed=seed)
    assert all((x == sum(range(p))).all() for x in a)
    assert all((x == 10 * (p - 1)).all() for x in b)
    assert all((x == np.arange(4)).all() for x in c)


# ------------------------------------------------------------------ errors before communication


async def test_bad_op_dtype_raises_before_any_message() -> None:
    arrays = [np.ones(8, np.float32) for _ in range(3)]
    fabric = MemoryFabric(3)
    chs = fabric.channels()
    for ch in chs:
        with pytest.raises(UnsupportedReduceOpError, match="BXOR"):
            await all_reduce(ch, 0, arrays[ch.rank], ReduceOp.BXOR)
        with pytest.raises(UnsupportedReduceOpError):
            await reduce(ch, 1, arrays[ch.rank], 0, ReduceOp.BAND)
        with pytest.raises(UnsupportedReduceOpError):
            await reduce_scatter_tensor(ch, 2, np.ones(1, np.complex64), np.ones(3, np.complex64), ReduceOp.MAX)
    assert fabric.messages == [0, 0, 0]


async def test_bad_arrays_raise_before_any_message() -> None:
    fabric = MemoryFabric(2)
    ch = fabric.channel(0)
    strided = np.ones((4, 4), np.float32)[:, ::2]
    with pytest.raises(InvalidArrayError, match="contiguous") as info:
        await all_reduce(ch, 0, strided)
    assert isinstance(info.value, ValueError) and info.value.reason == "not_contiguous"
    with pytest.raises(InvalidArrayError, match="contiguous"):
        await all_reduce(ch, 0, np.ones((4, 4), np.float32).T)
    ro = np.ones(4)
    ro.flags.writeable = False
    with pytest.raises(InvalidArrayError, match="read-only"):
        await all_reduce(ch, 0, ro)
    with pytest.raises(InvalidArrayError, match="numpy array or a buffer"):
        await all_reduce(ch, 0, [1.0, 2.0])
    with pytest.raises(InvalidArrayError) as info:
        await all_gather(ch, 0, [np.zeros(3)], np.zeros(3))
    assert info.value.reason == "length"
    with pytest.raises(InvalidArrayError) as info:
        await all_gather(ch, 0, [np.zeros(3), np.zeros(2)], np.zeros(3))
    assert info.value.argument == "out_list[1]" and info.value.reason == "size"
    with pytest.raises(InvalidArrayError) as info:
        await all_gather_into_tensor(ch, 0, np.zeros(6, np.float32), np.zeros(3))
    assert info.value.reason == "dtype"
    with pytest.raises(InvalidArrayError, match="divisible"):
        await all_to_all_single(ch, 0, np.zeros(3), np.zeros(3))
    with pytest.raises(InvalidArrayError, match="summing"):
        await all_to_all_single(ch, 0, np.zeros(3), np.zeros(3), [1, 2], [1, 1])
    with pytest.raises(InvalidRankError) as rinfo:
        await broadcast(ch, 0, np.zeros(3), 2)
    assert rinfo.value.rank == 2 and rinfo.value.size == 2
    with pytest.raises(InvalidArrayError, match="list"):
        await reduce_scatter(ch, 0, np.zeros(2), np.zeros(4))
    assert fabric.messages == [0, 0]


async def test_bytearray_buffers_are_accepted_in_place() -> None:
    bufs = [bytearray([r + 1] * 5) for r in range(3)]
    await run_ranks(3, lambda ch: all_reduce(ch, 0, bufs[ch.rank]))
    assert all(b == bytearray([6] * 5) for b in bufs)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner", "ring"])
@pytest.mark.parametrize("p", [2, 3, 4])
async def test_mismatched_sizes_raise_not_corrupt(algorithm: str, p: int) -> None:
    fabric = MemoryFabric(p, rng=random.Random(1))
    arrays = [np.ones(12 if r == p - 1 else 10, np.float32) for r in range(p)]
    tasks = [asyncio.ensure_future(all_reduce(ch, 0, arrays[ch.rank], algorithm=algorithm)) for ch in fabric.channels()]
    await asyncio.wait(tasks, timeout=5.0, return_when=asyncio.FIRST_EXCEPTION)
    await asyncio.sleep(0.01)  # let the other ranks run into the error too (or block)
    done = {t for t in tasks if t.done()}
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors = [t.exception() for t in tasks if t in done]
    assert any(isinstance(e, CollectiveMismatchError) for e in errors)
    # no rank finished "successfully" with a silently wrong result
    for r, t in enumerate(tasks):
        if t in done and t.exception() is None:
            assert (arrays[r] == p).all()


# ------------------------------------------------------------------ broadcast / reduce


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("algorithm", ["binomial", "scatter_allgather"])
async def test_broadcast_any_root(p: int, algorithm: str) -> None:
    for n in (0, 1, p + 1, 100):
        for root in sorted({0, p // 2, p - 1}):
            arrays = [make_input("float32", ReduceOp.SUM, n, r) for r in range(p)]
            want = arrays[root].copy()
            await run_ranks(p, lambda ch: broadcast(ch, 3, arrays[ch.rank], root, algorithm=algorithm), seed=root)
            for a in arrays:
                np.testing.assert_array_equal(a, want)


async def test_broadcast_large_default_uses_scatter_allgather() -> None:
    p = 5
    n = tuning.BCAST_SCATTER_MIN_BYTES // 8 + 3
    arrays = [np.arange(n, dtype=np.float64) if r == 2 else np.zeros(n) for r in range(p)]
    _, fabric = await run_ranks(p, lambda ch: broadcast(ch, 0, arrays[ch.rank], 2))
    assert all((a == np.arange(n)).all() for a in arrays)
    # the root sends its p-1 blocks down the tree and one block around the ring, not p-1 whole copies
    assert fabric.bytes_sent[2] < 2 * n * 8


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("algorithm", ["binomial", "reduce_scatter_gather"])
async def test_reduce_any_root_leaves_others_untouched(p: int, algorithm: str) -> None:
    for n in (1, p + 2, 64):
        for root in sorted({0, p - 1}):
            for op, dtype in ((ReduceOp.SUM, "float64"), (ReduceOp.AVG, "int32"), (ReduceOp.BXOR, "uint8")):
                inputs = [make_input(dtype, op, n, r) for r in range(p)]
                arrays = [x.copy() for x in inputs]
                await run_ranks(p, lambda ch: reduce(ch, 0, arrays[ch.rank], root, op, algorithm=algorithm), seed=n)
                assert_close(arrays[root], reference(op, inputs), op)
                for r in range(p):
                    if r != root:
                        np.testing.assert_array_equal(arrays[r], inputs[r])


# ------------------------------------------------------------------ gather family


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "bruck", "ring"])
async def test_all_gather_both_forms(p: int, algorithm: str) -> None:
    if algorithm == "recursive_doubling" and p & (p - 1):
        pytest.skip("power of two only")
    for n in (0, 1, 5):
        inputs = [np.arange(n, dtype=np.int32) + 100 * r for r in range(p)]
        lists = [[np.full(n, -1, np.int32) for _ in range(p)] for _ in range(p)]
        tensors = [np.full((p, n), -1, np.int32) for _ in range(p)]

        async def body(ch: MemoryChannel) -> None:
            r = ch.rank
            got = await all_gather(ch, 0, lists[r], inputs[r], algorithm=algorithm)
            assert got == lists[r]
            await all_gather_into_tensor(ch, 1, tensors[r], inputs[r], algorithm=algorithm)

        await run_ranks(p, body, seed=n)
        for r in range(p):
            for i in range(p):
                np.testing.assert_array_equal(lists[r][i], inputs[i])
                np.testing.assert_array_equal(tensors[r][i], inputs[i])


async def test_all_gather_input_may_be_the_output_slice() -> None:
    p = 4
    outs = [np.zeros(p * 3, np.float32) for _ in range(p)]
    for r in range(p):
        outs[r][3 * r : 3 * r + 3] = r + 1
    await run_ranks(p, lambda ch: all_gather_into_tensor(ch, 0, outs[ch.rank], outs[ch.rank][3 * ch.rank : 3 * ch.rank + 3]))
    for o in outs:
        np.testing.assert_array_equal(o, np.repeat(np.arange(1, p + 1, dtype=np.float32), 3))


@pytest.mark.parametrize("p", [1, 2, 3, 6])
async def test_all_gather_default_selection_large(p: int) -> None:
    n = tuning.ALLGATHER_RING_MIN_BYTES // (4 * p) + 1
    inputs = [np.full(n, r, np.float32) for r in range(p)]
    outs = [np.empty(n * p, np.float32) for _ in range(p)]
    await run_ranks(p, lambda ch: all_gather_into_tensor(ch, 0, outs[ch.rank], inputs[ch.rank]))
    for o in outs:
        np.testing.assert_array_equal(o, np.repeat(np.arange(p, dtype=np.float32), n))


@pytest.mark.parametrize("p", PS)
async def test_gather_and_scatter_any_root(p: int) -> None:
    for root in sorted({0, p - 1}):
        for n in (0, 3, 20_000):  # the last one takes the concurrent path
            inputs = [np.full(n, r, np.int64) for r in range(p)]
            glist = [np.empty(n, np.int64) for _ in range(p)]
            slist = [np.full(n, 7 * i, np.int64) for i in range(p)]
            outs = [np.empty(n, np.int64) for _ in range(p)]

            async def body(ch: MemoryChannel) -> None:
                r = ch.rank
                await gather(ch, 0, inputs[r], glist if r == root else None, root)
                await scatter(ch, 1, outs[r], slist if r == root else None, root)

            await run_ranks(p, body)
            for i in range(p):
                np.testing.assert_array_equal(glist[i], inputs[i])
                np.testing.assert_array_equal(outs[i], slist[i])


# ------------------------------------------------------------------ reduce_scatter


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("algorithm", ["all_reduce", "ring"])
async def test_reduce_scatter_both_forms(p: int, algorithm: str) -> None:
    for m in (0, 1, 9):
        for op, dtype in ((ReduceOp.SUM, "float32"), (ReduceOp.AVG, "int64"), (ReduceOp.MIN, "int32")):
            inputs = [make_input(dtype, op, m * p, r, seed=m) for r in range(p)]
            keep = [x.copy() for x in inputs]
            outs1 = [np.empty(m, dtype) for _ in range(p)]
            outs2 = [np.empty(m, dtype) for _ in range(p)]

            async def body(ch: MemoryChannel) -> None:
                r = ch.rank
                in_list = [inputs[r][i * m : (i + 1) * m] for i in range(p)]
                await reduce_scatter(ch, 0, outs1[r], in_list, op, algorithm=algorithm)
                await reduce_scatter_tensor(ch, 1, outs2[r], inputs[r], op, algorithm=algorithm)

            await run_ranks(p, body, seed=m)
            want = reference(op, inputs)
            for r in range(p):
                assert_close(outs1[r], want[r * m : (r + 1) * m], op)
                assert_close(outs2[r], want[r * m : (r + 1) * m], op)
                np.testing.assert_array_equal(inputs[r], keep[r])  # inputs untouched


async def test_reduce_scatter_default_large_uses_ring() -> None:
    p = 3
    m = tuning.REDUCE_SCATTER_RING_MIN_BYTES // 8 + 5
    inputs = [np.full(m * p, r + 1.0) for r in range(p)]
    outs = [np.empty(m) for _ in range(p)]
    _, fabric = await run_ranks(p, lambda ch: reduce_scatter_tensor(ch, 0, outs[ch.rank], inputs[ch.rank]))
    assert all((o == 6.0).all() for o in outs)
    assert fabric.messages == [p - 1] * p


# ------------------------------------------------------------------ all_to_all, barrier


@pytest.mark.parametrize("p", PS)
async def test_all_to_all_lists_uneven(p: int) -> None:
    for big in (False, True):
        scale = 10_000 if big else 1
        size = [[((i + 2 * j) % 3) * scale for j in range(p)] for i in range(p)]  # rank i sends size[i][j] to j
        ins = [[np.full(size[i][j], 1000 * i + j, np.int32) for j in range(p)] for i in range(p)]
        outs = [[np.empty(size[j][i], np.int32) for j in range(p)] for i in range(p)]
        await run_ranks(p, lambda ch: all_to_all(ch, 0, outs[ch.rank], ins[ch.rank]), seed=p)
        for i in range(p):
            for j in range(p):
                np.testing.assert_array_equal(outs[i][j], ins[j][i])


@pytest.mark.parametrize("p", PS)
async def test_all_to_all_single_splits(p: int) -> None:
    rng = np.random.default_rng(p)
    split = rng.integers(0, 4, (p, p))  # rank i sends split[i][j] rows to j
    ins = [np.stack([np.arange(5) + 100 * i + j for j in range(p) for _ in range(split[i][j])]) if split[i].sum() else np.empty((0, 5)) for i in range(p)]
    ins = [x.astype(np.float32).reshape(-1, 5) for x in ins]
    outs = [np.full((int(split[:, i].sum()), 5), -1, np.float32) for i in range(p)]

    async def body(ch: MemoryChannel) -> None:
        r = ch.rank
        await all_to_all_single(ch, 0, outs[r], ins[r], list(split[:, r]), list(split[r]))

    await run_ranks(p, body)
    for i in range(p):
        want = [np.arange(5) + 100 * j + i for j in range(p) for _ in range(split[j][i])]
        np.testing.assert_array_equal(outs[i], np.array(want, np.float32).reshape(-1, 5))


async def test_all_to_all_single_even_default_and_mismatch() -> None:
    p = 4
    ins = [np.arange(8, dtype=np.int16) + 10 * r for r in range(p)]
    outs = [np.empty(8, np.int16) for _ in range(p)]
    await run_ranks(p, lambda ch: all_to_all_single(ch, 0, outs[ch.rank], ins[ch.rank]))
    for i in range(p):
        np.testing.assert_array_equal(outs[i], np.concatenate([ins[j][2 * i : 2 * i + 2] for j in range(p)]))
    # rank 0 sends rank 1 two rows, rank 1 expects one (and vice versa): errors, not garbage
    fabric = MemoryFabric(2)
    a, b = fabric.channels()
    results = await asyncio.gather(
        all_to_all_single(a, 0, np.zeros(4), np.zeros(4), [2, 2], [2, 2]),
        all_to_all_single(b, 0, np.zeros(4), np.zeros(4), [1, 3], [1, 3]),
        return_exceptions=True,
    )
    assert all(isinstance(e, CollectiveMismatchError) for e in results)
    # a rank that disagrees with itself is refused before sending
    with pytest.raises(InvalidArrayError, match="sends itself"):
        await all_to_all_single(MemoryFabric(2).channel(0), 0, np.zeros(4), np.zeros(4), [1, 3], [2, 2])


@pytest.mark.parametrize("p", PS)
async def test_barrier_releases_only_after_everyone_entered(p: int) -> None:
    entered = 0

    async def body(ch: MemoryChannel) -> None:
        nonlocal entered
        for _ in range(random.Random(ch.rank).randrange(20)):
            await asyncio.sleep(0)
        entered += 1
        await barrier(ch, 0)
        assert entered == p
        await barrier(ch, 1)  # a second barrier reuses nothing of the first

    _, fabric = await run_ranks(p, body)
    lg = max(0, (p - 1).bit_length())
    assert fabric.messages == [2 * lg] * p


async def test_barrier_waits_for_a_late_rank() -> None:
    fabric = MemoryFabric(3)
    chs = fabric.channels()
    early = [asyncio.ensure_future(barrier(ch, 0)) for ch in chs[:2]]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in early)
    await asyncio.wait_for(asyncio.gather(barrier(chs[2], 0), *early), 5)


@pytest.mark.parametrize("p", [5, 6, 8])
async def test_reduce_default_large_uses_reduce_scatter_gather(p: int) -> None:
    n = tuning.REDUCE_RS_MIN_BYTES // 8 + 3
    inputs = [np.full(n, r + 1.0) for r in range(p)]
    arrays = [x.copy() for x in inputs]
    _, fabric = await run_ranks(p, lambda ch: reduce(ch, 0, arrays[ch.rank], p - 1, ReduceOp.AVG))
    assert (arrays[p - 1] == (p + 1) / 2).all()
    for r in range(p - 1):
        np.testing.assert_array_equal(arrays[r], inputs[r])
    # ring reduce-scatter (p-1 messages of ~n/p each), then every non-root sends its block to the root
    assert fabric.messages == [p - 1 + (r != p - 1) for r in range(p)]
    assert max(fabric.bytes_sent) <= 8 * (n // p + 1) * p


async def test_tensor_like_objects_are_reduced_in_their_own_memory() -> None:
    class FakeTensor:  # what torch CPU tensors offer: a .numpy() view sharing memory
        def __init__(self, data: np.ndarray) -> None:
            self.data = data

        def numpy(self) -> np.ndarray:
            return self.data

    class GradTensor:
        def numpy(self) -> np.ndarray:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad")

    tensors = [FakeTensor(np.full(3, r, np.float32)) for r in range(3)]
    await run_ranks(3, lambda ch: all_reduce(ch, 0, tensors[ch.rank]))
    assert all((t.data == 3).all() for t in tensors)
    with pytest.raises(InvalidArrayError, match="requires grad") as info:
        await all_reduce(MemoryFabric(2).channel(0), 0, GradTensor())
    assert info.value.reason == "type"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    p=st.integers(1, 20),
    n=st.integers(0, 300),
    algorithm=st.sampled_from(["recursive_doubling", "rabenseifner", "ring"]),
    block_bytes=st.integers(8, 512),
    lanes=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_all_reduce_property(p: int, n: int, algorithm: str, block_bytes: int, lanes: int, seed: int) -> None:
    inputs = [np.random.default_rng([seed, r]).integers(-1000, 1000, n) for r in range(p)]
    arrays = [x.copy() for x in inputs]

    async def main() -> None:
        await run_ranks(
            p,
            lambda ch: all_reduce(ch, seed, arrays[ch.rank], algorithm=algorithm, block_bytes=block_bytes, lanes=lanes),
            seed=seed,
        )

    asyncio.run(main())
    want = np.sum(inputs, axis=0) if p else None
    for a in arrays:
        np.testing.assert_array_equal(a, want)


# ------------------------------------------------------------------ large messages under a rendezvous transport

EAGER = 64 * 1024  # like a socket buffer: larger sends complete only once the receive is posted


async def test_rendezvous_fabric_deadlocks_a_naive_send_then_receive() -> None:
    fabric = MemoryFabric(2, eager_limit=EAGER)
    big = memoryview(bytearray(EAGER + 1))

    async def naive(ch: MemoryChannel) -> None:
        await ch.send(1 - ch.rank, (0,), big)
        await ch.recv_into(1 - ch.rank, (0,), memoryview(bytearray(EAGER + 1)))

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await asyncio.gather(*[naive(ch) for ch in fabric.channels()])


@pytest.mark.parametrize("p", [2, 3, 4, 5])
async def test_large_collectives_do_not_deadlock_under_rendezvous(p: int) -> None:
    n = 3 * EAGER // 8 * p + 5  # every block above the eager limit
    base = [np.arange(n, dtype=np.float64) + r for r in range(p)]
    want_sum = np.sum(base, axis=0)

    async def body(ch: MemoryChannel) -> None:
        r = ch.rank
        for k, algorithm in enumerate(["recursive_doubling", "rabenseifner", "ring"]):
            x = base[r].copy()
            await all_reduce(ch, 10 + k, x, algorithm=algorithm, block_bytes=EAGER * 2)
            np.testing.assert_array_equal(x, want_sum)
        for k, algorithm in enumerate(["binomial", "scatter_allgather"]):
            x = base[r].copy()
            await broadcast(ch, 20 + k, x, p - 1, algorithm=algorithm)
            np.testing.assert_array_equal(x, base[p - 1])
        for k, algorithm in enumerate(["binomial", "reduce_scatter_gather"]):
            x = base[r].copy()
            await reduce(ch, 30 + k, x, 0, algorithm=algorithm)
            if r == 0:
                np.testing.assert_array_equal(x, want_sum)
        for k, algorithm in enumerate(["ring", "bruck"] + (["recursive_doubling"] if p & (p - 1) == 0 else [])):
            out = np.empty(n * p)
            await all_gather_into_tensor(ch, 40 + k, out, base[r], algorithm=algorithm)
            np.testing.assert_array_equal(out, np.concatenate(base))
        m = n // p
        for k, algorithm in enumerate(["ring", "all_reduce"]):
            out = np.empty(m)
            await reduce_scatter_tensor(ch, 50 + k, out, base[r][: m * p], algorithm=algorithm)
            np.testing.assert_array_equal(out, want_sum[r * m : (r + 1) * m])
        out = np.empty(m * p)
        await all_to_all_single(ch, 60, out, base[r][: m * p])
        np.testing.assert_array_equal(out, np.concatenate([base[j][r * m : (r + 1) * m] for j in range(p)]))
        glist = [np.empty(n) for _ in range(p)]
        await gather(ch, 61, base[r], glist if r == 1 else None, 1)
        x = np.empty(n)
        await scatter(ch, 62, x, [b for b in base] if r == 1 else None, 1)
        np.testing.assert_array_equal(x, base[r])

    await run_ranks(p, body, eager_limit=EAGER)


async def test_payloads_above_the_message_limit_travel_in_pieces(monkeypatch: Any) -> None:
    from aiodist.collectives import transfer

    monkeypatch.setattr(transfer, "MAX_MESSAGE_BYTES", 96)
    p, n = 3, 101  # 808 bytes: 9 pieces per whole-array message

    async def body(ch: MemoryChannel) -> None:
        r = ch.rank
        x = np.arange(n, dtype=np.float64) + r
        await all_reduce(ch, 0, x, algorithm="recursive_doubling")
        np.testing.assert_array_equal(x, 3 * np.arange(n) + 3)
        b = np.full(n, r, np.int64)
        await broadcast(ch, 1, b, 2, algorithm="binomial")
        assert (b == 2).all()
        glist = [np.empty(n) for _ in range(p)]
        await gather(ch, 2, np.full(n, float(r)), glist if r == 0 else None, 0)
        if r == 0:
            assert all((g == i).all() for i, g in enumerate(glist))
        out = np.empty(n * p, np.int32)
        await all_to_all_single(ch, 3, out, np.full(n * p, r, np.int32))
        np.testing.assert_array_equal(out.reshape(p, n), np.repeat(np.arange(p), n).reshape(p, n))

    _, chunked = await run_ranks(p, body, eager_limit=EAGER)
    # a size disagreement still fails on the first piece instead of hanging on missing pieces
    fabric = MemoryFabric(2)
    results = await asyncio.gather(
        *[broadcast(ch, 0, np.zeros(n if ch.rank == 0 else n + 20), 0) for ch in fabric.channels()],
        return_exceptions=True,
    )
    assert isinstance(results[1], CollectiveMismatchError)
    monkeypatch.setattr(transfer, "MAX_MESSAGE_BYTES", 1 << 28)
    _, whole = await run_ranks(p, body, eager_limit=EAGER)
    assert chunked.bytes_sent == whole.bytes_sent
    assert all(c > w for c, w in zip(chunked.messages, whole.messages))
