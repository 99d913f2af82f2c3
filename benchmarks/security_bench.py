"""The numbers of issue 13: the attacks' outcome, memory under hostile connections, the cost of authentication.

    PYTHONPATH=. python benchmarks/security_bench.py [--only attack,rss,load,handshake] [--clients 1000]
    PYTHONPATH=/work/base python benchmarks/security_bench.py    # the same measurements of another tree

Runs against the aiodist found on ``PYTHONPATH`` (its own processes get the
same path and start in that tree), so one file measures today's tree and an
older one side by side:

* **attack**: a default ``aiodist run -n 2`` job computes 200 float64
  all_reduces; a foreign process of the same user (its own default secret,
  not the job's) connects to the job's store, rewrites both ranks' addresses
  to a relay of its own that adds 1000.0 to the first element of every
  payload. Prints whether the store let it in, how many results came out
  wrong, and the launcher's exit code.
* **rss**: 8 connections each send ~40 bytes announcing a huge frame, to the
  store server and to a rank's listener: RSS growth of each process.
* **load**: ``--clients`` authenticated clients each do 20 rounds of
  set+get (``--pause`` seconds apart on average) while as many
  unauthenticated sockets sit open: p50/p99/max latency of each call.
* **handshake**: milliseconds per ``TCPStore.connect`` (connection set-up
  and, where the tree has it, authentication), median of 300; and the
  in-process cost of the four handshake messages (no I/O).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import random
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

import aiodist
from aiodist.store import StoreServer, TCPStore
from aiodist.wire import PREAMBLE

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # the attacks' tools, shared with the tests
from attacker import HOST, LISTENING_RANK, Job, Relay, child_env, rss_growth  # noqa: E402
from rank_procs import free_port  # noqa: E402

TREE = str(Path(aiodist.__file__).resolve().parents[1])

# ------------------------------------------------------------------ the address-rewrite attack


class CorruptingRelay(Relay):
    """Forwards aiodist frames both ways, adding 1000.0 to the first float64 of each large payload."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(target)
        self.corrupted = 0

    async def pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            w.write(await r.readexactly(len(PREAMBLE)))
            while True:
                prefix = await r.readexactly(12)
                hlen, plen = struct.unpack("<IQ", prefix)
                header = await r.readexactly(hlen)
                payload = bytearray(await r.readexactly(plen))
                if plen >= 8 * 64:
                    struct.pack_into("<d", payload, 0, struct.unpack_from("<d", payload, 0)[0] + 1000.0)
                    self.corrupted += 1
                w.write(prefix + header + payload)
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            w.close()


async def attack() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        job = await asyncio.to_thread(Job, Path(tmp), 2, iterations=200, tree=TREE)
        outcome = "refused"
        relays: list[CorruptingRelay] = []
        try:
            store = await TCPStore.connect(HOST, job.port, timeout=5)  # the attacker's own default settings
        except Exception as e:  # noqa: BLE001 - whatever keeps the attacker out
            outcome = f"refused ({type(e).__name__})"
        else:
            outcome = "ACCEPTED: rewrote aiodist/0/addr/0 and /1"
            for rank in (0, 1):
                host, _, p = bytes(await store.get(f"aiodist/0/addr/{rank}")).decode().rpartition("|")
                relay = CorruptingRelay((host, int(p)))
                relays.append(relay)
                await store.set(f"aiodist/0/addr/{rank}", f"{HOST}|{await relay.start()}")
            await store.close()
        code, out, err = await asyncio.to_thread(job.finish, 120)
        wrong = sum(int(line.split()[-1]) for line in out.splitlines() if "wrong" in line)
        for relay in relays:
            relay.close()
        return {"store": outcome, "wrong results": wrong, "exit": code,
                "relayed payloads changed": sum(r.corrupted for r in relays)}


# ------------------------------------------------------------------ memory before the bytes


async def growth(pid: int, port: int, data: bytes) -> int:
    await asyncio.sleep(0.3)  # (what the previous connections left behind settles first)
    return await rss_growth(pid, port, data, settle=1.5)


