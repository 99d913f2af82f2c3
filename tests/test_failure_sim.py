"""The failure scenarios in the simulator: deterministic, on virtual time."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest

import aiodist.api as dist
import sim
from aiodist.errors import AiodistError, PeerFailureError


async def loop_main(iters: int = 10_000) -> Any:
    loop = asyncio.get_running_loop()
    await dist.init_process_group(timeout=60)
    x = np.ones(16)
    try:
        for _ in range(iters):
            await dist.all_reduce(x)
            x[:] = 1
    except PeerFailureError as e:
        return e.global_rank, e.how, loop.time()
    return "finished", None, loop.time()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_vanished_rank_is_named_by_every_survivor_through_heartbeats(seed: int) -> None:
    """Crash(silent=True): the host vanishes, nothing closes (what SIGSTOP or a pulled cable looks like)."""
    # Fixed timing: every pair is connected before the crash at 0.05 s.
    res = sim.run(loop_main, world_size=4, seed=seed, faults=[sim.Crash(3, at=0.05, silent=True)], stop_on_error=False,
                  explore=False)
    assert res.ok, res.summary()
    for r in range(3):
        culprit, how, when = res.rank_results[r]
        assert culprit == 3, res.rank_results
        assert when - 0.05 < 5.0, res.rank_results  # default heartbeats: 3 s of silence
    again = sim.run(loop_main, world_size=4, seed=seed, faults=[sim.Crash(3, at=0.05, silent=True)],
                    stop_on_error=False, explore=False)
    assert again.digest == res.digest


def test_heartbeats_can_be_tuned_from_init_process_group() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        await dist.init_process_group(timeout=60, heartbeat_interval=0.1, heartbeat_misses=4)
        x = np.ones(4)
        try:
            while True:
                await dist.all_reduce(x)
        except PeerFailureError as e:
            return e.global_rank, loop.time()

    res = sim.run(main, world_size=4, seed=0, faults=[sim.Crash(1, at=0.05, silent=True)], stop_on_error=False,
                  explore=False)  # (fixed timing: every pair connected before the crash)
    assert res.ok, res.summary()
    for r in (0, 2, 3):
        assert res.rank_results[r][0] == 1
        assert res.rank_results[r][1] < 0.05 + 1.0


async def busy_main() -> Any:
    """Ranks that compute (await sleeps) for far longer than the heartbeat timeout are not declared failed."""
    await dist.init_process_group(timeout=600)
    x = np.ones(4)
    for i in range(3):
        await asyncio.sleep(10.0 * (dist.get_rank() + 1))
        await dist.all_reduce(x)
        x[:] = 1
    await dist.destroy_process_group()
    return "ok"


def test_no_false_positive_for_long_waits_and_stragglers() -> None:
    res = sim.run(busy_main, world_size=4, seed=0, faults=[sim.Straggler(2, 5.0)])
    assert res.ok, res.summary()
    assert res.rank_results == ["ok"] * 4


async def store_loss_main() -> Any:
    await dist.init_process_group(timeout=30)
    x = np.ones(16)
    for _ in range(50):  # connections are made: the world group does not need the store any more
        await dist.all_reduce(x)
        x[:] = 1
    await asyncio.sleep(1.0)  # the store host dies meanwhile
    for _ in range(50):
        x[:] = 1
        await dist.all_reduce(x)
    result = float(x[0])
    try:
        await dist.new_group([0, 1])  # needs the store: fails clearly, at once
        outcome = "created"
    except AiodistError as e:
        outcome = type(e).__name__
    return result, outcome


def test_losing_the_store_host_does_not_break_a_working_group() -> None:
    """Decision: the store is needed to set things up (rendezvous, addresses, new groups), not to run
    collectives over connections already made; losing it fails the operations that need it (clear error),
    not the group."""
    res = sim.run(store_loss_main, world_size=4, seed=0, faults=[sim.CrashStore(at=0.5)], stop_on_error=False)
    assert res.ok, res.summary()
    for r, (value, outcome) in enumerate(res.rank_results):
        assert value == 4.0
        # members need the store to agree on the group: a clear store error; non-members do not
        assert outcome == ("StoreConnectionLost" if r in (0, 1) else "created"), res.rank_results
    assert res.virtual_time < 35, res.summary()


async def big_allreduce_main() -> Any:
    await dist.init_process_group(timeout=600)
    x = np.ones(1 << 22, np.float32)  # 16 MiB
    loop = asyncio.get_running_loop()
    t = loop.time()
    await dist.all_reduce(x)
    took = loop.time() - t
    await dist.destroy_process_group()
    return took, float(x[0])


def test_a_slow_link_is_not_a_hung_peer() -> None:
    """A 16 MiB all_reduce over 5 MB/s links takes ~5 s, longer than the 3 s heartbeat timeout: frames keep
    arriving (and heartbeats between them), so nobody is declared failed. (The simulator delivers a frame
    whole when its last byte arrives: a single frame that takes longer than the timeout would look like
    silence there, so its header buys it time, see HEARTBEAT_MIN_BANDWIDTH; over TCP its bytes, as they come, are
the signs of life.)"""
    res = sim.run(big_allreduce_main, world_size=4, seed=0, network=sim.Network.ideal(alpha=1e-4, bandwidth=5e6),
                  trace=False)
    assert res.ok, res.summary()
    for took, value in res.rank_results:
        assert value == 4.0 and took > 3.0


async def blame_main() -> Any:
    loop = asyncio.get_running_loop()
    await dist.init_process_group(timeout=60)
    x = np.ones(16)
    try:
        while True:
            await dist.all_reduce(x)
            x[:] = 1
    except PeerFailureError as e:
        return type(e).__name__, e.global_rank, loop.time()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_paused_rank_that_resumes_learns_that_it_was_declared_failed(seed: int) -> None:
    """SIGSTOP past the heartbeat timeout, then SIGCONT: the others name it, and it blames itself
    (EvictedError naming its own rank), not a healthy peer that hung up on it."""
    if not hasattr(sim, "Pause"):
        pytest.skip("this simulator cannot pause a rank (sim.Pause)")
    # Paused once the group is up and busy (its 200th frame), whatever the explored timing did
    # to rendezvous: a pause during rendezvous is only a slow start, which nobody must call a failure.
    res = sim.run(blame_main, world_size=4, seed=seed, faults=[sim.Pause(3, on=sim.MessageSent(3, 200), duration=6.0)],
                  stop_on_error=False)
    assert res.ok, res.summary()
    detected = []
    for r in range(3):
        kind, culprit, when = res.rank_results[r]
        assert (kind, culprit) == ("PeerFailureError", 3), res.rank_results
        detected.append(when)
    kind, culprit, when = res.rank_results[3]
    assert (kind, culprit) == ("EvictedError", 3), res.rank_results
    # the others named it within the detector's bound (~3.5 s of silence), well before it resumed
    # 6 s after it stopped; it could only learn its fate once it ran again
    assert when - max(detected) > 6.0 - 5.0, res.rank_results


async def _outcome(body: Any) -> str:
    """Run ``body(pg, x)`` as the rank's work: "finished", or the error that ended it (the group destroyed after)."""
    pg = await dist.init_process_group(timeout=60)
    try:
        await body(pg, np.zeros(4))
        return "finished"
    except AiodistError as e:
        return str(e)
    finally:
        await dist.destroy_process_group()


