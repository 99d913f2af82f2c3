"""Faults that say what they do: checked against the world, the store on a host of its own, restarts on triggers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aiodist
import sim
from aiodist.context import getenv
from sim.cli import build_parser


async def idle() -> int:
    await asyncio.sleep(0.1)
    return int(getenv("RANK") or 0)


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (sim.Crash(9, at=1.0), "names rank 9, which is outside the world (ranks 0-3)"),
        (sim.Restart(4, at=1.0), "names rank 4"),
        (sim.Straggler(-1, 2.0), "names rank -1"),
        (sim.Pause(0, on=sim.MessageSent(7, 3), duration=1.0), "names rank 7"),
        (sim.Partition(("store",), (1,), at=1.0), "exists only with store_host='separate'"),
        (sim.Clog(("rank2", "nowhere"), at=1.0, until=2.0), "names host 'nowhere', which does not exist"),
        (sim.ResetConnection(0, 5, at=1.0), "names rank 5"),
    ],
)
def test_a_fault_naming_a_host_the_world_lacks_is_an_error_before_the_run(fault: Any, says: str) -> None:
    with pytest.raises(sim.FaultError) as info:
        sim.run(idle, world_size=4, faults=[fault])
    assert says in str(info.value) and repr(fault) in str(info.value)
    assert info.value.fault == fault


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: sim.Crash(1), "exactly one of at="),
        (lambda: sim.Crash(1, at=1.0, on=sim.MessageSent(1, 2)), "exactly one of at="),
        (lambda: sim.Pause(1, at=-1.0, duration=1.0), "not a time >= 0"),
        (lambda: sim.Pause(1, at=1.0, duration=0.0), "duration=0.0 is not a positive number"),
        (lambda: sim.Partition((0, 1), (1, 2), at=1.0), "on both sides"),
        (lambda: sim.Partition((0,), (1,), at=2.0, heal_at=1.0), "heal_at needs at= and comes after it"),
        (lambda: sim.Clog((0, 1), at=1.0), "exactly one of until="),
        (lambda: sim.Straggler(1, 0.0), "factor=0.0 is not a positive number"),
        (lambda: sim.Swarm(kinds={"crash", "meteor"}), "unknown: ['meteor']"),
    ],
)
def test_a_malformed_fault_says_what_is_wrong_with_it(make: Any, says: str) -> None:
    with pytest.raises(sim.FaultError) as info:
        make()
    assert says in str(info.value)


def test_something_that_is_not_a_fault_is_refused() -> None:
    with pytest.raises(sim.FaultError, match="is not a fault"):
        sim.run(idle, world_size=2, faults=["crash 1"])  # type: ignore[list-item]


@pytest.mark.parametrize(
    "fault",
    [
        sim.Pause(2, at=1.5, duration=0.25),
        sim.Pause(2, on=sim.MessageReceived(2, 7), duration=0.5),
        sim.Pause("store", at=1.0, duration=2.0),
        sim.Restart(2, on=sim.MessageSent(2, 5), delay=0.5),
        sim.Crash(1, on=sim.MessageSent(3, 4)),
        sim.Crash("store", at=2.0),
        sim.Straggler(1, 3.0, at=1.0, duration=2.0),
        sim.Straggler(1, 3.0, on=sim.MessageSent(1, 9), duration=0.5),
        sim.Partition((0, "store"), (1,), on=sim.MessageSent(1, 3), duration=0.75, one_way=True),
        sim.Partition((0,), (1, 2), at=1.0, duration=0.5),
        sim.Clog((0, 0), on=sim.MessageSent(0, 12), duration=0.125),
        sim.Clog(("store", 3), at=1.0, until=2.0),
        sim.ResetConnection(0, "store", on=sim.MessageReceived(0, 2)),
        sim.CrashStore(on=sim.MessageSent(2, 8)),
        sim.Swarm(),
        sim.Swarm(kinds={"partition", "restart"}),
    ],
)
def test_new_fault_spellings_round_trip_through_their_flags(fault: Any) -> None:
    ns = build_parser().parse_args(["run", "prog.py", *fault.to_cli().split()])
    parsed = ns.faults + ([ns.swarm] if ns.swarm is not None else [])  # (every fault flag fills the one list)
    assert parsed == [fault]


# --------------------------------------------------------------------------- the store on its own host


async def store_user() -> Any:
    """Every rank uses the job's store (``env://``) through its group; rank 1 keeps writing."""
    loop = asyncio.get_running_loop()
    pg = await aiodist.init_process_group(timeout=30)
    store = pg.store
    if pg.rank == 1:
        outcome = "wrote"
        try:
            for i in range(30):
                await store.set(f"k{i}", "v")
                await asyncio.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - which error, and when, is what the test looks at
            outcome = type(e).__name__
        return outcome, round(loop.time(), 1)
    await asyncio.sleep(4)
    return "idle", round(loop.time(), 1)


