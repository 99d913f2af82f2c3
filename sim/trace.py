"""The event trace of a run: its digest, its events, and Chrome/Perfetto export.

Every event is hashed into a running digest (so two runs can be proven equal
without keeping their events); when ``keep`` is true the events are also kept
as :class:`TraceEvent` tuples. The digest hashes a canonical binary
serialization of plain values (see :class:`Tracer`), so it does not depend on
PYTHONHASHSEED, object identities or the process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import marshal
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple


class TraceEvent(NamedTuple):
    """One thing that happened at a virtual instant.

    ``kind``: send, recv, listen, connect, accept, refused, fin, reset, start,
    exit, crash, restart, fault, end. ``host`` is where it happened,
    ``peer`` the other end (or ""), ``msg`` a message id linking a send to its
    recv (-1 if none), ``detail`` a short free text (header repr for messages).
    """

    time: float
    kind: str
    host: str
    peer: str = ""
    nbytes: int = 0
    msg: int = -1
    detail: str = ""

    def line(self) -> str:
        return f"{self.time!r}|{self.kind}|{self.host}|{self.peer}|{self.nbytes}|{self.msg}|{self.detail}"


class Tracer:
    """Collects events; ``digest`` is a hash of all of them in order.

    The digest hashes compact tuples, not formatted lines: events are buffered
    as ``(time, kind, host, peer, nbytes, msg, detail)`` tuples and each batch
    is serialized with :func:`marshal.dumps` at version 2 (no object
    references, no interning flags: the bytes depend only on the values and
    their exact types, never on PYTHONHASHSEED, ``id()`` or refcounts). A
    list's encoding is a 5-byte prefix followed by its items' encodings, so
    dropping the prefix makes the digest independent of where batches end.
    For messages, ``detail`` is the header itself (a plain msgpack-like value
    after :func:`sim.headers.wire_header`); its ``repr`` is only built when
    events are kept.
    """

    _BATCH = 2048  # (message() and delivered() spell it out: they run once per message)

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.events: list[TraceEvent] = []
        self._hash = hashlib.blake2b(digest_size=16)
        self._buf: list[tuple[Any, ...]] = []
        self.count = 0

    def emit(self, time: float, kind: str, host: str, peer: str = "", nbytes: int = 0, msg: int = -1,
             detail: str = "") -> None:
        buf = self._buf
        buf.append((time, kind, host, peer, nbytes, msg, detail))
        if self.keep:
            self.events.append(TraceEvent(time, kind, host, peer, nbytes, msg, detail))
        if len(buf) >= self._BATCH:
            self._flush()

    def message(self, time: float, arrival: float, src: Any, dst: Any, nbytes: int, msg: int, header: Any) -> None:
        """Message ``msg`` sent at ``time`` from host ``src`` to host ``dst``, due at ``arrival``: a "send" event.

        Hosts have ``.name`` and ``.num``. The digest entry is compact, ``(time, arrival, src
        number, dst number, nbytes, msg, header)``: the names (and the kind) would be serialized
        again for every message, and the arrival makes a digest entry for the delivery
        unnecessary. The ``repr`` of the header is built only when events are kept.
        """
        buf = self._buf
        buf.append((time, arrival, src.num, dst.num, nbytes, msg, header))
        if self.keep:
            self.events.append(TraceEvent(time, "send", src.name, dst.name, nbytes, msg, repr(header)))
        if len(buf) >= 2048:
            self._flush()

    def delivered(self, time: float, host: Any, peer: Any, nbytes: int, msg: int) -> None:
        """Message ``msg`` from host ``peer`` reached host ``host``: a "recv" event, kept for the trace only.

        (The digest has the arrival time in the send's entry; a frame that arrives at a
        closed connection is never delivered, and the events that closed it say so.)
        """
        if self.keep:
            self.events.append(TraceEvent(time, "recv", host.name, peer.name, nbytes, msg, ""))

    def _flush(self) -> None:
        buf = self._buf
        if buf:
            self.count += len(buf)
            try:
                data = marshal.dumps(buf, 2)
            except ValueError:  # a receiver stored something unusual in a header it got: hash its type name
                data = marshal.dumps([_marshallable(e) for e in buf], 2)
            self._hash.update(memoryview(data)[5:])
            buf.clear()  # the same list: the network's hot paths append to it directly

    @property
    def digest(self) -> str:
        """Hash of every event so far (independent of how the events were batched)."""
        self._flush()
        return self._hash.hexdigest()


def _marshallable(event: tuple[Any, ...]) -> tuple[Any, ...]:
    try:
        marshal.dumps(event, 2)
    except ValueError:
        return event[:-1] + (f"<{type(event[-1]).__name__}>",)  # (the header or detail: always last)
    return event


def first_divergence(a: Sequence[TraceEvent], b: Sequence[TraceEvent]) -> int | None:
    """Index of the first event that differs (or where one trace ends), None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if tuple(x) != tuple(y):
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def events_to_json(events: Iterable[TraceEvent]) -> list[list[Any]]:
    return [list(e) for e in events]