async def _store_host_leaves(pg: Any, x: np.ndarray) -> None:
    """Rank 0 (the store's host) and rank 2 talk; rank 2 crashes; rank 1 only uses the store."""
    if pg.rank == 2:
        await dist.send(x, 0)
        await asyncio.sleep(10)  # (crashed here)
    elif pg.rank == 0:
        await dist.recv(x, 2)
        await dist.recv(x, 2)  # rank 2 crashes instead of sending this one
    else:
        await pg.store.get("never-set", timeout=60)


store_host_leaves_after_a_failure = functools.partial(_outcome, _store_host_leaves)


@pytest.mark.parametrize("seed", [0, 1])
def test_ranks_that_lose_the_store_with_its_host_learn_which_failure_it_left_after(seed: int) -> None:
    """The store server goes with its host; it tells its clients why first (its host left after rank 2 failed).

    Rank 1 has no link to the failed rank, nor to rank 0: the store is its only news.
    """
    res = sim.run(store_host_leaves_after_a_failure, world_size=3, seed=seed, faults=[sim.Crash(2, at=0.05)],
                  stop_on_error=False, explore=False)
    assert "rank 2 failed" in res.rank_results[0], res.rank_results
    said = res.rank_results[1]
    assert "its host, rank 0, left the job after rank 2 failed" in said, said


async def _dials_a_rank_gone(pg: Any, x: np.ndarray) -> None:
    """Rank 1 leaves after rank 3 crashed; rank 2, which never talked to either, then sends to rank 1."""
    if pg.rank == 3:
        await dist.send(x, 1)
        await asyncio.sleep(10)  # (crashed here)
    elif pg.rank == 1:
        await dist.recv(x, 3)
        await dist.recv(x, 3)  # rank 3 crashes instead of sending this one
    elif pg.rank == 2:
        await asyncio.sleep(1.0)  # rank 1 has left by then: its listener is gone
        await dist.send(x, 1)
    else:
        await asyncio.sleep(2.0)


