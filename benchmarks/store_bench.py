"""Store throughput: aiodist's StoreServer/TCPStore versus torch.distributed.TCPStore.

    PYTHONPATH=. python benchmarks/store_bench.py [--reps 3] [--seconds 0.5] [--no-torch]
        [--ops add,get] [--scenarios "1 client seq,8 procs x8"]

For each op (set, get, add, compare_set) and each scenario

* ``1 client seq``      one client, one request at a time
* ``1 client x64``      one client, 64 requests in flight (64 tasks on one
                        connection; for torch's blocking API: 64 threads sharing
                        one client)
* ``8 procs seq``       8 client processes, each with its own event loop,
                        one request at a time each
* ``8 procs x8``        8 client processes, 8 requests in flight each (torch:
                        8 threads per process sharing its client)

it prints the median ops/s over ``--reps`` repetitions. The server runs in its
own process; clients run in persistent worker processes that start together on
a barrier. torch is measured in the same run when ``import torch`` works.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

OPS = ("set", "get", "add", "compare_set")
SCENARIOS = (("1 client seq", 1, 1), ("1 client x64", 1, 64), ("8 procs seq", 8, 1), ("8 procs x8", 8, 8))
VALUE = b"v" * 32


# ---------------------------------------------------------------------- servers


def _aiodist_server(ready: Any) -> None:
    import asyncio

    from aiodist.eventloop import run
    from aiodist.store import StoreServer

    async def main() -> None:
        server = await StoreServer.start("127.0.0.1", 0)
        ready.send(server.port)
        while True:
            await asyncio.sleep(3600)

    run(main())


def _torch_server(ready: Any) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=300))
    ready.send(store.port)
    time.sleep(3600 * 24)


# ---------------------------------------------------------------------- workers


def _call(store: Any, op: str, key: str) -> Callable[[], Any]:
    """The measured call of ``op`` by one client (its own ``key``), on either store (aiodist's returns an awaitable)."""
    if op == "set":
        return lambda: store.set(key + "/v", VALUE)
    if op == "get":
        return lambda: store.get(key + "/v")
    if op == "add":
        return lambda: store.add(key, 1)
    return lambda: store.compare_set(key + "/v", VALUE, VALUE)


def _aiodist_worker(port: int, rank: int, cmds: Any, barrier: Any) -> None:
    import asyncio

    from aiodist.eventloop import loop_factory
    from aiodist.store import TCPStore

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        store = runner.run(TCPStore.connect("127.0.0.1", port, timeout=30))

        async def job(op: str, inflight: int, seconds: float) -> tuple[float, float, int]:
            key = f"bench/{rank}"
            await store.set(key, b"0")
            await store.set(key + "/v", VALUE)
            call = _call(store, op, key)
            stop = False
            count = 0

            async def loop() -> None:
                nonlocal count
                while not stop:
                    await call()
                    count += 1

            barrier.wait()
            t0 = time.perf_counter()
            tasks = [asyncio.ensure_future(loop()) for _ in range(inflight)]
            await asyncio.sleep(seconds)
            stop = True
            await asyncio.gather(*tasks)
            return t0, time.perf_counter(), count

        cmds.send("ready")
        while True:
            cmd = cmds.recv()
            if cmd is None:
                break
            cmds.send(runner.run(job(*cmd)))
        runner.run(store.close())


def _torch_worker(port: int, rank: int, cmds: Any, barrier: Any) -> None:
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))

    def job(op: str, inflight: int, seconds: float) -> tuple[float, float, int]:
        key = f"bench/{rank}"
        store.set(key, "0")
        store.set(key + "/v", VALUE)
        call = _call(store, op, key)
        counts = [0] * inflight
        stop = threading.Event()

        def loop(i: int) -> None:
            while not stop.is_set():
                call()
                counts[i] += 1

        barrier.wait()
        t0 = time.perf_counter()
        if inflight == 1:
            end = t0 + seconds
            n = 0
            while True:
                call()
                n += 1
                if n % 64 == 0 and time.perf_counter() >= end:
                    break
            return t0, time.perf_counter(), n
        threads = [threading.Thread(target=loop, args=(i,)) for i in range(inflight)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        return t0, time.perf_counter(), sum(counts)

    cmds.send("ready")
    while True:
        cmd = cmds.recv()
        if cmd is None:
            break
        cmds.send(job(*cmd))


# ---------------------------------------------------------------------- driver


class Fleet:
    """A server process plus 8 persistent client processes of one implementation."""

    def __init__(self, kind: str) -> None:
        ctx = mp.get_context("spawn")
        server_fn, worker_fn = (_aiodist_server, _aiodist_worker) if kind == "aiodist" else (_torch_server, _torch_worker)
        rx, tx = ctx.Pipe(duplex=False)
        self.server = ctx.Process(target=server_fn, args=(tx,), daemon=True)
        self.server.start()
        if not rx.poll(60):
            raise RuntimeError(f"{kind} store server did not start")
        port = rx.recv()
        # Barriers can only be handed to processes at creation: one for runs of 8, one for runs of 1.
        all_barrier, one_barrier = ctx.Barrier(8), ctx.Barrier(1)
        self.barriers = (all_barrier, one_barrier)  # keep them alive while children unpickle them
        self.workers: list[Any] = []
        self.pipes: list[Any] = []
        for rank in range(8):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker_entry, args=(worker_fn, port, rank, b, all_barrier, one_barrier), daemon=True)
            p.start()
            self.pipes.append(a)
            self.workers.append(p)
        for pipe in self.pipes:  # measure only once every client process is up and connected
            if not pipe.poll(120) or pipe.recv() != "ready":
                raise RuntimeError(f"a {kind} client process did not start")

    def run(self, op: str, nprocs: int, inflight: int, seconds: float) -> float:
        for i in range(nprocs):
            self.pipes[i].send(("run", op, inflight, seconds, nprocs))
        results = [self.pipes[i].recv() for i in range(nprocs)]
        start = min(r[0] for r in results)
        end = max(r[1] for r in results)
        return sum(r[2] for r in results) / (end - start)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for p in self.workers:
            p.join(10)
            if p.is_alive():
                p.kill()
        self.server.kill()
        self.server.join(5)


