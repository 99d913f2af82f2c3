"""Data-parallel SGD written the torch.distributed way, with only ``await`` added.

    aiodist run -n 4 examples/torch_ddp_sgd.py
    python -m sim run -n 4 examples/torch_ddp_sgd.py

A linear regression trained on 4 ranks: rank 0's initial weights are
broadcast, each rank computes the gradient of its shard of the data, the
gradients are averaged with ``all_reduce`` (torch's ``async_op=True`` handle,
``ReduceOp.SUM`` then a division, as DDP does), and every rank takes the
same step. torch's forms as written: ``init_process_group("gloo",
"env://", timeout=timedelta(...))``, ``tensor=`` keywords, ``group.WORLD``,
``all_reduce_coalesced``. Each rank prints its final loss and a checksum of
its weights (equal on every rank, and under the simulator).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np

import aiodist as dist

STEPS = 30
LR = 0.1


def make_data(rank: int, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard of a fixed data set (y = X @ w_true + noise)."""
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(64 * world_size, 8))
    w_true = np.arange(1.0, 9.0) / 8
    y = x @ w_true + 0.01 * rng.normal(size=len(x))
    return x[rank::world_size], y[rank::world_size]


async def main() -> list[float]:
    await dist.init_process_group("gloo", "env://", timeout=timedelta(seconds=60))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = make_data(rank, world_size)

    weight = np.random.default_rng(rank).normal(size=8)  # different on every rank ...
    bias = np.zeros(1)
    await dist.broadcast(tensor=weight, src=0, group=dist.group.WORLD)  # ... until rank 0's are broadcast
    for _ in range(STEPS):
        err = x @ weight + bias[0] - y
        grad_w = (x.T @ err) / len(y)
        grad_b = np.array([err.mean()])
        work = dist.all_reduce(grad_w, op=dist.ReduceOp.SUM, async_op=True)
        await dist.all_reduce_coalesced([grad_b], op=dist.ReduceOp.SUM)
        await work.wait()
        weight -= LR * grad_w / world_size
        bias -= LR * grad_b / world_size

    loss = np.array([float(np.mean((x @ weight + bias[0] - y) ** 2))])
    await dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    checksums = [None] * world_size
    await dist.all_gather_object(checksums, round(float(weight.sum() + bias[0]), 10))
    assert len(set(checksums)) == 1, f"the ranks' weights differ: {checksums}"
    print(f"rank {rank}: loss {loss[0]:.6f} weights {np.round(weight, 4).tolist()} checksum {checksums[0]}")
    await dist.destroy_process_group()
    return [round(float(v), 10) for v in weight]
