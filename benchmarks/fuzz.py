"""Fuzz a live store server and a live rank listener with hostile connections; count crashes, hangs, memory.

    PYTHONPATH=. python benchmarks/fuzz.py [--cases 100000] [--seed 0] [--targets store,rank]
        [--concurrency 64] [--check-every 500]

Each target runs in its own process (``aiodist store serve``; one rank of an
``init_process_group`` job): the fuzzer opens a connection per case and sends
one of twelve kinds of input (random bytes, a broken preamble, truncated
frames, huge length prefixes, headers of the wrong type, hellos with mangled
authentication fields, forged or missing answers, garbage after a valid
hello, and -- for the store, after an authenticated handshake -- random
requests, huge or truncated frames and floods of tiny frames), reads what
comes back for a moment, and resets the connection. Every ``--check-every``
cases a well-behaved client must still be served within 5 s (else a *hang*);
the process must still be alive (else a *crash*); its RSS is sampled.
Prints, per target: cases, crashes, hangs, RSS at the start and its maximum
growth, cases per second. Cases are drawn from ``random.Random(seed)``:
a run replays.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

import aiodist
from aiodist import auth
from aiodist.store import TCPStore
from aiodist.store import protocol as P
from aiodist.wire import PREAMBLE

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # the attacks' tools, shared with the tests
from attacker import HOST, LISTENING_RANK, child_env, rss  # noqa: E402
from rank_procs import free_port  # noqa: E402

SECRET = "fuzzing-" + auth.new_secret()
TREE = str(Path(aiodist.__file__).resolve().parents[1])
STORE_OPS = ["set", "get", "add", "compare_set", "append", "check", "wait", "delete_key", "num_keys", "multi_get",
             "multi_set", "queue_push", "queue_pop", "queue_len", "cancel", "unpop", "ping", "hello", "answer"]


# ------------------------------------------------------------------ inputs


def frame(header: Any, payload: bytes = b"", *, hlen: int | None = None, plen: int | None = None) -> bytes:
    h = msgpack.packb(header, use_bin_type=True)
    return struct.pack("<IQ", len(h) if hlen is None else hlen, len(payload) if plen is None else plen) + h + payload


def junk_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 2 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randrange(-(2**63), 2**64)
    if kind == 3:
        return rng.choice([float("nan"), float("inf"), -1.0, 1e308, rng.random()])
    if kind == 4:
        return "".join(rng.choice("ak/0\u00e9\ud7ff") for _ in range(rng.randrange(12)))
    if kind == 5:
        return rng.randbytes(rng.randrange(40))
    if kind == 6:
        return rng.randrange(-5, 100)
    if kind == 7:
        return [junk_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(junk_value(rng, depth + 1))[:6]: junk_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def store_request(rng: random.Random, rid: int) -> bytes:
    h: dict[str, Any] = {"op": rng.choice(STORE_OPS), "id": rid if rng.random() < 0.9 else junk_value(rng)}
    for f in rng.sample(["k", "ks", "v", "l", "n", "t", "c"], rng.randrange(4)):
        h[f] = rng.choice([junk_value(rng), f"key{rng.randrange(50)}", [b"v" * rng.randrange(100)],
                           [f"key{rng.randrange(50)}"], rng.random() * 0.05])
    payload = rng.randbytes(rng.randrange(64)) if rng.random() < 0.2 else b""
    return frame(h, payload)


def rank_hello(rng: random.Random) -> dict[str, Any]:
    h: dict[str, Any] = {"t": "hello", "job": rng.choice(["?", junk_value(rng)]), "rank": rng.randrange(-1, 3),
                         "world": rng.choice([1, 2, junk_value(rng)])}
    if rng.random() < 0.7:
        h["nonce"] = rng.choice([os.urandom(32), junk_value(rng)])
    return h


KINDS = ("random bytes", "broken preamble", "truncated frame", "huge length", "not a map", "mangled hello",
         "garbage answer", "forged proof", "garbage after hello", "requests after auth", "huge frame after auth",
         "tiny-frame flood")
AUTHENTICATED = {"requests after auth", "huge frame after auth", "tiny-frame flood"}


def case(rng: random.Random, kind: str, target: str) -> bytes:
    """The bytes one hostile connection sends (after the handshake, for the AUTHENTICATED kinds)."""
    hello = P.hello({"nonce": os.urandom(32)}) if target == "store" else rank_hello(rng)
    if kind == "random bytes":
        return rng.randbytes(rng.randrange(1, 200))
    if kind == "broken preamble":
        pre = bytearray(PREAMBLE)
        pre[rng.randrange(len(pre))] ^= 1 << rng.randrange(8)
        return bytes(pre) + frame(hello)
    if kind == "truncated frame":
        data = PREAMBLE + frame(hello, rng.randbytes(rng.randrange(100)))
        return data[: rng.randrange(1, len(data))]
    if kind == "huge length":
        return PREAMBLE + frame(hello, hlen=rng.choice([0, 2**32 - 1, 1 << 20, 4097]) if rng.random() < 0.5 else None,
                                plen=rng.choice([2**64 - 1, 1 << 30, 1 << 40, 5000]))
    if kind == "not a map":
        return PREAMBLE + struct.pack("<IQ", 5, 0) + rng.choice([b"\x93\x01\x02\x03\xc0", b"\xc1" * 5, b"\xa4abcd"])
    if kind == "mangled hello":
        h = dict(hello)
        for f in rng.sample(sorted(h), rng.randrange(1, len(h) + 1)):
            h[f] = junk_value(rng)
        return PREAMBLE + frame(h)
    if kind == "garbage answer":
        return PREAMBLE + frame(hello) + frame(junk_value(rng) if rng.random() < 0.5 else {"op": "answer"})
    if kind == "forged proof":
        return PREAMBLE + frame(hello) + frame({"op": "answer", "proof": rng.randbytes(32)})
    if kind == "garbage after hello":
        return PREAMBLE + frame(hello) + rng.randbytes(rng.randrange(1, 300))
    if kind == "requests after auth":
        return b"".join(store_request(rng, i) for i in range(rng.randrange(1, 20)))
    if kind == "huge frame after auth":
        return frame({"op": "set", "id": 1, "k": "big", "l": [1 << 29]}, plen=rng.choice([1 << 29, 1 << 40, 2**64 - 1]))
    return frame({"op": "ping"}) * rng.randrange(100, 2000)


async def authenticate(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
    dialer = auth.Dialer(SECRET.encode(), purpose="store", binding=P.AUTH_BINDING, nonce=os.urandom(32))
    w.write(PREAMBLE + frame(P.hello(dialer.hello())))
    if await r.readexactly(8) != PREAMBLE:
        return False
    for step in range(2):
        hlen, plen = struct.unpack("<IQ", await r.readexactly(12))
        header = msgpack.unpackb(await r.readexactly(hlen))
        await r.readexactly(plen)
        if step == 0:
            w.write(frame(P.answer(dialer.answer(header))))
    return bool(header.get("op") == "hello")


async def one_case(port: int, data: bytes, authenticated: bool) -> None:
    r, w = await asyncio.open_connection(HOST, port)
    sock = w.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset: no TIME_WAIT
    try:
        async with asyncio.timeout(2.0):
            if authenticated and not await authenticate(r, w):
                raise AssertionError("the fuzzer could not authenticate")
        w.write(data)
        try:
            async with asyncio.timeout(0.05):
                while await r.read(65536):
                    pass
        except TimeoutError:
            pass
    except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError):
        pass
    finally:
        w.transport.abort()


# ------------------------------------------------------------------ targets


def env(**extra: str) -> dict[str, str]:
    """A target's environment: the fuzzer's secret (the health checks authenticate with it), aiodist of this tree."""
    return child_env(TREE, AIODIST_SECRET=SECRET, **extra)


def start(target: str) -> tuple[subprocess.Popen[str], int, Callable[[], Any]]:
    """The target's process, the port to fuzz, and a health check (a coroutine function)."""
    if target == "store":
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "aiodist", "store", "serve", "--port", str(port),
                                 "--handshake-timeout", "2"], env=env(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None and "listening" in proc.stdout.readline()

        async def healthy() -> Any:
            async with await TCPStore.connect(HOST, port, secret=SECRET, timeout=5) as c:
                return await c.add("health", 1)

        return proc, port, healthy
    store_port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", LISTENING_RANK], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=env(RANK="0", WORLD_SIZE="1", MASTER_ADDR=HOST, MASTER_PORT=str(store_port)))
    assert proc.stdout is not None
    host, _, port = proc.stdout.readline().strip().rpartition("|")

    async def listening() -> Any:
        r, w = await asyncio.open_connection(host, int(port))
        try:
            return await r.readexactly(len(PREAMBLE)) == PREAMBLE
        finally:
            w.close()

    return proc, int(port), listening


async def fuzz(target: str, cases: int, seed: int, concurrency: int, check_every: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}/{target}")
    kinds = [k for k in KINDS if target == "store" or k not in AUTHENTICATED]
    proc, port, healthy = start(target)
    await asyncio.sleep(0.5)
    rss0 = rss(proc.pid)
    peak = rss0
    crashes = hangs = 0
    done = 0
    by_kind: Counter[str] = Counter()
    t0 = time.monotonic()
    try:
        while done < cases:
            batch = min(check_every, cases - done)
            sem = asyncio.Semaphore(concurrency)

            async def bounded(data: bytes, authd: bool) -> None:
                async with sem:
                    await one_case(port, data, authd)

            jobs = []
            for _ in range(batch):
                kind = rng.choice(kinds)
                by_kind[kind] += 1
                jobs.append(bounded(case(rng, kind, target), kind in AUTHENTICATED))
            await asyncio.gather(*jobs)
            done += batch
            peak = max(peak, rss(proc.pid))
            if proc.poll() is not None:
                crashes += 1
                print(f"{target}: the process died (exit {proc.returncode}) after {done} cases", file=sys.stderr)
                proc, port, healthy = start(target)
                continue
            try:
                async with asyncio.timeout(5):
                    await healthy()
            except Exception as e:  # noqa: BLE001 - any failure of a good client is a finding
                hangs += 1
                print(f"{target}: a good client was not served after {done} cases: {e!r}", file=sys.stderr)
    finally:
        proc.terminate()
        proc.wait(10)
    elapsed = time.monotonic() - t0
    return {"target": target, "cases": done, "crashes": crashes, "hangs": hangs, "rss0": rss0,
            "growth": peak - rss0, "rate": done / elapsed, "kinds": len(by_kind)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000, help="cases per target (default: 100000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default="store,rank")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--check-every", type=int, default=500)
    args = ap.parse_args()
    rows = [asyncio.run(fuzz(t, args.cases, args.seed, args.concurrency, args.check_every))
            for t in args.targets.split(",")]
    print(f"{'target':8} {'cases':>8} {'kinds':>5} {'crashes':>7} {'hangs':>5} {'RSS start':>10} {'max growth':>11} {'cases/s':>8}")
    for r in rows:
        print(f"{r['target']:8} {r['cases']:>8} {r['kinds']:>5} {r['crashes']:>7} {r['hangs']:>5} "
              f"{r['rss0'] / 2**20:>8.1f}MB {r['growth'] / 2**20:>9.1f}MB {r['rate']:>8.0f}")


if __name__ == "__main__":
    main()
