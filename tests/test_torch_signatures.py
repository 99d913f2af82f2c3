"""torch.distributed's signatures, as a torch program writes them, mean the same here (plus ``await``); aiodist's own forms keep working.

Semantics in the simulator (4 virtual ranks); init methods with real processes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aiodist as dist
import sim
from aiodist.errors import InvalidRankError, RendezvousError


def run4(main: Any, **options: Any) -> list[Any]:
    res = sim.run(main, world_size=4, seed=0, **options)
    assert res.ok, res.summary()
    return list(res.rank_results)


# ------------------------------------------------------------------ init_process_group


def test_init_process_group_takes_torchs_positional_forms_and_a_timedelta() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("gloo", "env://", timedelta(seconds=42), -1, -1)
        got = (str(dist.get_backend()), pg.timeout, dist.is_initialized())
        await dist.destroy_process_group()
        return got

    assert run4(main) == [("gloo", 42.0, True)] * 4


def test_init_process_group_still_takes_aiodists_form_with_the_init_method_first() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("env://", timeout=30)
        got = (str(dist.get_backend(pg)), pg.timeout)
        await dist.destroy_process_group()
        return got

    assert run4(main) == [("gloo", 30.0)] * 4


@pytest.mark.parametrize(
    "args, kwargs, error, words",
    [
        (("gloo", "gloo"), {}, ValueError, "not an init method"),
        (("env://", "env://"), {}, TypeError, "torch's order is (backend, init_method)"),
        (("nosuchbackend",), {}, ValueError, "unknown backend"),
        ((), {"timeout": "soon"}, TypeError, "timedelta"),
    ],
)
def test_init_process_group_refuses_what_it_cannot_mean(args: Any, kwargs: Any, error: type, words: str) -> None:
    async def main() -> Any:
        with pytest.raises(error) as info:
            await dist.init_process_group(*args, **kwargs)
        assert words in str(info.value)
        return "refused"

    assert run4(main) == ["refused"] * 4


def test_backend_names_as_torch_spells_them() -> None:
    assert dist.Backend("GLOO") == "gloo" and dist.Backend.NCCL == "nccl"
    assert dist.Backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    with pytest.raises(ValueError, match="unknown backend"):
        dist.Backend("smoke-signals")
    assert dist.is_available() and dist.is_gloo_available() and not dist.is_nccl_available()


def _file_init_rank(path: str, rank: int) -> str:
    code = f"""
import asyncio, numpy as np, aiodist as dist
async def main():
    await dist.init_process_group("gloo", init_method="file://{path}", rank={rank}, world_size=3)
    x = np.array([{rank}.0 + 1])
    await dist.all_reduce(x)
    print(x[0])
    await dist.destroy_process_group()
