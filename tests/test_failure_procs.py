"""Real processes: kill, stop, mismatch, early exit of one of 4 ranks; every survivor names the culprit in time.

Each scenario starts 4 Python processes (env:// rendezvous on 127.0.0.1, rank
0 hosts the store) running small all_reduce in a loop, injects the fault once
every rank looped a while, and checks each survivor's error: its type, the
rank it names, and the time from the fault (wall clock, measured outside the
runtime) to the error.

Run as a script (``--worker SCENARIO``) it is the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4


def _emit(kind: str, **kw: Any) -> None:
    print(json.dumps({"kind": kind, "t": time.time(), **kw}), flush=True)


def worker(scenario: str) -> None:
    import numpy as np

    import aiodist.api as dist
    from aiodist.eventloop import run

    async def main() -> None:
        pg = await dist.init_process_group(timeout=60.0)
        x = np.ones(4, dtype=np.float32)
        i = 0
        try:
            while True:
                if i == 200 and scenario == "exit" and pg.rank == 1:
                    _emit("fault")
                    os._exit(0)  # leaves without a word, exit status 0
                if i == 200 and scenario == "mismatch" and pg.rank == 2:
                    _emit("fault")
                    await dist.broadcast(x, src=0)
                else:
                    await dist.all_reduce(x)
                x[:] = 1
                i += 1
                if i == 100:
                    _emit("ready")
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            _emit("error", type=type(e).__name__, msg=str(e)[:400], rank=getattr(e, "rank", None))
            os._exit(0)

    run(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _scenario(scenario: str, victim: int, *, signum: int | None = None, cap: float = 15.0,
                    resume: bool = False, transport: str = "auto",
                    everyone: bool = False) -> tuple[float, dict[int, dict[str, Any]]]:
    port = _free_port()
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(ROOT), AIODIST_TRANSPORT=transport)
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", scenario, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    events: dict[int, dict[str, Any]] = {}
    ready: set[int] = set()
    all_ready = asyncio.Event()
    fault_at: list[float] = []

    async def read(r: int) -> None:
        assert procs[r].stdout is not None
        async for line in procs[r].stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev["kind"] == "ready":
                ready.add(r)
                if len(ready) == WORLD:
                    all_ready.set()
            elif ev["kind"] == "fault":
                fault_at.append(ev["t"])
            elif ev["kind"] == "error":
                events[r] = ev

    readers = [asyncio.create_task(read(r)) for r in range(WORLD)]
    try:
        await asyncio.wait_for(all_ready.wait(), 60)
        if signum is not None:
            fault_at.append(time.time())
            os.kill(procs[victim].pid, signum)
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline and len([r for r in events if r != victim]) < WORLD - 1:
            await asyncio.sleep(0.01)
        while everyone and time.monotonic() < deadline and victim not in events:  # (it reports too: wait for it)
            await asyncio.sleep(0.01)
        if resume:  # the stopped rank comes back: what does it make of it?
            procs[victim].send_signal(signal.SIGCONT)
            deadline = time.monotonic() + cap
            while time.monotonic() < deadline and victim not in events:
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
    assert fault_at, "the fault never happened"
    return fault_at[0], events


def _check(t_fault: float, events: dict[int, dict[str, Any]], victim: int, error: str, bound: float,
           *, named: bool = True) -> None:
    for r in range(WORLD):
        if r == victim:
            continue
        ev = events.get(r)
        assert ev is not None, f"rank {r} never raised: {events}"
        assert ev["type"] == error, (r, ev)
        if named:
            assert ev["rank"] == victim, (r, ev)
        assert ev["t"] - t_fault < bound, (r, ev["t"] - t_fault, ev)


pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals")


# "auto": the ranks of this host talk over Unix sockets and shared memory; "tcp": over TCP.
@pytest.mark.parametrize(("victim", "transport"), [(3, "auto"), (0, "auto"), (3, "tcp")])  # rank 0 hosts the store
async def test_sigkill_one_of_four_every_survivor_names_it_within_a_second(victim: int, transport: str) -> None:
    t, events = await _scenario("loop", victim, signum=signal.SIGKILL, transport=transport)
    _check(t, events, victim, "PeerFailureError", 1.0)


@pytest.mark.parametrize("transport", ["auto", "tcp"])
async def test_sigstop_one_of_four_every_survivor_names_it_within_five_seconds(transport: str) -> None:
    t, events = await _scenario("loop", 3, signum=signal.SIGSTOP, transport=transport)
    _check(t, events, 3, "PeerFailureError", 5.0)
    for r in (0, 1, 2):
        assert "heard nothing" in events[r]["msg"], events[r]


@pytest.mark.parametrize("transport", ["auto", "tcp"])
async def test_a_stopped_rank_that_resumes_learns_that_it_was_declared_failed(transport: str) -> None:
    """SIGSTOP past the heartbeat timeout, then SIGCONT: the others named it; it must blame itself
    (EvictedError naming its own rank), not a healthy peer that hung up on it."""
    t, events = await _scenario("loop", 3, signum=signal.SIGSTOP, resume=True, transport=transport)
    _check(t, events, 3, "PeerFailureError", 5.0)
    ev = events.get(3)
    assert ev is not None, f"the resumed rank never raised: {events}"
    assert ev["type"] == "EvictedError" and ev["rank"] == 3, ev
    assert "declared failed" in ev["msg"], ev


@pytest.mark.parametrize("transport", ["auto", "tcp"])
async def test_a_collective_mismatch_raises_on_every_rank_within_a_second(transport: str) -> None:
    t, events = await _scenario("mismatch", 2, transport=transport, everyone=True)
    assert events[2]["type"] == "CollectiveMismatchError", events
    for r in range(WORLD):
        ev = events[r]
        assert ev["type"] == "CollectiveMismatchError", (r, ev)
        assert ev["t"] - t < 1.0, (r, ev)
    assert any("broadcast" in ev["msg"] and "all_reduce" in ev["msg"] for ev in events.values()), events


async def test_a_rank_that_exits_early_without_error_is_named() -> None:
    t, events = await _scenario("exit", 1)
    _check(t, events, 1, "PeerFailureError", 1.0)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    worker(sys.argv[2])
