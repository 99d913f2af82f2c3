"""Every collective through the group API over real TCP, against numpy references."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist.api as dist
from aiodist.collectives.ops import ReduceOp

SIZES = [1, 2, 3, 4, 5, 8]


def data(rank: int, n: int, dtype: Any, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * salt + rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-50, 50, n).astype(dtype)


async def _all_collectives(pg: Any) -> dict[str, Any]:
    r, p = pg.rank, pg.size
    out: dict[str, Any] = {}

    x = data(r, 1001, np.float64)
    out["sum_f64"] = (await pg.all_reduce(x)).copy()
    xi = data(r, 37, np.int32, 1)
    out["sum_i32"] = (await dist.all_reduce(xi, op=ReduceOp.SUM)).copy()
    xm = data(r, 64, np.int16, 2)
    out["max_i16"] = (await pg.all_reduce(xm, ReduceOp.MAX)).copy()
    xa = data(r, 10, np.float32, 3)
    out["avg_f32"] = (await pg.all_reduce(xa, "avg")).copy()
    xb = np.array([r % 2 == 0, r == 1, True, False])
    out["bor_bool"] = (await pg.all_reduce(xb, ReduceOp.BOR)).copy()

    src = p - 1
    b = data(r, 300, np.float32, 4) if r == src else np.zeros(300, np.float32)
    out["bcast"] = (await dist.broadcast(b, src=pg.ranks[src])).copy()

    dst = p // 2
    red = data(r, 50, np.int64, 5)
    await pg.reduce(red, dst=dst, op=ReduceOp.MIN)
    if r == dst:
        out["reduce_min"] = red.copy()

    g = data(r, 20, np.uint8, 6)
    gl = [np.empty(20, np.uint8) for _ in range(p)]
    await pg.all_gather(gl, g)
    out["all_gather"] = np.stack(gl)
    big = np.empty(p * 20, np.uint8)
    await dist.all_gather_into_tensor(big, g)
    out["all_gather_into_tensor"] = big

    gathered = [np.empty(20, np.uint8) for _ in range(p)] if r == dst else None
    res = await pg.gather(g, gathered, dst=dst)
    if r == dst:
        assert res is gathered
        out["gather"] = np.stack(gathered)
    else:
        assert res is None

    sl = [np.full(5, 10 * i + 1, np.int32) for i in range(p)] if r == 0 else None
    sx = np.zeros(5, np.int32)
    await pg.scatter(sx, sl, src=0)
    out["scatter"] = sx.copy()

    inl = [data(r, 7, np.float64, 10 + i) for i in range(p)]
    rs = np.empty(7, np.float64)
    await pg.reduce_scatter(rs, inl, ReduceOp.SUM)
    out["reduce_scatter"] = rs.copy()
    rst = np.empty(3, np.int64)
    await pg.reduce_scatter_tensor(rst, np.arange(3 * p, dtype=np.int64) * (r + 1), ReduceOp.SUM)
    out["reduce_scatter_tensor"] = rst.copy()

    a2a_in = [np.full(4, 100 * r + j, np.int32) for j in range(p)]
    a2a_out = [np.empty(4, np.int32) for _ in range(p)]
    await pg.all_to_all(a2a_out, a2a_in)
    out["all_to_all"] = np.stack(a2a_out)
    single_in = np.repeat(np.arange(p, dtype=np.float32) + 10 * r, 2)
    single_out = np.empty(2 * p, np.float32)
    await pg.all_to_all_single(single_out, single_in)
    out["all_to_all_single"] = single_out.copy()
    # uneven splits: rank r sends j+1 elements to rank j
    ins = np.concatenate([np.full(j + 1, r, np.int64) for j in range(p)])
    outs = np.empty(p * (r + 1), np.int64)
    await pg.all_to_all_single(outs, ins, [r + 1] * p, [j + 1 for j in range(p)])
    out["all_to_all_uneven"] = outs.copy()

    await pg.barrier()
    await pg.monitored_barrier()
    out["objects"] = await pg.all_gather_object({"rank": r, "sq": r * r})
    lst = [f"from {r}", r] if r == 0 else [None, None]
    out["bcast_objects"] = list(await pg.broadcast_object_list(lst, src=0))
    out["gather_object"] = await pg.gather_object(("g", r), dst=dst)
    so = [None]
    await pg.scatter_object_list(so, [f"to {i}" for i in range(p)] if r == 0 else None, src=0)
    out["scatter_object"] = so[0]
    return out


def _check(results: list[dict[str, Any]]) -> None:
    p = len(results)
    dst = p // 2
    xs = [data(r, 1001, np.float64) for r in range(p)]
    for r, out in enumerate(results):
        np.testing.assert_allclose(out["sum_f64"], np.sum(xs, axis=0, dtype=np.float64), rtol=1e-12, atol=1e-12)
        assert out["sum_f64"].tobytes() == results[0]["sum_f64"].tobytes(), "ranks disagree bitwise"
        np.testing.assert_array_equal(out["sum_i32"], np.sum([data(q, 37, np.int32, 1) for q in range(p)], axis=0))
        np.testing.assert_array_equal(out["max_i16"], np.max([data(q, 64, np.int16, 2) for q in range(p)], axis=0))
        avg = np.sum([data(q, 10, np.float32, 3).astype(np.float64) for q in range(p)], axis=0) / p
        np.testing.assert_allclose(out["avg_f32"], avg, rtol=1e-5, atol=1e-6)
        assert out["avg_f32"].tobytes() == results[0]["avg_f32"].tobytes()
        np.testing.assert_array_equal(out["bor_bool"], [True, p > 1, True, False])
        np.testing.assert_array_equal(out["bcast"], data(p - 1, 300, np.float32, 4))
        expect_g = np.stack([data(q, 20, np.uint8, 6) for q in range(p)])
        np.testing.assert_array_equal(out["all_gather"], expect_g)
        np.testing.assert_array_equal(out["all_gather_into_tensor"], expect_g.reshape(-1))
        np.testing.assert_array_equal(out["scatter"], np.full(5, 10 * r + 1))
        rs = np.sum([data(q, 7, np.float64, 10 + r) for q in range(p)], axis=0)
        np.testing.assert_allclose(out["reduce_scatter"], rs, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(out["reduce_scatter_tensor"], np.arange(3 * r, 3 * r + 3) * sum(range(1, p + 1)))
        np.testing.assert_array_equal(out["all_to_all"], [np.full(4, 100 * q + r) for q in range(p)])
        np.testing.assert_array_equal(out["all_to_all_single"], np.repeat(np.arange(p) * 10 + r, 2).astype(np.float32))
        np.testing.assert_array_equal(out["all_to_all_uneven"], np.repeat(np.arange(p), r + 1))
        assert out["objects"] == [{"rank": q, "sq": q * q} for q in range(p)]
        assert out["bcast_objects"] == ["from 0", 0]
        assert out["gather_object"] == ([("g", q) for q in range(p)] if r == dst else None)
        assert out["scatter_object"] == f"to {r}"
    red = results[dst]["reduce_min"]
    np.testing.assert_array_equal(red, np.min([data(q, 50, np.int64, 5) for q in range(p)], axis=0))


@pytest.mark.parametrize("world_size", SIZES)
async def test_every_collective_matches_numpy(world_size: int) -> None:
    results = await run_world(world_size, _all_collectives, timeout=30)
    _check(results)


async def test_large_all_reduce_is_bit_identical_and_correct() -> None:
    n = 600_000  # 4.8 MB of float64: bandwidth algorithms, payloads written in place

    async def body(pg: Any) -> np.ndarray:
        x = data(pg.rank, n, np.float64, 7)
        await pg.all_reduce(x)
        return x

    results = await run_world(5, body, timeout=30)
    ref = np.sum([data(r, n, np.float64, 7) for r in range(5)], axis=0)
    for x in results:
        np.testing.assert_allclose(x, ref, rtol=1e-10, atol=1e-10)
        assert x.tobytes() == results[0].tobytes()


async def test_invalid_arguments_raise_before_communication() -> None:
    async def body(pg: Any) -> None:
        with pytest.raises(TypeError):
            pg.all_reduce(np.zeros(3), op=ReduceOp.BXOR)  # BXOR on floats
        with pytest.raises(ValueError, match="read-only"):  # (a strided array is staged: tests/test_buffers_dtypes.py)
            pg.all_reduce(np.broadcast_to(np.zeros(4), (4, 4))[:, 0])
        with pytest.raises(ValueError, match="entries"):
            pg.all_gather([np.zeros(2)], np.zeros(2))
        with pytest.raises(ValueError, match="out of range"):
            pg.broadcast(np.zeros(2), src=pg.size)
        with pytest.raises(ValueError, match="read-only"):
            ro = np.zeros(3)
            ro.flags.writeable = False
            pg.all_reduce(ro)
        with pytest.raises(ValueError, match="elements"):
            pg.all_gather_into_tensor(np.zeros(3), np.zeros(2))
        # nothing was sent: the next real collective still matches across ranks
        x = np.ones(4)
        await pg.all_reduce(x)
        assert x.tolist() == [pg.size] * 4

    await run_world(2, body)


async def test_sixteen_ranks_all_dialing_each_other_at_once() -> None:
    async def body(pg: Any) -> Any:
        out = np.empty(pg.size * 3, np.int64)
        h = pg.all_to_all_single(out, np.repeat(np.arange(pg.size) + 100 * pg.rank, 3))  # everyone to everyone
        x = pg.all_reduce(np.full(1000, pg.rank, np.float64))
        await h
        x_done = float((await x)[0])
        peers = len(pg.transport.connected_peers())
        await pg.barrier()  # nobody leaves (and says bye) before every rank has counted its peers
        return out[::3].tolist(), x_done, peers

    res = await run_world(16, body, timeout=40)
    for r, (out, x, peers) in enumerate(res):
        assert out == [100 * q + r for q in range(16)] and x == sum(range(16)) and peers == 15
