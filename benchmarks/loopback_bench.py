"""The ceilings: what plain sockets do over 127.0.0.1 here, without aiodist.

    python benchmarks/loopback_bench.py [--mib 4,64] [--reps 5] [--round-trips 20000]

Bandwidth.
Two processes, blocking sockets, ``sendall`` / ``recv_into`` on preallocated
buffers (the kernel copies; no Python code runs per byte). It prints the
median GB/s of:

* ``one way``: process A sends S bytes, B receives them;
* ``both ways``: A and B each send S bytes to the other at the same time, each
  from one thread with a non-blocking socket (as a rank's event loop does),
  what every rank of a 2-rank ring all_reduce does; the rate is S / time, per
  direction.

A 2-rank all_reduce moves S bytes each way per rank (reduce-scatter plus
all-gather, half each), so its bus bandwidth (nccl-tests: 2(p-1)/p * S / t = S / t)
cannot exceed the ``both ways`` rate, whatever the implementation. That puts
the collectives benchmark's ratios in perspective.

Latency. The median round trip of a 40-byte ping-pong between two processes:

* ``blocking sockets``: ``sendall`` / ``recv`` in a loop on both sides;
* ``asyncio + uvloop``: both sides asyncio protocols on uvloop, the client
  awaiting a future per round trip -- no framing, no protocol, nothing but
  the event loops. No asyncio client and server (a store, a collective) can
  answer faster than this; the store benchmark's sequential rows compare
  against it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import selectors
import statistics
import time
from typing import Any

_CHUNK = 1 << 20


def _exchange(sock: socket.socket, out: memoryview, inp: memoryview) -> None:
    """Send ``out`` while receiving ``inp`` on one non-blocking socket, one thread (as a rank's loop does)."""
    sel = selectors.DefaultSelector()
    sock.setblocking(False)
    sent = got = 0
    n_out, n_in = out.nbytes, inp.nbytes
    try:
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while sent < n_out or got < n_in:
            want = (selectors.EVENT_READ if got < n_in else 0) | (selectors.EVENT_WRITE if sent < n_out else 0)
            sel.modify(sock, want)
            for _, events in sel.select(5.0):
                if events & selectors.EVENT_WRITE:
                    try:
                        sent += sock.send(out[sent : sent + _CHUNK * 4])
                    except BlockingIOError:
                        pass
                if events & selectors.EVENT_READ:
                    try:
                        k = sock.recv_into(inp[got : got + _CHUNK * 4])
                    except BlockingIOError:
                        continue
                    if k == 0:
                        raise ConnectionError("peer closed")
                    got += k
    finally:
        sel.close()
        sock.setblocking(True)


def _recv_all(sock: socket.socket, buf: memoryview) -> None:
    got = 0
    n = buf.nbytes
    while got < n:
        k = sock.recv_into(buf[got : got + min(_CHUNK * 8, n - got)])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def _peer(port: int, nbytes: int, reps: int, ready: Any) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = memoryview(bytearray(nbytes))
    inp = memoryview(bytearray(nbytes))
    ready.send(True)
    for _ in range(reps):  # one way: receive
        _recv_all(sock, inp)
        sock.sendall(b"k")
    for _ in range(reps):  # both ways
        _exchange(sock, out, inp)
    sock.close()


def measure(nbytes: int, reps: int) -> dict[str, float]:
    """Median GB/s one way and both ways (per direction) for messages of ``nbytes``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    ctx = mp.get_context("spawn")
    ready_r, ready_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_peer, args=(port, nbytes, reps, ready_w))
    proc.start()
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ready_r.recv()
    out = memoryview(bytearray(nbytes))
    inp = memoryview(bytearray(nbytes))
    one, both = [], []
    ack = bytearray(1)
    for _ in range(reps):
        t0 = time.perf_counter()
        sock.sendall(out)
        sock.recv_into(ack)  # the peer has everything
        one.append(nbytes / (time.perf_counter() - t0) / 1e9)
    for _ in range(reps):
        t0 = time.perf_counter()
        _exchange(sock, out, inp)
        both.append(nbytes / (time.perf_counter() - t0) / 1e9)
    sock.close()
    listener.close()
    proc.join(30)
    return {"one way": statistics.median(one), "both ways": statistics.median(both)}


# ------------------------------------------------------------------ latency

_PING = b"p" * 40


def _blocking_echo(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        data = sock.recv(4096)
        if not data:
            return
        sock.sendall(data)


def _uvloop_echo(ready: Any) -> None:
    import asyncio

    from aiodist.eventloop import run

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            done.set()

    done: Any = None

    async def serve() -> None:
        nonlocal done
        done = asyncio.Event()
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        ready.send(server.sockets[0].getsockname()[1])
        await done.wait()
        server.close()

    run(serve())


def blocking_round_trip(n: int) -> float:
    """Median microseconds per round trip, blocking sockets on both sides."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    proc = mp.get_context("spawn").Process(target=_blocking_echo, args=(listener.getsockname()[1],))
    proc.start()
    sock, _ = listener.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(_PING)
        got = 0
        while got < len(_PING):
            got += len(sock.recv(4096))
        times.append(time.perf_counter() - t0)
    sock.close()
    listener.close()
    proc.join(10)
    return statistics.median(times) * 1e6


def uvloop_round_trip(n: int) -> float:
    """Median microseconds per round trip, asyncio protocols on uvloop on both sides."""
    import asyncio

    from aiodist.eventloop import run

    ctx = mp.get_context("spawn")
    ready_r, ready_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_uvloop_echo, args=(ready_w,))
    proc.start()
    port = ready_r.recv()

    class Client(asyncio.Protocol):
        waiter: Any = None
        got = 0

        def data_received(self, data: bytes) -> None:
            self.got += len(data)
            if self.got >= len(_PING) and self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

    async def client() -> float:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_connection(Client, "127.0.0.1", port)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(n):
            proto.got = 0
            proto.waiter = loop.create_future()
            t0 = time.perf_counter()
            transport.write(_PING)
            await proto.waiter
            times.append(time.perf_counter() - t0)
        transport.close()
        return statistics.median(times) * 1e6

    try:
        return run(client())
    finally:
        proc.join(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", default="4,64", help="comma-separated message sizes in MiB (default 4,64)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--round-trips", type=int, default=20000, help="per latency row (0: skip)")
    args = parser.parse_args(argv)
    if args.round_trips:
        print(f"{'round trip, 40 B':<28}{'median us':>10}")
        print(f"{'blocking sockets':<28}{blocking_round_trip(args.round_trips):>10.1f}")
        print(f"{'asyncio + uvloop':<28}{uvloop_round_trip(args.round_trips):>10.1f}")
    print(f"{'size':>8}  {'one way GB/s':>13}  {'both ways GB/s (each)':>22}")
    for mib in (int(m) for m in args.mib.split(",")):
        r = measure(mib << 20, args.reps)
        print(f"{mib:>5} MiB  {r['one way']:>13.2f}  {r['both ways']:>22.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
