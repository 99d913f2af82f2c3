"""Point-to-point calls on a group this rank is not a member of do what torch 2.13's do.

torch 2.13 (gloo, checked on 3 processes): ``send``, ``send_object_list`` and ``recv_object_list`` raise
``ValueError: Invalid process group specified``; ``isend``, ``irecv``, ``recv`` (returning -1),
``batch_isend_irecv`` and every collective do nothing, with a warning "Running <op> on global rank R which
does not belong to the given group." Before, aiodist's ``send`` (and the object ones) only warned, with a
warning saying "as in torch.distributed". Now they raise NotMemberError (a ValueError and a GroupError,
naming the operation, the group and this rank); the others still do nothing, warning once per group.
Real TCP (one process) and the simulator. (torch port probe s21, finding 4.)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist
import aiodist as dist
import sim
from aiodist.errors import NotMemberError


async def _on_a_group_without_me(world_rank: int) -> dict[str, Any]:
    sub = await dist.new_group([0, 1])
    out: dict[str, Any] = {}
    if world_rank in (0, 1):
        x = np.ones(1)
        await dist.all_reduce(x, group=sub)
        out["all_reduce"] = x.tolist()
        return out
    x = np.array([5.0])
    refused = {
        "send": lambda: dist.send(x, dst=0, group=sub),
        "send group_dst": lambda: dist.send(x, group_dst=0, group=sub),
        "send_object_list": lambda: dist.send_object_list([1], dst=0, group=sub),
        "recv_object_list": lambda: dist.recv_object_list([None], src=0, group=sub),
    }
    for name, call in refused.items():
        with pytest.raises(ValueError) as info:
            call()
        e = info.value
        assert isinstance(e, NotMemberError) and isinstance(e, aiodist.GroupError), type(e).__mro__
        assert "Invalid process group specified" in str(e) and "global rank 2 (this rank) is not a member" in str(e)
        assert (e.op, e.ranks, e.global_rank) == (name.split()[0], [0, 1], 2), (e.op, e.ranks, e.global_rank)
        out[name] = "raised"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["isend"] = await dist.isend(x, dst=0, group=sub)
        out["recv"] = await dist.recv(x, src=0, group=sub)
        out["irecv"] = await dist.irecv(x, group=sub)
        out["batch"] = [await w for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 0, group=sub)])]
        out["all_reduce"] = (await dist.all_reduce(x, group=sub)).tolist()
    mine = [str(w.message) for w in caught if "does not belong to the given group" in str(w.message)]
    assert len(mine) == 1 and mine[0].startswith("Running isend on global rank 2 "), mine  # (once per group)
    assert "as in torch.distributed)" not in mine[0]
    return out


MEMBER = {"all_reduce": [2.0]}
OTHER = {"send": "raised", "send group_dst": "raised", "send_object_list": "raised", "recv_object_list": "raised",
         "isend": None, "recv": -1, "irecv": -1, "batch": [None], "all_reduce": [5.0]}


async def test_p2p_on_a_group_without_this_rank_over_tcp() -> None:
    async def body(pg: Any) -> Any:
        out = await _on_a_group_without_me(pg.rank)
        await pg.barrier()
        return out

    assert await run_world(3, body) == [MEMBER, MEMBER, OTHER]


async def _sim_main() -> Any:
    await dist.init_process_group()
    out = await _on_a_group_without_me(dist.get_rank())
    await dist.barrier()
    await dist.destroy_process_group()
    return out


def test_p2p_on_a_group_without_this_rank_in_the_simulator() -> None:
    res = sim.run(_sim_main, world_size=3, seed=2)
    assert res.ok, res.summary()
    assert res.rank_results == [MEMBER, MEMBER, OTHER]
