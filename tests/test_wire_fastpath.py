"""The small-frame fast paths of the codec and of the TCP connection keep their semantics.

* the decoder's fast path (whole frames staged back to back) hands over to
  the general state machine at any frame it cannot take, fails like it on
  bad headers, and gives payloads to the sink exactly as it does (in place or
  a new buffer);
* request/reply traffic writes each frame at once and schedules no deferred
  flush (no extra loop iteration per round trip);
* replies that a frame handler sends for a batch of frames received together
  go out in one write;
* a frame handler that steps aside in the middle of a batch gets no more
  frames: the rest of the batch goes to recv(), in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiodist.errors import FrameTooLargeError, ProtocolError
from aiodist.net.base import Frame
from aiodist.net.tcp import TCPNetwork
from aiodist.wire import PREAMBLE, FrameDecoder
from test_wire import _stream


def _wire(*frames: tuple[dict[str, Any], bytes | None]) -> bytes:
    """The frames' bytes, without the connection preamble."""
    return _stream(frames)[len(PREAMBLE) :]


def _put(dec: FrameDecoder, data: bytes) -> list[tuple[dict[str, Any], Any]]:
    """Write ``data`` through get_buffer/buffer_updated, as a transport does, in one piece."""
    buf = dec.get_buffer(-1)
    assert len(buf) >= len(data)
    buf[: len(data)] = data
    return dec.buffer_updated(len(data))


def test_small_frames_then_a_payload_then_a_partial_frame_in_one_read() -> None:
    dec = FrameDecoder(expect_preamble=False)
    data = _wire(({"i": 0}, None), ({"i": 1}, None), ({"i": 2}, b"xyz"), ({"i": 3}, None), ({"i": 4}, None))
    cut = len(data) - 3  # the last frame arrives in two reads
    got = _put(dec, data[:cut])
    assert [(h["i"], None if p is None else bytes(p)) for h, p in got] == [(0, None), (1, None), (2, b"xyz"), (3, None)]
    got = _put(dec, data[cut:])
    assert [h["i"] for h, _ in got] == [4]


def test_whole_frames_with_payloads_land_where_the_sink_says() -> None:
    places = {"in": bytearray(3)}
    asked: list[tuple[int, int]] = []

    def sink(header: dict[str, Any], nbytes: int, received: int) -> Any:
        asked.append((header["i"], nbytes))
        return memoryview(places[header["to"]]) if header.get("to") in places else None

    dec = FrameDecoder(expect_preamble=False)
    dec.sink = sink
    data = _wire(({"i": 0, "to": "in"}, b"abc"), ({"i": 1}, b"new"), ({"i": 2}, None))
    got = _put(dec, data)
    assert asked == [(0, 3), (1, 3)]
    assert [h["i"] for h, _ in got] == [0, 1, 2]
    assert got[0][1].obj is places["in"] and bytes(places["in"]) == b"abc"  # in place, no copy handed out
    assert bytes(got[1][1]) == b"new" and got[2][1] is None


def test_a_sink_buffer_of_the_wrong_size_breaks_the_decoder_in_the_fast_path_too() -> None:
    dec = FrameDecoder(expect_preamble=False)
    dec.sink = lambda header, nbytes, received: memoryview(bytearray(nbytes + 1))
    with pytest.raises(ProtocolError, match="unusable buffer"):
        _put(dec, _wire(({"i": 0}, b"abc")))


def test_a_prefix_split_across_reads_goes_through_the_general_path() -> None:
    dec = FrameDecoder(expect_preamble=False)
    data = _wire(({"a": 1}, None), ({"b": 2}, None))
    first = len(_wire(({"a": 1}, None))) + 5  # the second frame's prefix is cut
    assert [h for h, _ in _put(dec, data[:first])] == [{"a": 1}]
    assert [h for h, _ in _put(dec, data[first:])] == [{"b": 2}]


@pytest.mark.parametrize(
    ("body", "match"),
    [(b"\xc1", "undecodable"), (b"\x93\x01\x02\x03", "not a map")],
)
def test_a_bad_header_after_good_frames_breaks_the_decoder(body: bytes, match: str) -> None:
    import struct

    dec = FrameDecoder()
    bad = struct.pack("<IQ", len(body), 0) + body
    with pytest.raises(ProtocolError, match=match):
        _put(dec, PREAMBLE + _wire(({"ok": 1}, None)) + bad)
    with pytest.raises(ProtocolError, match="already failed"):
        dec.feed(_wire(({"ok": 2}, None)))


