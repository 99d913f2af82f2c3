"""What ordering collectives in flight on shared memory costs: many all_reduces issued at once, then awaited.

Four virtual ranks (the simulator, fixed timing) each issue ``--ops`` all_reduces
at once, then await them all: on the columns of one matrix (``m[:, j]``: strided
views whose spans all cover the whole matrix), on contiguous slices of one array
(``flat[j*k:(j+1)*k]``), and on as many separate arrays (nothing to order).
Reported: CPU seconds per run and per call (medians of ``--repeat``). With
``--vs DIR ...`` each case also runs with ``PYTHONPATH=DIR`` (another checkout),
in turn, in fresh interpreters, and the medians are printed side by side.

    PYTHONPATH=. python benchmarks/order_bench.py --ops 2000 --repeat 3 --vs /work/base

The wall clock and the CPU clock are read here (benchmarks/), never inside aiodist/ or sim/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

CASES = ("columns", "slices", "separate")
ROWS = 16  # elements per column (each all_reduce's size)


def program(case: str, ops: int) -> Any:
    import numpy as np

    from aiodist import api

    async def main() -> float:
        await api.init_process_group()
        if case == "columns":
            m = np.ones((ROWS, ops), np.float32)
            arrays = [m[:, j] for j in range(ops)]
        elif case == "slices":
            flat = np.ones(ROWS * ops, np.float32)
            arrays = [flat[j * ROWS:(j + 1) * ROWS] for j in range(ops)]
        else:
            arrays = [np.ones(ROWS, np.float32) for _ in range(ops)]
        works = [api.all_reduce(a) for a in arrays]  # (a Work each: all in flight at once)
        for w in works:
            await w
        await api.destroy_process_group()
        return float(sum(float(a[0]) for a in arrays))

    return main


def once(case: str, ops: int) -> float:
    """CPU seconds of one simulated run (4 ranks)."""
    import sim

    c0 = time.process_time()
    res = sim.run(program(case, ops), world_size=4, seed=1, trace=False, explore=False, time_limit=3600)
    cpu = time.process_time() - c0
    if not res.ok or any(v != 4.0 * ops for v in res.rank_results):
        raise SystemExit(f"{case}: the run failed or gave wrong sums: {res}")
    return cpu


def _in(pythonpath: str, case: str, ops: int) -> float:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, __file__, "--once", case, "--ops", str(ops)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"run failed under {pythonpath}:\n{proc.stdout}{proc.stderr}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["cpu_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vs", nargs="*", default=None, metavar="DIR", help="other checkouts, side by side")
    ap.add_argument("--once", choices=CASES, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.once:
        print(json.dumps({"case": ns.once, "cpu_s": once(ns.once, ns.ops)}))
        return 0
    here = os.environ.get("PYTHONPATH", ".") or "."
    sides = [here, *(ns.vs or [])]
    runs: dict[tuple[str, str], list[float]] = {(s, c): [] for s in sides for c in CASES}
    for _ in range(ns.repeat):
        for case in CASES:
            for side in sides:
                runs[side, case].append(_in(side, case, ns.ops))
    print(f"{ns.ops} all_reduces of {ROWS} float32 in flight on each of 4 simulated ranks, then awaited "
          f"(CPU s per run, medians of {ns.repeat}; per call: / {4 * ns.ops})")
    print(f"{'checkout':<28}" + "".join(f"{c:>22}" for c in CASES))
    for side in sides:
        cells = []
        for case in CASES:
            m = statistics.median(runs[side, case])
            cells.append(f"{m:8.2f} s {1e6 * m / (4 * ns.ops):7.0f} us")
        print(f"{side:<28}" + "".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
