"""Real processes on shared memory: a peer killed in the middle of the engine's collectives leaves nothing behind.

Three ranks run a 1 MiB all_reduce in a loop (the intra-node engine: staging
segments, rings on the Unix sockets). Rank 2 is SIGKILLed (or SIGSTOPped);
each survivor must raise PeerFailureError naming it in time, must no longer
map any segment of a killed victim once it raised, and must map no shared
memory at all once its group is destroyed. Nothing may appear in ``/dev/shm``.

Run as a script (``--worker``) it is the worker.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import pytest
from conftest import aiodist_run_source
from rank_procs import RankProcs, emit

WORLD = 3
VICTIM = 2


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
                    emit("ready", own=own, mapped=sorted(_memfd_inodes()))
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            raised_at = time.time()
            # Told of the failure by another survivor first, this rank may not have read the dead
            # rank's end of file yet: a moment later it has (the kernel closed the dead one's sockets).
            await asyncio.sleep(0.2)
            mapped = sorted(_memfd_inodes())
            await dist.destroy_process_group()
            gc.collect()
            emit("error", type=type(e).__name__, msg=str(e)[:400], rank=getattr(e, "rank", None), mapped=mapped,
                 after=sorted(_memfd_inodes()), raised=raised_at)
            os._exit(0)

    run(main())


async def _scenario(signum: int, cap: float) -> tuple[float, dict[int, Any], dict[int, Any]]:
    """Signal VICTIM once every rank loops; (time of the signal, rank -> its ready event, rank -> its error)."""
    async with await RankProcs.start([__file__, "--worker"], WORLD, env={"AIODIST_TRANSPORT": "auto"}) as ranks:
        await ranks.all_ready(60)
        t_fault = ranks.kill(VICTIM, signum)
        await ranks.until(lambda: len(ranks.of("error")) >= WORLD - 1, cap)
    return t_fault, ranks.of("ready"), ranks.of("error")


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


STOPPED_SINK = '''
import asyncio, os, signal, time
import numpy as np
import aiodist

async def main():
    pg = await aiodist.init_process_group(timeout=40)
    await aiodist.barrier()
    if pg.rank == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # (the launcher ends it: the others declared it failed)
        return
    x = np.ones((64 << 20) // 8)
    start = time.monotonic()
    try:
        await aiodist.send(x, 0)
        print(f"RESULT rank {pg.rank} sent")
    except aiodist.PeerFailureError as e:
        print(f"RESULT rank {pg.rank} {time.monotonic() - start:.1f} {e.how[:40]}", flush=True)
        raise  # (the launcher then stops the job, the stopped rank with it)
'''


def test_a_send_to_a_stopped_rank_fails_when_it_is_declared_failed_wherever_that_was_found(tmp_path: Any) -> None:
    """Two ranks send 64 MiB to a rank that stopped (SIGSTOP). The one whose detector notices closes its link;
    the other hears it from that one and keeps its link (to tell the accused). Before (shm probe): on shared
    memory the send of the first waited on until the peer was killed, the other's until its timeout (40 s
    here; 300 s by default), both blocked in the full ring (over TCP both failed in ~3.3 s)."""
    from conftest import aiodist_run_source

    run = aiodist_run_source(tmp_path, STOPPED_SINK, 3, timeout=120, options=["--grace-period", "0.5"])  # (stopped: SIGKILL)
    results = [ln.split("RESULT ")[1] for ln in run.stdout.splitlines() if "RESULT" in ln]
    assert len(results) == 2, run.stdout + run.stderr
    for res in results:
        _, rank, took, *_ = res.split()
        assert took != "sent" and float(took) < 15, results  # (detection: 3 s of silence, then the report)


RETRY_AFTER_TIMEOUT = '''
import asyncio
import numpy as np
import aiodist
from aiodist.collectives import intranode

async def main():
    pg = await aiodist.init_process_group(timeout=30)
    n = 1 << 20  # 4 MiB of float32: the shared memory engine
    x = np.ones(n, np.float32)
    if WARM:
        await aiodist.all_reduce(x)  # (else the operation that times out is the engine's setup)
    if pg.rank == 0:
        try:
            await aiodist.all_reduce(x, timeout=0.5)  # rank 1 comes too late
        except aiodist.CollectiveTimeoutError:
            print("RESULT 0 timed out", flush=True)
    else:
        await asyncio.sleep(2.0)
        try:
            await aiodist.all_reduce(x)
        except aiodist.PeerCallFailedError:  # rank 0 gave up, and said so
            print("RESULT 1 told", flush=True)
    first = intranode._ENGINES[pg._comm]
    broken = repr(first)
    y = np.full(n, pg.rank + 1, np.float32)
    await aiodist.all_reduce(y)  # the program goes on
    z = np.full(3 * n, 2 * pg.rank + 1, np.float64)
    await aiodist.all_reduce(z)
    now = intranode._ENGINES[pg._comm]
    print(f"RESULT {pg.rank} {y.min()} {y.max()} {z.min()} {z.max()} fresh={now is not first} {broken} {now!r}",
          flush=True)
    await aiodist.destroy_process_group()
'''


@pytest.mark.parametrize("warm", [True, False], ids=["in_an_operation", "in_the_setup"])
def test_after_a_timed_out_engine_operation_the_next_large_collective_works(tmp_path: Any, warm: bool) -> None:
    """A program that catches a collective's timeout and goes on gets correct results, as it does over TCP.

    Before: the failed operation left the shared memory engine broken for good: every later large
    collective of the group raised GroupError ("shared memory is unusable after an earlier failure")
    on every rank. Now the failed operation's segments are never used again (unmapped, its peers
    fenced off) and the group's next large collective sets the engine up afresh.
    """
    proc = aiodist_run_source(tmp_path, f"WARM = {warm}\n" + RETRY_AFTER_TIMEOUT, 2, timeout=60)
    lines = sorted(line.split("RESULT ", 1)[1] for line in proc.stdout.splitlines() if "RESULT " in line)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    told = [line for line in lines if line.endswith(("timed out", "told"))]
    assert told == ["0 timed out", "1 told"], lines
    for r, line in enumerate(line for line in lines if line not in told):
        assert line.startswith(f"{r} 3.0 3.0 4.0 4.0 fresh=True <GroupEngine world rank={r}/2 broken>"), line
        assert line.endswith(" on>"), line
