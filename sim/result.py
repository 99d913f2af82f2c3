"""What a simulated run produced: :class:`Result` and its :class:`Failure` entries, and their text.

A failure names the rank at fault, where the program was (its own line, not
aiodist's) and, for ranks still running, the operations each waits in; big
runs fold ranks that fail or wait in the same place into one line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .explore import TimingPlan
from .trace import TraceEvent

@dataclass
class Failure:
    """Something that went wrong in a run.

    ``kind``: "exception" (a rank's main raised), "deadlock" (nothing ready,
    no timer pending, ranks still running), "time_limit" or "unawaited" (a
    rank finished with operations it never awaited). ``blocked`` maps
    each still-running rank to the operations it waits in (from
    :mod:`aiodist.inflight`), ``where`` to its innermost await location.
    """

    kind: str
    rank: int | None
    message: str
    traceback: str = ""
    time: float = 0.0
    blocked: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    where: dict[int, str] = field(default_factory=dict)
    location: str = ""
    """For an exception: the program's own innermost line it came through (file:line in function)."""
    paused: dict[int, float] = field(default_factory=dict)
    """Ranks still running that were paused when the run ended (a Pause fault, or exploration's): when each was
    to resume. Such a rank is not waiting in its operations: it is stopped (their replies may be there)."""
    restarting: dict[int, float] = field(default_factory=dict)
    """Ranks down when the run ended, between a Restart fault's crash and the restart: when each was to start."""
    cycle: list[int] = field(default_factory=list)
    """For an operation of the world that timed out: ranks that each waited for the next when it did (the first
    is this failure's rank, and the last too), e.g. ``[2, 0, 1, 2]``: a deadlock the timeout ended. Else empty."""

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "run"
        lines = [f"[{self.kind}] {who} at t={self.time:.6f}s: {self.message}"]
        if self.location:
            lines.append(f"    raised at {_display_path(self.location)}")
        if self.cycle:
            ring = " -> ".join(f"rank {r}" for r in self.cycle)
            lines.append(f"    waits in a ring when it timed out: {ring} (each waited for the next: a deadlock, unless "
                         "a task of theirs in no operation was about to send)")
        lines += [f"    rank {r} down: crashed by a restart fault, to start again at t={t:.6f}s"
                  for r, t in self.restarting.items()]
        described: list[tuple[int, str]] = []
        for r in sorted(set(self.blocked) | set(self.where)):
            ops = self.blocked.get(r) or []
            desc = "; ".join(_describe_op(op) for op in ops) or "no aiodist operation"
            loc = f"  ({_display_path(self.where[r])})" if r in self.where else ""
            described.append((r, f"{desc}{loc}"))
        if len(described) <= self.MAX_RANK_LINES:
            lines += [f"    rank {r} {self._state(r)} {text}" for r, text in described]
        else:  # a big run: one line per distinct place (when each rank started waiting aside), with its ranks
            places: dict[str, list[int]] = {}
            starts: dict[str, list[float]] = {}
            for r in sorted(set(self.blocked) | set(self.where)):
                ops = self.blocked.get(r) or []
                desc = "; ".join(_describe_op(op, timeless=True) for op in ops) or "no aiodist operation"
                text = f"{desc}  ({_display_path(self.where[r])})" if r in self.where else desc
                text = f"{self._state(r)} {text}"  # (paused ranks on lines of their own: stopped, not waiting)
                places.setdefault(text, []).append(r)
                first = ops[0].get("start") if ops else None  # (when it started waiting in its first operation)
                starts.setdefault(text, []).extend([float(first)] if isinstance(first, (int, float)) else [])
            for text, ranks in places.items():
                who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({_ranks_text(ranks)})"
                t = starts[text]
                since = "" if not t else f" [since t={min(t):.6f}s]" if min(t) == max(t) else \
                    f" [since t={min(t):.6f}-{max(t):.6f}s]"
                lines.append(f"    {who} {text}{since}")
        return "\n".join(lines)

    def _state(self, rank: int) -> str:
        """How rank ``rank`` is in its operations: blocked, or stopped by a pause (which may not be the
        operations' fault: their replies may have come)."""
        if rank in self.paused:
            return f"paused (until t={self.paused[rank]:.6f}s) in:"
        return "blocked in:"

    MAX_RANK_LINES = 16
    """Beyond this many blocked ranks, ranks blocked in the same place share one line."""


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _display_path(where: str) -> str:
    """``file:line in f`` with the file relative to the working directory when it is under it."""
    path, sep, rest = where.partition(":")
    if sep and os.path.isabs(path):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel + sep + rest
    return where


def _shape(text: str) -> str:
    """``text`` with its numbers blanked: lines that differ only in rank numbers or times group together."""
    return _NUMBER.sub("#", text)


