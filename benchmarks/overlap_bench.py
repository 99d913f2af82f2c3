"""Does communication progress while a rank computes? An 8 MB all_reduce issued before 300 ms of numpy work.

Two real processes (``aiodist.spawn``, TCP on 127.0.0.1). Each trial, on both
ranks: start ``all_reduce`` of 8 MB (float64), then run about 300 ms of numpy
work (matrix products, calibrated on this machine), then await the
all_reduce. Three ways of running the work:

* ``inline``: called in the coroutine (blocks the event loop: the rule is
  that communication then waits for the computation);
* ``compute``: ``await aiodist.compute(work)`` (a worker thread; numpy
  releases the GIL, so the loop keeps the all_reduce going);
* ``none``: no work, the all_reduce alone (what it costs by itself).

Reported per mode (medians over the trials, slowest rank of each trial):
when the all_reduce finished and when the computation finished, in ms after
the all_reduce was issued. With ``compute`` the all_reduce is done by the
time the computation is (``all_reduce done`` <= ``compute done``); inline it
finishes only after.

    python benchmarks/overlap_bench.py [--trials 7] [--mbytes 8] [--ms 300]

Wall-clock time is fine here: a harness outside the runtime, measuring processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import aiodist  # noqa: E402

MODES = ("none", "inline", "compute")


def _calibrate(ms: float) -> tuple[np.ndarray, int]:
    """A matrix and a number of products of it that take about ``ms`` milliseconds here."""
    a = np.random.default_rng(0).standard_normal((256, 256))
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < 0.05:
        a @ a
        n += 1
    per = (time.perf_counter() - t0) / n
    return a, max(1, round(ms / 1000 / per))


def _work(a: np.ndarray, n: int) -> float:
    acc = 0.0
    for _ in range(n):
        acc += float((a @ a)[0, 0])
    return acc


async def _rank(trials: int, nbytes: int, ms: float) -> dict[str, list[tuple[float, float]]]:
    await aiodist.init_process_group(timeout=120)
    a, n = _calibrate(ms)
    # the same amount of work on both ranks: rank 0's calibration
    counts = await aiodist.all_gather_object(n)
    n = int(counts[0])
    x = np.ones(nbytes // 8)
    loop = asyncio.get_running_loop()
    await aiodist.all_reduce(x)  # connections up, buffers warm
    out: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for _ in range(trials):
        for mode in MODES:
            await aiodist.barrier()
            done: list[float] = []
            t0 = loop.time()
            h = aiodist.all_reduce(x)

            async def watch() -> None:
                await h
                done.append(loop.time() - t0)

            w = asyncio.ensure_future(watch())
            if mode == "inline":
                _work(a, n)
            elif mode == "compute":
                await aiodist.compute(_work, a, n)
            t_compute = loop.time() - t0 if mode != "none" else 0.0
            await w
            out[mode].append((done[0] * 1000, t_compute * 1000))
    await aiodist.destroy_process_group()
    return out


def rank_main(trials: int, nbytes: int, ms: float) -> dict[str, list[tuple[float, float]]]:
    return aiodist.run(_rank(trials, nbytes, ms))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--mbytes", type=float, default=8.0, help="size of the all_reduce in MB (default: 8)")
    ap.add_argument("--ms", type=float, default=300.0, help="milliseconds of computation (default: 300)")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per rank: 2 ranks on this 2-core machine
    results = aiodist.spawn(rank_main, 2, args=(args.trials, int(args.mbytes * 1e6), args.ms), timeout=600)
    print(f"all_reduce of {args.mbytes:g} MB issued before ~{args.ms:g} ms of numpy work, 2 processes, "
          f"{args.trials} trials (medians of the slower rank), ms after the all_reduce was issued")
    print(f"{'mode':<10} {'all_reduce done':>16} {'compute done':>13}  overlapped")
    for mode in MODES:
        per_trial = list(zip(*(r[mode] for r in results)))
        ar = statistics.median(max(t[0] for t in trial) for trial in per_trial)
        cp = statistics.median(max(t[1] for t in trial) for trial in per_trial)
        verdict = "-" if mode == "none" else ("yes" if ar <= cp else "no")
        print(f"{mode:<10} {ar:>16.1f} {cp:>13.1f}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
