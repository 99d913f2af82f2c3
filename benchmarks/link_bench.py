"""What setting up a rank link costs: the handshake's CPU, and a whole link over TCP on 127.0.0.1.

* handshake CPU: both sides of :mod:`aiodist.comm.handshake` run in a loop
  without I/O (nonces, four HMAC-SHA256 proofs, header building), with the
  job's secret and with authentication off: the difference is what
  authentication costs per connection.
* link set-up: two transports in this process; the first message from rank 0
  to rank 1 includes the address lookup, the connect and the handshake, the
  second one does not: their difference is the set-up of one link.
* per message: over an established link, rank 0 and rank 1 exchange small
  keyed messages (a ping-pong); process CPU time per round trip (both ranks
  share this process), which a loaded machine disturbs less than wall time.

Medians over the repetitions, in microseconds. Run it with ``PYTHONPATH`` set
to another checkout to compare (a build without authentication shows one
column of link set-up).

    python benchmarks/link_bench.py [--repeat 200]

Wall-clock time (``time.perf_counter``) is right here: this is a harness
outside the runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("PYTHONPATH") is None and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from aiodist.comm import GroupComm, OpChannel, Transport  # noqa: E402
from aiodist.store import MemoryStore  # noqa: E402

SECRET = b"a secret of 32 bytes, more or less"


def handshake_cpu(secret: bytes | None, repeat: int) -> float:
    from aiodist.comm.handshake import AcceptHandshake, DialHandshake

    addr = b"127.0.0.1|40000"
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        nd, na = (os.urandom(32), os.urandom(32)) if secret is not None else (b"", b"")
        d = DialHandshake(secret, job="job", rank=1, world=2, peer_rank=0, address=addr, nonce=nd)
        a = AcceptHandshake(secret, job="job", rank=0, world=2, address=addr, nonce=na)
        answer = d.on_reply(a.on_hello(d.hello()))
        a.on_answer(answer)  # type: ignore[arg-type]
        d.on_verdict({"t": "welcome"})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def link_setup(secret: Any, repeat: int) -> float:
    kw = {} if secret == "n/a" else {"secret": secret}
    costs = []
    for i in range(repeat):
        store = MemoryStore()
        ts = [await Transport.start(rank=r, world_size=2, job_id=f"j{i}", store=store, key_prefix="t/", timeout=10.0,
                                    **kw) for r in range(2)]
        chans = []
        for t in ts:
            t.register_group(0, (0, 1))
            chans.append(OpChannel(GroupComm(t, 0, (0, 1), name="bench"), op="bench", seq=0, sig="bench"))
        took = []
        for k in range(2):
            t0 = time.perf_counter()
            await asyncio.gather(chans[0].send(1, ("m", k), b"x"), chans[1].recv_bytes(0, ("m", k)))
            took.append(time.perf_counter() - t0)
        costs.append(took[0] - took[1])
        for t in ts:
            await t.close()
    return statistics.median(costs) * 1e6


async def ping_pong(secret: Any, rounds: int) -> float:
    kw = {} if secret == "n/a" else {"secret": secret}
    store = MemoryStore()
    ts = [await Transport.start(rank=r, world_size=2, job_id="pp", store=store, key_prefix="t/", timeout=10.0, **kw)
          for r in range(2)]
    comms = []
    for t in ts:
        t.register_group(0, (0, 1))
        comms.append(GroupComm(t, 0, (0, 1), name="bench"))
    out = bytearray(64)

    async def one(seq: int) -> None:
        a = OpChannel(comms[0], op="bench", seq=seq, sig="bench")
        b = OpChannel(comms[1], op="bench", seq=seq, sig="bench")
        await asyncio.gather(a.send(1, ("p",), out), b.recv_into(0, ("p",), memoryview(bytearray(64))))
        await asyncio.gather(b.send(0, ("q",), out), a.recv_into(1, ("q",), memoryview(bytearray(64))))

    for seq in range(200):  # warm-up (and the link)
        await one(seq)
    t0 = time.process_time()
    for seq in range(200, 200 + rounds):
        await one(seq)
    took = time.process_time() - t0
    for t in ts:
        await t.close()
    return took / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--messages", type=int, default=0, help="only the per-message ping-pong, this many round trips")
    args = ap.parse_args()
    if args.messages:
        secret = SECRET if "secret" in inspect.signature(Transport.start).parameters else "n/a"
        from aiodist.eventloop import run  # (uvloop when available, as ranks run)

        print(f"per message round trip (CPU): {run(ping_pong(secret, args.messages)):.1f} us")
        return
    has_auth = "secret" in inspect.signature(Transport.start).parameters
    print(f"{'':24}{'with secret':>14}{'auth off':>14}   (median us, {args.repeat} repetitions)")
    if has_auth:
        print(f"{'handshake CPU':24}{handshake_cpu(SECRET, args.repeat * 10):14.1f}"
              f"{handshake_cpu(None, args.repeat * 10):14.1f}")
        on = asyncio.run(link_setup(SECRET, args.repeat))
        off = asyncio.run(link_setup(None, args.repeat))
        print(f"{'link set-up (TCP)':24}{on:14.1f}{off:14.1f}")
    else:
        print(f"{'link set-up (TCP)':24}{'-':>14}{asyncio.run(link_setup('n/a', args.repeat)):14.1f}   (no authentication)")


if __name__ == "__main__":
    main()