class _Commands:
    """Adapts the ("run", op, inflight, seconds, nprocs) protocol to a worker's (op, inflight, seconds)."""

    def __init__(self, pipe: Any, all_barrier: Any, one_barrier: Any) -> None:
        self.pipe = pipe
        self.all_barrier = all_barrier
        self.one_barrier = one_barrier
        self.current = one_barrier

    def recv(self) -> Any:
        cmd = self.pipe.recv()
        if cmd is None:
            return None
        _, op, inflight, seconds, nprocs = cmd
        self.current = self.all_barrier if nprocs == 8 else self.one_barrier
        return (op, inflight, seconds)

    def send(self, result: Any) -> None:
        self.pipe.send(result)

    def wait(self) -> None:
        self.current.wait()


def _worker_entry(fn: Any, port: int, rank: int, pipe: Any, all_barrier: Any, one_barrier: Any) -> None:
    cmds = _Commands(pipe, all_barrier, one_barrier)
    fn(port, rank, cmds, cmds)


def measure(
    kind: str, reps: int, seconds: float, ops: tuple[str, ...] = OPS, scenarios: tuple[tuple[str, int, int], ...] = SCENARIOS
) -> dict[tuple[str, str], float]:
    fleet = Fleet(kind)
    out: dict[tuple[str, str], float] = {}
    try:
        for op in ops:
            for name, nprocs, inflight in scenarios:
                fleet.run(op, nprocs, inflight, min(0.1, seconds))  # warm-up
                rates = [fleet.run(op, nprocs, inflight, seconds) for _ in range(reps)]
                out[(op, name)] = statistics.median(rates)
                print(f"  {kind:8} {op:12} {name:14} {out[(op, name)]:>10,.0f} ops/s", file=sys.stderr, flush=True)
    finally:
        fleet.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per cell (median reported)")
    parser.add_argument("--seconds", type=float, default=0.5, help="duration of one repetition")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated ops to measure (default: all)")
    parser.add_argument(
        "--scenarios", default=",".join(n for n, _, _ in SCENARIOS), help="comma-separated scenario names (default: all)"
    )
    args = parser.parse_args(argv)
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
    wanted = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    scenarios = tuple(sc for sc in SCENARIOS if sc[0] in wanted)
    unknown = [o for o in ops if o not in OPS] + [n for n in wanted if n not in {sc[0] for sc in SCENARIOS}]
    if unknown or not ops or not scenarios:
        parser.error(f"unknown or empty --ops/--scenarios: {unknown or 'nothing selected'}")

    have_torch = False
    if not args.no_torch:
        try:
            import torch.distributed  # noqa: F401

            have_torch = True
        except Exception:
            print("torch not importable: measuring aiodist only", file=sys.stderr)

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.reps} reps x {args.seconds}s, median", file=sys.stderr)
    ours = measure("aiodist", args.reps, args.seconds, ops, scenarios)
    theirs = measure("torch", args.reps, args.seconds, ops, scenarios) if have_torch else {}

    head = f"| {'op':<12} | {'scenario':<14} | {'aiodist ops/s':>13} |"
    if theirs:
        head += f" {'torch ops/s':>11} | {'ratio':>6} |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    for op in ops:
        for name, _, _ in scenarios:
            row = f"| {op:<12} | {name:<14} | {ours[(op, name)]:>13,.0f} |"
            if theirs:
                t = theirs[(op, name)]
                row += f" {t:>11,.0f} | {ours[(op, name)] / t:>5.2f}x |"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
