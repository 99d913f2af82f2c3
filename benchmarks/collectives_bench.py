"""Collective performance in the nccl-tests format: aiodist, and torch.distributed (gloo) beside it.

For each world size (real processes on 127.0.0.1, started with
``aiodist.spawn``), each operation and each message size, every rank runs a
few warm-up calls, then timed iterations; before each timed call the ranks
meet at a barrier, and an iteration's time is that of the slowest rank. The
table shows the median over the iterations, and

* algbw = S / t, with S the message size as nccl-tests counts it (the whole
  vector: the output of all_gather, the input of reduce_scatter, the array of
  all_reduce / broadcast / reduce / all_to_all);
* busbw = algbw x factor (all_reduce 2(p-1)/p; reduce_scatter, all_gather,
  all_to_all (p-1)/p; broadcast, reduce 1), comparable to one link's speed.

When torch imports (in this interpreter, or in the one given by
``--torch-python``) the same plan runs with torch.distributed on the gloo
backend, and the ``gloo/aio`` column gives t_gloo / t_aiodist (above 1: aiodist
is faster). ``--shared-arrays`` runs aiodist a second time on arrays
allocated with ``aiodist.empty`` (shared memory: the ranks of one host read
each other's arrays in place) and adds its columns. ``AIODIST_TRANSPORT=tcp``
in the environment makes the aiodist ranks talk over TCP only.

``--ceilings`` prints the machine's own limits beside the table: the memory
copy bandwidth (numpy copying 64 MiB in one process) and what plain sockets
do between two processes (``loopback_bench.py``); ``--memory`` the peak extra
memory of each rank during a 64 MiB all_reduce (resident memory, shared pages
included), aiodist beside gloo.

    python benchmarks/collectives_bench.py                     # 4 B .. 64 MiB, world sizes 2 and 4
    python benchmarks/collectives_bench.py --quick --no-torch  # a smoke run
    python benchmarks/collectives_bench.py --torch-python /tmp/vt/bin/python --json results.json
    python benchmarks/collectives_bench.py --rounds 3   # alternate the backends; median per case
    python benchmarks/collectives_bench.py --ceilings --memory --shared-arrays

Wall-clock time (``time.perf_counter``) is right here: this is a harness
outside the runtime, timing real processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

OPS: tuple[str, ...] = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
)
ITEM = 4  # float32


def busbw_factor(op: str, world: int) -> float:
    """The nccl-tests factor from algorithm bandwidth to bus bandwidth."""
    if op == "all_reduce":
        return 2 * (world - 1) / world
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        return (world - 1) / world
    return 1.0


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864 (K, M, G are powers of 1024)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, size = [], max(ITEM, min_bytes)
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def iterations(nbytes: int, *, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) iterations for a message of ``nbytes``: fewer for large messages."""
    if quick:
        return (1, 5) if nbytes <= 1 << 16 else (1, 3)
    if nbytes <= 1 << 16:
        return 20, 200  # (cheap: a median of 50 small operations still moved by ~20% between runs here)
    if nbytes <= 1 << 20:
        return 3, 20
    if nbytes <= 1 << 22:
        return 2, 10
    return 1, 5


@dataclass(frozen=True)
class Case:
    op: str
    nbytes: int  # S as nccl-tests counts it
    count: int  # float32 elements of the array each rank passes (see _arrays)
    warmup: int
    iters: int


