"""Find rates of the simulator on the blind programs of ``tests/sim_bugs/blind_b.py`` (issue 12, classes B).

    PYTHONPATH=. python benchmarks/sim_findrate_blind_b.py [--bug-seeds 200] [--twin-seeds 100] [NAME ...]

For each buggy program: its seeds under plain ``sim.run`` defaults (split brain: with
``faults=[sim.Swarm()]``), the first seed that failed with the bug's own symptom and how
many did, plus the same count with fixed timing (``explore=False``). For each fixed twin:
failures over its seeds under the defaults, and for split brain under
``Swarm(kinds={"partition"})`` too. Runs one seed at a time in this process and prints a
table; ``--json FILE`` also writes every failure's message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sim  # noqa: E402
from tests.sim_bugs import blind_b  # noqa: E402

CLASSES = {
    "causal_publish_eval": "causal order, 2 senders",
    "causal_read_your_writes": "causal order, 2 senders",
    "anysource_dataset": "any-source after store trips",
    "anysource_weighted_grads": "any-source after store trips",
    "timeout_step_results": "receive timeout too tight",
    "timeout_store_rpc": "receive timeout too tight",
    "barrier_gate_reused": "store barrier reused",
    "barrier_flags_reused": "store barrier reused",
    "split_brain_log_server": "split brain, one-way partition",
    "split_brain_store_state": "split brain, one-way partition",
}
SWARM_CLASSES = {"split_brain_log_server", "split_brain_store_state"}


def symptom(name: str, result: sim.Result) -> bool:
    """The bug's own failure: the program's AssertionError (barrier_flags: also the barrier's store timeout)."""
    for f in result.failures:
        if f.kind != "exception":
            continue
        if f.message.startswith("AssertionError"):
            return True
        if name == "barrier_flags_reused" and f.message.startswith("StoreTimeoutError") and "ready/" in f.message:
            return True
    return False


def sweep(prog: Callable[[], Any], world: int, seeds: range, **kw: Any) -> list[sim.Result]:
    return [sim.run(prog, world_size=world, seed=s, trace=False, **kw) for s in seeds]


def describe(result: sim.Result) -> str:
    f = result.failures[0]
    return f"{f.kind} rank {f.rank}: {f.message.splitlines()[0][:200]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(blind_b.PROGRAMS))
    ap.add_argument("--bug-seeds", type=int, default=200)
    ap.add_argument("--twin-seeds", type=int, default=100)
    ap.add_argument("--no-fixed-timing", action="store_true", help="skip the explore=False column")
    ap.add_argument("--json", help="write every failure here")
    args = ap.parse_args()
    rows, detail = [], {}
    for name in args.names:
        world = blind_b.PROGRAMS[name]
        bug, twin = getattr(blind_b, name), getattr(blind_b, name + "_fixed")
        swarm = name in SWARM_CLASSES
        bug_kw: dict[str, Any] = {"faults": [sim.Swarm()]} if swarm else {}
        t0 = time.time()
        bug_runs = sweep(bug, world, range(args.bug_seeds), **bug_kw)
        hits: list[int] = [int(r.seed) for r in bug_runs if symptom(name, r)]
        other = Counter(describe(r).split(":")[0] + ":" + describe(r).split(":")[1][:40] for r in bug_runs if not r.ok and r.seed not in hits)
        fixed_timing = "-"
        if not args.no_fixed_timing:
            ft = sweep(bug, world, range(args.bug_seeds), explore=False, **bug_kw)
            fixed_timing = str(sum(symptom(name, r) for r in ft))
        defaults_hits = "-"
        if swarm:  # also: does plain exploration (pauses) trigger it?
            dr = sweep(bug, world, range(args.bug_seeds))
            defaults_hits = str(sum(symptom(name, r) for r in dr))
        twin_runs = sweep(twin, world, range(args.twin_seeds))
        twin_fail = [r for r in twin_runs if not r.ok]
        twin_swarm = "-"
        twin_swarm_fail: list[sim.Result] = []
        if swarm:
            twin_swarm_fail = [r for r in sweep(twin, world, range(args.twin_seeds), faults=[sim.Swarm(kinds=frozenset({"partition"}))]) if not r.ok]
            twin_swarm = str(len(twin_swarm_fail))
        wall = time.time() - t0
        rows.append((name, CLASSES[name], world, "Swarm()" if swarm else "defaults", str(hits[0]) if hits else "none",
                     len(hits), fixed_timing, defaults_hits, len(twin_fail), twin_swarm, f"{wall:.0f}s"))
        detail[name] = {
            "hits": hits,
            "first_hit": describe(bug_runs[hits[0]]) if hits else None,
            "other_failures": dict(other),
            "twin_failures": {r.seed: describe(r) for r in twin_fail},
            "twin_swarm_failures": {r.seed: describe(r) for r in twin_swarm_fail},
        }
        print(" | ".join(str(c) for c in rows[-1]), flush=True)
        for r in (twin_fail + twin_swarm_fail)[:3]:
            print("   twin failure:", r.seed, describe(r), flush=True)
        if other:
            print("   other failures of the buggy program:", dict(other), flush=True)
    print()
    print("| program | class | n | found by | first failing seed | failing (of %d) | fixed timing | split brain under defaults | twin fails (of %d) | twin under Swarm(partition) | wall |"
          % (args.bug_seeds, args.twin_seeds))
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(detail, indent=1))


if __name__ == "__main__":
    main()
