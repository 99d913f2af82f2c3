"""Object collectives for metrics and configuration, written the torch.distributed way plus ``await``.

    aiodist run -n 4 examples/torch_object_metrics.py
    python -m sim run -n 4 examples/torch_object_metrics.py

torch's argument orders, filling the caller's lists: rank 0 broadcasts a
config (``broadcast_object_list``), scatters a work split
(``scatter_object_list``), every rank computes a metrics dict, gathers all of
them (``all_gather_object(object_list, obj)``) and rank 0 also collects them
(``gather_object(obj, object_gather_list, dst=0)``); a summary goes around
the ring with ``send_object_list``/``recv_object_list``.
"""

from __future__ import annotations

import numpy as np

import aiodist as dist


async def main() -> dict[str, object]:
    await dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    config: list[object] = [{"lr": 0.1, "name": "demo", "epochs": 3}] if rank == 0 else [None]
    await dist.broadcast_object_list(config, src=0)
    cfg = config[0]
    assert isinstance(cfg, dict)

    split: list[object] = [None]
    shards = [list(range(r * 10, r * 10 + 10)) for r in range(world_size)] if rank == 0 else None
    await dist.scatter_object_list(split, shards, src=0)
    mine = split[0]
    assert isinstance(mine, list)

    metrics = {"rank": rank, "n": len(mine), "mean": float(np.mean(mine)), "tag": f"{cfg['name']}-{rank}"}
    everyone: list[object] = [None] * world_size
    await dist.all_gather_object(everyone, metrics)
    collected: list[object] | None = [None] * world_size if rank == 0 else None
    await dist.gather_object(metrics, collected, dst=0)
    if rank == 0:
        assert collected == everyone, (collected, everyone)

    # the ring: each rank adds its mean to what it gets from the left and passes it on
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    box: list[object] = [None]
    if rank == 0:
        await dist.send_object_list([{"total": metrics["mean"]}], dst=right)
        await dist.recv_object_list(box, src=left)
    else:
        await dist.recv_object_list(box, src=left)
        assert isinstance(box[0], dict)
        await dist.send_object_list([{"total": box[0]["total"] + metrics["mean"]}], dst=right)
    summary = {"means": [m["mean"] for m in everyone if isinstance(m, dict)], "lr": cfg["lr"]}
    if rank == 0:
        summary["ring_total"] = box[0]["total"] if isinstance(box[0], dict) else None
    print(f"rank {rank}: shard {mine[0]}..{mine[-1]} {summary}")
    await dist.destroy_process_group()
    return summary
