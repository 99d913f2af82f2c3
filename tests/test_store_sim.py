"""The unchanged store server and client running in the simulator (virtual network, virtual clock)."""

from __future__ import annotations

import time

import pytest

sim = pytest.importorskip("sim")

from aiodist.context import getenv  # noqa: E402
from aiodist.errors import StoreConnectionLost, StoreTimeoutError  # noqa: E402
from aiodist.store import StoreServer, TCPStore  # noqa: E402


async def _open() -> tuple[int, int, StoreServer | None, TCPStore]:
    rank = int(getenv("RANK", "0") or 0)
    world = int(getenv("WORLD_SIZE", "1") or 1)
    host = getenv("MASTER_ADDR", "127.0.0.1") or "127.0.0.1"
    port = int(getenv("MASTER_PORT", "29500") or 29500)
    server = await StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await TCPStore.connect(host, port, timeout=60.0)  # retries until rank 0 listens
    return rank, world, server, store


async def _finish(rank: int, world: int, server: StoreServer | None, store: TCPStore) -> None:
    """A barrier: rank 0 keeps the server up until every rank is done with the store."""
    if await store.add("exit", 1) == world:
        await store.set("all-exited", b"")
    if rank == 0:
        await store.wait(["all-exited"], timeout=60)
    await store.close()
    if server is not None:
        await server.close()


async def counter_and_queue_main() -> dict[str, object]:
    rank, world, server, store = await _open()
    jobs = 3 * world
    for _ in range(10):
        await store.add("counter", 1)
    if rank == 0:
        for j in range(jobs):
            await store.queue_push("jobs", b"%d" % j)
        for _ in range(world):
            await store.queue_push("jobs", b"stop")
    done: list[int] = []
    while (item := await store.queue_pop("jobs", timeout=30)) != b"stop":
        done.append(int(item))
    await store.set(f"done/{rank}", ",".join(map(str, done)))
    await store.wait([f"done/{r}" for r in range(world)], timeout=30)
    lists = await store.multi_get([f"done/{r}" for r in range(world)])
    handled = sorted(int(x) for v in lists for x in v.split(b",") if x)
    result = {"counter": int(await store.get("counter")), "handled": handled, "mine": done}
    await _finish(rank, world, server, store)
    return result


def test_counters_and_queue_are_exact_under_many_schedules() -> None:
    for seed in range(6):
        res = sim.run(counter_and_queue_main, world_size=4, seed=seed)
        res.raise_on_failure()
        for r in res.rank_results:
            assert r["counter"] == 40
            assert r["handled"] == list(range(12))  # every job exactly once


def test_same_seed_same_run() -> None:
    a = sim.run(counter_and_queue_main, world_size=3, seed=11)
    b = sim.run(counter_and_queue_main, world_size=3, seed=11)
    a.raise_on_failure()
    assert a.digest == b.digest and a.virtual_time == b.virtual_time
    assert [r["mine"] for r in a.rank_results] == [r["mine"] for r in b.rank_results]


async def timeout_main() -> str:
    rank, world, server, store = await _open()
    if rank == 1:
        try:
            await store.get("never", timeout=100.0)
        except StoreTimeoutError as e:
            outcome = f"timeout {e.keys} {e.timeout:g}"
        else:
            outcome = "no timeout"
        await store.set("rank1-done", b"")
    else:
        await store.wait(["rank1-done"], timeout=300.0)
        outcome = "waited"
    await store.close()
    if server is not None:
        await server.close()
    return outcome


def test_blocking_timeout_runs_on_the_virtual_clock() -> None:
    t0 = time.perf_counter()
    res = sim.run(timeout_main, world_size=2, seed=0)
    res.raise_on_failure()
    assert res.rank_results == ["waited", "timeout ['never'] 100"]
    assert 100.0 <= res.virtual_time < 110.0
    assert time.perf_counter() - t0 < 10.0


async def stuck_main() -> None:
    rank, world, server, store = await _open()
    await store.get(f"never-set-{rank}", timeout=1000.0)


def test_time_limit_report_names_the_store_key_each_rank_waits_for() -> None:
    res = sim.run(stuck_main, world_size=2, seed=0, time_limit=50.0)
    assert not res.ok
    (failure,) = res.failures
    assert failure.kind == "time_limit"
    for rank in (0, 1):
        ops = failure.blocked[rank]
        assert any(op["op"] == "store.get" and op["key"] == f"never-set-{rank}" for op in ops), ops


async def crash_main() -> str:
    rank, world, server, store = await _open()
    try:
        await store.get("never", timeout=100.0)
    except StoreConnectionLost as e:
        assert "closed the connection" in str(e)
        try:
            await store.add("x", 1)
        except StoreConnectionLost:
            return "lost, then refused"
        return "lost, then accepted?!"
    return "no error"


def test_store_crash_fails_pending_calls_promptly() -> None:
    res = sim.run(crash_main, world_size=3, seed=2, faults=[sim.CrashStore(at=5.0)])
    res.raise_on_failure()
    assert res.rank_results == ["lost, then refused"] * 3
    assert res.virtual_time < 10.0  # nobody waited for the 100 s timeout


def test_digest_does_not_depend_on_the_hash_seed() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys; sys.path.insert(0, 'tests'); import sim, test_store_sim as t; "
        "print(sim.run(t.counter_and_queue_main, world_size=3, seed=5).digest)"
    )
    digests = set()
    for hashseed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(root))
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    digests.add(sim.run(counter_and_queue_main, world_size=3, seed=5).digest)
    assert len(digests) == 1
