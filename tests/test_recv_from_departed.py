"""A receive from a lower rank that left the job before it ever connected fails at once, saying so.

Before (differential fuzz): the lower rank of a pair dials when it sends, so a receive from a lower
rank that had left (never having connected) waited for its whole timeout (300 s by default) and then
blamed it with a CollectiveTimeoutError; so did a broadcast from it. Now, after a short wait for its
connection (``EXPECT_LOWER``), the receiver dials it, finds it gone, and the receive fails with
PeerFailureError ("left the job").
"""

from __future__ import annotations

from pathlib import Path

from conftest import aiodist_run_source, sim_run_source

PROGRAM = '''
import asyncio, os
import numpy as np
import aiodist as dist

async def main():
    await dist.init_process_group(timeout=30)
    r = dist.get_rank()
    if r == 0:
        return "left"  # before any operation: no connection to it was ever made
    await asyncio.sleep(0.5)  # rank 0 has left by now
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        if os.environ.get("OP") == "broadcast":
            await dist.broadcast(np.zeros(2), src=0, timeout=20)
        else:
            await dist.recv(np.zeros(2), src=0, timeout=20)
        out = "received"
    except dist.PeerFailureError as e:
        out = f"{type(e).__name__} rank {e.global_rank}: {'left the job' in str(e)}"
    took = loop.time() - t0
    print(f"rank {r}: {out} fast={took < 5}", flush=True)
    return out, took < 5
'''


def test_in_the_simulator(tmp_path: Path, monkeypatch: object) -> None:
    for op in ("recv", "broadcast"):
        monkeypatch.setenv("OP", op)  # type: ignore[attr-defined]
        for results in sim_run_source(tmp_path, PROGRAM, 3, range(3)):
            assert results == ["left"] + [("PeerFailureError rank 0: True", True)] * 2, (op, results)


def test_for_real(tmp_path: Path) -> None:
    for op in ("recv", "broadcast"):
        proc = aiodist_run_source(tmp_path, PROGRAM, 3, timeout=90, env={"OP": op})
        for r in (1, 2):
            assert f"rank {r}: PeerFailureError rank 0: True fast=True" in proc.stdout, (op, proc.stdout, proc.stderr[-2000:])
