"""How fast does each survivor learn that a peer died or hung, and is it named?

For each backend (aiodist; torch.distributed with gloo when torch imports), for
each fault (SIGKILL, SIGSTOP of the last rank), over several trials: start W
ranks (real processes, 127.0.0.1) that run small all_reduce in a loop, inject
the fault once every rank is looping, and record on each survivor the time
from the fault to the error and whether the error names the faulty rank.
A survivor that has not raised after --cap seconds counts as hung.

    python benchmarks/failure_bench.py [--trials 10] [--world 4] [--cap 10]

Prints a table of medians. Wall-clock time is fine here: this is a harness
outside the runtime, comparing processes on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------- workers


def _report(kind: str, **kw: object) -> None:
    print(json.dumps({"kind": kind, "t": time.time(), **kw}), flush=True)


def worker_aiodist() -> None:
    import numpy as np

    import aiodist
    from aiodist.eventloop import run

    async def main() -> None:
        await aiodist.init_process_group(timeout=60.0)
        x = np.ones(4, dtype=np.float32)
        i = 0
        try:
            while True:
                await aiodist.all_reduce(x)
                i += 1
                if i == 50:
                    _report("ready")
        except Exception as e:  # noqa: BLE001 - we report whatever it is
            _report("error", type=type(e).__name__, msg=str(e)[:300], rank=getattr(e, "rank", None))
            os._exit(0)

    run(main())


def worker_torch() -> None:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    x = torch.ones(4)
    i = 0
    try:
        while True:
            dist.all_reduce(x)
            i += 1
            if i == 50:
                _report("ready")
    except Exception as e:  # noqa: BLE001
        _report("error", type=type(e).__name__, msg=str(e)[:300], rank=None)
        os._exit(0)


# ----------------------------------------------------------------- harness


async def _trial(python: str, backend: str, world: int, fault: str, cap: float) -> list[dict]:
    port = _free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=str(ROOT))
        procs.append(await asyncio.create_subprocess_exec(
            python, __file__, "--worker", backend, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    victim = world - 1
    events: dict[int, dict] = {}
    ready: set[int] = set()
    all_ready = asyncio.Event()

    async def read(r: int) -> None:
        assert procs[r].stdout is not None
        async for line in procs[r].stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev["kind"] == "ready":
                ready.add(r)
                if len(ready) == world:
                    all_ready.set()
            elif ev["kind"] == "error":
                events[r] = ev

    readers = [asyncio.create_task(read(r)) for r in range(world)]
    results: list[dict] = []
    try:
        try:
            await asyncio.wait_for(all_ready.wait(), 60)
        except TimeoutError:
            raise RuntimeError(f"{backend}: ranks did not all start looping within 60 s") from None
        t_fault = time.time()
        os.kill(procs[victim].pid, signal.SIGKILL if fault == "SIGKILL" else signal.SIGSTOP)
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline and len([r for r in events if r != victim]) < world - 1:
            await asyncio.sleep(0.005)
        for r in range(world):
            if r == victim:
                continue
            ev = events.get(r)
            if ev is None:
                results.append({"rank": r, "latency": None, "named": False, "type": "hung"})
            else:
                named = ev.get("rank") == victim
                results.append({"rank": r, "latency": ev["t"] - t_fault, "named": named, "type": ev["type"],
                                "msg": ev["msg"]})
    finally:
        for p in procs:
            try:
                p.send_signal(signal.SIGCONT)
                p.kill()
            except ProcessLookupError:
                pass
        for p in procs:
            await p.wait()
        for t in readers:
            t.cancel()
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
        for fault in ("SIGKILL", "SIGSTOP"):
            lat: list[float] = []
            hung = named = total = 0
            example = ""
            for _ in range(args.trials):
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
    print(f"\nfault detection, {args.world} ranks, {args.trials} trials, cap {args.cap:g}s (victim: rank {args.world - 1})")
    head = ("backend", "fault", "median", "worst", "named", "hung>cap", "error seen")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["aiodist", "torch"])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--cap", type=float, default=10.0, help="seconds after which a survivor counts as hung")
    ap.add_argument("--torch-python", help="python interpreter that has torch (default: this one)")
    ap.add_argument("--backends", default="aiodist,torch", help="comma-separated subset of aiodist,torch")
    args = ap.parse_args()
    if args.worker == "aiodist":
        worker_aiodist()
    elif args.worker == "torch":
        worker_torch()
    else:
        asyncio.run(amain(args))


if __name__ == "__main__":
    main()
