"""A virtual rank is a whole process: environment, generators, addresses, exit, threads, operations never awaited."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import secrets
import os
import random
import sys
import time
import uuid
from typing import Any

import numpy as np
import pytest

import aiodist
import sim
from aiodist.context import current_network, token_bytes
from aiodist.errors import ConnectionLost
from aiodist.net.base import Connection


# ----------------------------------------------------------------------------- os.environ


def test_each_rank_reads_and_writes_its_own_os_environ() -> None:
    real = os.environ

    async def main() -> Any:
        rank = os.environ["RANK"]
        os.environ["MINE"] = rank
        await asyncio.sleep(0.01 * (3 - int(rank)))  # the others write meanwhile
        return os.environ["RANK"], os.getenv("WORLD_SIZE"), os.environ["MINE"], "PATH" in os.environ, \
            os.environ.get("EXTRA")

    res = sim.run(main, world_size=3, env={"EXTRA": "x"})
    assert res.ok, res.summary()
    assert res.rank_results == [(str(r), "3", str(r), "PATH" in real, "x") for r in range(3)]
    assert os.environ is real and "MINE" not in os.environ


def test_launcher_and_aiodist_variables_of_the_shell_do_not_leak_into_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIODIST_HEARTBEAT_INTERVAL", "0.01")
    monkeypatch.setenv("RANK", "99")

    async def main() -> Any:
        return os.environ["RANK"], os.getenv("AIODIST_HEARTBEAT_INTERVAL")

    assert sim.run(main, world_size=2).rank_results == [("0", None), ("1", None)]


# ----------------------------------------------------------------------------- generators


async def _draws() -> Any:
    unseeded = (random.random(), float(np.random.rand()))
    random.seed(7)
    np.random.seed(7)
    await asyncio.sleep(0.001 * int(os.environ["RANK"]))  # interleave the ranks' draws
    seeded = (random.random(), random.randrange(1000), float(np.random.rand()), int(np.random.randint(1000)),
              float(np.random.mtrand._rand.random_sample()))
    return unseeded, seeded


def test_each_rank_has_its_own_module_level_generators() -> None:
    before = random.getstate(), np.random.get_state()[1].tolist()
    a = sim.run(_draws, world_size=4, seed=3)
    b = sim.run(_draws, world_size=4, seed=3)
    c = sim.run(_draws, world_size=4, seed=4)
    assert a.ok and a.rank_results == b.rank_results
    unseeded = [u for u, _ in a.rank_results]
    seeded = [s for _, s in a.rank_results]
    # random.seed(7) on every rank gives every rank the same draws, as in separate processes
    assert all(s == seeded[0] for s in seeded)
    assert len(set(unseeded)) == 4  # each rank starts from its own state ...
    assert [u for u, _ in c.rank_results] != unseeded  # ... drawn from the run's seed
    assert (random.getstate(), np.random.get_state()[1].tolist()) == before  # restored after the run


def test_torch_default_generator_is_per_rank() -> None:
    torch = pytest.importorskip("torch")

    async def main() -> Any:
        torch.manual_seed(0)
        await asyncio.sleep(0.001 * int(os.environ["RANK"]))
        first = torch.randperm(8).tolist()
        await asyncio.sleep(0.001)
        return first, torch.rand(2).tolist()

    state = torch.get_rng_state()
    res = sim.run(main, world_size=3)
    assert res.ok and all(r == res.rank_results[0] for r in res.rank_results)
    assert torch.equal(torch.get_rng_state(), state)


# ----------------------------------------------------------------------------- nonces, secret, addresses


def test_ranks_get_a_seeded_secret_and_nonce_source() -> None:
    async def main() -> Any:
        return os.environ.get("AIODIST_SECRET"), token_bytes(8)

    a = sim.run(main, world_size=3, seed=1).rank_results
    assert a == sim.run(main, world_size=3, seed=1).rank_results
    secrets = {s for s, _ in a}
    assert len(secrets) == 1 and None not in secrets  # one job, one secret
    assert len({t for _, t in a}) == 3  # each rank its own nonces
    assert {s for s, _ in sim.run(main, world_size=3, seed=2).rank_results} != secrets
    insecure = sim.run(main, world_size=2, seed=1, env={"AIODIST_INSECURE": "1"}).rank_results
    assert [s for s, _ in insecure] == [None, None]


async def _clocks() -> Any:
    t0, m0, p0, n0 = time.time(), time.monotonic(), time.perf_counter(), time.monotonic_ns()
    await asyncio.sleep(1.5)
    return (time.time() - t0, time.monotonic() - m0, time.perf_counter() - p0, time.monotonic_ns() - n0,
            time.time_ns() // 10**9 == int(time.time()), t0)


def test_a_ranks_clocks_read_virtual_time() -> None:
    """time.time/monotonic/perf_counter in a rank: 1.5 s of virtual sleep is 1.5 s on each (a lease expires)."""
    real = time.time, time.monotonic, time.perf_counter
    res = sim.run(_clocks, world_size=2, seed=1)
    assert res.ok, res.summary()
    for wall, mono, perf, mono_ns, ns_agrees, start in res.rank_results:
        assert wall == pytest.approx(1.5, abs=1e-6) and mono == pytest.approx(1.5, abs=1e-6)
        assert perf == pytest.approx(1.5, abs=1e-6) and mono_ns == pytest.approx(1.5e9, abs=1e3) and ns_agrees
        assert sim.VIRTUAL_EPOCH <= start < sim.VIRTUAL_EPOCH + 1  # a fixed wall clock: replays agree
    assert (time.time, time.monotonic, time.perf_counter) == real  # restored after the run
    assert abs(time.time() - res.rank_results[0][5]) > 1.0 or time.time() < sim.VIRTUAL_EPOCH  # (real again)


async def _poll_for_50ms() -> int:
    deadline = time.time() + 0.05  # the way programs poll for a while
    polls = 0
    while time.time() < deadline:
        polls += 1
        await asyncio.sleep(0.001)
    return polls


def test_a_deadline_read_from_time_time_replays_exactly() -> None:
    """Real time in a rank made every run of one seed differ (the loop ran as long as the machine took)."""
    for explore in (False, True):
        runs = [sim.run(_poll_for_50ms, world_size=2, seed=0, explore=explore) for _ in range(3)]
        assert all(r.ok for r in runs)
        assert all(r.rank_results == runs[0].rank_results for r in runs) and len({r.digest for r in runs}) == 1
        if not explore:
            assert runs[0].rank_results == [50, 50]


async def _tcp_loopback() -> Any:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    await aiodist.init_process_group("tcp://127.0.0.1:29612", rank=rank, world_size=world, timeout=30)
    x = np.ones(4)
    await aiodist.all_reduce(x)
    await aiodist.destroy_process_group()
    return float(x[0])


def test_tcp_loopback_init_method_reaches_the_store_host() -> None:
    res = sim.run(_tcp_loopback, world_size=4, seed=2)
    assert res.ok, res.summary()
    assert res.rank_results == [4.0] * 4


def test_env_init_with_master_addr_localhost_set_by_the_program() -> None:
    async def main() -> Any:
        os.environ["MASTER_ADDR"] = "localhost"  # as tutorials do before init_process_group
        os.environ["MASTER_PORT"] = "12355"
        await aiodist.init_process_group()
        x = np.ones(2)
        await aiodist.all_reduce(x)
        await aiodist.destroy_process_group()
        return float(x[0])

    res = sim.run(main, world_size=3, seed=5)
    assert res.ok, res.summary()
    assert res.rank_results == [3.0] * 3


# ----------------------------------------------------------------------------- a rank that returns exits


async def _server_leaves_early(*, read: bool) -> Any:
    rank = int(os.environ["RANK"])
    net = current_network()
    if rank == 0:
        accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        listener = await net.listen(("", 7000), lambda conn: accepted.set_result(conn) or asyncio.sleep(3600))
        conn = await accepted
        if read:
            await conn.recv()
        await asyncio.sleep(0.001)
        return "left"  # without closing anything: the process exit does
    conn = await net.connect(("rank0", 7000))
    await conn.send({"hello": 1})
    await asyncio.sleep(0.1)
    try:
        await conn.recv()  # rank 0 never answers: it left
    except ConnectionLost as e:
        return str(e)
    return "answered"


def test_a_rank_that_returns_closes_its_connections() -> None:
    async def main() -> Any:
        return await _server_leaves_early(read=True)

    res = sim.run(main, world_size=2, seed=1)
    assert res.ok, res.summary()
    assert res.rank_results[0] == "left"
    assert "closed the connection" in res.rank_results[1] and "exited" in res.rank_results[1]


def test_a_rank_that_returned_before_the_failure_is_named_in_the_summary() -> None:
    """As the launcher's 'rank 3 exited cleanly while ranks 0-2 wait': the peers only say 'left the job'."""

    async def main() -> Any:
        pg = await aiodist.init_process_group()
        if pg.rank == 3:
            return "early"
        await aiodist.all_reduce(np.ones(4))
        await aiodist.destroy_process_group()
        return "late"

    res = sim.run(main, world_size=4, seed=0)
    assert not res.ok and list(res.returned) == [3]
    assert res.returned[3] < min(f.time for f in res.failures)
    assert "rank 3 ended without error (returned from main" in res.summary() and "before the first failure" in res.summary()
    fine = sim.run(_all_stay, world_size=4, seed=0)
    assert fine.ok and list(fine.returned) == [0, 1, 2, 3] and "ended without error" not in fine.summary()