def _ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 2, 3, 4, 7]`` as ``"0, 2-4, 7"``."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(_span(start, prev))  # type: ignore[arg-type]
        start = prev = r
    if start is not None:
        parts.append(_span(start, prev))  # type: ignore[arg-type]
    return ", ".join(parts)


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"


def _describe_op(op: Mapping[str, Any], *, timeless: bool = False) -> str:
    """``barrier(seq=0, group='world', start=0.65, ...)``; ``timeless``: without when it started.

    A store call on aiodist's own keys (``aiodist/<round>/...``: the rendezvous of ``init_process_group``, a
    group's bookkeeping) says so: the key is not the program's.
    """
    rest = ", ".join(f"{k}={v:.9g}" if k == "start" and isinstance(v, float) else f"{k}={v!r}"
                     for k, v in op.items() if k != "op" and not (timeless and k == "start"))
    name = str(op.get("op", "?"))
    keys = op.get("key", op.get("keys"))
    first = keys[0] if isinstance(keys, (list, tuple)) and keys else keys
    own = " [aiodist's own key: the rendezvous or a group's bookkeeping]" if (
        name.startswith("store.") and isinstance(first, str) and first.startswith("aiodist/")) else ""
    return f"{name}({rest}){own}"


@dataclass
class Result:
    """What a run produced. ``ok`` is true when there are no failures."""

    ok: bool
    seed: int | str
    world_size: int
    virtual_time: float
    digest: str
    rank_results: list[Any]
    failures: list[Failure]
    trace: list[TraceEvent] = field(repr=False)
    steps: int = 0
    messages: int = 0
    crashed: list[int] = field(default_factory=list)
    returned: dict[int, float] = field(default_factory=dict)
    """Ranks whose process ended without error (main returned, ``sys.exit(0)``, ``os._exit(0)``), and when
    (virtual time; a restarted rank's last)."""
    restarts: dict[int, int] = field(default_factory=dict)
    unhandled: list[str] = field(default_factory=list)
    faults: list[Any] = field(default_factory=list)
    """Every fault of the run, ``Chaos`` and ``Swarm`` expanded into the concrete faults they drew."""
    explored: list[Any] = field(default_factory=list)
    """The timing perturbations exploration applied, as concrete faults (see :mod:`sim.explore`)."""
    timing: TimingPlan | None = None
    """What exploration drew for this seed (None: ``explore=False``)."""
    ops: dict[int, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    """Per rank, its last operations from aiodist's flight recorder (start/end virtual times)."""

    def summary(self) -> str:
        head = (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} — {self.world_size} ranks, "
                f"virtual time {self.virtual_time:.6f}s, {self.messages} messages, digest {self.digest}")
        lines = [head]
        if self.faults:
            lines.append("  faults: " + "; ".join(f.to_cli().lstrip("-") for f in self.faults))
        if self.timing is not None:
            lines.append(f"  explored: {self.timing.describe()}"
                         + "".join(f"; {f.to_cli().lstrip('-')}" for f in self.explored))
        early = self._returned_early()
        if early:
            times = sorted({self.returned[r] for r in early})
            when = f"t={times[0]:.6f}s" if len(times) == 1 else f"t={times[0]:.6f}-{times[-1]:.6f}s"
            who = f"rank {early[0]}" if len(early) == 1 else f"ranks {_ranks_text(early)}"
            lines.append(f"  {who} ended without error (returned from main, or exited with code 0) at {when}, "
                         "before the first failure (the others still ran)")
        if len(self.failures) <= Failure.MAX_RANK_LINES:
            lines += [str(f) for f in self.failures]
        else:  # a big run: failures that differ only in numbers (ranks, times) share one entry
            groups: dict[tuple[str, str], list[Failure]] = {}
            for f in self.failures:
                groups.setdefault((f.kind, _shape(f.message)), []).append(f)
            for members in groups.values():
                lines.append(str(members[0]))
                others = [f.rank for f in members[1:] if f.rank is not None]
                if len(members) > 1:
                    who = f" (ranks {_ranks_text(others)})" if others else ""
                    lines.append(f"    ... and {len(members) - 1} more like it{who}")
        if self.unhandled:
            lines.append(f"  {len(self.unhandled)} error(s) were only logged (handler tasks, unretrieved task errors):")
            lines += [f"    {u}" for u in self.unhandled[:5]]
        return "\n".join(lines)

    def _returned_early(self) -> list[int]:
        """Ranks that returned before the first failure, when that failure came while other ranks still ran."""
        if not self.failures:
            return []
        first = min(f.time for f in self.failures)
        return [r for r, t in self.returned.items() if t < first]

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())
