"""The pure wire codec: no sockets, bytes in and frames out."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.errors import FrameTooLargeError, ProtocolError
from aiodist.wire import PREAMBLE, FrameDecoder, encode_frame

headers = st.dictionaries(
    st.text(max_size=8),
    st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.binary(max_size=20), st.none(), st.booleans()),
    max_size=5,
)
frames_st = st.lists(st.tuples(headers, st.one_of(st.none(), st.binary(max_size=3000))), max_size=30)


def _stream(frames) -> bytes:
    out = bytearray(PREAMBLE)
    for h, p in frames:
        head, body = encode_frame(h, p)
        out += head
        if body is not None:
            out += body
    return bytes(out)


@settings(max_examples=150, deadline=None)
@given(frames=frames_st, cuts=st.lists(st.integers(1, 5000), max_size=50))
def test_any_chunking_gives_the_same_frames(frames, cuts):
    data = _stream(frames)
    dec = FrameDecoder()
    got, off, i = [], 0, 0
    while off < len(data):
        n = cuts[i % len(cuts)] if cuts else len(data)
        got += dec.feed(data[off : off + n])
        off += n
        i += 1
    assert len(got) == len(frames)
    for (h, p), (h2, p2) in zip(frames, got):
        assert h2 == h
        assert (bytes(p2) if p2 is not None else b"") == (p or b"")


def test_many_tiny_frames_in_one_chunk_do_not_recurse():
    frames = [({"i": i}, b"x") for i in range(20000)]
    got = FrameDecoder().feed(_stream(frames))
    assert [h["i"] for h, _ in got] == list(range(20000))


def test_numpy_payload_is_not_copied_on_send():
    a = np.arange(10, dtype=np.float32)
    _, body = encode_frame({}, a)
    assert np.shares_memory(np.frombuffer(body, dtype=np.float32), a)
    with pytest.raises(ValueError, match="contiguous"):
        encode_frame({}, a[::2])
    _, body0 = encode_frame({}, np.float64(2.5).reshape(()))
    assert bytes(body0) == struct.pack("<d", 2.5)


def test_oversize_frames_rejected_before_allocating():
    dec = FrameDecoder(max_frame_size=1000)
    with pytest.raises(FrameTooLargeError) as ei:
        dec.feed(PREAMBLE + struct.pack("<IQ", 10, 1 << 62))
    assert ei.value.size == 10 + (1 << 62) and ei.value.limit == 1000
    with pytest.raises(ProtocolError):  # broken for good
        dec.feed(b"\x00")
    dec = FrameDecoder(max_header_size=64)
    with pytest.raises(FrameTooLargeError):
        dec.feed(PREAMBLE + struct.pack("<IQ", 65, 0))


@pytest.mark.parametrize(
    "data,match",
    [
        (b"HTTP/1.1", "not an aiodist peer"),
        (b"AIOD" + struct.pack("<HH", 99, 0), "version 99"),
        (PREAMBLE + struct.pack("<IQ", 0, 0), "without a header"),
        (PREAMBLE + struct.pack("<IQ", 1, 0) + b"\xc1", "undecodable"),
        (PREAMBLE + struct.pack("<IQ", 1, 0) + b"\x05", "not a map"),
    ],
)
def test_garbage_raises_protocol_error(data, match):
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder().feed(data)


def test_payload_sink_gets_the_bytes_in_place():
    dest = bytearray(5000)
    dec = FrameDecoder(sink=lambda h, n, got: memoryview(dest) if h["to"] == "d" else None)
    data = _stream([({"to": "d"}, bytes(range(250)) * 20), ({"to": "x"}, b"abc")])
    got = []
    for i in range(0, len(data), 777):
        got += dec.feed(data[i : i + 777])
    assert got[0][1].obj is dest and bytes(dest) == bytes(range(250)) * 20
    assert bytes(got[1][1]) == b"abc"


def test_payload_sink_with_wrong_size_is_a_protocol_error():
    dec = FrameDecoder(sink=lambda h, n, got: memoryview(bytearray(n + 1)))
    with pytest.raises(ProtocolError, match="unusable buffer"):
        dec.feed(_stream([({}, b"abc")]))


def test_header_larger_than_staging_area():
    big = {"k": "v" * 200_000}
    got = FrameDecoder().feed(_stream([(big, b"p"), ({"n": 2}, None)]))
    assert got[0][0] == big and got[1][0] == {"n": 2}


def test_a_decoder_limited_to_small_frames_stages_in_a_few_kib_and_grows_when_the_limit_is_raised() -> None:
    """A connection that has not authenticated (frames limited to a few KiB) costs no 64 KiB staging area."""
    dec = FrameDecoder(max_frame_size=8192)
    assert len(dec.get_buffer()) <= 8192 + 64
    big = {"k": "x" * 8000}  # the largest header the limit allows still fits, whatever the chunking
    data = _stream([(big, None), ({"n": 1}, b"abc")])
    got = []
    for i in range(0, len(data), 999):
        got += dec.feed(data[i : i + 999])
    assert [h for h, _ in got] == [big, {"n": 1}] and bytes(got[1][1]) == b"abc"
    assert len(dec.get_buffer()) <= 8192 + 64
    dec.set_max_frame_size(1 << 30)  # authenticated: the full staging area
    assert len(dec.get_buffer()) >= 1 << 16
    head, body = encode_frame({"n": 2}, b"p" * 100_000)
    got = dec.feed(head + bytes(body))
    assert got[0][0] == {"n": 2} and bytes(got[0][1]) == b"p" * 100_000