rank_gone_after_a_failure = functools.partial(_outcome, _dials_a_rank_gone)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_rank_that_dials_a_rank_gone_after_a_failure_learns_which_from_the_store(seed: int) -> None:
    """It could only say "rank 1 failed: unreachable (connection refused)": nothing named rank 3."""
    res = sim.run(rank_gone_after_a_failure, world_size=4, seed=seed, faults=[sim.Crash(3, at=0.05)],
                  stop_on_error=False, explore=False)
    assert "rank 3 failed" in res.rank_results[1], res.rank_results
    assert "rank 1 failed: left the job after rank 3 failed: connection lost" in res.rank_results[2], res.rank_results


async def _raises_without_leaving() -> Any:
    await dist.init_process_group(timeout=20)
    if dist.get_rank() == 2:
        await asyncio.sleep(0.01)
        raise ValueError("rank 2's own bug")  # (no destroy_process_group: the process just ends)
    try:
        await dist.all_reduce(np.ones(2))
    except PeerFailureError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_whose_main_raises_leaves_as_under_aiodist_run_saying_what_failed(seed: int) -> None:
    """Under ``aiodist run`` a rank whose main raises leaves saying what failed (finish_failed_rank): its peers'
    errors read "rank 2 failed: left the job after: raised ValueError: ...". The simulator only dropped the
    process's connections: its peers read "connection lost" or "unreachable (connection refused)"."""
    res = sim.run(_raises_without_leaving, world_size=4, seed=seed, stop_on_error=False)
    assert [f.rank for f in res.failures if f.kind == "exception"] == [2], res.summary()
    said = [r for i, r in enumerate(res.rank_results) if i != 2]
    assert all("raised ValueError: rank 2's own bug" in s for s in said), said
    # with the program's line, as the launcher says it (before: without it, in the simulator only)
    assert all("rank 2's own bug (test_failure_sim.py:" in s for s in said), said
    assert sim.run(_raises_without_leaving, world_size=4, seed=seed, stop_on_error=False).digest == res.digest


def _train_dp() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / "train_dp.py"
    spec = importlib.util.spec_from_file_location("train_dp_for_blame", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 4, 5])
def test_every_survivor_of_a_crash_in_training_names_the_crashed_rank_as_the_root_cause(
    seed: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 ranks train (the demo's program), rank 37 crashes; the others leave one after another as they learn.

    Every survivor's error must name rank 37 as the root cause, and only rank 37. Before: (seed 4, 5) a rank
    leaving with a dial still awaiting its verdict dropped it without a word, where the acceptor already held
    it as the link: that rank read "rank 35 failed: connection lost"; (seed 0) a failure heard of through a
    report kept no root, so the next ranks to leave passed on "left the job after rank 35 failed: left the job
    after rank 37 failed" and `.culprit` named rank 35 at the ranks that heard it.
    """
    train_dp = _train_dp()
    clean = sim.run(train_dp.main, world_size=40, seed=seed, faults=[sim.Straggler(3, 4.0)])
    assert clean.ok, clean.summary()
    faults = [sim.Straggler(3, 4.0), sim.Crash(37, at=round(clean.virtual_time * 0.3, 6))]
    res = sim.run(train_dp.main, world_size=40, seed=seed, faults=faults, stop_on_error=False)
    capsys.readouterr()
    errors = [f for f in res.failures if f.kind == "exception"]
    assert len(errors) >= 30, res.summary()
    import re

    for f in errors:
        last = f.message.strip().splitlines()[-1]
        assert "rank 37 failed" in last and set(re.findall(r"after rank (\d+) failed", last)) <= {"37"}, (f.rank, last)


async def _waits_for_rank_1(rank_1_aborts: bool) -> Any:
    await dist.init_process_group(timeout=60)
    if dist.get_rank() == 1:
        if rank_1_aborts:
            await asyncio.sleep(0.3)
            await dist.abort()
        await asyncio.sleep(100)
        return None
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        await dist.recv(np.empty(4), src=1, timeout=50)
    except AiodistError as e:
        return loop.time() - t0, type(e).__name__, getattr(e, "rank", None)
    return None


@pytest.mark.parametrize("how", ["crash", "abort"])
def test_a_rank_gone_before_it_ever_connected_fails_the_receives_waiting_for_it(how: str) -> None:
    """Rank 1 crashes (or aborts) before it ever sent anything; ranks 0 and 2 wait to receive from it. Rank 0
    (the lower rank) dialed it and saw the connection go; rank 2 dials it speculatively after 0.5 s, and
    nothing listens there any more -- or the store, hosted by rank 0, which returned with its error, is
    gone, its farewell naming rank 1's failure. That was no verdict: rank 2 waited its receive's 50 s."""
    faults = [sim.Crash(1, at=0.3)] if how == "crash" else []
    res = sim.run(functools.partial(_waits_for_rank_1, how == "abort"), world_size=3, seed=0, explore=False,
                  stop_on_error=False, faults=faults)
    for r in (0, 2):
        took, kind, rank = res.rank_results[r]
        assert kind == "PeerFailureError" and rank == 1 and took < 1.0, res.rank_results
