"""A collective mismatch reaches every rank under the launcher, even when the ranks that found it (the store host among them) leave at once."""

from __future__ import annotations

from pathlib import Path

from test_launcher_run import launch_source

DTYPE_MISMATCH = """
import numpy as np
import aiodist


async def main():
    pg = await aiodist.init_process_group(timeout=30)
    x = np.ones(4, np.float64 if pg.rank == 0 else np.float32)
    await aiodist.all_reduce(np.ones(4))
    try:
        await aiodist.all_reduce(x)
        await aiodist.all_reduce(x)
    except Exception as e:
        print(f"RESULT {pg.rank} {type(e).__name__}", flush=True)
        raise
"""


async def test_every_rank_of_a_dtype_mismatch_raises_it_when_the_store_host_leaves_first(tmp_path: Path) -> None:
    # Before: ranks 0 and 1 (which found it) exited at once, and a rank that only they could tell
    # (they had never talked to it) got PeerFailureError instead (2 runs of 5).
    for _ in range(4):
        run = await launch_source(tmp_path, DTYPE_MISMATCH, 4)
        results = sorted(line.split("RESULT ", 1)[1] for line in run.out.splitlines() if "RESULT " in line)
        assert results == [f"{r} CollectiveMismatchError" for r in range(4)], (run.logs, run.err[-6000:])
        assert run.result.exit_code == 1
