"""Real processes on shared memory: a peer killed in the middle of the engine's collectives leaves nothing behind.

Three ranks run a 1 MiB all_reduce in a loop (the intra-node engine: staging
segments, rings on the Unix sockets). Rank 2 is SIGKILLed (or SIGSTOPped);
each survivor must raise PeerFailureError naming it in time, must no longer
map any segment of a killed victim once it raised, and must map no shared
memory at all once its group is destroyed. Nothing may appear in ``/dev/shm``.

Run as a script (``--worker``) it is the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORLD = 3
VICTIM = 2


def _emit(kind: str, **kw: Any) -> None:
    print(json.dumps({"kind": kind, "t": time.time(), **kw}), flush=True)


def _memfd_inodes() -> dict[int, str]:
    """inode -> name of every shared memory mapping of this process (ours are named aiodist-...)."""
    found = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/memfd:"):
                found[int(parts[4])] = parts[5].strip()
    return found


def worker() -> None:
    import gc

    import asyncio

    import numpy as np

    import aiodist.api as dist
    from aiodist.collectives import intranode
    from aiodist.eventloop import run

    async def main() -> None:
        pg = await dist.init_process_group(timeout=60.0)
        x = np.ones(1 << 18, dtype=np.float32)
        i = 0
        try:
            while True:
                await dist.all_reduce(x)
                x[:] = 1
                i += 1
                if i == 30:
                    eng = intranode._ENGINES[pg._comm]
                    own = [eng._staging[pg.rank].ref.ino]  # type: ignore[union-attr]
                    own += [p.conn._out.ref.ino for p in pg.transport._peers.values() if p.conn is not None]
                    _emit("ready", own=own, mapped=sorted(_memfd_inodes()))
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            raised_at = time.time()
            # Told of the failure by another survivor first, this rank may not have read the dead
            # rank's end of file yet: a moment later it has (the kernel closed the dead one's sockets).
            await asyncio.sleep(0.2)
            mapped = sorted(_memfd_inodes())
            await dist.destroy_process_group()
            gc.collect()
            _emit("error", type=type(e).__name__, msg=str(e)[:400], rank=getattr(e, "rank", None), mapped=mapped,
                  after=sorted(_memfd_inodes()), raised=raised_at)
            os._exit(0)

    run(main())


async def _scenario(signum: int, cap: float) -> tuple[float, dict[int, Any], dict[int, Any]]:
    from conftest import free_port

    port = free_port()
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(ROOT), AIODIST_TRANSPORT="auto")
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    ready: dict[int, Any] = {}
    errors: dict[int, Any] = {}
    all_ready = asyncio.Event()

    async def read(r: int) -> None:
        assert procs[r].stdout is not None
        async for line in procs[r].stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev["kind"] == "ready":
                ready[r] = ev
                if len(ready) == WORLD:
                    all_ready.set()
            elif ev["kind"] == "error":
                errors[r] = ev

    readers = [asyncio.create_task(read(r)) for r in range(WORLD)]
    try:
        await asyncio.wait_for(all_ready.wait(), 60)
        t_fault = time.time()
        os.kill(procs[VICTIM].pid, signum)
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline and len(errors) < WORLD - 1:
            await asyncio.sleep(0.01)
    finally:
        for p in procs:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass
        for p in procs:
            await p.wait()
        for t in readers:
            t.cancel()
    return t_fault, ready, errors


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd, /proc")


@pytest.mark.parametrize(("signum", "bound"), [(signal.SIGKILL, 1.0), (signal.SIGSTOP, 5.0)])
async def test_a_killed_or_stopped_peer_is_named_in_time_and_leaves_no_segment_behind(signum: int, bound: float) -> None:
    shm_before = sorted(os.listdir("/dev/shm"))
    t_fault, ready, errors = await _scenario(signum, cap=bound + 10)
    victim_own = set(ready[VICTIM]["own"])
    assert victim_own, ready
    for r in range(WORLD):
        if r == VICTIM:
            continue
        assert victim_own & set(ready[r]["mapped"]), "the survivors had mapped the victim's segments"
        ev = errors.get(r)
        assert ev is not None, f"rank {r} never raised: {errors}"
        assert ev["type"] == "PeerFailureError" and ev["rank"] == VICTIM, ev
        assert ev["raised"] - t_fault < bound, (r, ev["raised"] - t_fault)
        if signum == signal.SIGKILL:  # (a stopped rank is alive: a rank only told of it keeps its connection)
            assert not victim_own & set(ev["mapped"]), f"rank {r} still maps the dead rank's memory: {ev}"
        assert ev["after"] == [], f"rank {r} maps shared memory after destroying its group: {ev}"
    assert sorted(os.listdir("/dev/shm")) == shm_before


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker()
