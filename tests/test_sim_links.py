"""Link timing: order per connection only, NIC queues that serve bytes, latency tails."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import sim
from aiodist.context import current_network, getenv
from aiodist.net.base import Connection
from sim.links import book

PORT = 7100


def rank() -> int:
    return int(getenv("RANK") or 0)


async def _serve(n: int) -> tuple[list[tuple[str, float]], Any]:
    """Listen; return (arrivals, listener) once ``n`` frames came in (from any connection)."""
    loop = asyncio.get_running_loop()
    got: list[tuple[str, float]] = []
    done = asyncio.Event()
    conns: list[Connection] = []

    async def handler(conn: Connection) -> None:
        conns.append(conn)
        while True:
            f = await conn.recv()
            got.append((f.header["what"], loop.time()))
            if len(got) == n:
                done.set()

    listener = await current_network().listen(("", PORT), handler)
    await done.wait()
    return got, listener


def test_a_relayed_message_is_not_held_behind_a_slower_direct_one() -> None:
    """1 -> 0 takes 1 ms, 1 -> 2 -> 0 takes 2 x 10 us: nothing orders two senders' frames at 0."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        net = current_network()
        r = rank()
        if r == 0:
            got, listener = await _serve(2)
            await listener.aclose()
            return got
        if r == 2:
            to0 = await net.connect(("rank0", PORT))
            inbox: asyncio.Queue[Any] = asyncio.Queue()

            async def relay(conn: Connection) -> None:
                f = await conn.recv()
                await to0.send({"what": "relayed"}, f.payload)
                inbox.put_nowait(None)

            listener = await net.listen(("", PORT), relay)
            await inbox.get()
            await asyncio.sleep(0.01)
            await listener.aclose()
            return None
        await asyncio.sleep(0.005)  # both listeners are up, rank 2 is connected
        to0 = await net.connect(("rank0", PORT))
        to2 = await net.connect(("rank2", PORT))
        await asyncio.sleep(0.005)
        start = loop.time()
        await to0.send({"what": "direct"}, bytes(1000))
        await to2.send({"what": "via 2"}, bytes(1000))
        await asyncio.sleep(0.01)
        return start

    links = {(1, 0): 1e-3, (0, 1): 1e-3, (1, 2): 10e-6, (2, 1): 10e-6, (2, 0): 10e-6, (0, 2): 10e-6}
    net = sim.Network(latency=50e-6, links=links)  # default bandwidth and NIC contention
    res = sim.run(main, world_size=3, network=net, explore=False)
    assert res.ok, res.summary()
    got, start = res.rank_results[0], res.rank_results[1]
    assert [what for what, _ in got] == ["relayed", "direct"]
    tx = 1000 / 1.25e9
    relayed = dict(got)["relayed"] - start
    assert relayed == pytest.approx(2 * (10e-6 + tx) + tx, abs=1e-9)  # two hops; the second waits for rank 1's NIC
    assert dict(got)["direct"] - start == pytest.approx(1e-3 + tx, abs=1e-9)


def test_frames_of_one_connection_never_overtake_each_other_even_with_a_tail() -> None:
    async def main() -> Any:
        if rank() == 0:
            got, listener = await _serve(400)
            await listener.aclose()
            return [int(w) for w, _ in got]
        await asyncio.sleep(0.001)
        conn = await current_network().connect(("rank0", PORT))
        for i in range(400):
            conn.send_nowait({"what": str(i)}, bytes(i % 7))
            await asyncio.sleep(0)
        await conn.drained()
        await asyncio.sleep(1)
        return None

    net = sim.Network(tail=sim.Tail(0.2, 1e-3, 0.1))
    res = sim.run(main, world_size=2, network=net, explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[0] == list(range(400))


def test_an_incast_is_served_one_frame_at_a_time() -> None:
    """Three senders start 1 MB each at once into one receiver: its NIC takes them in turn."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            got, listener = await _serve(3)
            await listener.aclose()
            return sorted(t for _, t in got)
        await asyncio.sleep(0.001)
        conn = await current_network().connect(("rank0", PORT))
        await asyncio.sleep(1 - loop.time())
        await conn.send({"what": "x"}, bytes(1_000_000))
        await asyncio.sleep(10)
        return None

    net = sim.Network(latency=1e-3, bandwidth=1e6)
    res = sim.run(main, world_size=4, network=net, explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[0] == pytest.approx([2.001, 3.001, 4.001])


def test_booking_keeps_earlier_bookings_and_never_serves_two_at_once() -> None:
    rng = random.Random(5)
    busy: list[float] = []
    booked: list[tuple[float, float]] = []
    now = 0.0
    for _ in range(3000):
        now += rng.random() * 1e-3
        arrive = now + rng.choice([1e-5, 1e-4, 2e-3]) * rng.random()
        need = rng.choice([1e-6, 1e-4, 1e-3])
        snapshot = list(busy)
        end = book(busy, arrive, need, now)
        assert end - need >= arrive - 1e-15
        booked.append((end - need, end))
        # what was booked before (and is not over yet) is still booked
        for s, e in zip(snapshot[::2], snapshot[1::2]):
            if e > now:
                assert any(bs <= s + 1e-15 and e <= be + 1e-15 for bs, be in zip(busy[::2], busy[1::2]))
        assert busy == sorted(busy)
    booked.sort()
    for (s1, e1), (s2, _) in zip(booked, booked[1:]):
        assert s2 >= e1 - 1e-12  # one at a time: total time served equals the sum of the needs


def test_a_tail_delays_a_few_messages_by_up_to_its_bound() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        if rank() == 0:
            got, listener = await _serve(2000)
            await listener.aclose()
            return [t for _, t in got]
        await asyncio.sleep(0.001)
        conn = await current_network().connect(("rank0", PORT))
        sent = []
        for i in range(2000):
            await asyncio.sleep(1.0 - loop.time() + i)  # one a second: each alone on the link
            sent.append(loop.time())
            await conn.send({"what": str(i)})
        await asyncio.sleep(1)
        return sent

    net = sim.Network(latency=1e-4, tail=sim.Tail(0.05, 1e-3, 0.5))
    res = sim.run(main, world_size=2, network=net, explore=False)
    assert res.ok, res.summary()
    delays = [a - s for a, s in zip(res.rank_results[0], res.rank_results[1])]
    late = [d - 1e-4 for d in delays if d > 1e-4 + 1e-9]
    assert 50 <= len(late) <= 150  # ~5% of 2000
    assert min(late) >= 1e-3 - 1e-9 and max(late) <= 0.5 + 1e-9
    assert sum(1 for d in late if d > 0.05) >= 10  # log-uniform: the top decade as likely as the bottom one