async def _all_stay() -> Any:
    await aiodist.init_process_group()
    await aiodist.all_reduce(np.ones(4))
    await aiodist.destroy_process_group()


def test_unread_data_at_exit_resets_the_connection() -> None:
    async def main() -> Any:
        return await _server_leaves_early(read=False)

    res = sim.run(main, world_size=2, seed=1)
    assert res.ok, res.summary()
    assert "reset" in res.rank_results[1] and "unread" in res.rank_results[1]


def test_tasks_left_at_return_are_cancelled_as_asyncio_run_does() -> None:
    log: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            log.append(os.environ["RANK"])

    async def main() -> Any:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0.001)
        return "done"

    res = sim.run(main, world_size=2)
    assert res.ok and res.virtual_time < 1 and sorted(log) == ["0", "1"]


# ----------------------------------------------------------------------------- operations never awaited


async def _forgets_a_work(*, forget: bool) -> Any:
    await aiodist.init_process_group()
    x = np.ones(3)
    work = aiodist.all_reduce(x)  # the line a failure must name
    if not forget:
        await work
    await aiodist.barrier()
    await aiodist.destroy_process_group()


def test_an_operation_never_awaited_is_a_failure_naming_its_line() -> None:
    async def forgets() -> Any:
        return await _forgets_a_work(forget=True)

    async def awaits() -> Any:
        return await _forgets_a_work(forget=False)

    res = sim.run(forgets, world_size=2, stop_on_error=False)
    assert not res.ok
    assert [f.kind for f in res.failures] == ["unawaited", "unawaited"]
    line = _forgets_a_work.__code__.co_firstlineno + 3
    assert f"all_reduce #0 of world (test_sim_process.py:{line} in _forgets_a_work)" in res.failures[0].message
    assert sim.run(awaits, world_size=2).ok


