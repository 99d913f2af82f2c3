"""FrameDecoder asks its payload sink again while a payload it declined arrives (sans-IO, no sockets).

The contract is :data:`aiodist.net.base.PayloadSink`: asked with ``received`` 0
when the header is decoded; after ``None``, asked again at chunk boundaries
with the same header object and how many bytes arrived; a buffer named then
gets those bytes copied in and the rest written straight into it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.errors import ProtocolError
from aiodist.wire import PREAMBLE, FrameDecoder
from test_wire import _stream

Frames = list[tuple[dict[str, Any], Any]]


def _wire(*frames: tuple[dict[str, Any], Any]) -> bytes:
    """The frames' bytes, without the connection preamble."""
    return _stream(frames)[len(PREAMBLE) :]


def _read(dec: FrameDecoder, data: bytes, most: int = 1 << 30) -> tuple[Frames, list[int]]:
    """Write ``data`` as a transport does (each read at most ``most`` bytes); (frames, sizes offered)."""
    frames: Frames = []
    offered: list[int] = []
    view = memoryview(data)
    while view.nbytes:
        buf = dec.get_buffer(-1)
        offered.append(len(buf))
        n = min(len(buf), view.nbytes, most)
        buf[:n] = view[:n]
        view = view[n:]
        frames += dec.buffer_updated(n)
    return frames, offered


def _payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8).tobytes()


def test_a_buffer_named_when_asked_again_gets_every_byte_and_becomes_the_payload() -> None:
    data = _payload(1 << 20)
    dest = bytearray(len(data))
    asks: list[tuple[Any, int, int]] = []

    def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
        if header.get("i") != 0:
            return None
        asks.append((header, n, received))
        return memoryview(dest) if len(asks) == 3 else None

    dec = FrameDecoder(expect_preamble=False, sink=sink)
    frames, offered = _read(dec, _wire(({"i": 0}, data), ({"i": 1}, b"behind")))
    assert [h for h, _ in frames] == [{"i": 0}, {"i": 1}]
    payload = frames[0][1]
    assert payload.obj is dest and bytes(dest) == data  # the early bytes were copied, the rest landed there
    assert bytes(frames[1][1]) == b"behind"
    assert [(n, got) for _, n, got in asks][0] == (len(data), 0)
    assert all(h is asks[0][0] for h, _, _ in asks)  # the same header object every time
    assert [got for _, _, got in asks][1:] == sorted(got for _, _, got in asks[1:]) and 0 < asks[1][2] < asks[2][2] < len(data)
    assert max(offered) >= len(data) - asks[2][2]  # once named, the rest is offered in one piece


def test_reads_stop_at_each_chunk_boundary_while_the_sink_has_no_buffer() -> None:
    data = _payload(1 << 20, 1)
    asked_at: list[int] = []

    def sink(header: dict[str, Any], n: int, received: int) -> None:
        asked_at.append(received)

    dec = FrameDecoder(expect_preamble=False, sink=sink)
    head = _wire(({"i": 0}, data))[: -len(data)]
    assert dec.buffer_updated(_fill(dec, head)) == []
    assert asked_at == [0] and dec.declined
    got: Frames = []
    view = memoryview(data)
    while view.nbytes:
        dec.declined = False
        buf = dec.get_buffer(-1)
        before = len(asked_at)
        n = min(len(buf), view.nbytes)
        buf[:n] = view[:n]
        view = view[n:]
        got += dec.buffer_updated(n)
        if view.nbytes:
            assert len(asked_at) == before + 1 and asked_at[-1] == len(data) - view.nbytes  # each read ends at a boundary
            assert dec.declined
    assert len(got) == 1 and bytes(got[0][1]) == data
    assert len(asked_at) <= 12  # a handful of questions for a megabyte: the chunks grow


def _fill(dec: FrameDecoder, data: bytes) -> int:
    buf = dec.get_buffer(-1)
    buf[: len(data)] = data
    return len(data)


