"""Find rates of a module of bug programs with fixed twins, the way issue 12 checks them.

    PYTHONPATH=. python benchmarks/sim_blind_findrate.py tests.sim_bugs.blind_a [NAME ...]
    PYTHONPATH=. python benchmarks/sim_blind_findrate.py tests.sim_bugs.blind_a --no-explore

The module lists its programs: ``PROGRAMS`` (buggy name -> class), ``WORLD``
(name -> world size), ``SYMPTOM`` (name -> text in the failure's message when
it is the program's own bug) and ``SWARM_KINDS`` (names found only with
destructive faults -> the swarm kinds their twins tolerate); the twin of
``name`` is ``name_fixed``.

Per program, in this process, one seed after the other: the buggy one over
seeds 0..199 under ``sim.run`` defaults (``faults=[sim.Swarm()]`` for the
``SWARM_KINDS`` ones), counting the failures with its own symptom apart
from the others; the twin over seeds 0..99 under the defaults and, for the
``SWARM_KINDS`` ones, under ``sim.Swarm(kinds=...)``. ``--no-explore`` runs
the buggy programs with fixed timing instead (twins skipped).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections import Counter
from types import ModuleType
from typing import Any

import sim


def _first_line(result: sim.Result) -> str:
    f = result.failures[0]
    return f"{f.kind}: {f.message.splitlines()[0][:150]} @ {f.location}"


def _sweep(mod: ModuleType, name: str, suffix: str, seeds: range, **run: Any) -> tuple[list[int], Counter[str], float]:
    """Seeds failing with ``name``'s own symptom, the other failures by first line, wall seconds."""
    program = getattr(mod, name + suffix)
    own: list[int] = []
    other: Counter[str] = Counter()
    start = time.perf_counter()
    for seed in seeds:
        result = sim.run(program, world_size=mod.WORLD[name], seed=seed, trace=False, **run)
        if result.ok:
            continue
        line = _first_line(result)
        if suffix == "" and mod.SYMPTOM[name] in line:
            own.append(seed)
        else:
            other[line] += 1
    return own, other, time.perf_counter() - start


def _print_others(other: Counter[str]) -> None:
    for line, n in other.most_common(4):
        print(f"      {n:3d} x {line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module", help="module of bug programs, e.g. tests.sim_bugs.blind_a")
    ap.add_argument("names", nargs="*", help="programs to run (default: all)")
    ap.add_argument("--no-explore", action="store_true", help="buggy programs with fixed timing; no twins")
    args = ap.parse_args()
    mod = importlib.import_module(args.module)
    print(f"{'program':18s} {'class':26s} {'n':>2s} {'found by':22s} {'first':>5s} {'own/200':>7s} {'other':>5s}  twins")
    for name in args.names or list(mod.PROGRAMS):
        kinds = mod.SWARM_KINDS.get(name)
        bug_run: dict[str, Any] = {"faults": [sim.Swarm()]} if kinds else {}
        label = "Swarm()" if kinds else "defaults"
        if args.no_explore:
            bug_run["explore"] = False
            label += ", no explore"
        own, other, wall = _sweep(mod, name, "", range(200), **bug_run)
        twins: list[str] = []
        twin_other: Counter[str] = Counter()
        if not args.no_explore:
            plans: list[tuple[str, dict[str, Any]]] = [("defaults", {})]
            if kinds:
                plans.append((f"Swarm({','.join(sorted(kinds))})", {"faults": [sim.Swarm(kinds=kinds)]}))
            for plan, run in plans:
                _, failed, twin_wall = _sweep(mod, name, "_fixed", range(100), **run)
                wall += twin_wall
                twins.append(f"{sum(failed.values())}/100 {plan}")
                twin_other += failed
        first = str(own[0]) if own else "-"
        print(f"{name:18s} {mod.PROGRAMS[name]:26s} {mod.WORLD[name]:2d} {label:22s} {first:>5s} {len(own):7d} "
              f"{sum(other.values()):5d}  {'; '.join(twins)}  ({wall:.1f} s)", flush=True)
        _print_others(other)
        if twin_other:
            print("    twin failures:")
            _print_others(twin_other)


if __name__ == "__main__":
    main()
