"""AVG sums a narrow dtype in a wider one: an average that fits its dtype is what it gets.

torch24 probe, finding 5: the int8 average of four ranks' 100 came back as -28
and the uint8 average of four 200s as 8 (the sum wrapped in the array's own
dtype before the division), silently; float16 ranks of 60000 averaged to inf.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import run_world

import aiodist.api as dist
import sim
from aiodist.collectives import intranode, intranode_ops
from aiodist.collectives.ops import avg_accumulator

CASES = [(np.int8, 100), (np.uint8, 200), (np.int16, 30000), (np.uint32, 4_000_000_000), (np.float16, 60000.0),
         (ml_dtypes.bfloat16, 3.0e38)]


def test_the_accumulators() -> None:
    assert avg_accumulator(np.dtype(np.int8)) == np.int64 and avg_accumulator(np.dtype(np.uint16)) == np.uint64
    assert avg_accumulator(np.dtype(np.float16)) == np.float32
    assert avg_accumulator(np.dtype(ml_dtypes.bfloat16)) == np.float64  # (float32's range: its sum needs more)
    for wide in (np.int64, np.uint64, np.float32, np.float64, np.complex64):
        assert avg_accumulator(np.dtype(wide)) is None


async def _averages(n: int) -> list[Any]:
    p, rank = dist.get_world_size(), dist.get_rank()
    out = []
    for dtype, v in CASES:
        x = np.full(n * p, v, dtype=dtype)
        await dist.all_reduce(x, op=dist.ReduceOp.AVG)
        r = np.full(n, v, dtype=dtype)
        await dist.reduce(r, dst=1, op=dist.ReduceOp.AVG)
        s = np.zeros(n, dtype=dtype)
        await dist.reduce_scatter_tensor(s, np.full(n * p, v, dtype=dtype), op=dist.ReduceOp.AVG)
        ok = [bool(np.all(x == np.asarray(v, dtype))), rank != 1 or bool(np.all(r == np.asarray(v, dtype))),
              bool(np.all(s == np.asarray(v, dtype)))]
        out.append((np.dtype(dtype).name, ok))
    return out


@pytest.mark.parametrize("n", [4, 1 << 14])
async def test_avg_of_values_that_fit_is_exact_over_tcp_and_shared_memory(n: int, monkeypatch: Any) -> None:
    for mod, name, value in ((intranode, "ENGINE_MIN_BYTES", 16 << 10), (intranode, "ENGINE_MIN_BYTES_MANY", 16 << 10),
                             (intranode, "ROUND_BYTES", 64 << 10), (intranode_ops, "ROUND_BYTES", 64 << 10)):
        monkeypatch.setattr(mod, name, value)  # (the big case goes through the shared-memory engine)
    results = await run_world(4, lambda pg: _averages(n))
    for per_rank in results:
        for name, ok in per_rank:
            assert ok == [True, True, True], (name, ok)


def test_avg_of_values_that_fit_is_exact_in_the_simulator() -> None:
    async def main() -> Any:
        await dist.init_process_group()
        got = await _averages(4)
        await dist.destroy_process_group()
        return got

    res = sim.run(main, world_size=4, seed=0)
    assert res.ok, res.summary()
    for per_rank in res.rank_results:
        for name, ok in per_rank:
            assert ok == [True, True, True], (name, ok)
