"""The ``try_send`` fast path of the network seam: all or nothing, never a wait.

``conn.try_send(header, payload)`` sends a frame at once when that needs no
waiting (True) and otherwise sends *nothing* (False: the caller uses ``send``).

* TCP (real sockets on 127.0.0.1): small frames go out intact and are copied
  (the sender may reuse its buffer at once); a frame over the coalescing limit
  (64 KiB, header included), a paused writer and a closed connection are all
  refused without a byte sent.
* The simulator: a taken frame is exactly what ``send`` would have sent (same
  trace, same timing, headers as msgpack gives them); a per-message overhead,
  a send trigger and a full window are refused without a byte sent.
* ``Transport.send_soon``: None when the frame went out, else the awaitable
  that sends it; failures become PeerFailureError.
* A simulated all_reduce program that goes through the fast path is still
  deterministic.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from transports import channel, start_transports

import sim
from aiodist import api
from aiodist.comm import Transport
from aiodist.errors import ConnectionLost, PeerFailureError
from aiodist.net.base import Connection
from aiodist.net.outbox import COALESCE_LIMIT as _COALESCE_LIMIT
from aiodist.net.tcp import TCPNetwork
from aiodist.store import MemoryStore
from aiodist.wire import encode_frame
from sim.endpoints import SimConnection
from test_net_tcp import LOOPS, run_on
from test_sim_network import dial, rank, serve_once

# --------------------------------------------------------------------------- TCP


async def _pair(net: TCPNetwork) -> tuple[Any, Any, Any]:
    """A listener, a client connection, and the listener's end of that connection (read with recv)."""
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def handler(conn: Any) -> None:
        ready.set_result(conn)
        await asyncio.sleep(30)

    lis = await net.listen(("127.0.0.1", 0), handler)
    conn = await net.connect(lis.address, timeout=5)
    return lis, conn, await asyncio.wait_for(ready, 5)


async def _close(lis: Any, conn: Any) -> None:
    conn.close()
    lis.close()
    await lis.wait_closed()


