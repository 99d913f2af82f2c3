"""The ring all-reduce of PyTorch's tutorial "Writing Distributed Applications with PyTorch", with aiodist.

    aiodist run -n 4 examples/tutorial_ring.py
    python -m sim run -n 4 examples/tutorial_ring.py

The tutorial's code with ``await`` added and numpy arrays for tensors, and,
like the tutorial, without ``destroy_process_group()``: when ``main`` returns,
the runner finishes the rank (its group is destroyed in order, so a peer
still finishing its last receive gets its data). Every rank checks the result
(the sum of every rank's ``rank + 1``) and returns it.
"""

from __future__ import annotations

import numpy as np

import aiodist


async def allreduce(send: np.ndarray, recv: np.ndarray) -> None:
    rank = aiodist.get_rank()
    size = aiodist.get_world_size()
    send_buff = send.copy()
    recv_buff = send.copy()
    accum = send.copy()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = aiodist.isend(send_buff, right)
            await aiodist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = aiodist.isend(recv_buff, right)
            await aiodist.recv(send_buff, left)
            accum[:] += send_buff[:]
        await send_req.wait()
    recv[:] = accum[:]


async def main() -> float:
    await aiodist.init_process_group()
    rank, size = aiodist.get_rank(), aiodist.get_world_size()
    t = np.full(4, float(rank + 1))
    out = np.zeros(4)
    await allreduce(t, out)
    expected = size * (size + 1) / 2
    if not np.all(out == expected):
        raise AssertionError(f"rank {rank}: got {out}, expected {expected}")
    print(f"Rank {rank} has data {out[0]}")
    return float(out[0])