def make_plan(world: int, ops: Sequence[str], size_list: Sequence[int], *, quick: bool) -> list[Case]:
    plan = []
    for op in ops:
        if op == "barrier":
            plan.append(Case(op, 0, 0, *iterations(0, quick=quick)))
            continue
        for nbytes in size_list:
            count = max(1, nbytes // ITEM)
            if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
                count = max(world, count // world * world)  # the whole vector splits evenly
            if plan and plan[-1].op == op and plan[-1].count == count:
                continue  # a size that rounded to the previous one
            plan.append(Case(op, count * ITEM, count, *iterations(count * ITEM, quick=quick)))
    return plan


def _arrays(case: Case, world: int, zeros: Callable[[int], Any]) -> tuple[Any, Any]:
    """(input, output) for one case; ``count`` is the whole vector of gather/scatter ops."""
    if case.op == "all_gather_into_tensor":
        return zeros(case.count // world), zeros(case.count)
    if case.op == "reduce_scatter_tensor":
        return zeros(case.count), zeros(case.count // world)
    if case.op == "all_to_all_single":
        return zeros(case.count), zeros(case.count)
    return zeros(max(case.count, 1)), None


def _calls(dist: Any) -> dict[str, Callable[[Any, Any], Any]]:
    """Op name -> ``call(x, out)`` on ``dist``: aiodist (the call returns an awaitable) or torch.distributed."""
    return {
        "all_reduce": lambda x, out: dist.all_reduce(x),
        "broadcast": lambda x, out: dist.broadcast(x, src=0),
        "reduce": lambda x, out: dist.reduce(x, dst=0),
        "all_gather_into_tensor": lambda x, out: dist.all_gather_into_tensor(out, x),
        "reduce_scatter_tensor": lambda x, out: dist.reduce_scatter_tensor(out, x),
        "all_to_all_single": lambda x, out: dist.all_to_all_single(out, x),
        "barrier": lambda x, out: dist.barrier(),
    }


def _slowest_median(per_rank: Sequence[Sequence[float]]) -> float:
    return statistics.median(max(times) for times in zip(*per_rank, strict=True))


# ----------------------------------------------------------------- aiodist ranks


async def aiodist_rank(plan_json: str, shared: bool = False) -> dict[str, float | None] | None:
    import aiodist as dist

    plan = [Case(**c) for c in json.loads(plan_json)]
    zeros: Callable[[int], Any] = (
        (lambda n: dist.zeros(n, np.float32)) if shared else (lambda n: np.zeros(n, dtype=np.float32))
    )
    await dist.init_process_group()
    try:
        world = dist.get_world_size()
        ops = _calls(dist)
        mine: list[list[float]] = []
        for case in plan:
            x, out = _arrays(case, world, zeros)
            call = ops[case.op]
            for _ in range(case.warmup):
                await call(x, out)
            times = []
            for _ in range(case.iters):
                await dist.barrier()
                start = time.perf_counter()
                await call(x, out)
                times.append(time.perf_counter() - start)
            mine.append(times)
        everyone = await dist.all_gather_object(mine)
        if dist.get_rank() != 0:
            return None
        return {
            f"{case.op}/{case.nbytes}": _slowest_median([r[i] for r in everyone]) for i, case in enumerate(plan)
        }
    finally:
        await dist.destroy_process_group()


# ----------------------------------------------------------------- torch ranks


def torch_rank(plan_json: str) -> dict[str, float | None] | None:
    import torch
    import torch.distributed as tdist

    plan = [Case(**c) for c in json.loads(plan_json)]
    tdist.init_process_group("gloo")
    try:
        world = tdist.get_world_size()
        ops = _calls(tdist)
        mine: list[list[float] | None] = []
        for case in plan:
            x, out = _arrays(case, world, lambda n: torch.zeros(n, dtype=torch.float32))
            call = ops[case.op]
            try:
                for _ in range(case.warmup):
                    call(x, out)
            except (RuntimeError, NotImplementedError, ValueError):  # unsupported by gloo: the same on every rank
                mine.append(None)
                continue
            times = []
            for _ in range(case.iters):
                tdist.barrier()
                start = time.perf_counter()
                call(x, out)
                times.append(time.perf_counter() - start)
            mine.append(times)
        everyone: list[Any] = [None] * world
        tdist.all_gather_object(everyone, mine)
        if tdist.get_rank() != 0:
            return None
        result: dict[str, float | None] = {}
        for i, case in enumerate(plan):
            rows = [r[i] for r in everyone]
            result[f"{case.op}/{case.nbytes}"] = None if any(r is None for r in rows) else _slowest_median(rows)
        return result
    finally:
        tdist.destroy_process_group()


# ----------------------------------------------------------------- driver


def run_backend(backend: str, world: int, plan: list[Case], *, timeout: float) -> dict[str, float | None]:
    """One run of ``plan``: backend "aiodist", "aiodist-shared" (shared arrays) or "torch"."""
    from aiodist import spawn

    plan_json = json.dumps([asdict(c) for c in plan])
    if backend == "torch":
        results = spawn(torch_rank, world, args=(plan_json,), timeout=timeout)
    else:
        results = spawn(aiodist_rank, world, args=(plan_json, backend == "aiodist-shared"), timeout=timeout)
    return results[0]


def run_torch_elsewhere(python: str, world: int, plan: list[Case], *, timeout: float) -> dict[str, float | None]:
    """Run the torch ranks from another interpreter (one where torch imports)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [python, __file__, "--_torch-worker", str(world)],
        input=json.dumps([asdict(c) for c in plan]),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout + 30,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"torch run with {python} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torch_importable() -> bool:
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def median_of_rounds(rounds: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per case, the median over the rounds that measured it (None if none did)."""
    out: dict[str, float | None] = {}
    for key in rounds[0]:
        vals = [r[key] for r in rounds if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None  # type: ignore[type-var]
    return out


def _fmt_size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def format_table(
    world: int,
    plan: list[Case],
    ours: dict[str, float | None],
    theirs: dict[str, float | None] | None,
    shared: dict[str, float | None] | None = None,
) -> str:
    head = f"{'op':<24}{'size':>10}{'aio us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}"
    if theirs is not None:
        head += f"{'gloo us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}{'gloo/aio':>10}"
    if shared is not None:
        head += f"{'shm-arr us':>12}{'busbw GB/s':>12}" + (f"{'gloo/shm':>10}" if theirs is not None else "")
    lines = [f"# world size {world}: float32, time = median over iterations of the slowest rank", head]

    def cols(t: float | None, case: Case) -> str:
        if t is None:
            return f"{'n/a':>12}{'':>12}{'':>12}"
        if case.op == "barrier":
            return f"{t * 1e6:>12.1f}{'':>12}{'':>12}"
        algbw = case.nbytes / t / 1e9
        return f"{t * 1e6:>12.1f}{algbw:>12.3f}{algbw * busbw_factor(case.op, world):>12.3f}"

    for case in plan:
        key = f"{case.op}/{case.nbytes}"
        t_ours = ours.get(key)
        line = f"{case.op:<24}{_fmt_size(case.nbytes) if case.op != 'barrier' else '-':>10}{cols(t_ours, case)}"
        t_theirs = theirs.get(key) if theirs is not None else None
        if theirs is not None:
            ratio = f"{t_theirs / t_ours:>10.2f}" if t_theirs and t_ours else f"{'n/a':>10}"
            line += cols(t_theirs, case) + ratio
        if shared is not None:
            t_shared = shared.get(key)
            line += cols(t_shared, case)[:12] + cols(t_shared, case)[24:]
            if theirs is not None:
                line += f"{t_theirs / t_shared:>10.2f}" if t_theirs and t_shared else f"{'n/a':>10}"
        lines.append(line)
    return "\n".join(lines)


def memcpy_ceiling(nbytes: int = 64 << 20, reps: int = 10) -> float:
    """This machine's memory copy bandwidth: GB/s of numpy copying ``nbytes`` in one process (median)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def ceilings_line(nbytes: int = 64 << 20, reps: int = 5) -> dict[str, float]:
    """Print (and return) the memory copy bandwidth and the loopback socket rates, measured now."""
    rates = loopback_line(nbytes, reps)
    rates["memcpy"] = memcpy_ceiling(nbytes)
    print(f"# memory copy ceiling, numpy copying {nbytes >> 20} MiB in one process: {rates['memcpy']:.2f} GB/s", flush=True)
    return rates


async def _memory_rank(nbytes: int, backend: str) -> dict[str, float]:
    """Resident memory (bytes) of one rank before, and at its peak during, one all_reduce of ``nbytes``.

    The first all_reduce of that size, so whatever it sets up counts. The
    kernel's high-water mark (VmHWM) is reset just before (``/proc/self/clear_refs``).
    """
    if backend == "torch":
        import torch
        import torch.distributed as tdist

        tdist.init_process_group("gloo")
        t = torch.ones(nbytes // ITEM, dtype=torch.float32)
        tdist.barrier()
        pss = _pss()
        before = _reset_peak()
        tdist.all_reduce(t)
        peak = _status("VmHWM")
        pss_after = _pss()
        tdist.destroy_process_group()
        return {"before": before, "peak": peak, "pss": pss_after - pss}
    import aiodist as dist

    await dist.init_process_group()
    try:
        x = dist.zeros(nbytes // ITEM, np.float32) if backend == "aiodist-shared" else np.zeros(nbytes // ITEM, np.float32)
        x[:] = 1
        await dist.barrier()
        pss = _pss()
        before = _reset_peak()
        await dist.all_reduce(x)
        peak = _status("VmHWM")
        return {"before": before, "peak": peak, "pss": _pss() - pss}
    finally:
        await dist.destroy_process_group()


def _status(field: str) -> float:
    """A memory field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _pss() -> float:
    """Proportional resident memory (bytes): a page shared by k processes counts 1/k in each."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return float(line.split()[1]) * 1024
    return 0.0


def _reset_peak() -> float:
    """Reset this process's resident-memory high-water mark to what it uses now; return that."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def memory_lines(world: int, backends: Sequence[str], torch_python: str | None, nbytes: int = 64 << 20) -> dict[str, Any]:
    """Print each backend's peak extra memory per rank during a 64 MiB all_reduce (max over ranks)."""
    from aiodist import spawn

    out: dict[str, Any] = {}
    for backend in backends:
        if backend == "torch" and torch_python not in (None, sys.executable):
            proc = subprocess.run(
                [torch_python, __file__, "--_memory-worker", str(world)],
                capture_output=True, text=True, timeout=300, check=False,
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)),
            )
            if proc.returncode != 0:
                print(f"# memory: torch run failed: {proc.stderr[-500:]}")
                continue
            per_rank = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            per_rank = spawn(_memory_rank, world, args=(nbytes, backend), timeout=300)
        extra = max(r["peak"] - r["before"] for r in per_rank)
        pss = max(r["pss"] for r in per_rank)
        out[backend] = {"peak_rss": extra, "pss_after": pss}
        name = {"aiodist": "aiodist", "aiodist-shared": "aiodist (shared arrays)", "torch": "gloo"}[backend]
        print(f"# extra memory per rank, {name}, {world} ranks, all_reduce of {nbytes >> 20} MiB: peak resident "
              f"+{extra / 2**20:.1f} MiB ({extra / nbytes:.2f} x the array; shared pages of the peers it touched "
              f"included), proportional after the call +{pss / 2**20:.1f} MiB ({pss / nbytes:.2f} x)", flush=True)
    return out


def loopback_line(nbytes: int = 64 << 20, reps: int = 5) -> dict[str, float]:
    """Print (and return) this machine's ceiling from loopback_bench.py: plain sockets, no aiodist."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # (its child process imports it from there too)
    import loopback_bench

    rates = loopback_bench.measure(nbytes, reps)
    print(
        f"# loopback ceiling, plain sockets between two processes, {nbytes >> 20} MiB: one way "
        f"{rates['one way']:.2f} GB/s, both ways at once {rates['both ways']:.2f} GB/s per direction "
        "(bounds a 2-rank all_reduce's busbw)",
        flush=True,
    )
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2,4", help="comma-separated (default: 2,4)")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    parser.add_argument("--min-bytes", type=parse_size, default=4)
    parser.add_argument("--max-bytes", type=parse_size, default=None, help="default: 64M (1M with --quick)")
    parser.add_argument("--factor", type=int, default=4, help="size step (default: x4)")
    parser.add_argument("--quick", action="store_true", help="few iterations, at most 1 MiB unless --max-bytes says")
    parser.add_argument("--no-torch", action="store_true", help="skip torch.distributed even if it imports")
    parser.add_argument("--torch-python", default=None, help="an interpreter where torch imports (default: this one)")
    parser.add_argument("--timeout", type=float, default=900.0, help="per backend and world size, seconds")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate the backends this many times per world size and report each case's median "
        "over the rounds (load on a shared machine then hits both alike)",
    )
    parser.add_argument(
        "--loopback",
        action="store_true",
        help="also print this machine's ceiling: plain sockets between two processes (loopback_bench.py)",
    )
    parser.add_argument(
        "--ceilings",
        action="store_true",
        help="also print this machine's ceilings: memory copy bandwidth, and plain sockets between two processes",
    )
    parser.add_argument(
        "--shared-arrays",
        action="store_true",
        help="also run aiodist on arrays in shared memory (aiodist.empty) and show their columns",
    )
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also print each rank's peak extra memory during a 64 MiB all_reduce (aiodist and gloo)",
    )
    parser.add_argument("--_torch-worker", dest="torch_worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_memory-worker", dest="memory_worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.torch_worker is not None:  # child mode: plan on stdin, results as JSON on stdout
        plan = [Case(**c) for c in json.loads(sys.stdin.read())]
        print(json.dumps(run_backend("torch", args.torch_worker, plan, timeout=args.timeout)))
        return 0
    if args.memory_worker is not None:  # child mode: the torch ranks of --memory
        from aiodist import spawn

        print(json.dumps(spawn(_memory_rank, args.memory_worker, args=(64 << 20, "torch"), timeout=300)))
        return 0

    ops = [op.strip() for op in args.ops.split(",") if op.strip()]
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        parser.error(f"unknown op(s): {unknown}")
    max_bytes = args.max_bytes if args.max_bytes is not None else (1 << 20 if args.quick else 64 << 20)
    size_list = sizes(args.min_bytes, max_bytes, args.factor)
    torch_python = None
    if not args.no_torch:
        if args.torch_python is not None:
            torch_python = args.torch_python
        elif torch_importable():
            torch_python = sys.executable
    report: dict[str, Any] = {"sizes": size_list, "ops": ops, "worlds": {}}
    if args.ceilings:
        report["ceilings"] = ceilings_line()
    elif args.loopback:
        report["loopback"] = loopback_line()
    for world in [int(w) for w in args.world_sizes.split(",")]:
        plan = make_plan(world, ops, size_list, quick=args.quick)
        our_rounds: list[dict[str, float | None]] = []
        their_rounds: list[dict[str, float | None]] = []
        shared_rounds: list[dict[str, float | None]] = []
        for _ in range(max(1, args.rounds)):
            our_rounds.append(run_backend("aiodist", world, plan, timeout=args.timeout))
            if args.shared_arrays:
                shared_rounds.append(run_backend("aiodist-shared", world, plan, timeout=args.timeout))
            if torch_python == sys.executable:
                their_rounds.append(run_backend("torch", world, plan, timeout=args.timeout))
            elif torch_python is not None:
                their_rounds.append(run_torch_elsewhere(torch_python, world, plan, timeout=args.timeout))
        ours = median_of_rounds(our_rounds)
        theirs = median_of_rounds(their_rounds) if their_rounds else None
        shared = median_of_rounds(shared_rounds) if shared_rounds else None
        print(format_table(world, plan, ours, theirs, shared), flush=True)
        print(flush=True)
        report["worlds"][str(world)] = {"aiodist": ours, "gloo": theirs, "aiodist-shared": shared}
        if args.memory:
            backends = ["aiodist"] + (["aiodist-shared"] if args.shared_arrays else []) + (["torch"] if torch_python else [])
            report["worlds"][str(world)]["memory"] = memory_lines(world, backends, torch_python)
    if torch_python is None:
        print("(torch.distributed not measured: torch does not import here; see --torch-python)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
