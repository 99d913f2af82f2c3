"""Every fault type, shown on real aiodist programs (the production store client/server)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import sim
from aiodist.context import current_network, getenv
from aiodist.errors import ConnectionLost
from aiodist.net.base import Connection
from aiodist.store import StoreServer, TCPStore

Body = Callable[[TCPStore, int], Awaitable[Any]]


async def store_program(body: Body, timeout: float = 300.0) -> Any:
    """Rank 0 hosts the store at MASTER_ADDR:MASTER_PORT; every rank runs ``body(store, rank)``."""
    rank = int(getenv("RANK") or 0)
    host = getenv("MASTER_ADDR") or "127.0.0.1"
    port = int(getenv("MASTER_PORT") or 0)
    server = await StoreServer.start(host="0.0.0.0", port=port) if rank == 0 else None
    store = await TCPStore.connect(host, port, timeout=timeout)
    try:
        return await body(store, rank)
    finally:
        await store.close()
        if server is not None:
            await server.close()


def run_store(body: Body, *, world_size: int = 3, faults: list[Any] = (), timeout: float = 300.0,
              network: sim.Network | None = None, seed: int = 0) -> sim.Result:
    return sim.run(store_program, args=(body, timeout), world_size=world_size, faults=faults, seed=seed,
                   network=network or sim.Network.fixed(1e-3), explore=False)


async def error_name(aw: Awaitable[Any]) -> str:
    try:
        await aw
    except Exception as e:  # noqa: BLE001 - the test looks at which error it was
        return type(e).__name__
    return "no error"


# --------------------------------------------------------------------------- crash


async def ticker(store: TCPStore, rank: int) -> Any:
    for _ in range(6):
        await asyncio.sleep(0.5)
        await store.add(f"tick{rank}", 1)
    if rank == 0:
        await asyncio.sleep(1)
        return [int(await store.add(f"tick{r}", 0)) for r in range(3)]
    return "done"


def test_crash_at_a_time_stops_the_rank() -> None:
    res = run_store(ticker, faults=[sim.Crash(2, at=1.2)])
    assert res.ok, res.summary()
    assert res.rank_results == [[6, 6, 2], "done", None]
    assert res.crashed == [2]
    assert any(e.kind == "crash" and e.host == "rank2" for e in res.trace)


def test_crash_on_the_nth_message_sent() -> None:
    res = run_store(ticker, faults=[sim.Crash(2, on=sim.MessageSent(2, 3))])
    assert res.ok, res.summary()
    sent_by_2 = [e for e in res.trace if e.kind == "send" and e.host == "rank2"]
    assert len(sent_by_2) == 3  # the 3rd message went out, nothing after it
    assert res.crashed == [2]
    assert res.rank_results[0][2] < 6


def test_crash_on_the_nth_message_received() -> None:
    res = run_store(ticker, faults=[sim.Crash(1, on=sim.MessageReceived(1, 4))])
    assert res.ok, res.summary()
    assert len([e for e in res.trace if e.kind == "recv" and e.host == "rank1"]) == 4
    assert res.crashed == [1]


async def connect_to_idle_rank0() -> Connection:
    """Rank 0 listens on port 5000 and idles (its connections' handlers too); the others connect to it at 0.1 s."""
    net = current_network()
    if int(getenv("RANK") or 0) == 0:
        async def handler(conn: Connection) -> None:
            await asyncio.sleep(1000)

        await net.listen(("", 5000), handler)
        await asyncio.sleep(1000)
    await asyncio.sleep(0.1)
    return await net.connect(("rank0", 5000))


def test_peers_of_a_crashed_rank_see_connection_lost() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        conn = await connect_to_idle_rank0()
        with pytest.raises(ConnectionLost, match="crashed"):
            await conn.recv()
        return loop.time()

    res = sim.run(main, world_size=2, faults=[sim.Crash(0, at=1.0)], network=sim.Network.fixed(1e-3), explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[1] == pytest.approx(1.001)  # one latency after the crash


def test_silent_crash_is_only_noticed_through_timeouts() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        conn = await connect_to_idle_rank0()
        with pytest.raises(TimeoutError):  # no FIN: silence, not ConnectionLost
            async with asyncio.timeout(5):
                await conn.recv()
        await conn.send({"hello": "anyone?"})  # never acknowledged ...
        with pytest.raises(ConnectionLost, match="timed out"):
            await conn.recv()  # ... so TCP gives up after the retransmit timeout
        t_broken = loop.time()
        with pytest.raises(ConnectionLost, match="no answer"):
            await current_network().connect(("rank0", 5000))
        return t_broken

    net = sim.Network(latency=1e-3, bandwidth=None, retransmit_timeout=3.0)
    res = sim.run(main, world_size=2, faults=[sim.Crash(0, at=1.0, silent=True)], network=net, explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[1] == pytest.approx(0.102 + 5.0 + 3.0, abs=1e-6)  # connect RTT, wait, retransmit


# --------------------------------------------------------------------------- restart


async def restartable(store: TCPStore, rank: int) -> Any:
    count = int(getenv("AIODIST_RESTART_COUNT") or 0)
    if rank == 2 and count == 0:
        await store.set("seen", b"incarnation 0")
        await asyncio.sleep(100)  # crashed before this ends
        return "never"
    if rank == 2:
        old = await store.get("seen")
        await store.set("r2done", b"1")
        return ("restarted", count, getenv("TORCHELASTIC_RESTART_COUNT"), old)
    await store.wait(["r2done"], timeout=50)
    return "ok"


def test_restart_runs_main_again_with_a_higher_restart_count() -> None:
    res = run_store(restartable, faults=[sim.Restart(2, at=1.0)])
    assert res.ok, res.summary()
    assert res.rank_results == ["ok", "ok", ("restarted", 1, "1", b"incarnation 0")]
    assert res.restarts == {2: 1}
    assert res.crashed == []


async def quick(store: TCPStore, rank: int) -> Any:
    await store.add("n", 1)
    return "ok"


def test_a_restart_due_after_every_rank_ended_does_not_keep_the_run_going() -> None:
    # (it would start nothing: a rank that returned is left alone; the run ended when the last rank did)
    plain = run_store(quick)
    res = run_store(quick, faults=[sim.Restart(1, at=50.0)])
    assert res.ok and res.restarts == {}, res.summary()
    assert res.virtual_time == plain.virtual_time < 50.0


# --------------------------------------------------------------------------- partitions and clogs


async def late_set(store: TCPStore, rank: int) -> Any:
    loop = asyncio.get_running_loop()
    if rank == 1:
        await asyncio.sleep(1.5)
        try:
            await store.set("k", b"v")
        except Exception as e:  # noqa: BLE001
            return type(e).__name__, loop.time()
        return "set", loop.time()
    await store.wait(["k"], timeout=200)
    return "seen", loop.time()


def test_partition_holds_messages_until_it_heals() -> None:
    res = run_store(late_set, world_size=2, faults=[sim.Partition((1,), (0,), at=1.0, heal_at=4.0)])
    assert res.ok, res.summary()
    (seen, t_seen), (done, t_set) = res.rank_results
    assert (seen, done) == ("seen", "set")
    assert 4.0 < t_seen < 4.01 and 4.0 < t_set < 4.01
    assert [e.detail.split()[0] for e in res.trace if e.kind == "fault"] == ["begin", "end"]


def test_one_way_partition_is_asymmetric() -> None:
    # 0 -> 1 cut: the request gets through at once, only the reply waits for the heal.
    res = run_store(late_set, world_size=2, faults=[sim.Partition((0,), (1,), at=1.0, heal_at=4.0, one_way=True)])
    assert res.ok, res.summary()
    (_, t_seen), (_, t_set) = res.rank_results
    assert t_seen < 1.51 and t_set > 4.0
    # 1 -> 0 cut: the request itself waits.
    res = run_store(late_set, world_size=2, faults=[sim.Partition((1,), (0,), at=1.0, heal_at=4.0, one_way=True)])
    (_, t_seen), (_, t_set) = res.rank_results
    assert t_seen > 4.0 and t_set > 4.0


def test_unhealed_partition_breaks_the_connection_after_retransmit_timeout() -> None:
    net = sim.Network(latency=1e-3, bandwidth=None, retransmit_timeout=5.0)

    async def body(store: TCPStore, rank: int) -> Any:
        if rank == 1:
            return await late_set(store, rank)
        await asyncio.sleep(10)
        return "rank0 done"

    res = run_store(body, world_size=2, faults=[sim.Partition((1,), (0,), at=1.0)], network=net)
    assert res.ok, res.summary()
    name, t = res.rank_results[1]
    assert name == "StoreConnectionLost"
    assert t == pytest.approx(6.5, abs=0.01)


def test_clog_holds_but_never_breaks_a_link() -> None:
    net = sim.Network(latency=1e-3, bandwidth=None, retransmit_timeout=5.0)
    res = run_store(late_set, world_size=2, faults=[sim.Clog((1, 0), at=1.0, until=20.0)], network=net)
    assert res.ok, res.summary()
    (_, t_seen), (done, t_set) = res.rank_results
    assert done == "set"
    assert 20.0 < t_seen < 20.01 and 20.0 < t_set < 20.01


# --------------------------------------------------------------------------- straggler


async def timings(store: TCPStore, rank: int) -> Any:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.sleep(1.0)
    slept = loop.time() - t0
    t0 = loop.time()
    await store.add("x", 1)
    rtt = loop.time() - t0
    await store.add("finished", 1)
    if rank == 0:
        while int(await store.add("finished", 0)) < 3:
            await asyncio.sleep(1)
    return round(slept, 6), round(rtt, 6)


def test_straggler_is_k_times_slower() -> None:
    res = run_store(timings, faults=[sim.Straggler(1, 4.0)])
    assert res.ok, res.summary()
    assert res.rank_results[2] == (1.0, 0.002)  # one 1 ms hop each way
    assert res.rank_results[1] == (4.0, 0.005)  # its sleep x4, its outgoing hop x4


# --------------------------------------------------------------------------- reset, store crash


async def call_after(store: TCPStore, rank: int) -> Any:
    await asyncio.sleep(1.5)
    name = await error_name(store.add("k", 1))
    await asyncio.sleep(1)
    return name


async def frames_against_the_cut() -> Any:
    """Rank 1 sends a frame every 50 ms from 1.0 on, on a connection to rank 0 (made before the cut); rank 0
    returns when each one came."""
    loop = asyncio.get_running_loop()
    if getenv("RANK") == "0":
        got: list[tuple[int, float]] = []
        done = asyncio.Event()

        async def handler(conn: Connection) -> None:
            for _ in range(10):
                f = await conn.recv()
                got.append((f.header["i"], round(loop.time(), 4)))
            done.set()

        listener = await current_network().listen(("", 7301), handler)
        await done.wait()
        await listener.aclose()
        return got
    await asyncio.sleep(0.01)
    conn = await current_network().connect(("rank0", 7301))
    await asyncio.sleep(1.0 - loop.time())
    for i in range(10):
        await conn.send({"i": i})
        await asyncio.sleep(0.05)
    await asyncio.sleep(4)
    conn.close()
    return None


def test_a_one_way_partition_stalls_the_other_direction_after_the_ack_timeout() -> None:
    """0 -> 1 cut from 1.0 to 4.0: rank 1's frames to 0 flow, but 0's acknowledgements of them are lost, so
    TCP sends what rank 1 sends from ACK_STALL after its first frame under the cut on only once it heals
    (in order); before, they all went through, and a rank that stopped hearing its peers was evicted by
    the very ranks it could not hear (the real cut-off rank is the one its peers blame)."""
    from sim.links import ACK_STALL

    res = sim.run(frames_against_the_cut, world_size=2, network=sim.Network.fixed(1e-3), explore=False,
                  faults=[sim.Partition((0,), (1,), at=0.5, heal_at=4.0, one_way=True)])
    assert res.ok, res.summary()
    got = res.rank_results[0]
    assert [i for i, _ in got] == list(range(10))
    first = 1.0  # the stream's first frame under the cut
    for i, t in got:
        sent = first + 0.05 * i
        if sent < first + ACK_STALL - 1e-9:
            assert t < sent + 0.01, (i, t)  # (through at once)
        else:
            assert t == pytest.approx(4.001, abs=2e-3), (i, t)  # held until the heal


@pytest.mark.parametrize("cut", [((0, 1), (2,)), ((2,), (0, 1))])
def test_under_a_one_way_partition_the_peers_blame_the_rank_cut_off(cut: Any) -> None:
    """As real ranks do under a one-way cut (netns, either direction): the two ranks that still hear each
    other name rank 2; none of them is told it was evicted."""
    import numpy as np

    import aiodist

    async def main() -> Any:
        await aiodist.init_process_group(timeout=60)
        try:
            for _ in range(100):
                await aiodist.all_reduce(np.ones(4))
                await asyncio.sleep(0.1)
        except aiodist.PeerFailureError as e:
            return type(e).__name__, e.rank
        return None

    res = sim.run(main, world_size=3, seed=0, explore=False,
                  faults=[sim.Partition(*cut, at=1.05, heal_at=7.05, one_way=True)])
    assert res.rank_results[0] == res.rank_results[1] == ("PeerFailureError", 2), res.rank_results
    assert res.rank_results[2][0] == "PeerFailureError" and res.rank_results[2][1] in (0, 1), res.rank_results


def test_reset_connection_breaks_only_that_link() -> None:
    res = run_store(call_after, faults=[sim.ResetConnection(1, 0, at=1.0)])
    assert res.ok, res.summary()
    assert res.rank_results == ["no error", "StoreConnectionLost", "no error"]
    assert any(e.kind == "reset" and "1 connection" in e.detail for e in res.trace)


def test_crash_store_breaks_every_client_but_no_rank() -> None:
    res = run_store(call_after, faults=[sim.CrashStore(at=1.0)])
    assert res.ok, res.summary()
    assert res.rank_results == ["StoreConnectionLost"] * 3
    assert res.crashed == []


async def connects_after(store: TCPStore, rank: int) -> Any:
    await asyncio.sleep(1.5)
    try:
        again = await TCPStore.connect(getenv("MASTER_ADDR") or "", int(getenv("MASTER_PORT") or 0), timeout=2.0)
    except Exception as e:  # noqa: BLE001 - the test reads what it says
        return str(e)
    await again.close()
    return "connected"


def test_a_connect_to_a_crashed_store_says_the_service_crashed() -> None:
    """Before (blind probe s22, finding 3): a rank that connected after a CrashStore (e.g. rank 0 in its
    rendezvous) was told only 'connection refused', for its whole timeout, while every other error named it."""
    res = run_store(connects_after, faults=[sim.CrashStore(at=1.0)])
    assert res.ok, res.summary()
    for said in res.rank_results:
        assert "connection refused (the service at rank0:29500 crashed (CrashStore fault))" in said, said


# --------------------------------------------------------------------------- as CLI flags


@pytest.mark.parametrize(
    "fault",
    [
        sim.Crash(2, at=1.5),
        sim.Crash(2, on=sim.MessageSent(2, 3)),
        sim.Crash(1, on=sim.MessageReceived(1, 7)),
        sim.Crash(3, at=2.0, silent=True),
        sim.Restart(2, at=1.0, delay=0.5),
        sim.Partition((0, 1), (2, 3), at=1.0, heal_at=5.0),
        sim.Partition((0,), (1,), at=1.0, one_way=True),
        sim.Clog((0, 1), at=1.0, until=2.0),
        sim.Straggler(3, 4.0),
        sim.ResetConnection(0, 1, at=2.0),
        sim.CrashStore(at=1.5),
        sim.Chaos(crashes=1, partitions=2, window=(0.5, 3.0)),
        sim.Chaos(clogs=1, resets=2, stragglers=1, window=(0.0, 1.0), max_duration=0.5, spare=(0, 1)),
    ],
)
def test_faults_round_trip_through_their_cli_flags(fault: Any) -> None:
    from sim.cli import build_parser

    ns = build_parser().parse_args(["run", "prog.py", *fault.to_cli().split()])
    assert ns.faults == [fault]  # (every fault flag fills the one list, in the command line's order)


# --------------------------------------------------------------------------- chaos


def test_chaos_draws_the_same_faults_for_the_same_seed() -> None:
    chaos = sim.Chaos(crashes=2, partitions=1, clogs=1, resets=1, stragglers=1, window=(1.0, 2.0))
    a, b, c = chaos.draw(7, 8), chaos.draw(7, 8), chaos.draw(8, 8)
    assert a == b and a != c
    assert [type(f).__name__ for f in a] == ["Crash", "Crash", "Partition", "Clog", "ResetConnection", "Straggler"]
    assert all(f.rank != 0 for f in a if isinstance(f, sim.Crash))  # rank 0 (the store) is spared
    assert all(1.0 <= f.at <= 2.0 for f in a)


def test_chaos_faults_take_effect_and_are_listed_in_the_result() -> None:
    res = run_store(ticker, faults=[sim.Chaos(crashes=1, window=(0.6, 0.9))], seed=3)
    (crash,) = res.faults
    assert isinstance(crash, sim.Crash) and crash.rank in (1, 2)
    assert res.crashed == [crash.rank]
    assert res.rank_results[0][crash.rank] == 1  # one tick at 0.5 s, then it died
