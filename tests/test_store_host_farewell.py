"""After the rank hosting the store leaves a broken job, the others' errors still name the ranks involved.

Before: a rank that needed the address of a peer after the store's host (rank 0) had left
following rank 2's failure got ``PeerFailureError`` with ``.rank`` None (the message named rank 2
only inside the store's closing notice); an elastic program that drops ``e.rank`` from its members
kept everyone. Now the store's closing notice carries its host's rank, the culprit and how
(``StoreConnectionLost.host_rank`` / ``.culprit`` / ``.cause``): a lookup of a peer's address that
fails so blames the culprit, and a dial of the host itself says it left after the culprit failed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

import aiodist as dist
import sim
from aiodist.store import protocol as P
from aiodist.store.client import _farewell


async def main() -> object:
    await dist.init_process_group(timeout=30)
    r = dist.get_rank()
    x = np.ones(2)
    if r == 2:
        await asyncio.sleep(100)  # crashed meanwhile
    if r == 0:  # the store's host finds rank 2 failed and leaves (its store closes, saying why)
        await asyncio.sleep(1.5)
        try:
            await dist.send(x, 2, timeout=10)
        except dist.PeerFailureError as e:
            return "left", e.rank
    await asyncio.sleep(4)  # rank 0 has left by now; ranks 1 and 3 never talked to it or to rank 2
    try:
        await dist.send(x, 2 if r == 3 else 0, timeout=10)
    except dist.PeerFailureError as e:
        return e.rank, str(e)
    return None


def test_peers_of_a_store_host_that_left_after_a_failure_are_blamed_right() -> None:
    for seed in range(3):
        res = sim.run(main, world_size=4, seed=seed, faults=[sim.Crash(2, at=1.0)], trace=False)
        assert res.ok, res.summary()
        left, r1, _, r3 = res.rank_results
        assert left == ("left", 2)
        assert r3[0] == 2 and "looking up the address of rank 2" in r3[1], r3  # before: rank None
        # before: rank None and "looking up the address of rank 0 ... failed"
        assert r1[0] == 0 and "rank 0 failed: left the job after rank 2 failed" in r1[1], r1


def test_a_closing_notice_carries_its_hosts_account_and_bad_fields_are_dropped() -> None:
    h = P.error_frame("closing", "its host, rank 0, left", host=0, culprit=2, cause="connection lost")
    assert _farewell(h) == {"host_rank": 0, "culprit": 2, "cause": "connection lost"}
    assert _farewell(P.error_frame("closing", "bye")) == {}
    assert _farewell({"h": "0", "r": 2}) == {}
    assert _farewell({"h": 1, "r": -3, "w": ["x"]}) == {"host_rank": 1, "culprit": None, "cause": None}
    assert len(_farewell({"h": 1, "w": "x" * 10_000})["cause"]) == 2000


OWN_FAILURE = '''
import asyncio
from pathlib import Path
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    r = dist.get_rank()
    await dist.barrier()
    if r == 0:
        raise ValueError("boom")  # the store's host fails on its own
    await asyncio.sleep(3)  # rank 0 is gone, and its store with it
    try:
        await dist.send(np.ones(2), 0, timeout=10)
    except dist.PeerFailureError as e:
        print(f"rank {r} sees rank {e.rank}: {e}", flush=True)
'''


def test_peers_of_a_store_host_that_failed_on_its_own_learn_its_error(tmp_path: Path) -> None:
    # Before: "send of world: looking up the address of rank 0 in the store failed (StoreConnectionLost: the
    # store server ... closed the connection)" with .rank None: the store went with its host's process.
    import os
    import subprocess
    import sys

    (tmp_path / "prog.py").write_text(OWN_FAILURE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, "-m", "aiodist", "run", "-n", "3", "--on-failure", "continue", "prog.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    for r in (1, 2):
        assert f"rank {r} sees rank 0: send of world: rank 0 failed: left the job after: raised ValueError: boom" \
            in proc.stdout, proc.stdout + proc.stderr
