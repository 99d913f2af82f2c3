"""The simulator kernel's fast paths: digest hashing, header copies, kernel events, lazy buffers.

These guard the optimizations of the hot path (see benchmarks/sim_bench.py):
they must not change what a run means (same digest for the same execution,
different digest for a different one, headers exactly as msgpack delivers
them) and must keep the kernel's cost per delivery bounded.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
from typing import Any

import msgpack
import pytest

import sys
from pathlib import Path

import sim
from aiodist.context import current_network, getenv
from aiodist.net.base import Connection
from sim.headers import wire_header
from sim.links import Host
from sim.loop import SimLoop
from sim.trace import TraceEvent, Tracer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import sim_pingpong  # noqa: E402


# --------------------------------------------------------------------------- digest

_H0, _H1 = Host("rank0", 0, 0), Host("rank1", 1, 1)


def _feed(tracer: Tracer, events: list[tuple[Any, ...]]) -> None:
    for kind, header in events:
        if kind == "send":
            tracer.message(0.5, 0.75, _H0, _H1, 8, 1, header)
        elif kind == "recv":
            tracer.delivered(0.25, _H1, _H0, 8, 1)
        else:
            tracer.emit(0.25, kind, "rank1", "rank0", 8, 1, "x")


EVENTS: list[tuple[Any, ...]] = [("send", {"t": "m", "k": [0, 1, 2], "o": "all_reduce SUM float32"}),
                                 ("recv", None), ("send", {"id": 3, "v": [b"rank6|40000"]}), ("fin", None)] * 50


def test_digest_does_not_depend_on_batching_or_on_keeping_events(monkeypatch: pytest.MonkeyPatch) -> None:
    a = Tracer(keep=False)
    _feed(a, EVENTS)
    b = Tracer(keep=True)
    monkeypatch.setattr(Tracer, "_BATCH", 7)
    _feed(b, EVENTS[:33])
    _ = b.digest  # reading the digest mid-run flushes a partial batch
    _feed(b, EVENTS[33:])
    assert a.digest == b.digest
    assert a.count == b.count == len([e for e in EVENTS if e[0] != "recv"])  # a delivery's arrival is in its send
    assert len(b.events) == len(EVENTS)
    assert b.events[0] == TraceEvent(0.5, "send", "rank0", "rank1", 8, 1,
                                     repr({"t": "m", "k": [0, 1, 2], "o": "all_reduce SUM float32"}))


@pytest.mark.parametrize("other", [{"a": 2}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"b": 1}, {"a": [1]}])
def test_digest_sees_header_values_and_their_types(other: dict[str, Any]) -> None:
    def digest(header: dict[str, Any]) -> str:
        t = Tracer(keep=False)
        t.message(0.0, 0.5, _H0, _H1, 0, 1, header)
        return t.digest

    assert digest({"a": 1}) == digest({"a": 1})
    assert digest({"a": 1}) != digest(other)


def test_digest_sees_times_exactly() -> None:
    def digest(time: float) -> str:
        t = Tracer(keep=False)
        t.emit(time, "recv", "rank0")
        return t.digest

    assert digest(0.1 + 0.2) != digest(0.3)  # repr-exact, as the old line format was


def test_a_header_a_receiver_filled_with_an_unusual_object_still_hashes() -> None:
    t = Tracer(keep=False)
    header: dict[str, Any] = {"a": 1}
    t.message(0.0, 0.5, _H0, _H1, 0, 1, header)
    header["x"] = object()  # the receiver owns the delivered dict; it may store anything in it
    u = Tracer(keep=False)
    u.message(0.0, 0.5, _H0, _H1, 0, 1, {"a": 1, "x": object()})
    assert t.digest == u.digest  # the type name is hashed, never an address


# --------------------------------------------------------------------------- headers


class Color(enum.IntEnum):
    RED = 1


class MyStr(str):
    pass


HEADERS: list[dict[str, Any]] = [
    {},
    {"t": "m", "g": 0, "k": (0, 0, 2, 0), "o": "all_reduce SUM float32"},
    {"k": [1, (2, 3), [4, (5,)]], "b": bytearray(b"xy"), "m": memoryview(b"z")},
    {"n": None, "f": 1.5, "flag": True, "c": Color.RED, "s": MyStr("s"), "big": 2**63},
    {"nested": {"t": (1, 2), "d": {"e": (True, None)}}, "l": [b"a", bytearray(b"b")]},
    {"mixed": (1, "a", 2.5, None, False, b"c")},
]


@pytest.mark.parametrize("header", HEADERS)
def test_wire_header_is_what_msgpack_delivers(header: dict[str, Any]) -> None:
    expected = msgpack.unpackb(msgpack.packb(header, use_bin_type=True), raw=False)
    got = wire_header(header)
    assert got == expected
    assert _types(got) == _types(expected)
    assert got is not header


def _types(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _types(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_types(x) for x in v]
    return type(v)


def test_wire_header_is_a_fresh_copy() -> None:
    inner = [1, 2]
    header = {"k": (1, 2), "l": inner, "d": {"x": 1}}
    got = wire_header(header)
    inner.append(3)
    header["d"]["x"] = 2  # type: ignore[index]
    assert got == {"k": [1, 2], "l": [1, 2], "d": {"x": 1}}


# --------------------------------------------------------------------------- kernel events


def test_kernel_events_run_in_time_then_posting_order_among_cancelled_timers() -> None:
    loop = SimLoop(seed=0, schedule="fifo")
    order: list[Any] = []
    timers = [loop.call_at(1.0 + i * 1e-3, order.append, ("timer", i)) for i in range(600)]
    for i in range(5):
        loop.schedule(2.0, 0, order.append, (("event", i),), contextvars.Context())
    loop.schedule(0.5, 0, order.append, (("early", 0),), contextvars.Context())
    for t in timers[:590]:
        t.cancel()  # enough to make the loop compact its heap, with kernel events in it
    loop.run_until_idle_or_stopped()
    assert order == [("early", 0)] + [("timer", i) for i in range(590, 600)] + [("event", i) for i in range(5)]
    assert loop.time() == 2.0


# --------------------------------------------------------------------------- cost per delivery

PINGS = 200


def test_a_delivery_costs_at_most_two_loop_steps() -> None:
    """Deterministic guard for the kernel's hot path: deliver + wake the reader, nothing more."""
    res = sim.run(sim_pingpong.main, world_size=4, seed=1, trace=False, schedule="fifo", args=(PINGS,),
                  explore=False)  # (counts steps)
    assert res.ok, res.summary()
    assert res.messages == 4 * PINGS
    assert res.steps <= 2 * res.messages + 100  # setup, connect, close and exits: a few dozen steps


def test_unused_flow_control_buffers_are_not_allocated() -> None:
    async def main() -> Any:
        net = current_network()
        if getenv("RANK") == "0":
            got: list[Any] = []

            async def handler(conn: Connection) -> None:
                got.append(((await conn.recv()).header, conn._kernel, conn._writers))  # type: ignore[attr-defined]

            listener = await net.listen(("", 1000), handler)
            await asyncio.sleep(1)
            await listener.aclose()
            return got
        conn = await net.connect(("rank0", 1000))
        await conn.send({"hello": 1})
        await asyncio.sleep(1)
        conn.close()
        return None

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results[0] == [({"hello": 1}, (), ())]


def test_scale_benchmark_reports_cpu_time_and_the_profile_split() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from sim_bench import bench_scale

    (row,) = bench_scale([4], "random", profile=True)
    assert row["ok"] and row["deliveries"] > 0 and row["cpu_s"] > 0
    split = row["profile_split_pct"]
    assert set(split) == {"sim", "aiodist", "other"} and 99 <= sum(split.values()) <= 101
    assert split["sim"] > 0 and split["aiodist"] > 0
