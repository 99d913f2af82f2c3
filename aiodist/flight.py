"""Flight recorder output: dump a rank's record on failure, merge ranks' records.

Each rank keeps its last operations (:mod:`aiodist.inflight`). When an
operation fails or times out, :func:`dump` writes them (with what is still in
flight) to ``$AIODIST_FLIGHT_RECORDER_DIR/rank<R>.json`` when that variable is
set, and logs one summary line either way. A launched rank whose own
exception ended it writes its record too (with ``outcome``: the exception's
type, message and line; :mod:`aiodist.launch.outcome`). ``aiodist trace DIR``
reads those files back, names the rank whose own error started the failure
and says which ranks are stuck where (:func:`report`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import inflight
from .context import getenv

log = logging.getLogger("aiodist.flight")


def describe_entry(entry: dict[str, Any]) -> str:
    """One in-flight or recorded operation: ``recv group=world src=0 tag=0``."""
    parts = [str(entry.get("op", "?"))]
    for k in ("group", "seq", "peer", "peers", "key", "src", "dst", "tag"):
        if k in entry and entry[k] is not None:
            parts.append(f"{k}={entry[k]}")
    return " ".join(parts)


def dump(
    reason: str, *, rank: int | None = None, world_size: int | None = None, outcome: dict[str, Any] | None = None
) -> Path | None:
    """Record the calling rank's flight data after a failure; return the file written, if any.

    ``outcome``: how the rank itself ended (an own exception: ``{"kind": "raised", "type": ..., ...}``).
    """
    if rank is None:
        r = getenv("RANK")
        rank = int(r) if r is not None and r.isdigit() else None
    stuck = inflight.snapshot()
    log.warning(  # (said before the program had a chance to handle the error: a note, not the rank's end)
        "rank %s: flight recorder, a first failure (the program may handle it): %s; in flight: %s",
        "?" if rank is None else rank,
        reason,
        "; ".join(describe_entry(e) for e in stuck) or "nothing",
    )
    directory = getenv("AIODIST_FLIGHT_RECORDER_DIR")
    if not directory:
        return None
    record = {
        "rank": rank,
        "world_size": world_size,
        "reason": reason,
        **({"outcome": outcome} if outcome else {}),
        "inflight": stuck,
        "recent": inflight.recent(),
    }
    path = Path(directory) / f"rank{'unknown' if rank is None else rank}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, default=repr))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write flight record %s: %s", path, e)
        return None
    return path


def load(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read every ``rank*.json`` record in ``directory``, ordered by rank."""
    records = []
    for p in sorted(Path(directory).glob("rank*.json")):
        try:
            records.append(json.loads(p.read_text()))
        except (OSError, ValueError) as e:
            records.append({"rank": None, "reason": f"unreadable record {p.name}: {e}", "inflight": [], "recent": []})

    def key(r: dict[str, Any]) -> tuple[int, int]:
        rank = r.get("rank")
        return (0, rank) if isinstance(rank, int) else (1, 0)

    return sorted(records, key=key)


def report(records: Sequence[dict[str, Any]]) -> str:
    """A merged, human-readable account of where each rank is stuck.

    For every group, the ranks whose furthest-started collective lags behind
    the others are named: they are the likely culprits.
    """
    lines: list[str] = []
    cause = _root_cause(records)
    if cause:
        lines.append(f"root cause: {cause}")
    furthest: dict[str, dict[int, int]] = {}
    for rec in records:
        rank = rec.get("rank")
        lines.append(f"rank {rank}: {rec.get('reason', '')}")
        for e in rec.get("inflight", []):
            lines.append(f"    waiting in {describe_entry(e)} (since t={e.get('start', 0):.3f})")
        if not rec.get("inflight"):
            done = [e for e in rec.get("recent", []) if e.get("state") == "done"]
            last = describe_entry(done[-1]) if done else "nothing"
            lines.append(f"    nothing in flight; last completed: {last}")
        if isinstance(rank, int):
            for e in rec.get("recent", []):
                seq = e.get("seq")
                if isinstance(seq, int):
                    g = str(e.get("group", "world"))
                    per_rank = furthest.setdefault(g, {})
                    per_rank[rank] = max(per_rank.get(rank, -1), seq)
    for g, per_rank in sorted(furthest.items()):
        top = max(per_rank.values())
        behind = sorted(r for r, s in per_rank.items() if s < top)
        if behind:
            detail = ", ".join(f"rank {r} at seq {per_rank[r]}" for r in behind)
            lines.append(f"group {g}: others reached seq {top}; behind: {detail}")
    return "\n".join(lines)


def _root_cause(records: Sequence[dict[str, Any]]) -> str | None:
    """The rank whose own exception started the failure (the earliest), else the rank the others lost."""
    own = [r for r in records if isinstance(r.get("outcome"), dict) and isinstance(r.get("rank"), int)]
    if own:
        first = min(own, key=lambda r: (r["outcome"].get("time", 0), r["rank"]))
        return f"rank {first['rank']} {first['reason']}"
    blamed: dict[int, int] = {}
    for rec in records:
        reason = str(rec.get("reason", ""))
        if reason.startswith("PeerFailureError"):
            _, _, rest = reason.partition(": rank ")
            head = rest.split(" ", 1)[0]
            if head.isdigit():
                blamed[int(head)] = blamed.get(int(head), 0) + 1
    if blamed:
        r = max(sorted(blamed), key=lambda k: blamed[k])
        return f"rank {r} (the others lost it; it left no record of its own)"
    return None


def add_cli(sub: Any) -> None:
    p = sub.add_parser("trace", help="merge flight-recorder files of a failed job into one report",
                       description="Read the rank*.json files a failed job's ranks wrote into "
                                   "AIODIST_FLIGHT_RECORDER_DIR and print one report: the rank whose own error "
                                   "started the failure, what each rank was waiting in, and which ranks lag behind.")
    p.add_argument("directory", help="the AIODIST_FLIGHT_RECORDER_DIR of the job")
    p.add_argument("--json", action="store_true", help="print the merged records as JSON")
    p.set_defaults(func=_cli_main)


def _cli_main(args: argparse.Namespace) -> int:
    records = load(args.directory)
    if not records:
        print(f"aiodist trace: no rank*.json records in {args.directory}")
        return 1
    print(json.dumps(records, indent=1) if args.json else report(records))
    return 0