def test_with_a_separate_store_host_the_store_can_fail_apart_from_rank_0() -> None:
    res = sim.run(store_user, world_size=3, store_host="separate", faults=[sim.Crash("store", at=1.0)],
                  explore=False, stop_on_error=False)
    assert res.rank_results[0] == ("idle", 4.0)  # rank 0 never hosted it: untouched
    assert res.rank_results[1][0] in ("StoreConnectionLost", "StoreConnectTimeoutError") and res.rank_results[1][1] < 2
    assert any(e.kind == "crash" and e.host == "store" for e in res.trace)
    assert any(e.kind == "start" and e.host == "store" for e in res.trace)


def test_a_partition_and_a_pause_of_the_store_host_hold_its_clients_then_let_them_go_on() -> None:
    for fault in (sim.Partition((1,), ("store",), at=1.0, heal_at=2.0), sim.Pause("store", at=1.0, duration=1.0)):
        res = sim.run(store_user, world_size=3, store_host="separate", faults=[fault], explore=False)
        assert res.ok, res.summary()
        assert res.rank_results[1][0] == "wrote" and res.rank_results[1][1] >= 3.9  # ~1 s late


def test_crash_store_on_a_separate_host_crashes_that_host() -> None:
    res = sim.run(store_user, world_size=2, store_host="separate", faults=[sim.CrashStore(at=1.0)],
                  explore=False, stop_on_error=False)
    assert any(e.kind == "crash" and e.host == "store" and "CrashStore" in e.detail for e in res.trace)
    assert res.rank_results[0] == ("idle", 4.0)


# --------------------------------------------------------------------------- restarts


async def counts_incarnations() -> Any:
    rank, count = int(getenv("RANK") or 0), int(getenv("AIODIST_RESTART_COUNT") or 0)
    for _ in range(20):
        await asyncio.sleep(0.05)
    return rank, count


async def store_counter() -> Any:
    """Rank 0 hosts the store; every incarnation of every rank counts 10 ticks in it."""
    rank, count = int(getenv("RANK") or 0), int(getenv("AIODIST_RESTART_COUNT") or 0)
    port = int(getenv("MASTER_PORT") or 0)
    server = await aiodist.StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await aiodist.TCPStore.connect(getenv("MASTER_ADDR") or "", port, timeout=30)
    for _ in range(10):
        await store.add(f"ticks/{rank}", 1)
        await asyncio.sleep(0.05)
    await store.close()
    if server is not None:
        await asyncio.sleep(2)
        await server.close()
    return rank, count


def test_restart_on_a_trigger_runs_main_again_with_a_higher_count() -> None:
    res = sim.run(store_counter, world_size=2, explore=False,
                  faults=[sim.Restart(1, on=sim.MessageSent(1, 4), delay=0.2)])
    assert res.ok, res.summary()
    assert res.restarts == {1: 1}
    assert res.rank_results == [(0, 0), (1, 1)]
    (crash,) = [e for e in res.trace if e.kind == "crash"]
    assert "Restart fault" in crash.detail and crash.host == "rank1"


def test_overlapping_restarts_never_run_two_processes_of_one_rank() -> None:
    faults = [sim.Restart(1, at=0.1, delay=0.5), sim.Restart(1, at=0.2, delay=0.1), sim.Restart(1, at=0.3)]
    res = sim.run(counts_incarnations, world_size=2, faults=faults, explore=False)
    assert res.ok, res.summary()
    starts = [e.time for e in res.trace if e.kind == "start" and e.host == "rank1"]
    assert starts == [0.0, pytest.approx(0.6)]  # the 2nd and 3rd restart came while its start was due
    assert res.restarts == {1: 1}


def test_no_restart_after_the_job_finished() -> None:
    res = sim.run(counts_incarnations, world_size=2, explore=False, faults=[sim.Restart(1, at=0.99, delay=0.5)])
    assert res.ok, res.summary()
    assert res.restarts == {} and res.crashed == [1]  # killed near the end; the others finished meanwhile


def test_a_program_serving_its_own_store_runs_with_a_separate_store_host_or_is_told_why_not(tmp_path) -> None:
    # Before: examples/hello_store.py failed at t=0 with "cannot listen on store:29500: not an address of
    # rank0", no word of why; now it checks TORCHELASTIC_USE_AGENT_STORE, as torch programs do, and a program
    # that does not is told.
    from pathlib import Path

    from conftest import load_file

    example = load_file(Path(__file__).resolve().parents[1] / "examples" / "hello_store.py", "hello_store_example")
    res = sim.run(example.main, world_size=3, store_host="separate", seed=0)
    assert res.ok and res.rank_results[0] == [f"hello from rank {r} of 3" for r in range(3)], res.summary()

    async def serves_its_own() -> None:
        from aiodist.store import StoreServer

        if int(getenv("RANK") or 0) == 0:
            await StoreServer.start(host=getenv("MASTER_ADDR"), port=int(getenv("MASTER_PORT") or 0))

    res = sim.run(serves_its_own, world_size=2, store_host="separate", seed=0)
    assert not res.ok and "TORCHELASTIC_USE_AGENT_STORE" in res.failures[0].message, res.summary()
