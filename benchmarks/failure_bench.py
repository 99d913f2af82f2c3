"""How fast does each survivor learn that a peer died or hung, and is it named?

For each backend (aiodist; torch.distributed with gloo when torch imports), for
each fault (SIGKILL, SIGSTOP of the last rank), over several trials: start W
ranks (real processes, 127.0.0.1) that run small all_reduce in a loop, inject
the fault once every rank is looping, and record on each survivor the time
from the fault to the error and whether the error names the faulty rank.
A survivor that has not raised after --cap seconds counts as hung.

    python benchmarks/failure_bench.py [--trials 10] [--world 4] [--cap 10] [--torch-python PY]

Also: a collective mismatch (one rank calls broadcast where the others call
all_reduce): time from the wrong call to the error on every rank; and the
cost of mismatch checking on small all_reduce (aiodist with its checks on
and off, alternating blocks in the same processes; gloo plain and with
TORCH_DISTRIBUTED_DEBUG=DETAIL, its mismatch-checking mode).

Prints a table of medians. Wall-clock time is fine here: this is a harness
outside the runtime, comparing processes on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # the real-process harness, shared with the tests
from rank_procs import RankProcs, emit, free_port  # noqa: E402


# ----------------------------------------------------------------- workers


MISMATCH_AT = 300  # iteration at which rank MISMATCH_RANK calls broadcast instead of all_reduce
MISMATCH_RANK = 1


def worker_aiodist(scenario: str) -> None:
    import numpy as np

    import aiodist
    from aiodist.eventloop import run

    async def main() -> None:
        pg = await aiodist.init_process_group(timeout=60.0)
        if scenario == "overhead":
            await overhead_aiodist(pg)
            return
        if scenario == "bandwidth":
            await bandwidth_aiodist(pg)
            return
        x = np.ones(4, dtype=np.float32)
        i = 0
        try:
            while True:
                if scenario == "mismatch" and i == MISMATCH_AT and pg.rank == MISMATCH_RANK:
                    emit("fault")
                    await aiodist.broadcast(x, src=0)
                else:
                    await aiodist.all_reduce(x)
                i += 1
                if i == 50:
                    emit("ready")
        except Exception as e:  # noqa: BLE001 - we report whatever it is
            emit("error", type=type(e).__name__, msg=str(e)[:300], rank=getattr(e, "rank", None))
            os._exit(0)

    run(main())


async def bandwidth_aiodist(pg: object) -> None:
    """Large all_reduce (4 Mi float32 = 16 MiB): seconds per call, median of BANDWIDTH_REPS."""
    import numpy as np

    import aiodist

    x = np.ones(1 << 22, dtype=np.float32)
    loop = __import__("asyncio").get_running_loop()
    await pg.all_reduce(x)  # type: ignore[attr-defined]
    times = []
    for _ in range(BANDWIDTH_REPS):
        await aiodist.barrier()
        t0 = loop.time()
        await pg.all_reduce(x)  # type: ignore[attr-defined]
        times.append(loop.time() - t0)
    emit("overhead", on=times, off=times)
    await aiodist.destroy_process_group()


BANDWIDTH_REPS = 10


async def overhead_aiodist(pg: object) -> None:
    """Blocks of small all_reduce, mismatch checking on and off alternately (every rank switches together)."""
    import numpy as np

    import aiodist

    x = np.ones(4, dtype=np.float32)
    sig_plain = pg.all_reduce  # type: ignore[attr-defined]
    for _ in range(200):
        await sig_plain(x)
    loop = __import__("asyncio").get_running_loop()
    times: dict[str, list[float]] = {"on": [], "off": []}
    for block in range(OVERHEAD_BLOCKS):
        mode = "on" if block % 2 == 0 else "off"
        pg.mismatch_check_after = 0.3 if mode == "on" else 0  # type: ignore[attr-defined]
        await aiodist.barrier()
        t0 = loop.time()
        for _ in range(OVERHEAD_OPS):
            await pg.all_reduce(x)  # type: ignore[attr-defined]
        times[mode].append((loop.time() - t0) / OVERHEAD_OPS)
    emit("overhead", on=times["on"], off=times["off"])
    await aiodist.destroy_process_group()


OVERHEAD_BLOCKS = 20
OVERHEAD_OPS = 300


def worker_torch(scenario: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    x = torch.ones(4)
    if scenario == "overhead":
        for _ in range(200):
            dist.all_reduce(x)
        times = []
        for _ in range(OVERHEAD_BLOCKS // 2):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(OVERHEAD_OPS):
                dist.all_reduce(x)
            times.append((time.perf_counter() - t0) / OVERHEAD_OPS)
        emit("overhead", on=times, off=times)
        dist.destroy_process_group()
        return
    i = 0
    try:
        while True:
            if scenario == "mismatch" and i == MISMATCH_AT and dist.get_rank() == MISMATCH_RANK:
                emit("fault")
                dist.broadcast(x, src=0)
            else:
                dist.all_reduce(x)
            i += 1
            if i == 50:
                emit("ready")
    except Exception as e:  # noqa: BLE001
        emit("error", type=type(e).__name__, msg=str(e)[:300], rank=None)
        os._exit(0)


# ----------------------------------------------------------------- harness


async def _start(python: str, backend: str, world: int, scenario: str,
                 extra_env: dict[str, str] | None = None) -> RankProcs:
    return await RankProcs.start([__file__, "--worker", backend, "--scenario", scenario], world, python=python,
                                 env=extra_env)


async def _overhead(python: str, backend: str, world: int, extra_env: dict[str, str] | None = None,
                    scenario: str = "overhead") -> tuple[float, float]:
    """Median seconds per small all_reduce (4 float32) over rank 0's blocks: (checks on, checks off)."""
    async with await _start(python, backend, world, scenario, extra_env) as ranks:
        if not await ranks.until(lambda: "overhead" in ranks.events[0] or 0 in ranks.ended, 300):
            raise TimeoutError(f"{backend}: no overhead report within 300 s")
        ev = ranks.events[0].get("overhead")
        if ev is None:
            raise RuntimeError(f"{backend}: no overhead report")
        await ranks.close(grace=10)
        return statistics.median(ev["on"]), statistics.median(ev["off"])