async def _recv_until(conn: Any, key: str, last: Any) -> list[Any]:
    """Frames received on ``conn`` up to and including the one whose ``header[key] == last``."""
    frames = []
    while True:
        f = await asyncio.wait_for(conn.recv(), 5)
        frames.append(f)
        if f.header.get(key) == last:
            return frames


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_small_frames_go_out_intact_and_the_sender_may_reuse_its_buffers_at_once(loop: str) -> None:
    """try_send takes small frames (True), in order, as copies: overwriting the sources right after changes nothing."""

    async def main() -> None:
        lis, conn, srv = await _pair(TCPNetwork())
        try:
            a = np.arange(1000, dtype=np.int32)
            b = np.arange(1000, 2000, dtype=np.int32)
            header = {"i": 0, "t": (1, 2)}
            assert conn.try_send(header, a) is True  # written at once
            assert conn.try_send({"i": 1}, b) is True  # same loop iteration: batched for the next one
            assert conn._outbox._wbuf  # (so the copy matters: the bytes are still in our hands)
            assert conn.try_send({"i": 2}) is True  # no payload
            a[:] = -1
            b[:] = -1
            header["i"] = 99
            f0, f1, f2 = [await asyncio.wait_for(srv.recv(), 5) for _ in range(3)]
            assert f0.header == {"i": 0, "t": [1, 2]}
            assert np.array_equal(np.frombuffer(f0.payload, dtype=np.int32), np.arange(1000))
            assert f1.header == {"i": 1}
            assert np.array_equal(np.frombuffer(f1.payload, dtype=np.int32), np.arange(1000, 2000))
            assert f2.header == {"i": 2} and f2.payload is None
        finally:
            await _close(lis, conn)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_a_1_mib_payload_is_refused_and_nothing_is_sent_until_send(loop: str) -> None:
    """A large payload (written without a copy) is refused (False) and not sent: send then delivers it exactly once."""

    async def main() -> None:
        lis, conn, srv = await _pair(TCPNetwork())
        try:
            big = np.arange(1 << 18, dtype=np.int32)  # 1 MiB
            assert conn.try_send({"n": "big"}, big) is False
            assert not conn._outbox._wbuf
            await conn.send({"n": "big"}, big)
            await conn.send({"n": "end"})
            frames = await _recv_until(srv, "n", "end")
            assert [f.header["n"] for f in frames] == ["big", "end"]  # one big frame, not two
            assert np.array_equal(np.frombuffer(frames[0].payload, dtype=np.int32), big)
        finally:
            await _close(lis, conn)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_the_limit_is_64_kib_header_included(loop: str) -> None:
    """A frame of exactly _COALESCE_LIMIT bytes (header + payload) is taken; one byte more is refused."""

    async def main() -> None:
        lis, conn, srv = await _pair(TCPNetwork())
        try:
            assert _COALESCE_LIMIT == 64 * 1024
            header = {"n": "fit"}
            head, _ = encode_frame(header, bytes(_COALESCE_LIMIT // 2))
            fit = _COALESCE_LIMIT - len(head)
            assert len(encode_frame(header, bytes(fit))[0]) + fit == _COALESCE_LIMIT
            over = {"n": "over"}
            assert len(encode_frame(over, bytes(fit + 1))[0]) + fit + 1 > _COALESCE_LIMIT
            assert conn.try_send(header, np.full(fit, 7, dtype=np.uint8)) is True
            assert conn.try_send(over, np.full(fit + 1, 8, dtype=np.uint8)) is False
            await conn.send({"n": "end"})
            frames = await _recv_until(srv, "n", "end")
            assert [f.header["n"] for f in frames] == ["fit", "end"]
            assert bytes(frames[0].payload) == bytes([7]) * fit
        finally:
            await _close(lis, conn)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_tcp_paused_writing_refuses_and_sends_nothing(loop: str) -> None:
    """While the transport still holds unsent bytes (writing paused), try_send is False and sends nothing."""

    async def main() -> None:
        lis, conn, srv = await _pair(TCPNetwork())
        try:
            huge = np.zeros(32 << 20, dtype=np.uint8)  # far more than the kernel's socket buffers take at once
            assert conn.send_nowait({"n": "huge"}, huge) is False
            assert conn._outbox.paused
            assert conn.try_send({"n": "refused"}) is False
            await conn.drained()
            assert conn.try_send({"n": "after"}) is True
            frames = await _recv_until(srv, "n", "after")
            assert [f.header["n"] for f in frames] == ["huge", "after"]
            assert frames[0].payload.nbytes == huge.nbytes
        finally:
            await _close(lis, conn)

    run_on(loop, main)


# --------------------------------------------------------------------------- Transport.send_soon


def _header(key: str) -> dict[str, Any]:
    """The header an OpChannel (group 0, seq 0, sig "test") puts on a message with key ``(key,)``."""
    return {"t": "m", "g": 0, "k": (0, key), "o": "test"}


async def test_send_soon_returns_none_for_a_frame_that_went_out_else_an_awaitable() -> None:
    """Not connected yet, or a 1 MiB payload: an awaitable that sends; a small frame once connected: None (sent)."""
    ts = await start_transports(2, MemoryStore(), mode="tcp")
    try:
        channel(ts[0], 2)
        b = channel(ts[1], 2)
        first = ts[0].send_soon(1, _header("first"), b"hi", 0)
        assert first is not None  # no connection yet: dial, then send
        await first
        got = bytearray(2)
        await asyncio.wait_for(b.recv_into(0, ("first",), memoryview(got)), 5)
        assert got == b"hi"

        small = np.arange(8, dtype=np.int64)
        assert ts[0].send_soon(1, _header("small"), small, 0) is None
        small[:] = -1  # already copied
        out = np.zeros(8, dtype=np.int64)
        await asyncio.wait_for(b.recv_into(0, ("small",), memoryview(out).cast("B")), 5)
        assert out.tolist() == list(range(8))

        big = np.arange(1 << 17, dtype=np.float64)  # 1 MiB
        pending = ts[0].send_soon(1, _header("big"), big, 0)
        assert pending is not None
        await pending
        out_big = np.zeros_like(big)
        await asyncio.wait_for(b.recv_into(0, ("big",), memoryview(out_big).cast("B")), 5)
        assert np.array_equal(out_big, big)
    finally:
        for t in ts:
            await t.close()


async def _connected(ts: list[Transport]) -> Any:
    """Rank 0's connection to rank 1, once a first frame went through it."""
    channel(ts[0], 2)
    b = channel(ts[1], 2)
    await ts[0].send(1, _header("warm"), b"", group=0)
    await asyncio.wait_for(b.recv_into(0, ("warm",), memoryview(bytearray())), 5)
    conn = ts[0]._peers[1].conn
    assert conn is not None
    return conn


async def test_send_soon_on_a_closed_connection_gives_an_awaitable_that_raises_peer_failure() -> None:
    """A connection closed under the transport: nothing goes out, and awaiting the send raises PeerFailureError."""
    ts = await start_transports(2, MemoryStore(), mode="tcp")
    try:
        conn = await _connected(ts)
        conn.close()
        pending = ts[0].send_soon(1, _header("late"), b"x", 0)
        assert pending is not None
        with pytest.raises(PeerFailureError) as e:
            await pending
        assert e.value.rank == 1
    finally:
        for t in ts:
            await t.close()


async def test_send_soon_turns_a_closed_error_from_try_send_into_peer_failure_at_once() -> None:
    """try_send raising ConnectionClosedError makes send_soon raise PeerFailureError synchronously (no awaitable)."""
    ts = await start_transports(2, MemoryStore(), mode="tcp")
    try:
        conn = await _connected(ts)

        def broken(header: Any, payload: Any = None) -> bool:
            raise ConnectionLost("broken under the send")

        conn.try_send = broken  # type: ignore[method-assign]
        with pytest.raises(PeerFailureError) as e:
            ts[0].send_soon(1, _header("late"), b"x", 0)
        assert e.value.rank == 1
        assert ts[0]._peers[1].failure is not None  # the peer is now failed for later operations too
    finally:
        for t in ts:
            await t.close()


async def test_exchange_posts_its_receive_before_it_sends_and_moves_megabytes_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpChannel.exchange: the receive is posted before a send that must wait starts waiting (so a
    large send never waits on a peer waiting for us to read), and 8 MiB each way arrive intact."""
    ts = await start_transports(2, MemoryStore(), mode="tcp")
    try:
        chans = [channel(t, 2) for t in ts]
        seen: list[bool] = []
        original = Transport.send_soon

        def posted() -> bool:
            return any(k[0] == 0 and k[1] == (0, "x") for k in ts[0].router.table._posted)

        def spy(self: Transport, dst: int, header: Any, payload: Any = None, group: Any = None) -> Any:
            pending = original(self, dst, header, payload, group)
            if self is not ts[0]:
                return pending
            assert pending is not None  # 8 MiB never goes at once

            async def watched() -> None:
                seen.append(posted())
                await pending

            return watched()

        monkeypatch.setattr(Transport, "send_soon", spy)  # (on the class: transports are slotted)
        data = [np.arange(1 << 20, dtype=np.float64) + r for r in range(2)]  # 8 MiB
        outs = [np.zeros_like(d) for d in data]

        def step(r: int) -> Any:
            return chans[r].exchange(1 - r, ("x",), memoryview(data[r]).cast("B"), 1 - r, ("x",),
                                     memoryview(outs[r]).cast("B"))

        await asyncio.wait_for(asyncio.gather(step(0), step(1)), 20)
        assert seen == [True]
        assert np.array_equal(outs[0], data[1]) and np.array_equal(outs[1], data[0])
    finally:
        for t in ts:
            await t.close()


# --------------------------------------------------------------------------- simulator

async def read_until_end(conn: Connection) -> list[Any]:
    """Rank 0: the ``i`` of every frame until ``"end"`` (included)."""
    got = []
    while True:
        f = await conn.recv()
        got.append(f.header["i"])
        if f.header["i"] == "end":
            return got


def ok(result: sim.Result) -> sim.Result:
    result.raise_on_failure()
    return result


def test_sim_try_send_delivers_with_headers_as_msgpack_gives_them_and_copies_the_payload() -> None:
    """Default network: try_send is True; the peer gets tuples as lists, and the data as it was at the call."""

    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> Any:
                f = await conn.recv()
                return f.header, bytes(f.payload)

            return await serve_once(h)
        conn = await dial()
        buf = np.arange(4, dtype=np.int32)
        header = {"key": (1, "a"), "nested": {"t": (2, 3)}, "b": bytearray(b"x")}
        took = conn.try_send(header, buf)
        buf[:] = -1  # the sender may reuse its buffer at once
        header["late"] = True
        await asyncio.sleep(1)
        conn.close()
        return took

    res = ok(sim.run(main, world_size=2))
    assert res.rank_results[1] is True
    header, payload = res.rank_results[0]
    assert header == {"key": [1, "a"], "nested": {"t": [2, 3]}, "b": b"x"}
    assert payload == np.arange(4, dtype=np.int32).tobytes()


async def _stream(how: str) -> Any:
    """Rank 1 sends 30 frames (some in the same step) with ``send`` or ``try_send``; rank 0 logs arrival times."""
    if rank() == 0:
        async def h(conn: Connection) -> list[tuple[int, float, int]]:
            loop = asyncio.get_running_loop()
            out = []
            for _ in range(30):
                f = await conn.recv()
                out.append((f.header["i"], loop.time(), 0 if f.payload is None else f.payload.nbytes))
            return out

        return await serve_once(h)
    conn = await dial()
    for i in range(30):
        payload = None if i % 4 == 0 else bytes(100 * i)
        if how == "try":
            assert conn.try_send({"i": i, "k": (i, "x")}, payload)
        else:
            await conn.send({"i": i, "k": (i, "x")}, payload)
        if i % 3 == 0:
            await asyncio.sleep(1e-4)
    await asyncio.sleep(1)
    conn.close()
    return None


def test_sim_try_send_is_exactly_send_without_the_wait() -> None:
    """The same program with try_send instead of send: same trace digest, same arrival times, same virtual end."""
    runs = [ok(sim.run(_stream, args=(how,), world_size=2, seed=11)) for how in ("send", "try")]
    assert runs[0].rank_results[0] == runs[1].rank_results[0]
    assert [i for i, _, _ in runs[1].rank_results[0]] == list(range(30))
    assert runs[0].digest == runs[1].digest
    assert runs[0].virtual_time == runs[1].virtual_time


@pytest.mark.parametrize(
    "network, faults",
    [
        pytest.param(sim.Network(overhead=1e-5), [], id="overhead"),
        pytest.param(None, [sim.Restart(1, on=sim.MessageSent(1, 10_000))], id="far-send-trigger"),
    ],
)
def test_sim_try_send_refuses_and_sends_nothing_when_send_would_wait(network: Any, faults: list[Any]) -> None:
    """A per-message overhead: try_send is False and the peer gets nothing from it (a fatal send trigger
    due at a later frame does not stand in the way: see the next test)."""

    async def main() -> Any:
        if rank() == 0:
            return await serve_once(read_until_end)
        conn = await dial()
        took = conn.try_send({"i": "try"}, b"abc")
        await asyncio.sleep(0.01)
        await conn.send({"i": "send"}, b"abc")
        await conn.send({"i": "end"})
        await asyncio.sleep(1)
        conn.close()
        return took

    res = ok(sim.run(main, world_size=2, network=network, faults=faults, explore=False))
    assert res.rank_results[1] is (not network)
    assert res.rank_results[0] == (["try", "send", "end"] if not network else ["send", "end"])


def test_sim_try_send_refuses_the_frame_that_fires_a_crash_trigger_and_send_crashes_after_it() -> None:
    """A crash on the sender's next frame: try_send is False (it could not stop the rest of its step);
    ``send`` sends the frame, then the rank is dead and the rest of its step never runs."""
    took: list[bool] = []
    after: list[str] = []

    async def main() -> Any:
        if rank() == 0:
            return await serve_once(read_until_lost)
        conn = await dial()
        took.append(conn.try_send({"i": "try"}, b"abc"))
        await conn.send({"i": "send"}, b"abc")
        after.append("ran on")  # never: the trigger killed this process inside send
        return None

    res = ok(sim.run(main, world_size=2, faults=[sim.Crash(1, on=sim.MessageSent(1, 1))], explore=False,
                     stop_on_error=False))
    assert took == [False] and after == []
    assert res.crashed == [1]
    assert res.rank_results[0] == ["send"]


def test_sim_a_full_window_refuses_while_send_blocks_and_takes_again_once_the_reader_reads() -> None:
    """socket_buffer=100: with a frame in flight or unread in the peer's kernel, try_send is False and send blocks."""

    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> list[Any]:
                await asyncio.sleep(0.5)  # not reading meanwhile
                return await read_until_after(conn)

            return await serve_once(h)
        conn = await dial()
        await conn.send({"i": "a"}, bytes(200))
        in_flight = conn.try_send({"i": "try1"}, bytes(10))  # a is on the wire: 200 > 100
        await conn.send({"i": "b"}, bytes(200))  # waits for a to arrive, then goes
        await asyncio.sleep(0.01)  # a is queued unread (max_unread_frames=1), b waits in the peer's kernel
        unread = conn.try_send({"i": "try2"}, bytes(10))
        try:
            await asyncio.wait_for(conn.send({"i": "blocked"}, bytes(10)), 0.05)
            blocked = False
        except TimeoutError:
            blocked = True
        await conn.send({"i": "end"})  # goes once rank 0 reads
        after = conn.try_send({"i": "after"}, bytes(10))  # the window is empty again
        await asyncio.sleep(1)
        conn.close()
        return in_flight, unread, blocked, after

    async def read_until_after(conn: Connection) -> list[Any]:
        got = []
        while not got or got[-1] != "after":
            got.append((await conn.recv()).header["i"])
        return got

    net = sim.Network(socket_buffer=100, max_unread_frames=1)
    res = ok(sim.run(main, world_size=2, network=net))
    assert res.rank_results[1] == (False, False, True, True)
    assert res.rank_results[0] == ["a", "b", "end", "after"]


def test_sim_send_nowait_queues_behind_a_full_window_in_order_and_drained_waits_for_the_reader() -> None:
    """socket_buffer=100, a reader that waits 0.5 s: send_nowait takes every frame (False while they wait on
    this side), a later send() goes after them, drained() returns only once they left, all in order."""

    async def main() -> Any:
        if rank() == 0:
            async def h(conn: Connection) -> list[Any]:
                await asyncio.sleep(0.5)
                got = []
                while not got or got[-1] != "end":
                    got.append((await conn.recv()).header["i"])
                return got

            return await serve_once(h)
        conn = await dial()
        loop = asyncio.get_running_loop()
        results = [conn.send_nowait({"i": i}, bytes(200)) for i in range(3)]  # the 2nd and 3rd wait here
        refused = conn.try_send({"i": "try"}, b"x")  # never overtakes what waits
        sender = asyncio.ensure_future(conn.send({"i": "send"}, bytes(10)))
        await conn.drained()
        drained_at = loop.time()
        await sender
        await conn.send({"i": "end"})
        await asyncio.sleep(1)
        conn.close()
        return results, refused, drained_at

    net = sim.Network(socket_buffer=100, max_unread_frames=1)
    res = ok(sim.run(main, world_size=2, network=net))
    results, refused, drained_at = res.rank_results[1]
    assert results == [True, False, False] and refused is False
    assert drained_at > 0.5  # not before the reader read
    assert res.rank_results[0] == [0, 1, 2, "send", "end"]


def test_sim_send_nowait_with_overhead_is_false_and_drained_waits_for_the_cpu() -> None:
    """overhead=1 ms: the frame leaves after the sender's CPU (False), drained() returns when the CPU is done."""

    async def main() -> Any:
        if rank() == 0:
            return await serve_once(read_until_end)
        conn = await dial()
        loop = asyncio.get_running_loop()
        start = loop.time()
        took = conn.send_nowait({"i": "a"}, b"abc")
        await conn.drained()
        waited = loop.time() - start
        await conn.send({"i": "end"})
        await asyncio.sleep(1)
        conn.close()
        return took, waited

    res = ok(sim.run(main, world_size=2, network=sim.Network(overhead=1e-3)))
    took, waited = res.rank_results[1]
    assert took is False and waited == pytest.approx(1e-3)
    assert res.rank_results[0] == ["a", "end"]


async def read_until_lost(conn: Connection) -> list[Any]:
    """Rank 0: the ``i`` of every frame until the connection ends."""
    got = []
    try:
        while True:
            got.append((await conn.recv()).header["i"])
    except ConnectionLost:
        return got


async def read_late_until_the_end(conn: Connection) -> list[Any]:
    """Rank 0: start reading after 0.5 s, then the ``i`` of every frame until the connection ends."""
    await asyncio.sleep(0.5)
    return await read_until_lost(conn)


def test_sim_close_sends_what_send_nowait_queued_before_the_fin() -> None:
    """Frames still waiting on this side when it closes leave first, as TCP flushes its buffer on close."""

    async def main() -> Any:
        if rank() == 0:
            return await serve_once(read_late_until_the_end)
        conn = await dial()
        queued = [conn.send_nowait({"i": i}, bytes(200)) for i in range(3)]
        conn.close()
        await asyncio.sleep(1)
        return queued

    res = ok(sim.run(main, world_size=2, network=sim.Network(socket_buffer=100, max_unread_frames=1)))
    assert res.rank_results[1] == [True, False, False]
    assert res.rank_results[0] == [0, 1, 2]


def test_sim_frames_waiting_in_the_readers_kernel_stay_readable_after_the_fin() -> None:
    """max_unread_frames=1 and a reader that is 3 frames behind when the sender closes: it still reads all 3.

    (The FIN used to make only one more frame readable: the rest stayed in the simulated kernel, lost.)
    """

    async def main() -> Any:
        if rank() == 0:
            return await serve_once(read_late_until_the_end)
        conn = await dial()
        for i in range(4):
            await conn.send({"i": i}, bytes(10))
        conn.close()
        await asyncio.sleep(1)
        return None

    res = ok(sim.run(main, world_size=2, network=sim.Network(max_unread_frames=1)))
    assert res.rank_results[0] == [0, 1, 2, 3]


# --------------------------------------------------------------------------- determinism


async def _all_reduce_program() -> list[float]:
    await api.init_process_group(timeout=60)
    x = np.ones(16)
    for _ in range(3):
        await api.all_reduce(x)
    await api.destroy_process_group()
    return x.tolist()


def test_sim_all_reduce_through_the_fast_path_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 ranks, 3 all_reduces (frames taken by try_send): the same seed gives the same digest and results."""
    taken = [0]
    original = SimConnection.try_send

    def counting(self: SimConnection, header: Any, payload: Any = None) -> bool:
        ok_ = original(self, header, payload)
        taken[0] += ok_
        return ok_

    monkeypatch.setattr(SimConnection, "try_send", counting)
    a = ok(sim.run(_all_reduce_program, world_size=8, seed=5))
    first = taken[0]
    b = ok(sim.run(_all_reduce_program, world_size=8, seed=5))
    assert first > 0 and taken[0] == 2 * first  # the fast path was used, as much both times
    assert a.rank_results == b.rank_results == [[512.0] * 16] * 8
    assert a.digest == b.digest
    assert a.virtual_time == b.virtual_time