# ----------------------------------------------------------------------------- threads


def test_to_thread_runs_inline_at_a_virtual_cost() -> None:
    def work(n: int) -> tuple[str, int]:
        if n < 0:
            raise ValueError("negative")
        return os.environ["RANK"], n * n

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await asyncio.to_thread(work, 3)
        other = await loop.run_in_executor(None, work, 4)
        try:
            await asyncio.to_thread(work, -1)
        except ValueError as e:
            err = str(e)
        return got, other, err, loop.time() - t0

    free = sim.run(main, world_size=2, explore=False)  # (fixed timing: the costs below)
    assert free.ok, free.summary()
    assert [r[:3] for r in free.rank_results] == [(("0", 9), ("0", 16), "negative"), (("1", 9), ("1", 16), "negative")]
    assert free.rank_results[0][3] == 0.0
    charged = sim.run(main, world_size=2, compute=0.25, explore=False)
    assert [r[3] for r in charged.rank_results] == [0.75, 0.75]
    by_call = sim.run(main, world_size=1, compute=lambda func, args: 0.1 * len(args), explore=False)
    assert by_call.rank_results[0][3] == pytest.approx(0.1)  # (to_thread passes no args; the executor call one)


@contextlib.asynccontextmanager
async def _resource() -> Any:
    try:
        yield
        await asyncio.sleep(1)  # leaving: a goodbye that waits
    finally:
        await asyncio.sleep(0)  # cleanup that awaits (closing a connection, say)


