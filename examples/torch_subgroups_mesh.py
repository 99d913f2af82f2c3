"""Subgroups and a 2x2 device mesh, written the torch.distributed way plus ``await``.

    aiodist run -n 4 examples/torch_subgroups_mesh.py
    python -m sim run -n 4 examples/torch_subgroups_mesh.py

``new_subgroups(2)`` (ranks {0,1} and {2,3}), ``new_subgroups_by_enumeration``
(the even and the odd ranks), ``new_group`` of some ranks (a collective on
it is a no-op on the others, as in torch), ``split_group``, and
``init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))`` with
``mesh["dp"]`` / ``mesh["tp"]``. Each rank prints what every group summed.
"""

from __future__ import annotations

import warnings

import numpy as np

import aiodist as dist
from aiodist.device_mesh import init_device_mesh


async def summed(value: float, group: dist.ProcessGroup | None) -> float:
    x = np.array([value])
    await dist.all_reduce(x, group=group)
    return float(x[0])


async def main() -> dict[str, object]:
    await dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    assert world_size == 4, "this example needs 4 ranks"
    out: dict[str, object] = {"backend": str(dist.get_backend())}

    pair, _ = await dist.new_subgroups(group_size=2)
    out["pair"] = [dist.get_process_group_ranks(pair), await summed(rank, pair)]

    parity, _ = await dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])
    out["parity"] = [dist.get_process_group_ranks(parity), await summed(rank, parity)]

    first_three = await dist.new_group([0, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rank 3 is warned that it is not a member: its all_reduce does nothing
        out["first_three"] = await summed(rank, first_three)
    out["first_three_size"] = dist.get_world_size(first_three)

    split = await dist.split_group(split_ranks=[[0, 3], [1, 2]])
    assert split is not None
    out["split"] = [dist.get_process_group_ranks(split), await summed(10 * rank, split)]

    mesh = await init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"], mesh["tp"]
    out["dp"] = [dp.mesh.tolist(), await summed(rank, dp.get_group())]
    out["tp"] = [tp.mesh.tolist(), await summed(rank, tp.get_group())]
    assert mesh.get_group("tp") is tp.get_group()

    print(f"rank {rank}: {out}")
    await dist.destroy_process_group()
    return out