def test_an_oversize_header_is_refused_by_the_fast_path_too() -> None:
    import struct

    dec = FrameDecoder(expect_preamble=False, max_header_size=16)
    with pytest.raises(FrameTooLargeError):
        _put(dec, _wire(({"ok": 1}, None)) + struct.pack("<IQ", 17, 0) + b"\x80" * 17)


def test_a_frame_is_a_plain_slotted_object_that_compares_by_value() -> None:
    f = Frame({"a": 1}, None)
    assert f == Frame({"a": 1}) and f != Frame({"a": 2}) and f.payload is None
    assert Frame({}, memoryview(b"xy")) == Frame({}, memoryview(bytearray(b"xy")))
    assert not hasattr(f, "__dict__")  # slots only: no per-frame dict
    assert "no payload" in repr(f) and "2 bytes" in repr(Frame({}, memoryview(b"xy")))


async def _echo_pair(net: TCPNetwork, on_server: Any) -> tuple[Any, Any, Any]:
    """A client connection and the listener's end of it (handed to ``on_server``)."""
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def handler(conn: Any) -> None:
        on_server(conn)
        ready.set_result(conn)
        await asyncio.sleep(30)

    lis = await net.listen(("127.0.0.1", 0), handler)
    conn = await net.connect(lis.address, timeout=5)
    return lis, conn, await asyncio.wait_for(ready, 5)


async def test_request_reply_writes_each_frame_at_once_without_a_deferred_flush() -> None:
    def serve(conn: Any) -> None:
        conn.set_frame_handler(lambda f: conn.send_nowait({"r": f.header["i"]}))

    lis, conn, _ = await _echo_pair(TCPNetwork(), serve)
    replies: asyncio.Queue[int] = asyncio.Queue()
    conn.set_frame_handler(lambda f: replies.put_nowait(f.header["r"]))
    writes: list[int] = []
    flushes: list[int] = []
    original_write = conn._transport.write
    original_flush = conn._outbox._flush

    def spy_write(data: Any) -> None:
        writes.append(len(data))
        original_write(data)

    def spy_flush() -> None:
        flushes.append(1)
        original_flush()

    conn._transport.write = spy_write
    conn._outbox._flush = spy_flush  # call_soon(self._flush) would find this one
    for i in range(20):
        assert conn.send_nowait({"i": i})
        assert await asyncio.wait_for(replies.get(), 5) == i
    assert len(writes) == 20  # one write per request, at once: the flush after each had nothing to write
    assert len(flushes) <= 20
    conn.close()
    lis.close()
    await lis.wait_closed()


async def test_replies_to_a_batch_of_requests_go_out_in_one_write() -> None:
    writes: list[int] = []

    def serve(conn: Any) -> None:
        original = conn._transport.write

        def spy(data: Any) -> None:
            writes.append(len(data))
            original(data)

        conn._transport.write = spy
        conn.set_frame_handler(lambda f: conn.send_nowait({"r": f.header["i"]}))

    lis, conn, _ = await _echo_pair(TCPNetwork(), serve)
    got: list[int] = []
    conn.set_frame_handler(lambda f: got.append(f.header["r"]))
    await asyncio.sleep(0.05)
    writes.clear()
    conn._transport.write(_wire(*[({"i": i}, None) for i in range(30)]))  # one segment: one read on the server
    for _ in range(200):
        if len(got) == 30:
            break
        await asyncio.sleep(0.005)
    assert got == list(range(30))
    assert len(writes) == 1
    conn.close()
    lis.close()
    await lis.wait_closed()


async def test_a_handler_that_steps_aside_mid_batch_gets_no_more_frames() -> None:
    seen: list[int] = []

    def serve(conn: Any) -> None:
        def on_frame(f: Frame) -> None:
            seen.append(f.header["i"])
            if f.header["i"] == 1:
                conn.set_frame_handler(None)

        conn.set_frame_handler(on_frame)

    lis, conn, srv = await _echo_pair(TCPNetwork(), serve)
    await asyncio.sleep(0.05)
    conn._transport.write(_wire(*[({"i": i}, None) for i in range(5)]))
    rest = [(await asyncio.wait_for(srv.recv(), 5)).header["i"] for _ in range(3)]
    assert seen == [0, 1]
    assert rest == [2, 3, 4]
    conn.close()
    lis.close()
    await lis.wait_closed()


async def test_a_frame_sent_in_a_later_iteration_goes_out_at_once() -> None:
    # A rank that sends, then (in a later iteration, having received nothing) sends
    # again -- a barrier then a collective -- must not have the second frame held
    # for a flush: that cost small collectives hundreds of microseconds.
    frames: list[int] = []
    lis, conn, _ = await _echo_pair(TCPNetwork(), lambda c: c.set_frame_handler(lambda f: frames.append(f.header["i"])))
    assert conn.send_nowait({"i": 0})
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert conn.send_nowait({"i": 1})
    assert not conn._outbox._wbuf  # written, not batched
    assert conn.send_nowait({"i": 2})  # the same iteration: this one is batched
    assert conn._outbox._wbuf
    for _ in range(200):
        if len(frames) == 3:
            break
        await asyncio.sleep(0.005)
    assert frames == [0, 1, 2]
    conn.close()
    lis.close()
    await lis.wait_closed()