async def _fails_inside_a_resource() -> None:
    async with _resource():
        if os.environ["RANK"] == "0":
            await asyncio.sleep(0.1)
            raise AssertionError("rank 0 fails")
        # (the other rank is in the exit's goodbye when the run ends: inside the async generator)


def test_a_dropped_world_prints_no_ignored_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks left inside an ``async with`` whose exit awaits: dropping them printed "Exception ignored in:
    <async_generator ...> RuntimeError: async generator ignored GeneratorExit" for each (sweeps too)."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    res = sim.run(_fails_inside_a_resource, world_size=2, seed=0)
    assert not res.ok and res.failures[0].message.startswith("AssertionError: rank 0 fails")
    assert seen == []
    assert sys.unraisablehook == seen.append  # (restored)


def test_a_rank_waiting_in_an_async_context_managers_exit_is_blocked_at_the_generators_line() -> None:
    """It was reported blocked in contextlib.py (its ``__aexit__``), not at the program's line."""
    res = sim.run(_fails_inside_a_resource, world_size=2, seed=0)
    lines, first = inspect.getsourcelines(_resource)
    wait_line = first + next(i for i, text in enumerate(lines) if "await asyncio.sleep(1)" in text)
    assert res.failures[0].where[1] == f"{__file__}:{wait_line} in _resource", res.failures[0].where
    assert f"test_sim_process.py:{wait_line} in _resource" in res.summary()


async def _blocks_then_sends() -> Any:
    await aiodist.init_process_group()
    loop = asyncio.get_running_loop()
    buf = np.zeros(1)
    try:
        if aiodist.get_rank() == 0:
            t0 = time.time()
            time.sleep(0.5)  # a blocking call: the process is stopped for 0.5 s
            buf[0] = time.time() - t0
            sent_at = loop.time()
            await aiodist.send(buf, dst=1)
            return float(buf[0]), sent_at
        start = loop.time()
        await aiodist.recv(buf, src=0)
        return float(buf[0]), loop.time() - start
    finally:
        await aiodist.destroy_process_group()


async def _polls_with_a_blocking_sleep() -> int:
    deadline = time.monotonic() + 0.2
    polls = 0
    while time.monotonic() < deadline:
        time.sleep(0.01)
        polls += 1
    return polls