async def rss_attack() -> dict[str, Any]:
    port = free_port()
    store = subprocess.Popen([sys.executable, "-m", "aiodist", "store", "serve", "--port", str(port)],
                             cwd=TREE, env=child_env(TREE), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rank = subprocess.Popen([sys.executable, "-c", LISTENING_RANK],
                            env=child_env(TREE, RANK="0", WORLD_SIZE="1", MASTER_ADDR=HOST, MASTER_PORT=str(free_port())),
                            cwd=TREE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert store.stdout is not None and rank.stdout is not None
        await asyncio.to_thread(store.stdout.readline)
        host, _, rank_port = (await asyncio.to_thread(rank.stdout.readline)).strip().rpartition("|")
        out = {}
        for v in (1, 2):
            hello = msgpack.packb({"op": "hello", "proto": "aiodist-store", "v": v}, use_bin_type=True)
            out[f"store (hello v{v} + 100 MiB claim)"] = await growth(
                store.pid, port, PREAMBLE + struct.pack("<IQ", len(hello), 100 << 20) + hello)
        hello = msgpack.packb({"t": "hello", "job": "?"}, use_bin_type=True)
        out["rank listener (512 MiB claim)"] = await growth(
            rank.pid, int(rank_port), PREAMBLE + struct.pack("<IQ", len(hello), 512 << 20) + hello)
        return out
    finally:
        for p in (store, rank):
            p.terminate()
            p.wait(10)


# ------------------------------------------------------------------ load with unauthenticated sockets open


def _clients(port: int, n: int, rounds: int, pause: float, out: Any) -> None:
    async def run() -> list[float]:
        stores = await asyncio.gather(*(TCPStore.connect(HOST, port, timeout=60) for _ in range(n)))
        lat: list[float] = []

        async def client(i: int, c: TCPStore) -> None:
            rng = random.Random(i)
            for j in range(rounds):
                await asyncio.sleep(rng.uniform(0, 2 * pause))  # spread out: an open system, not a closed loop
                t = time.perf_counter()
                await c.set(f"k{i}", b"v" * 32)
                lat.append(time.perf_counter() - t)
                t = time.perf_counter()
                await c.get(f"k{i}")
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(client(i, c) for i, c in enumerate(stores)))
        await asyncio.gather(*(c.close() for c in stores))
        return lat

    from aiodist.eventloop import run as run_loop

    out.send(run_loop(run()))


async def load(clients: int, pause: float) -> dict[str, Any]:
    import multiprocessing as mp

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * clients + 256)), hard))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c",
         "import resource,sys; s,h=resource.getrlimit(resource.RLIMIT_NOFILE); "
         "resource.setrlimit(resource.RLIMIT_NOFILE,(h,h)); sys.argv=['aiodist']+sys.argv[1:]; "
         "from aiodist.cli import main; sys.exit(main())",
         "store", "serve", "--port", str(port), "--handshake-timeout", "120"],
        cwd=TREE, env=child_env(TREE), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        await asyncio.to_thread(server.stdout.readline)
        idle = []
        for _ in range(clients):
            s = socket.create_connection((HOST, port))
            s.sendall(PREAMBLE)  # and nothing more: an unauthenticated socket sitting open
            idle.append(s)
        ctx = mp.get_context("spawn")
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_clients, args=(port, clients, 20, pause, send))
        t0 = time.monotonic()
        p.start()
        send.close()
        try:
            lat = sorted(await asyncio.to_thread(recv.recv))
        except EOFError:
            raise RuntimeError(f"the client process failed (exit {p.exitcode}); see its traceback above") from None
        elapsed = time.monotonic() - t0
        p.join(30)
        still_open = sum(1 for s in idle if _open(s))
        for s in idle:
            s.close()
        q = statistics.quantiles(lat, n=100)
        return {"ops": len(lat), "p50 ms": q[49] * 1e3, "p99 ms": q[98] * 1e3, "max ms": lat[-1] * 1e3,
                "unauthenticated open": still_open, "seconds": elapsed}
    finally:
        server.terminate()
        server.wait(10)


def _open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1 << 16, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ the handshake's cost


async def handshake(n: int = 300) -> dict[str, Any]:
    out: dict[str, Any] = {}
    variants: list[tuple[str, dict[str, Any]]] = [("connect, no authentication in this tree", {})]
    authenticates = "secret" in inspect.signature(StoreServer.start).parameters
    if authenticates:
        variants = [("connect, authenticated", {"secret": b"s" * 32}), ("connect, secret=None", {"secret": None})]
    for name, kw in variants:
        async with await StoreServer.start(HOST, 0, **kw) as srv:
            times = []
            for _ in range(n):
                t = time.perf_counter()
                c = await TCPStore.connect(HOST, srv.port, timeout=10, **kw)
                times.append(time.perf_counter() - t)
                await c.close()
            out[f"{name} (ms)"] = statistics.median(times) * 1e3
    if authenticates:
        from aiodist import auth

        t = time.perf_counter()
        for _ in range(n):
            d = auth.Dialer(b"s" * 32, purpose="store", binding=b"b", nonce=os.urandom(32))
            a = auth.Acceptor(b"s" * 32, purpose="store", binding=b"b", nonce=os.urandom(32))
            a.verify(d.answer(a.challenge(d.hello())))
        out["four handshake messages, no I/O (ms)"] = (time.perf_counter() - t) / n * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="attack,rss,load,handshake")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--pause", type=float, default=0.25,
                    help="mean seconds between a client's set+get rounds (default 0.25; 0: as fast as possible)")
    args = ap.parse_args()
    print(f"tree: {TREE}")
    parts = args.only.split(",")
    if "attack" in parts:
        print("attack:", asyncio.run(attack()))
    if "rss" in parts:
        for what, grew in asyncio.run(rss_attack()).items():
            print(f"rss: {what}: {grew / 2**20:+.1f} MB")
    if "load" in parts:
        r = asyncio.run(load(args.clients, args.pause))
        print(f"load: {args.clients} authenticated clients, set+get x20 each, ~{args.pause:g} s apart, "
              f"{r['unauthenticated open']} "
              f"unauthenticated sockets open: p50 {r['p50 ms']:.1f} ms, p99 {r['p99 ms']:.1f} ms, "
              f"max {r['max ms']:.1f} ms ({r['ops']} ops in {r['seconds']:.1f} s)")
    if "handshake" in parts:
        for what, ms in asyncio.run(handshake()).items():
            print(f"handshake: {what}: {ms:.3f}")


if __name__ == "__main__":
    main()
