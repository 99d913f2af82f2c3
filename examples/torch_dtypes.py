"""Unusual dtypes and torch CPU tensors, written the torch.distributed way plus ``await``.

    aiodist run -n 4 examples/torch_dtypes.py
    python -m sim run -n 4 examples/torch_dtypes.py

numpy arrays of bfloat16 (through ``ml_dtypes``), float16, int8, uint64,
bool, complex64; a Fortran-order array; ``PREMUL_SUM``. When torch is
importable: torch CPU tensors of several dtypes (bfloat16 included), a
non-contiguous view (reduced into the original), an ``nn.Parameter`` that
requires grad, and a ``send``/``recv`` of a tensor. Without torch, those lines
say "torch: not installed".
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import aiodist as dist


def describe(x: np.ndarray) -> str:
    return f"{x.dtype.name}:{np.asarray(x, dtype=np.float64 if x.dtype.kind != 'c' else np.complex128).ravel().tolist()}"


async def numpy_part(rank: int, world_size: int) -> list[str]:
    lines = []
    for dtype in (ml_dtypes.bfloat16, np.float16, np.int8, np.uint64, np.complex64):
        x = (np.arange(4) + rank).astype(dtype)
        await dist.all_reduce(x)
        lines.append(describe(x))
    flags = np.array([rank % 2 == 0, True, False])
    await dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    lines.append(f"bool:{flags.tolist()}")
    fortran = np.asfortranarray(np.arange(6.0).reshape(2, 3) * (rank + 1))
    await dist.all_reduce(fortran)
    lines.append(f"fortran:{fortran.tolist()}")
    halves = np.full(3, float(rank), np.float32)
    await dist.all_reduce(halves, op=dist._make_nccl_premul_sum(0.5))
    lines.append(f"premul_sum:{halves.tolist()}")
    return lines


async def torch_part(rank: int, world_size: int) -> list[str]:
    try:
        import torch
    except ImportError:
        return ["torch: not installed"]
    lines = []
    for dtype in (torch.bfloat16, torch.float16, torch.int16, torch.float64):
        t = torch.arange(4, dtype=dtype) + rank
        await dist.all_reduce(t)
        lines.append(f"torch {str(dtype)[6:]}:{t.tolist()}")
    m = torch.zeros(4, 4) + rank
    column = m[:, 1]  # not contiguous: reduced into m itself
    await dist.all_reduce(column)
    lines.append(f"torch column:{m[:, 1].tolist()} rest {m[:, 0].tolist()}")
    p = torch.nn.Parameter(torch.ones(3) * (rank + 1))
    await dist.broadcast(p, src=world_size - 1)
    lines.append(f"torch parameter:{p.detach().tolist()} requires_grad={p.requires_grad}")
    if rank == 0:
        await dist.send(torch.tensor([7.0, 8.0]), dst=1)
    elif rank == 1:
        got = torch.zeros(2)
        await dist.recv(got, src=0)
        lines.append(f"torch recv:{got.tolist()}")
    return lines


async def main() -> list[str]:
    await dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    lines = await numpy_part(rank, world_size) + await torch_part(rank, world_size)
    for line in lines:
        print(f"rank {rank}: {line}")
    await dist.destroy_process_group()
    return lines
