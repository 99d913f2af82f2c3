"""Simulator benchmarks: scale (wall time, deliveries per second) and fidelity (vs alpha-beta costs).

    PYTHONPATH=. python benchmarks/sim_bench.py scale --sizes 64,256,1024
    PYTHONPATH=. python benchmarks/sim_bench.py scale --sizes 256 --profile   # + time in sim/ vs aiodist/
    PYTHONPATH=. python benchmarks/sim_bench.py fidelity
    PYTHONPATH=. python benchmarks/sim_bench.py kernel        # the simulator alone: seam ping-pong
    PYTHONPATH=. python benchmarks/sim_bench.py ratio --ranks 1024 --repeat 3   # scale / kernel, same run
    PYTHONPATH=. python benchmarks/sim_bench.py ratio --ranks 1024 --repeat 5 --vs /work/base   # side by side
    PYTHONPATH=. python benchmarks/sim_bench.py ceiling --sizes 64,256,1024  # kernel and full stack per world size
    PYTHONPATH=. python benchmarks/sim_bench.py sweep -n 8 --seeds 20 --vs /work/base   # seeds per second (--vs DIR ...)
    PYTHONPATH=. python benchmarks/sim_bench.py explore -n 8 --seeds 30       # exploration's cost per seed

ratio: the full stack's deliveries per CPU second at ``--ranks`` (scale) over
the kernel's, both measured in this process, alternating, medians of
``--repeat`` (a ratio, because the machine's speed drifts). With ``--vs DIR
...`` each run is a fresh interpreter per checkout (``PYTHONPATH``), the
checkouts in turn, and the medians are printed side by side.

sweep: ``python -m sim run -n N PROGRAM --seeds 0:S -q`` in fresh
interpreters (startup, imports and the program's load included), seeds per
wall and per CPU second, medians of ``--repeat``; with ``--vs DIR`` the same
command with ``PYTHONPATH=DIR`` (another checkout) alternates with this one
and the ratio is printed.

scale: rendezvous + 10 all_reduce of 1024 float32 per rank, the production
aiodist code on ``world_size`` virtual ranks; reports wall and CPU seconds,
simulated message deliveries and deliveries per wall second (compare CPU
seconds on a shared machine: wall time there depends on the neighbours).

fidelity: on an ideal alpha-beta network (constant latency alpha, bandwidth
1/beta, no CPU overhead, no NIC contention) each collective is timed in
virtual time, all ranks starting at the same instant after a warm-up call
(which opens the connections), and compared with
``aiodist.collectives.alpha_beta_cost`` for the algorithm aiodist picks at
that size (gamma = 0: the simulator charges nothing for reducing).

kernel: N/2 pairs ping-pong frames over the raw network seam, so the number
is the simulator's own ceiling, without the collective stack on top.

scale, kernel and fidelity run with fixed timing (``explore=False``): they
measure the simulator, not what a seed's exploration draws. explore: the
same program and seeds with exploration on and off, alternating in this
process: CPU seconds per seed (medians over the seeds' runs) and the ratio.

The wall clock is read here (benchmarks/), never inside sim/ or aiodist/.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import sys
import time
from typing import Any

import numpy as np

from pathlib import Path

import sim
from aiodist import api

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import sim_pingpong  # noqa: E402  (the seam ping-pong program)

# Fixed timing where the simulator under test has exploration (an older checkout, compared with
# ``--vs``, may not: its timing is fixed anyway).
FIXED: dict[str, Any] = {"explore": False} if "explore" in inspect.signature(sim.run).parameters else {}

# --------------------------------------------------------------------------- scale


async def rendezvous_and_allreduce() -> float:
    await api.init_process_group(timeout=600)
    x = np.ones(1024, dtype=np.float32)
    for _ in range(10):
        await api.all_reduce(x)
    await api.destroy_process_group()
    return float(x[0])


def time_split(profile: Any) -> dict[str, float]:
    """Share of profiled time (self time per function) in sim/, aiodist/ and everything else.

    "other" is mostly asyncio's C core (Task steps, futures, contexts) and
    builtins, which both sides call. cProfile inflates small functions, so
    read the shares as a guide; a sampling profiler (py-spy) confirms them.
    """
    import pstats

    acc = {"sim": 0.0, "aiodist": 0.0, "other": 0.0}
    for (filename, _, _), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        key = "sim" if "/sim/" in filename else "aiodist" if "/aiodist/" in filename else "other"
        acc[key] += tottime
    total = sum(acc.values()) or 1.0
    return {k: round(100 * v / total, 1) for k, v in acc.items()}


def bench_scale(sizes: list[int], schedule: str, profile: bool = False) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        c0 = time.process_time()
        res = sim.run(rendezvous_and_allreduce, world_size=n, seed=1, trace=False, schedule=schedule,
                      time_limit=36000, **FIXED)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        ok = res.ok and all(v == float(n) ** 10 for v in res.rank_results)
        row: dict[str, Any] = {"ranks": n, "ok": ok, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "deliveries": res.messages,
               "deliveries_per_s": round(res.messages / wall), "deliveries_per_cpu_s": round(res.messages / cpu),
               "loop_steps": res.steps,
               "virtual_s": round(res.virtual_time, 6)}
        if prof is not None:
            prof.disable()
            row["profile_split_pct"] = time_split(prof)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- kernel


PINGS = 2000


def bench_kernel(world_size: int, pings: int = PINGS) -> dict[str, Any]:
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = sim.run(sim_pingpong.main, world_size=world_size, seed=1, trace=False, schedule="fifo", args=(pings,),
                  **FIXED)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    row = {"kernel_ranks": world_size, "ok": res.ok, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
           "deliveries": res.messages, "deliveries_per_s": round(res.messages / wall),
           "deliveries_per_cpu_s": round(res.messages / cpu)}
    print(json.dumps(row), flush=True)
    return row


def bench_ratio(ranks: int, repeat: int) -> float:
    """Full stack at ``ranks`` vs the bare kernel, alternating in this process: the ratio of median rates."""
    import statistics

    kernel: list[float] = []
    scale: list[float] = []
    for _ in range(repeat):
        kernel.append(bench_kernel(64)["deliveries_per_cpu_s"])
        scale.append(bench_scale([ranks], "random")[0]["deliveries_per_cpu_s"])
    k, f = statistics.median(kernel), statistics.median(scale)
    print(f"kernel {k:.0f} deliveries/CPU s, full stack at {ranks} ranks {f:.0f} deliveries/CPU s (medians of "
          f"{repeat}): ratio {f / k:.3f} = 1/{k / f:.1f}")
    return f / k


def bench_ceiling(sizes: list[int], repeat: int) -> None:
    """The kernel and the full stack at each world size, alternating: how both scale with the world.

    The kernel runs at least 1000 pings per pair (``PINGS`` at 64 ranks), so that its steady
    state, not its start-up, sets its rate: a drop in that rate at a bigger world is the cost of
    the world's size alone (more state, touched cold, per delivery), with no runtime on top.
    Medians of ``repeat``.
    """
    import statistics

    kernel: dict[int, list[float]] = {n: [] for n in sizes}
    full: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeat):
        for n in sizes:
            kernel[n].append(bench_kernel(n, max(1000, PINGS * 64 // n))["deliveries_per_cpu_s"])
            full[n].append(bench_scale([n], "random")[0]["deliveries_per_cpu_s"])
    k = {n: statistics.median(kernel[n]) for n in sizes}
    f = {n: statistics.median(full[n]) for n in sizes}
    base = k[sizes[0]]
    print(f"{'ranks':>6} {'kernel/CPU s':>13} {'full/CPU s':>11} {'full/kernel (same size)':>24} "
          f"{f'full/kernel ({sizes[0]})':>19} {f'kernel/kernel ({sizes[0]})':>21}")
    for n in sizes:
        print(f"{n:>6} {k[n]:>13.0f} {f[n]:>11.0f} {f'1/{k[n] / f[n]:.1f}':>24} {f'1/{base / f[n]:.1f}':>19} "
              f"{k[n] / base:>21.2f}")
    print(f"(medians of {repeat}; the issue's ratio is the full stack at 1024 over the kernel at 64)")


def _ratio_once(pythonpath: str, ranks: int) -> tuple[float, float, float]:
    """One kernel + scale pair in a fresh interpreter on checkout ``pythonpath``: (kernel rate, full rate, full CPU s)."""
    import os
    import subprocess

    env = dict(os.environ, PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, __file__, "ratio", "--ranks", str(ranks), "--repeat", "1"], env=env,
                          capture_output=True, text=True, timeout=3600)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(rows) != 2:
        raise SystemExit(f"ratio run failed under {pythonpath}:\n{proc.stdout}{proc.stderr}")
    kernel, full = rows
    if not full["ok"]:
        raise SystemExit(f"the full-stack run failed under {pythonpath}: {full}")
    return kernel["deliveries_per_cpu_s"], full["deliveries_per_cpu_s"], full["cpu_s"]


def bench_ratio_vs(ranks: int, repeat: int, others: list[str]) -> None:
    """``ratio`` on this checkout and on ``others`` (PYTHONPATH), one process each, in turn: medians side by side."""
    import statistics

    here = str(Path(__file__).resolve().parent.parent)
    sides = [here] + [str(Path(o).resolve()) for o in others]
    runs: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
    for i in range(repeat):
        for side in (sides if i % 2 == 0 else list(reversed(sides))):
            runs[side].append(_ratio_once(side, ranks))
    print(f"{'checkout':<34} {'kernel/CPU s':>13} {'full/CPU s':>11} {'full CPU s':>11} {'ratio':>8}")
    medians = {}
    for side in sides:
        k = statistics.median(r[0] for r in runs[side])
        f = statistics.median(r[1] for r in runs[side])
        c = statistics.median(r[2] for r in runs[side])
        ratio = statistics.median(r[1] / r[0] for r in runs[side])
        medians[side] = (k, f, c, ratio)
        print(f"{side:<34} {k:>13.0f} {f:>11.0f} {c:>11.2f} {ratio:>8.3f}  (= 1/{1 / ratio:.1f})")
    for side in sides[1:]:
        print(f"this vs {side}: full stack {medians[here][1] / medians[side][1]:.2f}x deliveries per CPU s, "
              f"ratio {medians[here][3] / medians[side][3]:.2f}x (medians of {repeat}, {ranks} ranks)")


# --------------------------------------------------------------------------- sweep throughput


def _sweep_once(pythonpath: str, program: str, n: int, seeds: int) -> tuple[float, float]:
    import os
    import resource
    import subprocess

    env = dict(os.environ, PYTHONPATH=pythonpath)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim", "run", "-n", str(n), program, "--seeds", f"0:{seeds}", "-q"],
                          env=env, cwd=pythonpath, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed under {pythonpath}:\n{proc.stdout}{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def bench_sweep(program: str, n: int, seeds: int, repeat: int, vs: list[str]) -> None:
    import statistics

    here = str(Path(__file__).resolve().parent.parent)
    sides = [("this", here)] + [(f"vs{i}", str(Path(v).resolve())) for i, v in enumerate(vs, 1)]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in sides}
    for _ in range(repeat):
        for name, path in (sides if _ % 2 == 0 else list(reversed(sides))):
            runs[name].append(_sweep_once(path, program, n, seeds))
    rows = {}
    for name, path in sides:
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        rows[name] = (seeds / wall, seeds / cpu)
        print(json.dumps({"side": name, "path": path, "program": program, "ranks": n, "seeds": seeds,
                          "runs": repeat, "seeds_per_wall_s": round(seeds / wall, 2),
                          "seeds_per_cpu_s": round(seeds / cpu, 2)}), flush=True)
    for name, path in sides[1:]:
        print(f"this / {path}: {rows['this'][0] / rows[name][0]:.2f}x seeds per wall second, "
              f"{rows['this'][1] / rows[name][1]:.2f}x per CPU second (medians of {repeat})")


# --------------------------------------------------------------------------- exploration's cost


def bench_explore(program: str, n: int, seeds: int) -> float:
    """CPU seconds per seed with exploration on and off (alternating, seed by seed): the ratio of medians."""
    import statistics

    from sim.cli import load_main

    main = load_main(program)
    cost: dict[bool, list[float]] = {True: [], False: []}
    virtual: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(seeds):
        for explore in ((True, False) if seed % 2 == 0 else (False, True)):
            c0 = time.process_time()
            res = sim.run(main, world_size=n, seed=seed, trace=False, explore=explore)
            cost[explore].append(time.process_time() - c0)
            virtual[explore].append(res.virtual_time)
    on, off = statistics.median(cost[True]), statistics.median(cost[False])
    print(json.dumps({"program": program, "ranks": n, "seeds": seeds, "cpu_s_per_seed_explore": round(on, 4),
                      "cpu_s_per_seed_fixed": round(off, 4), "mean_cpu_explore": round(statistics.mean(cost[True]), 4),
                      "mean_cpu_fixed": round(statistics.mean(cost[False]), 4),
                      "virtual_s_median_explore": round(statistics.median(virtual[True]), 4),
                      "virtual_s_median_fixed": round(statistics.median(virtual[False]), 4)}), flush=True)
    print(f"exploration costs {100 * (on / off - 1):+.1f}% CPU per seed (median), "
          f"{100 * (statistics.mean(cost[True]) / statistics.mean(cost[False]) - 1):+.1f}% (mean)")
    return on / off


# --------------------------------------------------------------------------- fidelity

ALPHA = 1e-4
BANDWIDTH = 1e9  # bytes/s: beta = 1 ns/byte


def _arrays(collective: str, p: int, nbytes: int, rank: int) -> tuple[Any, ...]:
    """Arguments for one call; ``nbytes`` follows cost.py's convention for each collective."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return (np.ones(max(1, nbytes // 4), dtype=np.float32),)
    if collective == "all_gather":
        per = max(1, nbytes // 4 // p)
        return ([np.zeros(per, dtype=np.float32) for _ in range(p)], np.ones(per, dtype=np.float32))
    if collective == "reduce_scatter":
        per = max(1, nbytes // 4 // p)
        return (np.zeros(per, dtype=np.float32), [np.ones(per, dtype=np.float32) for _ in range(p)])
    if collective == "all_to_all":
        per = max(1, nbytes // 4 // p)
        return ([np.zeros(per, dtype=np.float32) for _ in range(p)], [np.ones(per, dtype=np.float32) for _ in range(p)])
    return ()


def _call(collective: str, args: tuple[Any, ...]) -> Any:
    return getattr(api, collective)(*args)


async def timed_collective(collective: str, nbytes: int) -> float:
    pg = await api.init_process_group(timeout=600)
    loop = asyncio.get_running_loop()
    await _call(collective, _arrays(collective, pg.size, nbytes, pg.rank))  # warm-up: opens connections
    start = math.ceil(loop.time()) + 1.0  # everybody starts at the same virtual instant
    await asyncio.sleep(start - loop.time())
    await _call(collective, _arrays(collective, pg.size, nbytes, pg.rank))
    elapsed = loop.time() - start
    await asyncio.sleep(math.ceil(loop.time()) + 1.0 - loop.time())
    await api.destroy_process_group()
    return elapsed


FIDELITY_CASES = [
    ("all_reduce", 1024), ("all_reduce", 64 * 1024), ("all_reduce", 4 * 1024 * 1024),
    ("broadcast", 1024), ("broadcast", 4 * 1024 * 1024),
    ("all_gather", 16 * 1024), ("all_gather", 4 * 1024 * 1024),
    ("reduce_scatter", 16 * 1024), ("reduce_scatter", 4 * 1024 * 1024),
    ("all_to_all", 64 * 1024), ("all_to_all", 4 * 1024 * 1024), ("barrier", 0),
]


def bench_fidelity(world_sizes: list[int]) -> list[dict[str, Any]]:
    from aiodist.collectives import selected_cost

    rows = []
    net = sim.Network.ideal(alpha=ALPHA, bandwidth=BANDWIDTH)
    for p in world_sizes:
        for collective, nbytes in FIDELITY_CASES:
            res = sim.run(timed_collective, args=(collective, nbytes), world_size=p, seed=0, network=net, **FIXED,
                          trace=False, schedule="fifo")
            if not res.ok:
                row = {"collective": collective, "p": p, "nbytes": nbytes, "error": res.summary()[:300]}
            else:
                simulated = max(res.rank_results)
                name, model = selected_cost(collective, p, nbytes, ALPHA, 1.0 / BANDWIDTH, 0.0)
                err = (simulated - model) / model if model else 0.0
                row = {"collective": collective, "algorithm": name, "p": p, "nbytes": nbytes,
                       "simulated_s": round(simulated, 7), "model_s": round(model, 7),
                       "rel_error": round(err, 4), "within_1pct": abs(err) <= 0.01}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--sizes", default="64,256,1024,4096")
    s.add_argument("--schedule", default="random", choices=("fifo", "random", "pct"))
    s.add_argument("--profile", action="store_true", help="cProfile each run: share of time in sim/ vs aiodist/")
    k = sub.add_parser("kernel")
    k.add_argument("--ranks", type=int, default=64)
    f = sub.add_parser("fidelity")
    f.add_argument("--world-sizes", default="4,8,16")
    r = sub.add_parser("ratio")
    r.add_argument("--ranks", type=int, default=1024)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--vs", nargs="*", default=None, help="other checkouts (PYTHONPATH): one process per run, in turn")
    c = sub.add_parser("ceiling")
    c.add_argument("--sizes", default="64,256,1024")
    c.add_argument("--repeat", type=int, default=3)
    w = sub.add_parser("sweep")
    w.add_argument("--program", default="examples/train_dp.py")
    w.add_argument("-n", type=int, default=8)
    w.add_argument("--seeds", type=int, default=20)
    w.add_argument("--repeat", type=int, default=3)
    w.add_argument("--vs", nargs="*", default=[], help="other checkouts to compare with (PYTHONPATH)")
    e = sub.add_parser("explore")
    e.add_argument("--program", default="examples/train_dp.py")
    e.add_argument("-n", type=int, default=8)
    e.add_argument("--seeds", type=int, default=30)
    ns = parser.parse_args(argv)
    if ns.what == "scale":
        rows = bench_scale([int(x) for x in ns.sizes.split(",")], ns.schedule, ns.profile)
        kernel = bench_kernel(64)
        for row in rows:
            print(f"{row['ranks']} ranks: {row['deliveries_per_cpu_s']} deliveries/CPU s = 1/"
                  f"{kernel['deliveries_per_cpu_s'] / row['deliveries_per_cpu_s']:.1f} of the kernel's "
                  f"{kernel['deliveries_per_cpu_s']} (one run each; `ratio` for medians)")
    elif ns.what == "kernel":
        bench_kernel(ns.ranks)
    elif ns.what == "ratio" and ns.vs is not None:
        bench_ratio_vs(ns.ranks, ns.repeat, ns.vs)
    elif ns.what == "ratio":
        bench_ratio(ns.ranks, ns.repeat)
    elif ns.what == "ceiling":
        bench_ceiling([int(x) for x in ns.sizes.split(",")], ns.repeat)
    elif ns.what == "sweep":
        bench_sweep(ns.program, ns.n, ns.seeds, ns.repeat, ns.vs)
    elif ns.what == "explore":
        bench_explore(ns.program, ns.n, ns.seeds)
    else:
        rows = bench_fidelity([int(x) for x in ns.world_sizes.split(",")])
        good = sum(1 for r in rows if r.get("within_1pct"))
        print(f"{good} of {len(rows)} cases within 1% of the closed-form cost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
