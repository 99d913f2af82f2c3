"""The simulated network over aiodist's seam: ordering, timing, copies, errors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sim_pair import PORT, dial, rank, serve_once

import sim
from sim.latency import Constant, Exponential, Uniform
from aiodist.context import current_network, getenv
from aiodist.errors import ConnectionLost, ListenError
from aiodist.inflight import waiting_in
from aiodist.net.base import Connection

ROOT = Path(__file__).resolve().parents[1]


def ok(result: sim.Result) -> sim.Result:
    result.raise_on_failure()
    return result


def test_frames_stay_in_order_under_random_latency() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> list[int]:
                return [(await conn.recv()).header["i"] for _ in range(300)]

            return await serve_once(h)
        conn = await dial()
        for i in range(300):
            await conn.send({"i": i})
        await asyncio.sleep(1)
        conn.close()

    net = sim.Network(latency=sim.Exponential(1e-3, 1e-5))
    assert ok(sim.run(main, world_size=2, seed=4, network=net)).rank_results[0] == list(range(300))


def test_alpha_beta_timing_and_nic_contention() -> None:
    n = 1_000_000

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            arrivals: list[float] = []
            done = asyncio.Event()

            async def h(conn: Connection) -> None:
                await conn.recv()
                arrivals.append(loop.time())
                if len(arrivals) == int(getenv("WORLD_SIZE") or 1) - 1:
                    done.set()

            listener = await current_network().listen(("", PORT), h)
            await done.wait()
            await listener.aclose()
            return arrivals
        conn = await dial()
        start = loop.time()
        await conn.send({}, bytes(n))
        await asyncio.sleep(10)
        return start

    # 1 MB at 1 MB/s with 1 ms latency: alpha + n*beta = 1.001 s after the send.
    net = sim.Network(latency=1e-3, bandwidth=1e6, contention=False)
    res = ok(sim.run(main, world_size=2, network=net, explore=False))
    assert res.rank_results[0][0] - res.rank_results[1] == pytest.approx(1.001, rel=1e-9)
    assert len(res.rank_results[0]) == 1
    # Two senders into one receiver: its incoming link serializes them.
    net = sim.Network(latency=1e-3, bandwidth=1e6, contention=True)
    res = ok(sim.run(main, world_size=3, network=net, explore=False))
    first, second = sorted(res.rank_results[0])
    assert first - res.rank_results[1] == pytest.approx(1.001, rel=1e-6)
    assert second - first == pytest.approx(1.0, rel=1e-6)


def test_connect_refused_and_unknown_host_raise_connection_lost() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(ConnectionLost, match="refused"):
            await current_network().connect(("rank1", 1234))
        rtt = loop.time() - t0
        with pytest.raises(ConnectionLost, match="unknown host"):
            await current_network().connect(("nowhere", 1234))
        with pytest.raises(TimeoutError):
            await current_network().connect(("rank1", 1234), timeout=0.0001)
        return rtt

    assert ok(sim.run(main, world_size=2, network=sim.Network(latency=0.01), explore=False)).rank_results[0] == pytest.approx(0.02)


def test_listen_twice_on_a_port_fails_and_port_zero_picks_one() -> None:
    async def main() -> Any:
        net = current_network()

        async def h(conn: Connection) -> None:
            return None

        a = await net.listen(("0.0.0.0", 0), h)
        b = await net.listen(("", 0), h)
        with pytest.raises(ListenError, match="in use"):
            await net.listen(("", a.address[1]), h)
        ports = (a.address[1], b.address[1])
        await a.aclose()
        await b.aclose()
        return ports

    p1, p2 = ok(sim.run(main, world_size=1)).rank_results[0]
    assert p1 != p2 and p1 > 0 and p2 > 0


def test_per_link_latency_override() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            async def h(conn: Connection) -> None:
                while True:
                    f = await conn.recv()
                    await conn.send(f.header)

            listener = await current_network().listen(("", PORT), h)
            await asyncio.sleep(5)
            await listener.aclose()
            return None
        conn = await dial()
        t0 = loop.time()
        await conn.send({})
        await conn.recv()
        conn.close()
        return loop.time() - t0

    net = sim.Network(latency=1e-3, links={(2, 0): 0.05, (0, 2): 0.05})
    res = ok(sim.run(main, world_size=3, network=net, explore=False))
    assert res.rank_results[1] == pytest.approx(2e-3)
    assert res.rank_results[2] == pytest.approx(0.1)


def test_cpu_overhead_is_logp_and_serialized_per_host() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            async def h(conn: Connection) -> list[float]:
                return [(await conn.recv(), loop.time())[1] for _ in range(2)]

            return await serve_once(h)
        conn = await dial()
        t0 = loop.time()
        # Two concurrent sends: the CPU handles them one after the other.
        await asyncio.gather(conn.send({"a": 1}), conn.send({"b": 2}))
        returned = loop.time() - t0
        await asyncio.sleep(1)
        return t0, returned

    net = sim.Network(latency=1e-3, bandwidth=None, overhead=1e-4)
    res = ok(sim.run(main, world_size=2, network=net, explore=False))
    t0, returned = res.rank_results[1]
    first, second = res.rank_results[0]
    assert returned == pytest.approx(2e-4)  # 2 o of sender CPU
    assert first - t0 == pytest.approx(1e-3 + 2e-4)  # L + 2o
    assert second - t0 == pytest.approx(1e-3 + 3e-4)  # departs o later


def test_cancelled_connect_leaves_nothing_behind() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> str:
                with pytest.raises(ConnectionLost):
                    await conn.recv()
                return "server saw the abandoned connection close"

            return await serve_once(h)
        await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError):
            # accepted by the server after 1 ms, but we give up before the reply arrives
            await current_network().connect(("rank0", PORT), timeout=0.0015)
        await asyncio.sleep(1)

    res = ok(sim.run(main, world_size=2, network=sim.Network.fixed(1e-3)))
    assert res.rank_results[0] == "server saw the abandoned connection close"


def test_a_failing_connection_handler_is_reported_not_fatal() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> None:
                raise ValueError("handler bug")

            listener = await current_network().listen(("", PORT), h)
            await asyncio.sleep(1)
            await listener.aclose()
            return None
        conn = await dial()
        with pytest.raises(ConnectionLost):  # like TCP: the handler's connection is closed
            await conn.recv()
        return "closed"

    res = ok(sim.run(main, world_size=2))
    assert res.rank_results[1] == "closed"
    assert any("handler bug" in u for u in res.unhandled)
    assert "handler bug" in res.summary()


async def send_send(frames: int) -> Any:
    """Both ranks send everything first and read afterwards: fine while buffers absorb it."""
    net = current_network()
    r = rank()
    accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
    finished = asyncio.Event()

    async def h(conn: Connection) -> None:
        accepted.set_result(conn)
        await finished.wait()  # keep the connection open (no timer: a hang is a deadlock)

    listener = await net.listen(("", PORT), h)
    await asyncio.sleep(0.01)
    out = await net.connect((f"rank{1 - r}", PORT))
    inbound = await accepted
    with waiting_in("send_all", peer=1 - r):
        for i in range(frames):
            await out.send({"i": i}, bytes(1024))
    for _ in range(frames):
        await inbound.recv()
    finished.set()
    await asyncio.sleep(0.01)
    out.close()
    listener.close()
    return frames


def test_send_send_deadlocks_beyond_the_buffers_like_tcp() -> None:
    net = sim.Network(latency=1e-4, max_unread_frames=64, socket_buffer=32 * 1024)
    assert sim.run(send_send, args=(80,), world_size=2, network=net).ok  # 64 queued + 16 KiB in the kernel
    res = sim.run(send_send, args=(200,), world_size=2, network=net)
    (failure,) = res.failures
    assert failure.kind == "deadlock"
    assert [op["op"] for op in failure.blocked[0]] == ["send_all"] == [op["op"] for op in failure.blocked[1]]
    unbounded = sim.Network(latency=1e-4, max_unread_frames=None, socket_buffer=None)
    assert sim.run(send_send, args=(200,), world_size=2, network=unbounded).ok


def test_a_reader_that_keeps_up_never_blocks_the_sender() -> None:
    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> int:
                return sum([len((await conn.recv()).payload) for _ in range(1000)])

            return await serve_once(h)
        conn = await dial()
        for _ in range(1000):
            await conn.send({}, bytes(4096))
        await asyncio.sleep(1)

    net = sim.Network(latency=1e-4, max_unread_frames=16, socket_buffer=8192)
    assert ok(sim.run(main, world_size=2, network=net)).rank_results[0] == 4096 * 1000


@pytest.mark.parametrize("settings", [
    lambda: {"latency": float("nan")}, lambda: {"latency": -1e-3}, lambda: {"latency": Constant(float("inf"))},
    lambda: {"latency": Uniform(2e-4, 1e-4)}, lambda: {"latency": Exponential(float("nan"))},
    lambda: {"links": {(0, 1): float("nan")}}, lambda: {"bandwidth": 0}, lambda: {"bandwidth": -5.0},
    lambda: {"bandwidth": float("nan")}, lambda: {"overhead": -1.0}, lambda: {"slow": {(0, 1): 0.0}},
    lambda: {"retransmit_timeout": 0}, lambda: {"max_unread_frames": 0}, lambda: {"socket_buffer": -1},
])
def test_a_network_setting_no_network_has_is_refused_when_made(settings: Any) -> None:
    # Before: all accepted; a NaN latency made the clock stop advancing and sim.run spun forever (time_limit
    # never reached), the others gave runs that "passed" with negative or infinite delays.
    with pytest.raises(ValueError, match="must be|needs"):
        sim.Network(**settings())


def test_the_cli_says_what_is_wrong_with_a_network_setting(tmp_path: Path) -> None:
    (tmp_path / "p.py").write_text("async def main():\n    return 1\n")
    for flags, said in ((["--latency", "nan"], "bad latency 'nan'"), (["--bandwidth", "-5"], "bandwidth must be"),
                        (["--overhead", "nan"], "overhead must be")):
        proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", *flags, str(tmp_path / "p.py")],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
