"""A rank that leaves the job cleanly while the others still need it: each of them learns so at once.

Also the ranks that never had a link to it (they receive from it, which does not need a link of
theirs, and a dial that finds it gone used to conclude nothing): the leaver notes its departure
in the store, and a rank that is gone refuses a dial saying so, so they fail as its ``bye`` would
have made them fail, instead of waiting out their timeout ("still waiting for rank 3").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import sim_run_source
from test_launcher_run import launch_source

EARLY_LEAVER = """
import asyncio
import numpy as np
import aiodist


async def main():
    pg = await aiodist.init_process_group(timeout=60)
    await aiodist.all_reduce(np.ones(1))
    if pg.rank == 3:
        await aiodist.destroy_process_group()
        return "left"
    start = asyncio.get_running_loop().time()
    try:
        await aiodist.barrier()
        said = "barrier passed"
    except aiodist.PeerFailureError as e:
        quick = asyncio.get_running_loop().time() - start < 10
        said = f"{type(e).__name__} left={'left the job' in str(e)} quick={quick}"
    print(f"RESULT {pg.rank} {said}", flush=True)
    await aiodist.destroy_process_group()
    return said
"""

WANT = "PeerFailureError left=True quick=True"


def test_in_the_simulator_every_rank_learns_at_once_that_a_rank_left(tmp_path: Path) -> None:
    # Before: ranks 0 and 2 waited out their 60 s timeout (seed 0: "still waiting for rank 3").
    for results in sim_run_source(tmp_path, EARLY_LEAVER, 4, range(6)):
        assert results == [WANT, WANT, WANT, "left"]


async def test_with_real_processes_every_rank_learns_at_once_that_a_rank_left(tmp_path: Path) -> None:
    run = await launch_source(tmp_path, EARLY_LEAVER, 4, on_failure="continue")
    results = sorted(line.split("RESULT ", 1)[1] for line in run.out.splitlines() if "RESULT " in line)
    if results != [f"{r} {WANT}" for r in range(3)]:
        pytest.fail(f"results {results}\nlauncher: {run.logs}\nstderr:\n{run.err}", pytrace=False)
