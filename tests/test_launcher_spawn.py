"""``aiodist.spawn``: functions run as ranks in spawned processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest

import aiodist
from aiodist.errors import LaunchTimeoutError, RankFailedError
from aiodist.launch.spawn import spawn

# Module-level functions: the spawned children import this module to find them.


def sync_worker(tag: str) -> tuple[str, str, str, str, str]:
    env = os.environ
    return (tag, env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"])


async def async_worker(scale: int) -> int:
    await asyncio.sleep(0.01)
    return int(os.environ["RANK"]) * scale


def failing_worker() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("rank one is broken")
    time.sleep(60)


def killed_worker() -> None:
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)


def exiting_worker() -> None:
    if os.environ["RANK"] == "1":
        raise SystemExit(4)
    time.sleep(60)


def unpicklable_result() -> object:
    return lambda: None


def sleeping_worker() -> None:
    time.sleep(60)


async def leaves_then_raises() -> None:
    pg = await aiodist.init_process_group(timeout=30)
    await aiodist.barrier()
    if pg.rank == 2:
        await aiodist.destroy_process_group()  # the others lose it now, and fail first
        await asyncio.sleep(1.0)
        raise RuntimeError("rank 2 gave up")
    await aiodist.all_reduce(np.ones(4))


async def host_returns_early() -> None:
    pg = await aiodist.init_process_group(timeout=30)
    await aiodist.barrier()
    if pg.rank == 0:  # the store's host leaves while the others still need it
        await aiodist.destroy_process_group()
        return
    await aiodist.all_reduce(np.ones(4))


async def returns_before_its_rendezvous() -> str:
    if os.environ["RANK"] == "2":  # (a rank that skips the job: the others wait for it in their rendezvous)
        return "skipped"
    await aiodist.init_process_group(timeout=120)
    await aiodist.destroy_process_group()
    return "done"


def env_at_import_worker() -> str:
    return os.environ.get("AIODIST_SPAWN_TEST", "") + "/" + os.environ["RANK"]


def test_spawn_sync_function_returns_results_by_rank() -> None:
    results = spawn(sync_worker, 3, args=("t",), master_port=29533)
    assert results == [("t", str(r), "3", str(r), "29533") for r in range(3)]


def test_spawn_async_function() -> None:
    assert spawn(async_worker, 2, args=(10,)) == [0, 10]


def test_spawn_adds_caller_env() -> None:
    assert spawn(env_at_import_worker, 2, env={"AIODIST_SPAWN_TEST": "x"}) == ["x/0", "x/1"]
    assert "AIODIST_SPAWN_TEST" not in os.environ and "RANK" not in os.environ


def test_spawn_failing_rank_raises_naming_it_and_stops_the_others() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn(failing_worker, 2)
    assert time.monotonic() - start < 10
    err = info.value
    assert err.rank == 1 and err.exitcode == 1 and err.signal is None
    assert "rank 1 (pid" in str(err) and "ValueError: rank one is broken" in str(err)
    assert err.remote_traceback is not None and "failing_worker" in err.remote_traceback


def test_spawn_names_the_root_cause_not_the_first_rank_that_lost_it() -> None:
    # Before: spawn named whichever rank exited first: one of those that raised PeerFailureError
    # because rank 2 left (every run). ``aiodist run`` named rank 2.
    with pytest.raises(RankFailedError) as info:
        spawn(leaves_then_raises, 3)
    err = info.value
    assert err.rank == 2 and "RuntimeError: rank 2 gave up" in str(err)
    assert err.remote_traceback is not None and "leaves_then_raises" in err.remote_traceback


def test_spawn_says_when_the_root_cause_is_a_rank_that_returned_early() -> None:
    # Before: no root cause was given, and it could not have been: rank 0, the store's host, waited
    # 10 s for the others to leave the store although they had failed (now: until nobody else is
    # connected to it), so it was still running when spawn gave up waiting for the root cause.
    with pytest.raises(RankFailedError) as info:
        spawn(host_returns_early, 3)
    err = info.value
    assert err.rank in (1, 2) and "PeerFailureError" in str(err)
    assert "root cause: rank 0 exited cleanly while ranks 1, 2 wait in all_reduce #1" in str(err)


def test_spawn_stops_at_once_when_a_rank_returned_without_joining_the_rendezvous_the_others_wait_in() -> None:
    """Before: the others waited out their whole rendezvous timeout (here 120 s; 300 s by default) before the
    job failed, as ``aiodist run`` did until it read the ranks' rendezvous marks (aiodist.launch_marks)."""
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn(returns_before_its_rendezvous, 3, timeout=100)
    assert time.monotonic() - start < 30
    err = info.value
    assert err.rank == 2 and err.exitcode == 0 and err.signal is None
    assert "rank 2 (pid" in str(err) and "returned without joining its rendezvous" in str(err)
    assert "rank 2 exited cleanly while rank" in str(err) and "wait" in str(err)


def test_spawn_rank_killed_by_signal_is_named() -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(killed_worker, 2)
    assert info.value.rank == 0 and info.value.signal == signal.SIGKILL and info.value.exitcode is None
    assert "killed by signal SIGKILL" in str(info.value)


def test_spawn_sys_exit_is_a_failure_with_its_code() -> None:
    with pytest.raises(RankFailedError) as info:
        spawn(exiting_worker, 2)
    assert info.value.rank == 1 and info.value.exitcode == 4


def test_spawn_unpicklable_result_fails_that_rank_clearly() -> None:
    with pytest.raises(RankFailedError, match="cannot send the return value back"):
        spawn(unpicklable_result, 1)


def test_spawn_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchTimeoutError):
        spawn(sleeping_worker, 2, timeout=1.0)
    assert time.monotonic() - start < 8


def test_spawn_rejects_functions_children_cannot_import() -> None:
    def local() -> None:
        pass

    with pytest.raises(ValueError, match="top level"):
        spawn(local, 2)
    with pytest.raises(ValueError, match="top level"):
        spawn(lambda: None, 2)


@pytest.mark.skipif(not hasattr(aiodist, "spawn"), reason="aiodist.spawn is not exported yet")
def test_public_aiodist_spawn() -> None:
    assert aiodist.spawn(async_worker, 2, args=(3,)) == [0, 3]
