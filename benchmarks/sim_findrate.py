"""How well the simulator finds bugs by itself: find rates of the bug classes in tests/sim_bugs.

    PYTHONPATH=. python benchmarks/sim_findrate.py                 # 200 seeds per program, defaults
    PYTHONPATH=. python benchmarks/sim_findrate.py --seeds 500 --no-explore
    PYTHONPATH=. python benchmarks/sim_findrate.py --only lease,split_brain --variants
    PYTHONPATH=. python benchmarks/sim_findrate.py --blind          # the programs written from the outside

For each program: its buggy version under plain ``sim.run`` defaults (timing
classes) or ``faults=[sim.Swarm()]`` (restart and partition classes): the
first seed that fails the way the bug does (its symptom: a swarm may also
break a program in other ways, which do not count) and the share of such
seeds; its fixed twin under the defaults, and (restart and partition classes)
under a swarm of the fault kind it was fixed for: the number of seeds that
fail at all (must be 0). The table goes to stdout, one JSON row per
program as it finishes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sim  # noqa: E402
from sim_bugs import BLIND, CATALOG, VARIANTS, BugClass  # noqa: E402


def sweep(bc: BugClass, program: Any, seeds: int, faults: list[Any], explore: bool, *,
          bug_only: bool = False) -> tuple[int | None, int, str]:
    """(first failing seed, failing seeds, first failure's message) over seeds 0..seeds-1.

    ``bug_only``: count the runs that fail the way the bug does (its symptom), not any failure.
    """
    first: int | None = None
    failing = 0
    message = ""
    for seed in range(seeds):
        res = sim.run(program, world_size=bc.world_size, seed=seed, faults=faults, explore=explore, trace=False,
                      store_host=bc.store_host)
        if (bc.is_the_bug(res) if bug_only else not res.ok):
            failing += 1
            if first is None:
                first = seed
                message = res.failures[0].message.splitlines()[0][:120]
    return first, failing, message


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--twin-seeds", type=int, default=100)
    ap.add_argument("--no-explore", action="store_true", help="fixed timing (the simulator without exploration)")
    ap.add_argument("--variants", action="store_true", help="also the second programs of some classes")
    ap.add_argument("--blind", action="store_true",
                    help="only the programs of every class written without reading the others (tests/sim_bugs/blind_*)")
    ap.add_argument("--only", default="", help="comma-separated class names")
    ns = ap.parse_args(argv)
    classes = BLIND if ns.blind else CATALOG + (VARIANTS if ns.variants else [])
    if ns.only:
        wanted = set(ns.only.split(","))
        classes = [c for c in classes if c.name in wanted or c.name.split("/")[0] in wanted]
    explore = not ns.no_explore
    rows = []
    for bc in classes:
        t0 = time.perf_counter()
        faults: list[Any] = [sim.Swarm()] if bc.swarm else []
        first, failing, message = sweep(bc, bc.buggy, ns.seeds, faults, explore, bug_only=True)
        twin_first, twin_failing, twin_message = sweep(bc, bc.fixed, ns.twin_seeds, [], explore)
        row: dict[str, Any] = {"class": bc.name, "mode": "swarm" if bc.swarm else "defaults",
                               "first_find": first, "found": f"{failing}/{ns.seeds}",
                               "twin_fails": f"{twin_failing}/{ns.twin_seeds}", "first_message": message}
        if twin_first is not None:
            row["twin_message"] = f"seed {twin_first}: {twin_message}"
        if bc.swarm:
            kinds = sorted(bc.swarm)
            tf, tfail, tmsg = sweep(bc, bc.fixed, ns.twin_seeds, [sim.Swarm(kinds=set(kinds))], explore)
            row["twin_fails_swarm_" + "+".join(kinds)] = f"{tfail}/{ns.twin_seeds}"
            if tf is not None:
                row["twin_swarm_message"] = f"seed {tf}: {tmsg}"
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print()
    print(f"{'class':28s} {'mode':8s} {'first find':>10s} {'found':>9s} {'twin fails':>10s}")
    for r in rows:
        first = "-" if r["first_find"] is None else str(r["first_find"])
        print(f"{r['class']:28s} {r['mode']:8s} {first:>10s} {r['found']:>9s} {r['twin_fails']:>10s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
