"""A program for CLI tests: rank 1 sends to ranks 0 and 2 in turn, 20 times each (the CLI runs it by path)."""

from __future__ import annotations

import numpy as np

import aiodist as dist


async def main() -> None:
    await dist.init_process_group()
    r = dist.get_rank()
    buf = np.zeros(4)
    for _ in range(20):
        if r == 1:
            await dist.send(buf, dst=0)
            await dist.send(buf, dst=2)
        elif r in (0, 2):
            await dist.recv(buf, src=1)
    await dist.barrier()
    await dist.destroy_process_group()
