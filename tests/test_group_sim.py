"""The same group code under the simulator: many ranks, random schedules, crashes, determinism."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aiodist.api as dist
from aiodist.errors import CollectiveTimeoutError, PeerCallFailedError, PeerFailureError

sim = pytest.importorskip("sim")


async def program() -> Any:
    pg = await dist.init_process_group(timeout=60)
    r, n = pg.rank, pg.size
    x = np.full(257, r + 1.0)
    y = np.arange(4, dtype=np.int64) if r == n - 1 else np.zeros(4, np.int64)
    h1 = dist.all_reduce(x)
    h2 = dist.broadcast(y, src=n - 1)
    await h2
    await h1
    got = []
    if r == 0:
        for _ in range(n - 1):
            got.append(await dist.recv(np.empty(1), tag=3))  # any source: whatever order the schedule gives
    else:
        await dist.send(np.ones(1), dst=0, tag=3)
    sub = await dist.new_group(list(range(0, n, 2)))
    s = int((await sub.all_reduce(np.array([r], np.int64)))[0]) if sub.is_member else None
    objs = await dist.all_gather_object(r * r)
    await dist.destroy_process_group()
    return float(x[0]), y.tolist(), sorted(got), s, objs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_program_is_correct_under_random_schedules(seed: int) -> None:
    n = 12
    res = sim.run(program, world_size=n, seed=seed)
    res.raise_on_failure()
    total = n * (n + 1) / 2
    evens = sum(range(0, n, 2))
    for r, (x, y, got, s, objs) in enumerate(res.rank_results):
        assert x == total and y == [0, 1, 2, 3]
        assert got == (list(range(1, n)) if r == 0 else [])
        assert s == (evens if r % 2 == 0 else None)
        assert objs == [q * q for q in range(n)]


def test_same_seed_same_run() -> None:
    a = sim.run(program, world_size=6, seed=11)
    b = sim.run(program, world_size=6, seed=11)
    assert a.ok and b.ok and a.digest == b.digest


LINGER = 0.25
"""Seconds a rank that saw a failure stays up before returning. Returning ends the rank's process
(its connections close): the others would then learn of the failure from it, or see it leave,
depending on who gets there first, as with real processes."""


async def loop_until_failure() -> Any:
    await dist.init_process_group(timeout=60)
    x = np.ones(64)
    try:
        for _ in range(100):
            await dist.all_reduce(x)
            await dist.barrier()
    except PeerFailureError as e:
        when = asyncio.get_running_loop().time()
        await asyncio.sleep(LINGER)
        return e.rank, e.how, when
    except CollectiveTimeoutError as e:  # pragma: no cover - reported as a failure below
        return "timeout", e.waiting_for, asyncio.get_running_loop().time()
    except PeerCallFailedError as e:  # (another member's call failed: with heartbeats off, its timeout)
        return "call failed", str(e), asyncio.get_running_loop().time()
    return "finished"


def _latest(res: Any) -> float:
    """When the last rank of a ``loop_until_failure`` run learned of the failure (virtual seconds).

    (Not ``res.virtual_time``: a rank that returns finishes its group, which may wait for an
    unreachable peer much longer.)
    """
    return max((out[2] for out in res.rank_results if isinstance(out, tuple)), default=0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_crash_mid_collective_names_the_rank_on_every_survivor(seed: int) -> None:
    res = sim.run(
        loop_until_failure,
        world_size=6,
        seed=seed,
        faults=[sim.Crash(3, on=sim.MessageSent(3, 40))],
        stop_on_error=False,
    )
    assert res.ok, res.summary()
    assert _latest(res) < 10  # detected, not timed out (timeout is 60 s)
    for r, out in enumerate(res.rank_results):
        if r == 3:
            continue
        assert out[0] == 3, out
        assert "connection lost" in out[1] or "unreachable" in out[1]


async def _every_collective_main() -> Any:
    from test_group_collectives import _all_collectives

    pg = await dist.init_process_group(timeout=60)
    try:
        return await _all_collectives(pg)
    finally:
        await dist.destroy_process_group()


@pytest.mark.parametrize(("world_size", "seed"), [(1, 0), (3, 1), (5, 2), (8, 3)])
def test_every_collective_under_the_simulator_matches_numpy(world_size: int, seed: int) -> None:
    from test_group_collectives import _check

    res = sim.run(_every_collective_main, world_size=world_size, seed=seed)
    res.raise_on_failure()
    _check(res.rank_results)


def test_a_reset_connection_fails_every_rank_fast_and_names_one_of_its_ends() -> None:
    """Ranks that connect only after the failure, or that are mid-handshake, still learn of it.

    Every rank ends fast (not at the 60 s timeout) blaming one end of the
    reset link, or nobody when what failed was its store connection.
    """
    for seed in range(12):
        for a, b in ((0, 1), (1, 3), (2, 3)):
            res = sim.run(
                loop_until_failure,
                world_size=4,
                seed=seed,
                faults=[sim.ResetConnection(a, b, at=0.003)],
                stop_on_error=False,
                explore=False,  # (fixed timing: the reset lands after the rendezvous, as connections are made)
            )
            assert res.ok, res.summary()
            assert _latest(res) < 1.0, (seed, a, b)
            for out in res.rank_results:
                assert out == "finished" or out[0] in (a, b) or (out[0] is None and "store" in out[1]), (seed, a, b, out)


def test_a_crash_anywhere_is_blamed_on_the_crashed_rank() -> None:
    for seed in range(6):
        for victim, n in ((0, 80), (2, 30), (5, 80)):
            res = sim.run(
                loop_until_failure,
                world_size=6,
                seed=seed,
                faults=[sim.Crash(victim, on=sim.MessageSent(victim, n))],
                stop_on_error=False,
            )
            assert res.ok and _latest(res) < 10, res.summary()
            for r, out in enumerate(res.rank_results):
                if r != victim:
                    assert out[0] == victim or (out[0] is None and "store" in out[1]), (seed, victim, out)


def test_heartbeats_turn_a_silent_partition_into_a_peer_failure() -> None:
    fault = sim.Partition((0,), (1,), at=0.003)
    quiet = sim.run(  # (fixed timing throughout: the partition comes after the rendezvous)
        loop_until_failure, world_size=4, seed=1, faults=[fault], stop_on_error=False,
        env={"AIODIST_HEARTBEAT_TIMEOUT": "0"}, explore=False,
    )
    # Turned off: the partition is found by the 60 s timeout only, never by heartbeats. The first
    # rank to time out leaves; the others time out too, hear of a rank that left or lost a
    # connection on the way, or of the first one's timeout (PeerCallFailedError), whichever comes
    # first (microseconds apart: it depends on the seed and on the rendezvous's timeline).
    assert quiet.ok and _latest(quiet) >= 60, quiet.summary()
    assert any(out[0] == "timeout" for out in quiet.rank_results), quiet.rank_results
    assert all(out[0] == "timeout" or "heard nothing" not in out[1] for out in quiet.rank_results), quiet.rank_results
    res = sim.run(loop_until_failure, world_size=4, seed=1, faults=[fault], stop_on_error=False,
                  explore=False)  # heartbeats on by default
    assert res.ok and _latest(res) < 5, res.summary()
    for out in res.rank_results:
        assert out[0] in (0, 1) and "heard nothing" in out[1], out
    fast = sim.run(
        loop_until_failure, world_size=4, seed=1, faults=[fault], stop_on_error=False,
        env={"AIODIST_HEARTBEAT_INTERVAL": "0.1", "AIODIST_HEARTBEAT_MISSES": "3"}, explore=False,
    )
    assert fast.ok and _latest(fast) < 1, fast.summary()
    healthy = sim.run(loop_until_failure, world_size=4, seed=1, env={"AIODIST_HEARTBEAT_TIMEOUT": "3"}, explore=False)
    assert healthy.ok and healthy.rank_results == ["finished"] * 4


async def loop_then_destroy() -> Any:
    await dist.init_process_group(timeout=60)
    try:
        x = np.ones(16)
        for _ in range(100):
            await dist.all_reduce(x)
        return "finished"
    except PeerFailureError as e:
        return e.rank
    finally:
        await dist.destroy_process_group()


def test_the_store_host_does_not_linger_after_a_crash() -> None:
    """Rank 0 hosts the store and keeps it up at destroy until the others left -- not for a dead rank."""
    res = sim.run(loop_then_destroy, world_size=5, seed=4, faults=[sim.Crash(3, on=sim.MessageSent(3, 30))],
                  stop_on_error=False, explore=False)  # (fixed timing: the run's length below)
    assert res.ok, res.summary()
    assert [out for r, out in enumerate(res.rank_results) if r != 3] == [3, 3, 3, 3]
    assert res.virtual_time < 1.0  # not the 10 s leave wait
    healthy = sim.run(loop_then_destroy, world_size=5, seed=4)
    assert healthy.ok and healthy.rank_results == ["finished"] * 5
