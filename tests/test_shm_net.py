"""Connections between processes of one host: Unix socket frames, ring payloads, fallbacks, the end of a peer.

Both ends live in this process (the ring is mapped again through
``/proc/self/fd``, as another process of the host maps it), on asyncio and uvloop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import Any

import numpy as np
import pytest
from conftest import run_on

from aiodist.errors import ConnectionClosedLocally, ConnectionLost
from aiodist.net import shm
from aiodist.net.base import Connection, Frame
from aiodist.net.shm import ShmConnection
from aiodist.net.shmnet import HostNetwork, connect_local, endpoint_name
from aiodist.net.shmseg import Segment, SharedMemoryError
from aiodist.net import tcp_connection
from aiodist.net.tcp import TCPConnection, TCPNetwork

LOOPS = ["asyncio", "uvloop"]


async def pair(host: str = "h", *, other_host: str | None = None) -> tuple[Connection, Connection, Any]:
    """(dialer's connection, acceptor's connection, listener) between two HostNetworks of this process."""
    accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    async def handler(conn: Connection) -> None:
        accepted.set_result(conn)
        await asyncio.Event().wait()

    server = HostNetwork(TCPNetwork(), host_id=host)
    listener = await server.listen(("127.0.0.1", 0), handler)
    client = HostNetwork(TCPNetwork(), host_id=other_host or host)
    a = await client.connect(listener.address, timeout=5)
    b = await asyncio.wait_for(accepted, 5)
    return a, b, listener


async def ring_ready(*conns: Connection) -> None:
    """Wait until each side mapped the other's ring (the peer says so in its first frames)."""
    for _ in range(200):
        if all(c._space is not None for c in conns):  # type: ignore[attr-defined]
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the rings were never mapped")


async def stalled_pair(monkeypatch: Any) -> tuple[Connection, Connection, Any]:
    """A pair with a 1 MiB ring whose receiving side has stopped reading: two unread frames ({"i": 0}, {"i": 1})."""
    monkeypatch.setattr(shm, "RING_BYTES", 1 << 20)
    monkeypatch.setattr(shm, "MAX_QUEUED_FRAMES", 1)  # the receiver stops reading after two unread frames
    a, b, listener = await pair()
    await ring_ready(a, b)
    for i in range(2):
        await a.send({"i": i}, b"x")
    return a, b, listener


def collect(conn: Connection) -> asyncio.Queue[Frame]:
    q: asyncio.Queue[Frame] = asyncio.Queue()
    conn.set_frame_handler(q.put_nowait)
    return q


