"""A parameter server with point-to-point messages and tags, written the torch.distributed way plus ``await``.

    aiodist run -n 4 examples/torch_param_server.py
    python -m sim run -n 4 examples/torch_param_server.py

Rank 0 holds the parameters; every other rank is a worker. Each step a
worker ``isend``s its gradient to the server (tag 1) and ``irecv``s the new
parameters (tag 2). The server receives the gradients from any source
(``irecv`` with no ``src``: the handle returns the sender), applies them in
rank order (so the result does not depend on who was first), and sends the
parameters back with ``P2POp`` + ``batch_isend_irecv``. At the end the server
tells each worker to stop with ``send_object_list`` (tag 3). Every rank
prints a checksum of the final parameters.
"""

from __future__ import annotations

import numpy as np

import aiodist as dist

GRAD, PARAMS, CONTROL = 1, 2, 3
STEPS = 10
LR = 0.05
DIM = 16


def gradient(params: np.ndarray, rank: int, step: int) -> np.ndarray:
    """A worker's gradient: pulls the parameters toward a target of its own."""
    target = np.linspace(-1.0, 1.0, DIM) * rank + step * 0.01
    return params - target


async def server(world_size: int) -> np.ndarray:
    params = np.zeros(DIM)
    workers = range(1, world_size)
    for step in range(STEPS):
        grads = {w: np.zeros(DIM) for w in workers}
        inbox = [np.zeros(DIM) for _ in workers]
        handles = [dist.irecv(buf, tag=GRAD) for buf in inbox]  # any source: each handle says who sent
        for buf, handle in zip(inbox, handles):
            sender = await handle.wait()
            grads[sender][:] = buf
        for w in workers:  # rank order: the same result however the messages raced
            params -= LR * grads[w]
        ops = [dist.P2POp(dist.isend, params.copy(), w, tag=PARAMS) for w in workers]
        for work in dist.batch_isend_irecv(ops):
            await work.wait()
    for w in workers:
        await dist.send_object_list([{"stop": True, "steps": STEPS}], dst=w, tag=CONTROL)
    return params


async def worker(rank: int) -> np.ndarray:
    params = np.zeros(DIM)
    for step in range(STEPS):
        send = dist.isend(gradient(params, rank, step), dst=0, tag=GRAD)
        await dist.irecv(params, src=0, tag=PARAMS).wait()
        await send.wait()
    control: list[object] = [None]
    await dist.recv_object_list(control, src=0, tag=CONTROL)
    assert control[0] == {"stop": True, "steps": STEPS}, control
    return params


async def main() -> float:
    await dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    params = await server(world_size) if rank == 0 else await worker(rank)
    checksum = round(float(params.sum()), 10)
    print(f"rank {rank}: parameters after {STEPS} steps, checksum {checksum}, first {params[0]:.6f}")
    await dist.destroy_process_group()
    return checksum