def test_a_sink_that_names_a_buffer_at_once_is_asked_once_and_reads_are_not_cut() -> None:
    data = _payload(1 << 20, 2)
    dest = bytearray(len(data))
    asks: list[int] = []

    def sink(header: dict[str, Any], n: int, received: int) -> memoryview:
        asks.append(received)
        return memoryview(dest)

    dec = FrameDecoder(expect_preamble=False, sink=sink)
    frames, offered = _read(dec, _wire(({"i": 0}, data)))
    assert asks == [0] and bytes(dest) == data and frames[0][1].obj is dest
    assert not dec.declined
    assert offered[-1] >= len(data) - (1 << 16)  # the rest of the payload in one offer


def test_without_a_sink_nothing_is_asked_and_reads_are_not_cut() -> None:
    data = _payload(1 << 20, 3)
    dec = FrameDecoder(expect_preamble=False)
    frames, offered = _read(dec, _wire(({"i": 0}, data)))
    assert bytes(frames[0][1]) == data and not dec.declined
    assert offered[-1] >= len(data) - (1 << 16)


def test_a_sink_removed_while_the_payload_arrives_is_not_asked_again() -> None:
    data = _payload(1 << 20, 4)
    asks: list[int] = []
    dec = FrameDecoder(expect_preamble=False)

    def sink(header: dict[str, Any], n: int, received: int) -> None:
        asks.append(received)
        dec.sink = None  # (a connection's set_payload_sink(None))

    dec.sink = sink
    frames, _ = _read(dec, _wire(({"i": 0}, data)), most=1 << 15)
    assert asks == [0] and bytes(frames[0][1]) == data


@pytest.mark.parametrize("how", ["raises", "wrong size", "read-only"])
def test_a_sink_that_fails_when_asked_again_breaks_the_decoder(how: str) -> None:
    data = _payload(1 << 19, 5)

    def sink(header: dict[str, Any], n: int, received: int) -> Any:
        if not received:
            return None
        if how == "raises":
            raise RuntimeError("a bug in the sink")
        return memoryview(bytearray(n + 1)) if how == "wrong size" else memoryview(bytes(n))

    dec = FrameDecoder(expect_preamble=False, sink=sink)
    with pytest.raises(RuntimeError if how == "raises" else ProtocolError):
        _read(dec, _wire(({"i": 0}, data)))
    if how != "raises":
        with pytest.raises(ProtocolError, match="already failed"):
            dec.feed(b"\0" * 16)


def test_released_mid_payload_drops_its_buffers_and_asks_nothing() -> None:
    data = _payload(1 << 20, 6)
    asks: list[int] = []
    dec = FrameDecoder(expect_preamble=False, sink=lambda h, n, got: asks.append(got))
    wire = _wire(({"i": 0}, data))
    _read(dec, wire[: len(wire) // 2])
    n = len(asks)
    dec.release()
    assert _read(dec, wire[len(wire) // 2 :])[0] == [] and len(asks) == n and not dec.declined


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300_000),
    name_at=st.integers(0, 12),
    reads=st.lists(st.integers(1, 200_000), min_size=1, max_size=40),
    preamble=st.booleans(),
)
def test_any_chunking_and_any_moment_of_naming_give_the_right_bytes(size: int, name_at: int, reads: list[int], preamble: bool) -> None:
    data = _payload(size, size)
    dest = bytearray(size)
    asks: list[int] = []

    def sink(header: dict[str, Any], n: int, received: int) -> memoryview | None:
        if header.get("i") != 0:
            return None
        assert n == size and 0 <= received < size
        asks.append(received)
        return memoryview(dest) if len(asks) > name_at else None

    dec = FrameDecoder(expect_preamble=preamble, sink=sink)
    wire = (PREAMBLE if preamble else b"") + _wire(({"i": 0}, data), ({"i": 1}, b"xy"), ({"i": 2}, None))
    frames: Frames = []
    view = memoryview(wire)
    k = 0
    while view.nbytes:
        buf = dec.get_buffer(-1)
        n = min(len(buf), view.nbytes, reads[k] if k < len(reads) else len(buf))
        k += 1
        buf[:n] = view[:n]
        view = view[n:]
        frames += dec.buffer_updated(n)
    assert [h for h, _ in frames] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert bytes(frames[0][1]) == data and bytes(frames[1][1]) == b"xy" and frames[2][1] is None
    if frames[0][1].obj is dest:
        assert bytes(dest) == data
    assert asks == sorted(asks)