def events_from_json(rows: Iterable[Sequence[Any]]) -> list[TraceEvent]:
    return [TraceEvent(*row) for row in rows]


def _tid(host: str, tids: dict[str, int]) -> int:
    tid = tids.get(host)
    if tid is None:
        if host.startswith("rank") and host[4:].isdigit():
            tid = int(host[4:])
        else:
            tid = 100_000 + len(tids)
        tids[host] = tid
    return tid


def to_chrome(events: Iterable[TraceEvent], ops: Mapping[int, Sequence[Mapping[str, Any]]] | None = None
              ) -> dict[str, Any]:
    """Chrome / Perfetto trace-event JSON: a track per host, op spans, message flows, faults.

    ``ops`` (rank -> flight-recorder entries with ``op``, ``start``, ``end``)
    become spans on the rank's track. Times are virtual seconds shown as
    microseconds.
    """
    out: list[dict[str, Any]] = []
    tids: dict[str, int] = {}
    last = 0.0
    events = list(events)
    if events:
        last = events[-1].time
    delivered = {ev.msg for ev in events if ev.kind == "recv"}  # a flow starts only where it also ends
    for rank, entries in sorted((ops or {}).items()):
        tid = _tid(f"rank{rank}", tids)
        for e in entries:
            start = float(e.get("start", 0.0))
            end = float(e.get("end", last))
            args = {str(k): json_value(v) for k, v in e.items() if k not in ("op", "start", "end")}
            out.append({"name": str(e.get("op", "?")), "cat": "op", "ph": "X", "ts": start * 1e6,
                        "dur": max(end - start, 0.0) * 1e6, "pid": 0, "tid": tid, "args": args})
    for ev in events:
        ts = ev.time * 1e6
        tid = _tid(ev.host, tids)
        if ev.kind == "send":
            out.append({"name": "send", "ph": "i", "s": "t", "ts": ts, "pid": 0, "tid": tid,
                        "args": {"to": ev.peer, "bytes": ev.nbytes, "header": _header_value(ev.detail)}})
            if ev.msg in delivered:
                out.append({"name": "msg", "cat": "msg", "ph": "s", "id": ev.msg, "ts": ts, "pid": 0, "tid": tid})
        elif ev.kind == "recv":
            out.append({"name": "recv", "ph": "i", "s": "t", "ts": ts, "pid": 0, "tid": tid,
                        "args": {"from": ev.peer, "bytes": ev.nbytes}})
            out.append({"name": "msg", "cat": "msg", "ph": "f", "bp": "e", "id": ev.msg, "ts": ts, "pid": 0,
                        "tid": tid})
        elif ev.kind in ("crash", "restart", "fault", "reset"):
            out.append({"name": f"{ev.kind}: {ev.detail}", "ph": "i", "s": "g", "ts": ts, "pid": 0, "tid": tid,
                        "cname": "terrible"})
        else:
            out.append({"name": ev.kind, "ph": "i", "s": "t", "ts": ts, "pid": 0, "tid": tid,
                        "args": {"peer": ev.peer, "detail": ev.detail}})
    for host, tid in sorted(tids.items(), key=lambda kv: kv[1]):
        out.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": host}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
    out.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "sim (virtual time)"}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def json_value(v: Any) -> Any:
    """``v`` as a JSON value: numbers, strings, booleans, None, lists and str-keyed objects as they are;
    bytes as ``{"hex": "..."}`` (nonces, proofs: 32 bytes read as 64 hex digits) and anything else as its
    ``repr``."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"hex": bytes(v).hex()}
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, (list, tuple)):
        return [json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): json_value(x) for k, x in v.items()}
    return repr(v)


def _header_value(detail: str) -> Any:
    """A message header kept as its ``repr`` (see :meth:`Tracer.message`), back as a JSON value."""
    try:
        return json_value(ast.literal_eval(detail))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return detail


def write_chrome(events: Iterable[TraceEvent], path: str,
                 ops: Mapping[int, Sequence[Mapping[str, Any]]] | None = None) -> None:
    with open(path, "w") as f:
        json.dump(to_chrome(events, ops), f)
