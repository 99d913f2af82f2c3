"""A root-only list (``gather_list``, ``scatter_list``, ``object_gather_list``) passed on a rank that is not the
root raises there, as torch.distributed does; None or an empty list is fine.

Before, aiodist took it silently: the list was left as it was (zeros, or ``[None] * n``), so a program that
passed ``gather_list`` everywhere, expecting all_gather-like results, read unfilled buffers with no error (and
failed when moved back to torch). torch 2.13 raises ``ValueError: Argument ``gather_list`` must NOT be specified
on non-destination ranks.`` (``scatter_list``: non-source ranks; ``gather_object`` likewise). Here the rank
raises InvalidArrayError (a ValueError, ``.reason == "not_root"``), its peers' part fails with
PeerCallFailedError naming it, and the group stays in step. Real TCP (one process) and the simulator.
(torch port probe s21, finding 1.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist
import aiodist.api as dist
import sim
from aiodist.errors import InvalidArrayError, PeerCallFailedError


async def _calls(r: int, n: int, group: Any = None) -> dict[str, Any]:
    """Each root-only list passed on every rank (root 0 of the group); what each call did on this rank."""
    got: dict[str, Any] = {}
    root = {} if group is None else {"group": group}
    me = dist.get_rank(group)
    peers = [dist.get_global_rank(group, i) if group is not None else i for i in range(1, n)]
    calls = {
        "gather": lambda: dist.gather(np.full(2, float(r)), [np.zeros(2) for _ in range(n)], **root,
                                      **({"dst": 0} if group is None else {"group_dst": 0})),
        "scatter": lambda: dist.scatter(np.zeros(2), [np.full(2, float(i)) for i in range(n)], **root,
                                        **({"src": 0} if group is None else {"group_src": 0})),
        "gather_object": lambda: dist.gather_object(r, [None] * n, **root,
                                                    **({"dst": 0} if group is None else {"group_dst": 0})),
    }
    for name, call in calls.items():
        try:
            await call()
            got[name] = "returned"
        except InvalidArrayError as e:
            assert isinstance(e, ValueError) and isinstance(e, aiodist.AiodistError)
            assert e.reason == "not_root", e
            assert "must NOT be specified on non-" in str(e) and f"rank {me}," in str(e), e
            got[name] = ("refused", e.argument)
        except PeerCallFailedError as e:
            assert e.global_rank in peers, (e.global_rank, peers)
            got[name] = "peer failed"
    # None or an empty list is what torch accepts off the root; the group is still in step
    out = [np.zeros(2) for _ in range(n)] if me == 0 else []
    await dist.gather(np.full(2, float(me)), out, **root, **({"dst": 0} if group is None else {"group_dst": 0}))
    if me == 0:
        got["gathered"] = [float(a[0]) for a in out]
    return got


def _expected(me: int, n: int, got_scatter: Any = None) -> dict[str, Any]:
    if me == 0:
        # (scatter's source may have sent everything before it hears of the refusal: then it returns)
        return {"gather": "peer failed", "scatter": got_scatter, "gather_object": "peer failed",
                "gathered": [float(i) for i in range(n)]}
    return {"gather": ("refused", "gather_list"), "scatter": ("refused", "scatter_list"),
            "gather_object": ("refused", "object_gather_list")}


async def test_root_only_lists_on_other_ranks_raise_over_tcp() -> None:
    async def body(pg: Any) -> Any:
        return await _calls(pg.rank, pg.size)

    results = await run_world(3, body)
    for r, got in enumerate(results):
        assert got["scatter"] in ("peer failed", "returned") if r == 0 else True
        assert got == _expected(r, 3, got["scatter"]), (r, got)


async def _sim_main() -> Any:
    await dist.init_process_group()
    r = dist.get_rank()
    g = await dist.new_group([1, 2, 3])
    got = await _calls(r, 3, g) if r != 0 else None
    await dist.barrier()
    await dist.destroy_process_group()
    return got


@pytest.mark.parametrize("seed", [0, 1])
def test_root_only_lists_on_other_ranks_of_a_subgroup_raise_in_the_simulator(seed: int) -> None:
    res = sim.run(_sim_main, world_size=4, seed=seed)
    assert res.ok, res.summary()
    assert res.rank_results[0] is None
    for r in (1, 2, 3):
        got = res.rank_results[r]
        assert got["scatter"] in ("peer failed", "returned") if r == 1 else True
        assert got == _expected(r - 1, 3, got["scatter"]), (r, got)
