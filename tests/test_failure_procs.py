"""Real processes: kill, stop, mismatch, early exit of one of 4 ranks; every survivor names the culprit in time.

Each scenario starts 4 Python processes (env:// rendezvous on 127.0.0.1, rank
0 hosts the store) running small all_reduce in a loop, injects the fault once
every rank looped a while, and checks each survivor's error: its type, the
rank it names, and the time from the fault (wall clock, measured outside the
runtime) to the error.

Run as a script (``--worker SCENARIO``) it is the worker.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import pytest
from rank_procs import RankProcs, emit

WORLD = 4


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
                    emit("fault")
                    os._exit(0)  # leaves without a word, exit status 0
                if i == 200 and scenario == "mismatch" and pg.rank == 2:
                    emit("fault")
                    await dist.broadcast(x, src=0)
                else:
                    await dist.all_reduce(x)
                x[:] = 1
                i += 1
                if i == 100:
                    emit("ready")
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            emit("error", type=type(e).__name__, msg=str(e)[:400], rank=getattr(e, "rank", None))
            os._exit(0)

    run(main())


async def _scenario(scenario: str, victim: int, *, signum: int | None = None, cap: float = 15.0,
                    resume: bool = False, transport: str = "auto",
                    everyone: bool = False) -> tuple[float, dict[int, dict[str, Any]]]:
    """Run ``scenario`` on WORLD ranks, signal ``victim`` once all loop; (time of the fault, rank -> its error)."""
    async with await RankProcs.start([__file__, "--worker", scenario], WORLD,
                                     env={"AIODIST_TRANSPORT": transport}) as ranks:
        await ranks.all_ready(60)
        if signum is not None:
            ranks.kill(victim, signum)
        waited = [r for r in range(WORLD) if r != victim or everyone]  # (everyone: the victim reports too)
        await ranks.until(lambda: ranks.reported("error", waited), cap)
        if resume:  # the stopped rank comes back: what does it make of it?
            ranks.procs[victim].send_signal(signal.SIGCONT)
            await ranks.until(lambda: ranks.reported("error", [victim]), cap)
    assert ranks.faults, "the fault never happened"
    return ranks.faults[0], ranks.of("error")


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
