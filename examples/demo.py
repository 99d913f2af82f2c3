"""The main job (`make demo`): the runtime and the simulator, end to end.

1. The store: a server on 127.0.0.1 and concurrent clients using set/get/add/wait.
2. Real processes: `aiodist run -n 4 examples/train_dp.py` trains a model with
   data-parallel all_reduce (ranks on one host talk through shared memory, across
   hosts over TCP) and checks it against one-process training.
3. The simulator: the same, unchanged file as 60 virtual ranks with latency
   variation and a straggler; then again with a rank crashing mid-training, so
   that every survivor names the dead rank. Each run prints its virtual time and
   the command that replays it exactly.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiodist
import sim

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import train_dp  # noqa: E402  (the example program, imported as a module)


def banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)), flush=True)


async def store_demo() -> None:
    async with await aiodist.StoreServer.start(host="127.0.0.1", port=0) as server:
        print(f"store server listening on 127.0.0.1:{server.port}")

        async def worker(i: int) -> None:
            async with await aiodist.TCPStore.connect("127.0.0.1", server.port, timeout=10) as store:
                await store.set(f"worker/{i}", f"hello from {i}")
                n = await store.add("arrived", 1)
                if n == 4:
                    await store.set("all_arrived", b"yes")
                await store.wait(["all_arrived"], timeout=10)  # blocks until the 4th worker sets it
                peer = await store.get(f"worker/{(i + 1) % 4}", timeout=10)
                print(f"  client {i}: arrived as #{n}, read {peer.decode()!r} from its neighbour")

        await asyncio.gather(*(worker(i) for i in range(4)))
        async with await aiodist.TCPStore.connect("127.0.0.1", server.port) as store:
            print(f"  counter = {int(await store.get('arrived'))}, keys in store = {await store.num_keys()}")


def real_demo() -> None:
    cmd = [sys.executable, "-m", "aiodist", "run", "-n", "4", str(HERE / "train_dp.py")]
    print("$ aiodist run -n 4 examples/train_dp.py")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"demo: the 4-process training failed (exit code {proc.returncode})")
    print(f"(4 processes on one host: shared memory, {time.perf_counter() - t0:.1f}s wall; "
          "AIODIST_TRANSPORT=tcp forces TCP)")


def replay(world_size: int, seed: int, faults: list) -> str:
    flags = " ".join(f.to_cli() for f in faults)
    return f"python -m sim run -n {world_size} examples/train_dp.py --seed {seed} {flags}".rstrip()


def sim_demo() -> None:
    logging.getLogger("aiodist").setLevel(logging.ERROR)  # the flight recorder's per-rank lines would flood
    n, seed = 60, 7
    faults = [sim.Straggler(3, 4.0)]
    print(f"{n} virtual ranks, latency uniform 50-150 us, 1.25 GB/s links, rank 3 a 4x straggler")
    t0 = time.perf_counter()
    res = sim.run(train_dp.main, world_size=n, seed=seed, faults=faults)
    wall = time.perf_counter() - t0
    if not res.ok:
        print(res.summary())
        raise SystemExit("demo: simulated training failed")
    r0 = res.rank_results[0]
    print(f"  ok: every rank finished; rank 0 reports {r0}")
    print(f"  virtual time {res.virtual_time * 1e3:.2f} ms, {res.messages} messages, {wall:.1f}s wall, digest {res.digest[:16]}")
    print(f"  replay: {replay(n, seed, faults)}")

    crash_at = res.virtual_time / 2
    faults = [sim.Straggler(3, 4.0), sim.Crash(17, at=round(crash_at, 6))]
    print(f"\nthe same run, with rank 17 crashing at t={crash_at * 1e3:.3f} ms (virtual):")
    res2 = sim.run(train_dp.main, world_size=n, seed=seed, faults=faults, stop_on_error=False)
    errors = [f for f in res2.failures if f.kind == "exception"]
    named = Counter()
    for f in errors:
        last = f.message.strip().splitlines()[-1] if f.message else ""
        named["names rank 17" if "rank 17" in last else last[:60]] += 1
    print(f"  {len(errors)} survivors raised; what their errors say: {dict(named)}")
    if errors:
        print(f"  e.g. rank {errors[0].rank}: {errors[0].message.strip().splitlines()[-1][:150]}")
    last = max((f.time for f in errors), default=crash_at)
    print(f"  the last survivor raised at t={last * 1e3:.3f} ms (virtual), {(last - crash_at) * 1e3:.3f} ms after the crash")
    print(f"  replay: {replay(n, seed, faults)}")
    again = sim.run(train_dp.main, world_size=n, seed=seed, faults=faults, stop_on_error=False)
    print(f"  replayed: same digest? {again.digest == res2.digest}")


def main() -> None:
    banner("1. the store over TCP")
    aiodist.run(store_demo())
    banner("2. data-parallel training, 4 real processes")
    real_demo()
    banner("3. the same program in the simulator")
    sim_demo()
    print("\ndemo finished")


if __name__ == "__main__":
    main()