def test_a_blocking_sleep_stops_the_rank_in_virtual_time() -> None:
    """time.sleep in a rank: its clocks move on, what it sends after leaves then, the others go on meanwhile.

    (Real time before: the run waited for it and the rank's clocks did not move, so a
    polling loop on time.monotonic() with time.sleep never ended once the clocks were virtual.)
    """
    res = sim.run(_blocks_then_sends, world_size=2, seed=0, explore=False)
    assert res.ok, res.summary()
    (slept, _), (told, waited) = res.rank_results
    assert slept == pytest.approx(0.5) and told == pytest.approx(0.5)
    assert 0.5 <= waited < 0.51  # the message left when the sleep ended
    polls = sim.run(_polls_with_a_blocking_sleep, world_size=2, seed=0, explore=False)
    assert polls.ok and polls.rank_results == [20, 20] and polls.virtual_time == pytest.approx(0.2)
    assert time.sleep.__module__ == "time" and not hasattr(time.sleep, "__wrapped__")  # (restored: the builtin)


async def _sleeps_then_times_out() -> Any:
    await aiodist.init_process_group()
    loop = asyncio.get_running_loop()
    try:
        if aiodist.get_rank() == 1:
            time.sleep(5)
            after_sleep = loop.time()
            try:
                await aiodist.barrier(timeout=2)  # (rank 0 is away for 10 s: it cannot complete)
            except aiodist.CollectiveTimeoutError:
                return after_sleep, loop.time()
            return after_sleep, None
        await asyncio.sleep(10)
        return None
    finally:
        await aiodist.destroy_process_group()


def test_the_event_loop_clock_counts_a_blocking_sleep_so_a_deadline_set_after_it_is_not_short() -> None:
    """As in a real process, loop.time() after time.sleep(5) reads 5 s later, so a 2 s timeout set then ends at 7 s.

    (Before: loop.time() still read 0 in the rest of the step, so the timeout fired at 2 s,
    the moment the sleep ended; the real run times out at 7 s.)
    """
    res = sim.run(_sleeps_then_times_out, world_size=2, seed=0, explore=False)
    assert res.ok, res.summary()
    after_sleep, raised = res.rank_results[1]
    assert after_sleep == pytest.approx(5.0, abs=0.01) and raised == pytest.approx(7.0, abs=0.05)


async def _ids() -> Any:
    return os.getpid(), uuid.uuid4().hex, secrets.token_hex(8), random.SystemRandom().random(), os.urandom(4)


def test_each_rank_has_its_own_pid_and_seeded_urandom() -> None:
    """All ranks shared the simulator's pid (an owner id made of it named every rank), and uuid4/secrets/urandom
    drew from the OS, so a program that made ids or tokens with them never replayed."""
    real_pid = os.getpid()
    a, b = sim.run(_ids, world_size=3, seed=5), sim.run(_ids, world_size=3, seed=5)
    c = sim.run(_ids, world_size=3, seed=6)
    assert a.ok and a.rank_results == b.rank_results and a.digest == b.digest
    pids = [r[0] for r in a.rank_results]
    assert len(set(pids)) == 3 and real_pid not in pids
    assert len({r[1] for r in a.rank_results}) == 3  # (each rank its own stream)
    assert [r[1:] for r in c.rank_results] != [r[1:] for r in a.rank_results]  # (drawn from the seed)
    assert os.getpid() == real_pid and len(os.urandom(8)) == 8  # restored after the run


_PIDS_SEEN: list[tuple[int, str, int]] = []  # (a test's record across incarnations: module state is shared)


async def _records_its_pid() -> None:
    _PIDS_SEEN.append((int(os.environ["RANK"]), os.environ.get("AIODIST_RESTART_COUNT", "0"), os.getpid()))
    if os.environ.get("AIODIST_RESTART_COUNT", "0") == "0":
        await asyncio.sleep(1)  # (rank 1 is restarted meanwhile)


def test_a_restarted_rank_has_a_new_pid() -> None:
    _PIDS_SEEN.clear()
    res = sim.run(_records_its_pid, world_size=2, seed=0, faults=[sim.Restart(1, at=0.05)], explore=False,
                  isolate=False)  # (the ranks share this module: the test reads what they left in it)
    assert res.ok, res.summary()
    rank1 = [(count, pid) for rank, count, pid in _PIDS_SEEN if rank == 1]
    assert [count for count, _ in rank1] == ["0", "1"] and rank1[0][1] != rank1[1][1]


