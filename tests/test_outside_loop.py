"""An operation called from a worker thread is refused saying so, for real and in the simulator alike.

Before: for real, ``aiodist.all_reduce(x)`` inside ``asyncio.to_thread`` raised asyncio's bare
"no running event loop" from deep inside the runtime; in the simulator (offloaded calls run inline)
the same call ran, so the simulator passed a program that fails for real. Now both raise
``OutsideLoopError`` naming the operation, nothing is started (the group stays in step: the next
collective works), and the simulator's inline "thread" sees no running loop, as a thread does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import aiodist
import sim
from conftest import aiodist_run_source, sim_run_source

PROGRAM = '''
import asyncio
import numpy as np
import aiodist as dist

def in_a_thread(x):
    try:
        asyncio.get_running_loop()
        loop = "running"
    except RuntimeError:
        loop = "none"
    try:
        dist.all_reduce(x)
    except dist.OutsideLoopError as e:
        assert isinstance(e, RuntimeError) and e.op == "all_reduce", e
        assert "asyncio.run_coroutine_threadsafe" in str(e), e
        return loop + ",refused"
    return loop + ",started"

async def main():
    await dist.init_process_group(timeout=30)
    try:
        x = np.ones(4)
        seen = await asyncio.to_thread(in_a_thread, x)
        await dist.all_reduce(x, timeout=20)  # nothing was started: the group is in step
        assert x[0] == dist.get_world_size(), x
        print("seen", seen, flush=True)
        return seen
    finally:
        await dist.destroy_process_group()

if __name__ == "__main__":
    asyncio.run(main())
'''


def test_real_processes_refuse_an_operation_from_a_worker_thread(tmp_path: Path) -> None:
    proc = aiodist_run_source(tmp_path, PROGRAM, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("seen none,refused") == 2, proc.stdout


def test_the_simulator_refuses_it_the_same_way(tmp_path: Path) -> None:
    # Before: the inline call ran with the loop running ("running,started") and the program passed.
    assert sim_run_source(tmp_path, PROGRAM, 2, range(3)) == [["none,refused"] * 2] * 3


def test_outside_any_loop_the_error_names_the_operation() -> None:
    with pytest.raises(aiodist.OutsideLoopError) as info:
        aiodist.broadcast(np.ones(2), src=0)
    assert info.value.op == "broadcast" and "aiodist.broadcast()" in str(info.value)


def test_an_offloaded_call_still_runs_inline_and_its_result_arrives() -> None:
    async def main() -> tuple[int, float]:
        n = await asyncio.to_thread(sum, [1, 2, 3])
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await loop.run_in_executor(None, lambda: None)
        return n, loop.time() - t0

    res = sim.run(main, world_size=1, seed=0, trace=False, compute=0.5, explore=False)  # (a slow rank computes slower)
    assert res.ok and res.rank_results[0][0] == 6 and res.rank_results[0][1] == pytest.approx(0.5), res.summary()