asyncio.run(main())
"""
    return code


async def test_file_init_meets_through_a_file_and_skips_a_stale_one(tmp_path: Path) -> None:
    path = tmp_path / "rendezvous"
    path.write_text("127.0.0.1:1\n")  # left by an earlier job: nobody listens there
    env = dict(os.environ, AIODIST_SECRET="file-init-test", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    procs = []
    for r in (2, 1, 0):  # rank 0 last: the others find the stale file first
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-c", _file_init_rank(str(path), r), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE))
        await asyncio.sleep(0.3)
    async with asyncio.timeout(60):
        outs = [await p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e.decode()[-2000:] for _, e in outs]
    assert [o.decode().strip() for o, _ in outs] == ["6.0"] * 3
    assert not path.exists()  # rank 0 removed it at the end


def test_file_init_needs_a_rank() -> None:
    async def main() -> Any:
        with pytest.raises(RendezvousError, match="needs rank="):
            await dist.init_process_group(init_method="file:///nonexistent/x")
        return "refused"

    res = sim.run(main, world_size=1, seed=0, env={"RANK": ""})  # (RANK empty: not given)
    assert res.ok and res.rank_results == ["refused"], res.summary()


def test_file_init_names_a_file_it_cannot_write(tmp_path: Path) -> None:
    async def main() -> Any:
        with pytest.raises(RendezvousError, match="could not write"):
            await dist.init_process_group(init_method=f"file://{tmp_path}", rank=0, world_size=1)  # a directory
        return "refused"

    assert sim.run(main, world_size=1, seed=0).rank_results == ["refused"]


async def test_torchs_filestore_awaited_meets_through_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch24 probe, finding 8: aiodist.FileStore did not exist (only init_method="file://...").
    from conftest import run_ranks

    path = tmp_path / "filestore"

    async def rank(r: int) -> Any:
        store = await dist.FileStore(str(path), 3)
        await dist.init_process_group("gloo", store=store, rank=r, world_size=3)
        x = np.array([r + 1.0])
        await dist.all_reduce(x)
        n = await store.add("n", 1)
        await dist.destroy_process_group()
        if r == 0:
            await asyncio.sleep(0.2)  # (the others close theirs first)
        await store.close()  # (rank 0's stops the server and removes the file)
        return float(x[0]), n

    results = await run_ranks(3, rank, timeout=30)
    assert [x for x, _ in results] == [6.0] * 3 and sorted(n for _, n in results) == [1, 2, 3]
    assert not path.exists()
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK"):  # (who serves it is rank 0: without RANK, nobody knows)
        await dist.FileStore(str(path), 3)


def test_torchs_filestore_in_the_simulator(tmp_path: Path) -> None:
    async def main() -> Any:
        store = await dist.FileStore(str(tmp_path / f"fs{os.environ['AIODIST_RUN_ID']}"), 2)
        await dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]), world_size=2)
        x = np.ones(2)
        await dist.all_reduce(x)
        await dist.destroy_process_group()
        await store.close()
        return float(x[0])

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok and res.rank_results == [2.0, 2.0], res.summary()


# ------------------------------------------------------------------ operations


def test_keyword_names_of_torch_and_of_aiodist_both_work() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        a, b = np.ones(2), np.ones(2)
        await dist.all_reduce(tensor=a, op=dist.reduce_op.SUM)
        await dist.all_reduce(x=b)
        outs = [np.zeros(1) for _ in range(4)]
        await dist.all_gather(tensor_list=outs, tensor=np.array([float(r)]))
        outs2 = [np.zeros(1) for _ in range(4)]
        await dist.all_gather(out_list=outs2, x=np.array([float(r)]))
        with pytest.raises(TypeError, match="same argument"):
            dist.all_reduce(np.ones(1), x=np.ones(1))
        await dist.destroy_process_group()
        return a.tolist(), b.tolist(), [o[0] for o in outs], [o[0] for o in outs2]

    want = ([4.0, 4.0], [4.0, 4.0], [0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0])
    assert run4(main) == [want] * 4


def test_async_op_and_timedelta_timeouts_are_accepted_and_every_call_is_awaitable() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        x = np.ones(3)
        work = dist.all_reduce(x, async_op=True, timeout=timedelta(seconds=5))
        assert isinstance(work, dist.Work)
        await work.wait(timeout=timedelta(seconds=5))
        await dist.barrier(async_op=False)
        y = np.ones(3)
        await dist.all_reduce(y, async_op=False)  # an awaitable either way
        await dist.destroy_process_group()
        return x.tolist(), y.tolist()

    assert run4(main) == [([4.0] * 3, [4.0] * 3)] * 4


def test_group_src_and_group_dst_name_ranks_of_the_group() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        odd = await dist.new_group([1, 3])
        got: list[Any] = []
        if r in (1, 3):
            x = np.array([float(r)])
            await dist.broadcast(x, group=odd, group_src=1)  # group rank 1 is global rank 3
            got.append(x[0])
            y = np.array([float(r)])
            await dist.reduce(y, group=odd, group_dst=0)  # global rank 1
            got.append(y[0] if r == 1 else None)
            with pytest.raises(ValueError, match="not both"):
                dist.broadcast(x, src=3, group=odd, group_src=1)
            with pytest.raises(InvalidRankError):
                dist.broadcast(x, src=0, group=odd)  # global rank 0 is not in the group
        await dist.destroy_process_group()
        return got

    assert run4(main) == [[], [3.0, 4.0], [], [3.0, None]]


def test_object_collectives_in_torchs_argument_order_fill_the_callers_list() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        everyone: list[Any] = [None] * 4
        returned = await dist.all_gather_object(everyone, {"r": r})
        mine = await dist.all_gather_object({"r": r})  # aiodist's form: the list is returned
        gathered: list[Any] | None = [None] * 4 if r == 2 else None
        g = await dist.gather_object(r * 10, gathered, dst=2)
        g2 = await dist.gather_object(r * 10, 2)  # aiodist's (obj, dst)
        await dist.destroy_process_group()
        return everyone, returned is everyone, mine, gathered, g, g2

    results = run4(main)
    everyone = [{"r": i} for i in range(4)]
    for r, (filled, same, mine, gathered, g, g2) in enumerate(results):
        assert filled == everyone and same and mine == everyone
        if r == 2:
            assert gathered == [0, 10, 20, 30] and g == [0, 10, 20, 30] and g2 == [0, 10, 20, 30]
        else:
            assert gathered is None and g is None and g2 is None


def test_a_collective_on_a_group_the_rank_is_not_in_returns_at_once_with_one_warning() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        sub = await dist.new_group([0, 1])
        x = np.array([float(r)])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            await dist.all_reduce(x, group=sub)
            await dist.broadcast(x, src=0, group=sub)
            objs = [None, None]
            await dist.all_gather_object(objs, r, group=sub)
        mine = [str(w.message) for w in caught if "not a member" in str(w.message)]
        await dist.destroy_process_group()
        return x[0], objs, len(mine), dist.GroupMember.NON_GROUP_MEMBER == sub

    assert run4(main) == [(1.0, [0, 1], 0, False), (1.0, [0, 1], 0, False), (2.0, [None, None], 1, True),
                          (3.0, [None, None], 1, True)]


def test_group_world_and_groupmember_world_are_the_default_group() -> None:
    async def main() -> Any:
        before = (dist.group.WORLD, dist.GroupMember.WORLD)
        pg = await dist.init_process_group("gloo")
        same = dist.group.WORLD is pg and dist.GroupMember.WORLD is pg
        x = np.ones(1)
        await dist.all_reduce(x, group=dist.group.WORLD)
        await dist.destroy_process_group()
        return before, same, x[0]

    assert run4(main) == [((None, None), True, 4.0)] * 4
