"""The ceiling: what plain sockets move over 127.0.0.1 here, without aiodist, asyncio or Python per byte.

    python benchmarks/loopback_bench.py [--mib 64] [--reps 5]

Two processes, blocking sockets, ``sendall`` / ``recv_into`` on preallocated
buffers (the kernel copies; no Python code runs per byte). It prints the
median GB/s of:

* ``one way``: process A sends S bytes, B receives them;
* ``both ways``: A and B each send S bytes to the other at the same time (a
  thread per direction in each process), what every rank of a 2-rank ring
  all_reduce does; the rate is S / time, per direction.

A 2-rank all_reduce moves S bytes each way per rank (reduce-scatter plus
all-gather, half each), so its bus bandwidth (nccl-tests: 2(p-1)/p * S / t = S / t)
cannot exceed the ``both ways`` rate, whatever the implementation. That puts
the collectives benchmark's ratios in perspective.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import threading
import time
from typing import Any

_CHUNK = 1 << 20


def _send_all(sock: socket.socket, buf: memoryview) -> None:
    sock.sendall(buf)


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
        t = threading.Thread(target=_send_all, args=(sock, out))
        t.start()
        _recv_all(sock, inp)
        t.join()
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
        t = threading.Thread(target=_send_all, args=(sock, out))
        t.start()
        _recv_all(sock, inp)
        t.join()
        both.append(nbytes / (time.perf_counter() - t0) / 1e9)
    sock.close()
    listener.close()
    proc.join(30)
    return {"one way": statistics.median(one), "both ways": statistics.median(both)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", default="4,64", help="comma-separated message sizes in MiB (default 4,64)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"{'size':>8}  {'one way GB/s':>13}  {'both ways GB/s (each)':>22}")
    for mib in (int(m) for m in args.mib.split(",")):
        r = measure(mib << 20, args.reps)
        print(f"{mib:>5} MiB  {r['one way']:>13.2f}  {r['both ways']:>22.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
