"""Async handles overlapped with compute, written the torch.distributed way plus ``await``.

    aiodist run -n 4 examples/torch_async_overlap.py
    python -m sim run -n 4 examples/torch_async_overlap.py

The gradient of each "layer" is all-reduced with ``async_op=True`` as soon as
it is computed, while the next layer's computation runs in a worker thread
(``aiodist.compute``: compute that blocks the event loop would hold the
communication up). Then every handle is waited for, in the order they were
started: ``work.wait()``, ``await work``, ``work.get_future()`` and
``work.is_completed()``, as in torch.
"""

from __future__ import annotations

import numpy as np

import aiodist as dist

LAYERS = 6
SIZE = 20_000


def backward(layer: int, rank: int) -> np.ndarray:
    """This rank's gradient of one layer (numpy work: it runs in a thread)."""
    rng = np.random.default_rng(100 * layer + rank)
    a = rng.standard_normal((SIZE // 100, 100))
    return (a @ np.ones(100) / 100).repeat(100)[:SIZE]


async def main() -> list[float]:
    await dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    grads, works = [], []
    for layer in range(LAYERS):
        grad = await dist.compute(backward, layer, rank)  # the reductions started before run meanwhile
        grads.append(grad)
        works.append(dist.all_reduce(grad, op=dist.ReduceOp.SUM, async_op=True))

    futures = [w.get_future() for w in works[:2]]  # torch's get_future(): an awaitable future
    for f in futures:
        await f
    for w in works[2:4]:
        await w.wait()
    for w in works[4:]:
        await w
    assert all(w.is_completed() for w in works)

    sums = [round(float(g.sum()) / world_size, 6) for g in grads]
    print(f"rank {rank}: averaged gradient sums {sums}")
    await dist.destroy_process_group()
    return sums