async def _overhead_inproc(world: int, rounds: int) -> tuple[float, float]:
    """Every rank a task of this process (each in its own rank context), checks on/off in alternate blocks."""
    import contextvars

    import numpy as np

    import aiodist.api as dist
    from aiodist.context import new_rank_scope, set_rank_environ

    port = free_port()
    loop = asyncio.get_running_loop()
    times: dict[str, list[float]] = {"on": [], "off": []}

    async def rank(r: int) -> None:
        pg = await dist.init_process_group(timeout=60)
        x = np.ones(4, dtype=np.float32)
        for _ in range(200):
            await pg.all_reduce(x)
        for block in range(2 * rounds):
            mode = "on" if block % 2 == 0 else "off"
            pg.mismatch_check_after = 0.3 if mode == "on" else 0
            await pg.barrier()
            t0 = loop.time()
            for _ in range(OVERHEAD_OPS):
                await pg.all_reduce(x)
            if r == 0:
                times[mode].append((loop.time() - t0) / OVERHEAD_OPS)
        await dist.destroy_process_group()

    tasks = []
    for r in range(world):
        ctx = contextvars.copy_context()
        env = {"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ctx.run(lambda env=env: (set_rank_environ(env), new_rank_scope()))
        tasks.append(loop.create_task(rank(r), context=ctx))
    await asyncio.gather(*tasks)
    return statistics.median(times["on"]), statistics.median(times["off"])


async def _trial(python: str, backend: str, world: int, fault: str, cap: float) -> list[dict]:
    victim = MISMATCH_RANK if fault == "mismatch" else world - 1
    results: list[dict] = []
    async with await _start(python, backend, world, "mismatch" if fault == "mismatch" else "loop") as ranks:
        try:
            await ranks.all_ready(60)
        except TimeoutError:
            raise RuntimeError(f"{backend}: ranks did not all start looping within 60 s") from None
        if fault == "mismatch":
            waited = list(range(world))  # every rank, the odd one too, must raise
            await ranks.until(lambda: bool(ranks.faults), 30)
            t_fault = ranks.faults[0] if ranks.faults else time.time()
        else:
            waited = [r for r in range(world) if r != victim]
            t_fault = ranks.kill(victim, signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
        await ranks.until(lambda: ranks.reported("error", waited), cap)
        events = ranks.of("error")
        for r in waited:
            ev = events.get(r)
            if ev is None:
                results.append({"rank": r, "latency": None, "named": False, "type": "hung"})
            else:
                if fault == "mismatch":
                    named = ev["type"] == "CollectiveMismatchError" and "broadcast" in ev["msg"]
                else:
                    named = ev.get("rank") == victim
                results.append({"rank": r, "latency": ev["t"] - t_fault, "named": named, "type": ev["type"],
                                "msg": ev["msg"]})
    return results


def _fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} ms" if xs else "-"


async def amain(args: argparse.Namespace) -> None:
    backends = []
    if "aiodist" in args.backends:
        backends.append(("aiodist", sys.executable))
    torch_python = args.torch_python or sys.executable
    probe = subprocess.run([torch_python, "-c", "import torch.distributed"], capture_output=True)
    if "torch" not in args.backends:
        pass
    elif probe.returncode == 0:
        backends.append(("torch", torch_python))
    else:
        print(f"(torch not importable with {torch_python}: gloo rows skipped; pass --torch-python)")
    rows = []
    for backend, python in backends:
        for fault in [f for f in args.faults.split(",") if f]:
            lat: list[float] = []
            hung = named = total = 0
            example = ""
            trials = args.trials if backend == "aiodist" or fault != "mismatch" else min(args.trials, args.hung_trials)
            for _ in range(trials):
                for res in await _trial(python, backend, args.world, fault, args.cap):
                    total += 1
                    if res["latency"] is None:
                        hung += 1
                    else:
                        lat.append(res["latency"])
                        named += bool(res["named"])
                        example = example or f"{res['type']}: {res['msg'][:70]}"
            rows.append((backend, fault, _fmt(lat), _fmt([max(lat)] if lat else []), f"{named}/{total}",
                         f"{hung}/{total}", example))
    print(f"\nfault detection, {args.world} ranks, {args.trials} trials, cap {args.cap:g}s "
          f"(victim: rank {args.world - 1}; mismatch: rank {MISMATCH_RANK} calls broadcast, the others all_reduce; "
          f"'named' = names the rank / lists both calls)")
    head = ("backend", "fault", "median", "worst", "named", "hung>cap", "error seen")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if args.overhead:
        print(f"\nsmall all_reduce (4 float32), {args.world} ranks: median time per call over "
              f"{OVERHEAD_BLOCKS // 2} blocks of {OVERHEAD_OPS} per mode, interleaved; {args.overhead} runs")
        ons, offs = [], []
        for _ in range(args.overhead):
            on, off = await _overhead(sys.executable, "aiodist", args.world)
            ons.append(on)
            offs.append(off)
        on, off = statistics.median(ons), statistics.median(offs)
        print(f"aiodist, mismatch checks on : {on * 1e6:8.1f} us")
        print(f"aiodist, mismatch checks off: {off * 1e6:8.1f} us   overhead {100 * (on / off - 1):+.1f}%")
        if any(b == "torch" for b, _ in backends):
            g, _ = await _overhead(torch_python, "torch", args.world)
            gd, _ = await _overhead(torch_python, "torch", args.world, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
            print(f"gloo                        : {g * 1e6:8.1f} us")
            print(f"gloo, TORCH_DISTRIBUTED_DEBUG=DETAIL: {gd * 1e6:8.1f} us   overhead {100 * (gd / g - 1):+.1f}%")

    if args.inproc:
        on, off = await _overhead_inproc(args.world, args.inproc)
        print(f"\nsmall all_reduce (4 float32), {args.world} ranks in ONE process over TCP loopback (no process "
              f"switching: the CPU cost shows), {args.inproc} rounds of interleaved blocks")
        print(f"aiodist, mismatch checks on : {on * 1e6:8.1f} us")
        print(f"aiodist, mismatch checks off: {off * 1e6:8.1f} us   overhead {100 * (on / off - 1):+.1f}%")
    if args.bandwidth:
        print(f"\nlarge all_reduce (16 MiB float32), {args.world} ranks, heartbeats on (default) vs off: "
              f"median of {BANDWIDTH_REPS} calls per run, {args.bandwidth} runs each, alternating")
        on_t, off_t = [], []
        for _ in range(args.bandwidth):
            on_t.append((await _overhead(sys.executable, "aiodist", args.world, None, "bandwidth"))[0])
            off_t.append((await _overhead(sys.executable, "aiodist", args.world, {"AIODIST_HEARTBEAT_TIMEOUT": "0"},
                                          "bandwidth"))[0])
        on, off = statistics.median(on_t), statistics.median(off_t)
        print(f"heartbeats on : {on * 1e3:8.1f} ms")
        print(f"heartbeats off: {off * 1e3:8.1f} ms   ratio on/off {on / off:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["aiodist", "torch"])
    ap.add_argument("--scenario", default="loop", choices=["loop", "mismatch", "overhead", "bandwidth"])
    ap.add_argument("--inproc", type=int, default=0, metavar="ROUNDS",
                    help="also measure the mismatch-check overhead with all ranks in this process (default 0: skip)")
    ap.add_argument("--bandwidth", type=int, default=0, metavar="RUNS",
                    help="also measure large all_reduce with heartbeats on and off (RUNS each; default 0: skip)")
    ap.add_argument("--faults", default="SIGKILL,SIGSTOP,mismatch", help="comma-separated subset")
    ap.add_argument("--hung-trials", type=int, default=2,
                    help="trials for scenarios known to hang until --cap (gloo mismatch; default 2)")
    ap.add_argument("--overhead", type=int, default=3, metavar="RUNS",
                    help="runs of the small all_reduce overhead measurement (0: skip; default 3)")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--cap", type=float, default=10.0, help="seconds after which a survivor counts as hung")
    ap.add_argument("--torch-python", help="python interpreter that has torch (default: this one)")
    ap.add_argument("--backends", default="aiodist,torch", help="comma-separated subset of aiodist,torch")
    args = ap.parse_args()
    if args.worker == "aiodist":
        worker_aiodist(args.scenario)
    elif args.worker == "torch":
        worker_torch(args.scenario)
    else:
        asyncio.run(amain(args))


if __name__ == "__main__":
    main()
