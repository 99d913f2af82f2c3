"""The CLI spelling of faults: ``--crash 2@1.5``, ``--pause 3@sent:7+0.2``, ... (each fault's ``to_cli`` inverse).

When a fault happens: ``TIME`` (virtual seconds), ``sent:N`` / ``recv:N``
(the fault's own rank's n-th frame) or ``R:sent:N`` / ``R:recv:N`` (rank R's).
How long it lasts: ``+SECONDS`` after the start, or ``:END`` (a time) after a
start time. Hosts are rank numbers or names (``store``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .faults import Clog, Crash, CrashStore, HostRef, Partition, Pause, ResetConnection, Restart, Straggler
from .triggers import MessageReceived, MessageSent, Trigger

_SPAN = re.compile(r"^(?P<when>[^+]+?)(?:\+(?P<dur>[^+:]+))?$")


def _host(s: str) -> HostRef:
    return int(s) if s.isdigit() else s


def _hosts(s: str) -> tuple[HostRef, ...]:
    return tuple(_host(x) for x in s.split(",") if x)


def parse_when(spec: str, own: HostRef) -> tuple[float | None, Trigger | None, float | None]:
    """``TIME[:END]``, ``[R:]sent:N`` or ``[R:]recv:N`` -> (at, trigger, end)."""
    parts = spec.split(":")
    if "sent" in parts or "recv" in parts:
        kind = "sent" if "sent" in parts else "recv"
        i = parts.index(kind)
        if i not in (0, 1) or len(parts) != i + 2:
            raise ValueError(f"bad trigger {spec!r}: expected [RANK:]{kind}:N")
        rank = int(parts[0]) if i == 1 else own
        if not isinstance(rank, int):
            raise ValueError(f"trigger {spec!r} needs a rank: RANK:{kind}:N")
        n = int(parts[i + 1])
        return None, (MessageSent(rank, n) if kind == "sent" else MessageReceived(rank, n)), None
    if len(parts) > 2:
        raise ValueError(f"bad time {spec!r}: expected TIME or START:END")
    return float(parts[0]), None, float(parts[1]) if len(parts) == 2 else None


def _split(spec: str) -> tuple[str, str, float | None]:
    """``WHO@WHEN[+DUR]`` -> (who, when, duration)."""
    who, sep, rest = spec.partition("@")
    if not sep:
        raise ValueError(f"{spec!r}: expected WHO@WHEN")
    m = _SPAN.match(rest)
    if m is None:
        raise ValueError(f"{spec!r}: expected WHEN[+SECONDS]")
    return who, m["when"], float(m["dur"]) if m["dur"] is not None else None


def parse_crash(spec: str, *, silent: bool = False) -> Crash:
    """``RANK@TIME``, ``RANK@sent:N`` or ``RANK@recv:N``."""
    who, when, _ = _split(spec)
    rank = _host(who)
    at, on, _ = parse_when(when, rank)
    return Crash(rank, at=at, on=on, silent=silent)


def parse_restart(spec: str) -> Restart:
    """``RANK@WHEN`` or ``RANK@WHEN+DELAY``."""
    who, when, delay = _split(spec)
    rank = _host(who)
    at, on, _ = parse_when(when, rank)
    return Restart(rank, at=at, delay=delay or 0.0, on=on)


def parse_pause(spec: str) -> Pause:
    """``RANK@WHEN+SECONDS``."""
    who, when, duration = _split(spec)
    if duration is None:
        raise ValueError(f"--pause {spec!r}: expected RANK@WHEN+SECONDS")
    rank = _host(who)
    at, on, _ = parse_when(when, rank)
    return Pause(rank, at=at, duration=duration, on=on)


def parse_partition(spec: str, *, one_way: bool = False) -> Partition:
    """``A,B/C,D@START[:HEAL]`` or ``A/B@WHEN+SECONDS``."""
    sides, when, duration = _split(spec)
    a, b = sides.split("/", 1)
    at, on, heal = parse_when(when, -1)
    return Partition(_hosts(a), _hosts(b), at=at, heal_at=heal, one_way=one_way, on=on, duration=duration)


def parse_clog(spec: str) -> Clog:
    """``SRC-DST@START:END`` or ``SRC-DST@WHEN+SECONDS``."""
    link, when, duration = _split(spec)
    src, dst = link.split("-", 1)
    at, on, until = parse_when(when, _host(src))
    if until is None and duration is None:
        raise ValueError("--clog needs START:END or WHEN+SECONDS")
    return Clog((_host(src), _host(dst)), at=at, until=until, on=on, duration=duration)


def parse_straggler(spec: str) -> Straggler:
    """``RANKxFACTOR``, ``RANKxFACTOR@WHEN`` or ``RANKxFACTOR@WHEN+SECONDS``; ``~MOST`` after the factor: a sleep
    at most MOST seconds longer."""
    if "@" not in spec:
        rank_s, factor = spec.split("x", 1)
        factor, most = _most(factor)
        return Straggler(int(rank_s), float(factor), most=most)
    who, when, duration = _split(spec)
    rank_s, factor = who.split("x", 1)
    factor, most = _most(factor)
    at, on, _ = parse_when(when, int(rank_s))
    return Straggler(int(rank_s), float(factor), at=at, duration=duration, on=on, most=most)


def _most(factor: str) -> tuple[str, float | None]:
    """``FACTOR`` or ``FACTOR~MOST``."""
    factor, sep, most = factor.partition("~")
    return factor, float(most) if sep else None


def parse_reset(spec: str) -> ResetConnection:
    """``A-B@WHEN``."""
    link, when, _ = _split(spec)
    a, b = link.split("-", 1)
    at, on, _ = parse_when(when, _host(a))
    return ResetConnection(_host(a), _host(b), at=at, on=on)


def parse_crash_store(spec: str) -> CrashStore:
    """``TIME`` or ``R:sent:N``."""
    at, on, _ = parse_when(spec, -1)
    return CrashStore(at=at, on=on)


FAULT_FLAGS: list[tuple[str, Callable[[str], Any], str]] = [
    ("--crash", parse_crash, "RANK@TIME | RANK@sent:N | RANK@recv:N: kill a rank (or 'store')"),
    ("--vanish", lambda s: parse_crash(s, silent=True), "RANK@TIME | RANK@sent:N: the rank's machine vanishes"),
    ("--restart", parse_restart, "RANK@WHEN[+DELAY]: kill a rank and start it again"),
    ("--pause", parse_pause, "RANK@WHEN+SECONDS: stop a rank (SIGSTOP) for a while"),
    ("--partition", parse_partition, "A,B/C,D@START[:HEAL] | A,B/C,D@WHEN+SECONDS: cut hosts A,B from C,D"),
    ("--one-way-partition", lambda s: parse_partition(s, one_way=True), "A/B@START[:HEAL]: cut A->B only (B->A stalls after 0.2 s: its acknowledgements are cut)"),
    ("--clog", parse_clog, "SRC-DST@START:END | SRC-DST@WHEN+SECONDS: hold messages on one link"),
    ("--straggler", parse_straggler, "RANKxFACTOR[~MOST][@WHEN[+SECONDS]]: slow a rank down (a sleep at most MOST s "
                                     "longer)"),
    ("--reset", parse_reset, "A-B@WHEN: reset connections between two hosts"),
    ("--crash-store", parse_crash_store, "WHEN: kill the store"),
]
"""(flag, parser, help) of every concrete fault's flag (``Chaos`` and ``Swarm`` add their own)."""