async def test_a_sender_that_never_receives_still_gets_every_frame_out_in_order() -> None:
    frames: list[int] = []
    lis, conn, _ = await _echo_pair(TCPNetwork(), lambda c: c.set_frame_handler(lambda f: frames.append(f.header["i"])))
    for i in range(50):
        await conn.send({"i": i})
        if i % 3 == 0:
            await asyncio.sleep(0)  # some in the same iteration, some not
    for _ in range(200):
        if len(frames) == 50:
            break
        await asyncio.sleep(0.005)
    assert frames == list(range(50))
    conn.close()
    lis.close()
    await lis.wait_closed()


@pytest.mark.parametrize("use_uvloop", [False, True])
def test_a_header_larger_than_the_staging_area_after_an_idle_read(use_uvloop: bool) -> None:
    """The staging area grows while the transport still holds the buffer it was handed."""
    factory = None
    if use_uvloop:
        factory = pytest.importorskip("uvloop").new_event_loop

    async def main() -> tuple[int, int, dict[str, Any]]:
        got: asyncio.Future[tuple[int, int, dict[str, Any]]] = asyncio.get_running_loop().create_future()

        async def handler(conn: Any) -> None:
            f1, f2, f3 = [await conn.recv() for _ in range(3)]
            got.set_result((len(f1.header["x"]), len(f2.header["x"]), f3.header))

        net = TCPNetwork()
        lis = await net.listen(("127.0.0.1", 0), handler)
        conn = await net.connect(lis.address, timeout=5)
        await conn.send({"x": "a" * 10})
        await asyncio.sleep(0.05)  # consumed: the next read gets the whole staging area
        await conn.send({"x": "b" * 300_000})
        await conn.send({"ok": 1})
        try:
            return await asyncio.wait_for(got, 5)
        finally:
            conn.close()
            lis.close()
            await lis.wait_closed()

    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(main()) == (10, 300_000, {"ok": 1})


def _put_all(dec: FrameDecoder, data: bytes) -> tuple[list[tuple[dict[str, Any], Any]], int]:
    """Write ``data`` as a transport does, each read filling what get_buffer offers; (frames, reads)."""
    frames: list[tuple[dict[str, Any], Any]] = []
    reads = 0
    while data:
        buf = dec.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        frames += dec.buffer_updated(n)
        reads += 1
    return frames, reads


def test_a_frame_over_the_staging_area_is_waited_for_in_a_grown_area_and_decoded_in_one_pass() -> None:
    from aiodist import wire

    asked: list[int] = []
    targets: list[memoryview] = []

    def sink(header: dict[str, Any], nbytes: int, received: int) -> Any:
        asked.append(nbytes)
        targets.append(memoryview(bytearray(nbytes)))
        return targets[-1]

    dec = FrameDecoder(expect_preamble=False)
    dec.sink = sink
    small = bytes(range(256)) * 4
    mid = bytes(range(256)) * 400  # 100 KiB: more than the first staging area, less than the grown one
    data = _wire(({"i": 0}, small), ({"i": 1}, mid), ({"i": 2}, small), ({"i": 3}, mid), ({"i": 4}, mid))
    frames, reads = _put_all(dec, data)
    assert [(h["i"], bytes(p)) for h, p in frames] == [(0, small), (1, mid), (2, small), (3, mid), (4, mid)]
    assert asked == [len(small), len(mid), len(small), len(mid), len(mid)]  # each payload asked for once
    assert all(p is t for (_, p), t in zip(frames, targets))  # and landed in the sink's buffer
    assert len(dec._buf) == wire._STAGING_MAX  # grown once, then reused (frames straddling its end move to the front)
    assert reads <= 5  # a mid frame arrives in at most two reads (the first area's fill, then the rest)


def test_small_frames_never_grow_the_staging_area() -> None:
    from aiodist import wire

    dec = FrameDecoder(expect_preamble=False)
    data = _wire(*[({"i": i}, bytes(1000)) for i in range(300)])  # 300 KB of small frames, read in 64 KiB pieces
    frames, _ = _put_all(dec, data)
    assert [h["i"] for h, _ in frames] == list(range(300))
    assert len(dec._buf) == wire._STAGING_SIZE