def maps_with(word: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(word in line for line in f)


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_of_every_size_keep_their_order_both_ways(loop: str) -> None:
    sizes = [0, 10, 1000, 65536, 65537, 400_000, 3_000_000, 12_000_000, 7]

    async def main() -> None:
        a, b, listener = await pair()
        assert isinstance(a, ShmConnection) and isinstance(b, ShmConnection)
        await ring_ready(a, b)
        qa, qb = collect(a), collect(b)

        async def sender(conn: Connection, tag: str) -> None:
            for i, n in enumerate(sizes * 3):
                payload = None if n == 0 else np.full(n, i % 251, np.uint8)
                if not conn.try_send({"i": i, "t": tag}, payload):
                    await conn.send({"i": i, "t": tag}, payload)

        async def receiver(q: asyncio.Queue[Frame], tag: str) -> None:
            for i, n in enumerate(sizes * 3):
                f = await asyncio.wait_for(q.get(), 10)
                assert f.header == {"i": i, "t": tag}
                if n == 0:
                    assert f.payload is None
                else:
                    got = np.frombuffer(f.payload, np.uint8)  # type: ignore[arg-type]
                    assert got.size == n and got[0] == got[-1] == i % 251 and (got == i % 251).all()

        await asyncio.gather(sender(a, "a"), sender(b, "b"), receiver(qb, "a"), receiver(qa, "b"))
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_ring_payload_lands_in_the_sinks_buffer_and_a_large_one_goes_in_pieces(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(shm, "RING_BYTES", 1 << 20)
    monkeypatch.setattr(shm, "PIECE_BYTES", 256 << 10)

    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        target = np.zeros(5_000_000, np.uint8)  # five times the ring
        asked: list[tuple[Any, int]] = []

        def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
            asked.append((header["k"], n, received))
            return memoryview(target) if header["k"] == "mine" else None

        b.set_payload_sink(sink)
        src = (np.arange(5_000_000) % 253).astype(np.uint8)
        await a.send({"k": "mine"}, src)
        await a.send({"k": "grown"}, src)
        f1, f2 = await b.recv(), await b.recv()
        assert asked == [("mine", 5_000_000, 0), ("grown", 5_000_000, 0)]  # (pieces come whole: asked once)
        assert f1.payload is not None and f1.payload.obj is target  # written in place
        assert np.array_equal(target, src)
        assert np.array_equal(np.frombuffer(f2.payload, np.uint8), src)  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_payload_that_fits_the_ring_is_copied_at_once_and_the_buffer_is_free(loop: str) -> None:
    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        buf = np.full(1_000_000, 5, np.uint8)
        assert a.try_send({"x": 1}, buf)  # a large payload, but it fits: taken at once
        buf[:] = 6  # ours again
        f = await b.recv()
        assert (np.frombuffer(f.payload, np.uint8) == 5).all()  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_sender_goes_on_while_nobody_reads_on_the_other_side(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(shm, "RING_BYTES", 1 << 20)

    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        big = np.ones(4_000_000, np.uint8)
        for i in range(3):  # 12 MB through a 1 MiB ring: the receiving side acknowledges unasked
            await asyncio.wait_for(a.send({"i": i}, big), 10)
        for i in range(3):
            f = await b.recv()
            assert f.header == {"i": i} and f.payload is not None and f.payload.nbytes == 4_000_000
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_cancelling_a_send_that_waits_for_ring_space_leaves_no_or_a_whole_frame(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(shm, "PIECE_BYTES", 256 << 10)

    async def main() -> None:
        a, b, listener = await stalled_pair(monkeypatch)
        started = np.full(3_000_000, 1, np.uint8)
        behind = np.full(100_000, 2, np.uint8)
        first = asyncio.ensure_future(a.send({"i": "started"}, started))
        await asyncio.sleep(0.2)
        assert not first.done()  # the receiver no longer acknowledges: the ring is full
        second = asyncio.ensure_future(a.send({"i": "behind"}, behind))
        await asyncio.sleep(0.05)
        first.cancel()
        second.cancel()
        for t in (first, second):
            with pytest.raises(asyncio.CancelledError):
                await t
        started[:] = 9  # the rest of a frame that had begun was copied: this changes nothing
        assert not a.send_nowait({"i": "after"}, b"y")  # queued behind the rest of "started"
        got = [await asyncio.wait_for(b.recv(), 5) for _ in range(4)]
        assert [f.header["i"] for f in got] == [0, 1, "started", "after"]  # "behind" never went
        assert (np.frombuffer(got[2].payload, np.uint8) == 1).all()  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_close_releases_a_send_that_waits_for_ring_space_a_stopped_peer_never_gives(loop: str, monkeypatch: Any) -> None:
    """Before (shm probe): the failure detector closed the link to a SIGSTOPped peer, but a 256 MiB send to it
    waited on until the operation's timeout (300 s) or the peer's death; over TCP close released it."""
    async def main() -> None:
        a, b, listener = await stalled_pair(monkeypatch)
        big = np.full(3_000_000, 1, np.uint8)
        waiting = asyncio.ensure_future(a.send({"i": "big"}, big))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # nobody reads on the other side: the ring is full
        a.close()
        await asyncio.wait_for(waiting, 1)  # released: its frame was copied, the buffer is the caller's again
        big[:] = 0
        got = [await asyncio.wait_for(b.recv(), 5) for _ in range(3)]
        assert [f.header["i"] for f in got] == [0, 1, "big"]
        assert (np.frombuffer(got[2].payload, np.uint8) == 1).all()  # type: ignore[arg-type]
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_close_delivers_what_was_queued_then_the_peer_sees_the_end(loop: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(shm, "RING_BYTES", 1 << 20)

    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        big = np.full(5_000_000, 3, np.uint8)
        assert not a.send_nowait({"i": 0}, big)  # more than the ring: still going when we close
        a.send_nowait({"i": 1}, b"tail")
        a.close()
        big[:] = 0  # after close the connection no longer reads the senders' buffers
        with pytest.raises(ConnectionClosedLocally):
            await a.send({"i": 2})
        with pytest.raises(ConnectionClosedLocally):
            await a.drained()
        f0, f1 = await b.recv(), await b.recv()
        assert f0.header == {"i": 0} and (np.frombuffer(f0.payload, np.uint8) == 3).all()  # type: ignore[arg-type]
        assert f1.header == {"i": 1} and bytes(f1.payload) == b"tail"  # type: ignore[arg-type]
        with pytest.raises(ConnectionLost):
            await b.recv()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_end_of_the_peer_is_seen_at_once_and_both_rings_are_unmapped(loop: str) -> None:
    async def main() -> None:
        before = maps_with("aiodist-ring")
        a, b, listener = await pair()
        await ring_ready(a, b)
        assert maps_with("aiodist-ring") == before + 4  # each side: its own ring and the peer's
        waiting = asyncio.ensure_future(b.recv())
        a._stream._transport.abort()  # type: ignore[attr-defined]  # what a killed process leaves: a reset socket
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(waiting, 1)
        await a.wait_closed()
        await b.wait_closed()
        assert maps_with("aiodist-ring") == before
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_frames_the_peer_sent_before_it_left_arrive_even_if_our_next_write_fails_first(loop: str, monkeypatch: Any) -> None:
    """A Unix socket fails a write at once (EPIPE) once the peer is gone, with its last frames still
    unread in ours: they are delivered before the end (a rank stopped while the others declared it
    failed and left writes its heartbeat first when it resumes; it must still read that it was evicted)."""
    monkeypatch.setattr(tcp_connection, "_LINGER", 0.2)  # (the peer's close lingers for our end of stream: not 5 s)

    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        a._stream._transport.pause_reading()  # type: ignore[attr-defined]  # (a stopped process reads nothing)
        b.send_nowait({"notice": "you were declared failed"})
        b.send_nowait({"i": 1}, b"last words")
        b.close()
        await b.wait_closed()
        for _ in range(100):  # our next write hits the closed socket (EPIPE), before any read
            try:
                a.send_nowait({"hb": 1})
                await asyncio.sleep(0.005)
            except ConnectionLost:
                break
        f0, f1 = await a.recv(), await a.recv()
        assert f0.header == {"notice": "you were declared failed"}
        assert f1.header == {"i": 1} and bytes(f1.payload) == b"last words"  # type: ignore[arg-type]
        with pytest.raises(ConnectionLost):
            await a.recv()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_bad_input_on_the_ring_closes_the_connection_without_allocating(loop: str) -> None:
    async def main() -> None:
        accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

        async def handler(conn: Connection) -> None:
            accepted.set_result(conn)
            await asyncio.Event().wait()

        net = HostNetwork(TCPNetwork(), host_id="h")
        listener = await net.listen(("127.0.0.1", 0), handler)
        a = await connect_local(endpoint_name("h", listener.address), max_frame_size=1 << 20)
        assert a is not None
        b = await accepted
        await ring_ready(a, b)
        with pytest.raises(ValueError, match="reserved"):
            a.send_nowait({"\x00": 2}, b"")
        b.set_payload_sink(lambda h, n, r: pytest.fail("the sink must not be asked"))  # type: ignore[arg-type,return-value]
        await b.send({"i": 0}, np.zeros(2 << 20, np.uint8))  # twice what ``a`` accepts
        with pytest.raises(ConnectionLost, match="exceeds the limit"):
            await asyncio.wait_for(a.recv(), 5)
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_ring_that_cannot_be_mapped_leaves_the_payloads_inline(loop: str, monkeypatch: Any, caplog: Any) -> None:
    def refuse(ref: Any) -> Segment:
        raise SharedMemoryError("not here", reason="open")

    monkeypatch.setattr(Segment, "attach", staticmethod(refuse))

    async def main() -> None:
        a, b, listener = await pair()
        await asyncio.sleep(0.05)
        assert a._space is None and b._space is None  # type: ignore[attr-defined]
        big = np.arange(1_000_000, dtype=np.int64)
        await a.send({"i": 0}, big)
        f = await b.recv()
        assert np.array_equal(np.frombuffer(f.payload, np.int64), big)  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    with caplog.at_level(logging.INFO, logger="aiodist.net"):
        run_on(loop, main, timeout=60)
    assert "cannot map the ring" in caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_another_host_is_reached_over_tcp(loop: str) -> None:
    async def main() -> None:
        a, b, listener = await pair("host-a", other_host="host-b")
        assert isinstance(a, TCPConnection) and isinstance(b, TCPConnection)
        await a.send({"i": 1}, np.ones(200_000))
        f = await b.recv()
        assert f.header == {"i": 1} and f.payload is not None and f.payload.nbytes == 1_600_000
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_taken_unix_name_leaves_a_tcp_listener_that_works(loop: str, caplog: Any) -> None:
    async def main() -> None:
        net = HostNetwork(TCPNetwork(), host_id="dup")
        first = await net.listen(("127.0.0.1", 0), lambda c: asyncio.sleep(0))

        class Fixed(TCPNetwork):
            async def listen(self, address: Any, handler: Any, **kw: Any) -> Any:
                lis = await super().listen(address, handler, **kw)
                lis._address = first.address  # type: ignore[attr-defined]  # as if it got the same port
                return lis

        second = await HostNetwork(Fixed(), host_id="dup").listen(("127.0.0.1", 0), lambda c: asyncio.sleep(0))
        assert type(second).__name__ == "TCPListener"
        for lis in (first, second):
            lis.close()
            await lis.wait_closed()

    with caplog.at_level(logging.WARNING, logger="aiodist.net"):
        run_on(loop, main, timeout=60)
    assert "TCP only" in caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_memory_for_payloads_nobody_waited_for_is_reused_once_they_are_dropped(loop: str) -> None:
    async def main() -> None:
        a, b, listener = await pair()
        await ring_ready(a, b)
        src = np.arange(300_000, dtype=np.uint8)
        await a.send({"i": 1}, src)
        f1 = await b.recv()
        base = f1.payload.obj.base  # type: ignore[union-attr]
        assert bytes(f1.payload) == src.tobytes()  # type: ignore[arg-type]
        await a.send({"i": 2}, src)
        f2 = await b.recv()
        assert f2.payload.obj.base is not base  # type: ignore[union-attr]  # the first is still in use
        del f1
        await a.send({"i": 3}, src[::-1].copy())
        f3 = await b.recv()
        assert f3.payload.obj.base is base  # type: ignore[union-attr]  # back once dropped
        assert bytes(f3.payload) == src[::-1].tobytes()  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


@pytest.mark.parametrize("loop", LOOPS)
def test_without_a_ring_of_its_own_a_side_sends_inline_and_still_receives_through_the_peers(
    loop: str, monkeypatch: Any
) -> None:
    real = Segment.create
    made: list[int] = []

    def one_ring_only(nbytes: int, *, name: str = "aiodist") -> Segment:
        made.append(1)
        if len(made) == 1:
            raise SharedMemoryError("no memory today", reason="create")
        return real(nbytes, name=name)

    monkeypatch.setattr(Segment, "create", staticmethod(one_ring_only))

    async def main() -> None:
        a, b, listener = await pair()  # one of the two sides has no ring
        await asyncio.sleep(0.05)
        flags = [(c._inline, c._space is not None) for c in (a, b)]  # type: ignore[attr-defined]
        assert sorted(flags) == [(False, True), (True, False)], flags
        big = np.arange(500_000, dtype=np.int64)
        await a.send({"i": 0}, big)  # one through its ring, the other inline
        await b.send({"i": 1}, big)
        fa, fb = await b.recv(), await a.recv()
        assert np.array_equal(np.frombuffer(fa.payload, np.int64), big)  # type: ignore[arg-type]
        assert np.array_equal(np.frombuffer(fb.payload, np.int64), big)  # type: ignore[arg-type]
        a.close()
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


# ------------------------------------------------------------------ a name squatted by another user

SQUATTER = r"""
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1].encode().replace(b"@", b"\0", 1))
s.listen(8)
print("bound", flush=True)
s.settimeout(float(sys.argv[2]))
got = 0
try:
    c, _ = s.accept()
    c.settimeout(1.0)
    try:
        while True:
            data = c.recv(65536)
            if not data:
                break
            got += len(data)
    except OSError:
        pass
except OSError:
    pass
print("received", got, flush=True)
"""
"""A process that binds a rank's Unix socket name first (argv[1], '@' for the leading NUL) and counts what it is sent."""


async def _dial_past_a_squatter(host: str, squat: Any) -> tuple[Connection, Any]:
    """A TCP listener whose Unix name ``squat(name)`` took first, and a HostNetwork's connection to it."""
    accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    async def handler(conn: Connection) -> None:
        accepted.set_result(conn)
        await asyncio.Event().wait()

    tcp = await TCPNetwork().listen(("127.0.0.1", 0), handler)
    await squat(endpoint_name(host, tcp.address))
    conn = await HostNetwork(TCPNetwork(), host_id=host).connect(tcp.address, timeout=5)
    await conn.send({"secret": "data"})
    frame = await (await asyncio.wait_for(accepted, 5)).recv()
    assert frame.header == {"secret": "data"}
    return conn, tcp


@pytest.mark.parametrize("loop", LOOPS)
def test_a_unix_name_held_by_another_user_is_not_used_and_is_sent_nothing(loop: str, monkeypatch: Any, caplog: Any) -> None:
    """The listening end's user is checked (SO_PEERCRED): here this process's own socket poses as another user's."""
    import aiodist.net.shmnet as shmnet

    monkeypatch.setattr(shmnet.os, "geteuid", lambda: 4242)  # (so our own squatter is "another user")

    async def main() -> None:
        import socket

        holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        got: list[bytes] = []

        async def squat(name: str) -> None:
            holder.bind(name)
            holder.listen(8)
            holder.setblocking(False)

            async def serve() -> None:
                c, _ = await asyncio.get_running_loop().sock_accept(holder)
                c.setblocking(False)
                got.append(await asyncio.get_running_loop().sock_recv(c, 65536))
                c.close()

            tasks.append(asyncio.ensure_future(serve()))

        tasks: list[asyncio.Future[Any]] = []
        conn, tcp = await _dial_past_a_squatter("squat", squat)
        assert isinstance(conn, TCPConnection) and not isinstance(conn, ShmConnection)
        await asyncio.wait(tasks, timeout=2)
        assert got in ([], [b""])  # (it saw the connection, and nothing on it)
        conn.close()
        holder.close()
        tcp.close()
        await tcp.wait_closed()
        for t in tasks:
            t.cancel()

    with caplog.at_level(logging.WARNING, logger="aiodist.net"):
        run_on(loop, main, timeout=60)
    assert "held by a process of another user (uid 0" in caplog.text or "another user" in caplog.text


@pytest.mark.parametrize("loop", LOOPS)
def test_a_listener_closes_a_unix_connection_of_another_user(loop: str, monkeypatch: Any) -> None:
    import socket

    import aiodist.net.shmnet as shmnet

    async def main() -> None:
        handled: list[Connection] = []

        async def handler(conn: Connection) -> None:
            handled.append(conn)

        listener = await HostNetwork(TCPNetwork(), host_id="them").listen(("127.0.0.1", 0), handler)
        monkeypatch.setattr(shmnet.os, "geteuid", lambda: 4242)  # (from now on, every peer is "another user")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        loop_ = asyncio.get_running_loop()
        await loop_.sock_connect(s, endpoint_name("them", listener.address))
        assert await asyncio.wait_for(loop_.sock_recv(s, 10), 5) == b""  # (closed at once, nothing said)
        s.close()
        assert handled == []
        listener.close()
        await listener.wait_closed()

    run_on(loop, main, timeout=60)


def _as_nobody() -> list[str] | None:
    """The command prefix that runs a stdlib Python as user ``nobody`` (None: root and setpriv are needed, and a
    Python that user may run: a pyenv one under /root loads its libpython from where ``nobody`` cannot read)."""
    import subprocess
    import sys

    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]):
        if not python:
            continue
        cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", python]
        try:
            ok = subprocess.run([*cmd, "-c", "print('ok')"], capture_output=True, timeout=20).stdout == b"ok\n"
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return cmd
    return None


AS_NOBODY = _as_nobody()


@pytest.mark.skipif(AS_NOBODY is None, reason="needs root, setpriv and a Python that user nobody may run")
def test_a_squatter_running_as_another_user_gets_nothing_and_the_link_goes_over_tcp() -> None:
    """The attack itself: user ``nobody`` binds the rank's Unix name before the rank does."""
    import subprocess

    assert AS_NOBODY is not None

    async def main() -> None:
        proc: list[Any] = []

        async def squat(name: str) -> None:
            p = await asyncio.create_subprocess_exec(*AS_NOBODY, "-c", SQUATTER, "@" + name[1:], "3",
                                                     stdout=subprocess.PIPE)
            proc.append(p)
            assert await asyncio.wait_for(p.stdout.readline(), 10) == b"bound\n"  # type: ignore[union-attr]

        conn, tcp = await _dial_past_a_squatter("nobody-squats", squat)
        assert isinstance(conn, TCPConnection) and not isinstance(conn, ShmConnection)
        out, _ = await asyncio.wait_for(proc[0].communicate(), 10)
        assert out.decode().split() == ["received", "0"]
        conn.close()
        tcp.close()
        await tcp.wait_closed()

    run_on("asyncio", main, timeout=60)