async def _exits(code: Any, in_a_task: bool) -> str:
    if os.environ["RANK"] == "1":
        if in_a_task:
            async def child() -> None:
                await asyncio.sleep(0.01)
                sys.exit(code)

            task = asyncio.create_task(child())
            await asyncio.sleep(1)
            task.cancel()
        await asyncio.sleep(0.01)
        sys.exit(code)
    await asyncio.sleep(0.1)
    return "ok"


@pytest.mark.parametrize("in_a_task", [False, True])
def test_sys_exit_in_a_rank_ends_that_rank_with_its_code(in_a_task: bool) -> None:
    """SystemExit went through the simulator: sys.exit(3) in one rank ended the whole sweep."""
    res = sim.run(_exits, world_size=2, seed=0, args=(3, in_a_task), stop_on_error=False)
    assert not res.ok and [(f.rank, f.message) for f in res.failures] == [(1, "SystemExit: 3")]
    # The traceback starts at the program's frame, as a real process's does (it started in sim/loop.py).
    first = res.failures[0].traceback.splitlines()[1]
    assert "test_sim_process.py" in first and "sim/loop.py" not in res.failures[0].traceback, first
    assert res.rank_results[0] == "ok" and res.unhandled == []
    clean = sim.run(_exits, world_size=2, seed=0, args=(0, in_a_task))
    assert clean.ok and clean.rank_results == ["ok", None]


def test_a_rank_never_signals_a_real_process() -> None:
    """Elastic probe: os.kill was not virtualized, so a rank's os.kill reached the real process with that pid --
    os.kill(os.getpid(), SIGKILL), which examples/elastic_train.py does to inject a crash, targeted the real pid
    10000 + rank, and an unrelated process there died. Now a rank may end itself (its process exits, status
    128 + the signal, its connections close) and any other os.kill or os.killpg raises SimUnsupportedError."""
    import signal
    import subprocess
    import sys

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def main() -> Any:
            await aiodist.init_process_group(timeout=60)
            if aiodist.get_rank() == 1:
                try:
                    os.kill(sleeper.pid, signal.SIGTERM)
                except sim.SimUnsupportedError as e:
                    assert "no real process is ever signalled" in str(e)
                try:
                    os.killpg(sleeper.pid, signal.SIGTERM)
                except sim.SimUnsupportedError:
                    pass
                os.kill(os.getpid(), signal.SIGKILL)  # ends this rank
                return "still here"
            try:
                await aiodist.all_reduce(np.ones(2))
            except aiodist.PeerFailureError as e:
                return e.rank
            return None

        res = sim.run(main, world_size=3, seed=0, stop_on_error=False)
        assert sleeper.poll() is None, "a simulated rank signalled a real process"
        assert res.rank_results[0] == res.rank_results[2] == 1, res.rank_results
        assert res.rank_results[1] is None and "os._exit(137)" in res.failures[0].message, res.failures
    finally:
        sleeper.kill()
        sleeper.wait()


# ----------------------------------------------------------------------------- fork


_REAL_FORK = os.fork


async def _forks() -> Any:
    import posix

    pid = os.fork()
    if pid == 0:  # (before the fix: the child, a copy of the whole simulation, leaves at once here)
        posix._exit(0)
    posix.waitpid(pid, 0)
    return pid


def test_os_fork_in_a_rank_is_refused() -> None:
    # torch24 probe, finding 6: a DataLoader's worker (os.fork) in a rank made a child that went on running
    # the whole simulation and printed a second report; the parent said "ok".
    res = sim.run(_forks, world_size=1, seed=0)
    assert not res.ok
    assert "SimUnsupportedError" in res.summary() and "os.fork() in a simulated rank" in res.summary()
    assert os.fork is _REAL_FORK  # (restored after the run)
