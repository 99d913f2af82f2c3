"""torch.distributed's APIs that aiodist lacked, with torch's semantics, as module functions and group methods (simulator; one real-TCP run)."""

from __future__ import annotations

import json
import asyncio
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist as dist
import sim
from aiodist.device_mesh import DeviceMesh, init_device_mesh
from aiodist.errors import CollectiveMismatchError, UnsupportedReduceOpError


def run4(main: Any, **options: Any) -> list[Any]:
    res = sim.run(main, world_size=4, seed=0, **options)
    assert res.ok, res.summary()
    return list(res.rank_results)


# ------------------------------------------------------------------ point to point


async def ring_with_batch(pg: Any) -> Any:
    r, n = dist.get_rank(), dist.get_world_size()
    send = np.array([float(r)])
    got = np.zeros(1)
    ops = [dist.P2POp(dist.irecv, got, (r - 1) % n, tag=5), dist.P2POp(dist.isend, send, (r + 1) % n, tag=5)]
    works = dist.batch_isend_irecv(ops)
    assert len(works) == 2 and all(isinstance(w, dist.Work) for w in works)
    await asyncio.gather(*works)
    return got[0]


def test_batch_isend_irecv_runs_a_ring_in_the_simulator() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        out = await ring_with_batch(pg)
        await dist.destroy_process_group()
        return out

    assert run4(main) == [3.0, 0.0, 1.0, 2.0]


async def test_batch_isend_irecv_runs_a_ring_over_tcp() -> None:
    assert await run_world(4, ring_with_batch) == [3.0, 0.0, 1.0, 2.0]


def test_the_list_batch_isend_irecv_returns_can_be_awaited_as_a_whole() -> None:
    """The README's rule is "await every operation": ``await dist.batch_isend_irecv(ops)`` waits for all of
    them and returns the list (before: TypeError, "object list can't be used in 'await' expression"). An error
    of one is raised once all ended, and none is left un-awaited."""
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        r, n = pg.rank, pg.size
        got = np.zeros(1)
        ops = [dist.P2POp(dist.irecv, got, (r - 1) % n), dist.P2POp(dist.isend, np.array([float(r)]), (r + 1) % n)]
        works = await dist.batch_isend_irecv(ops)
        assert len(works) == 2 and all(w.is_completed() for w in works)
        bad = np.zeros(2)  # (rank 0 receives a 1-element message into it: a mismatch, raised after the send ended)
        ops = [dist.P2POp(dist.isend, np.array([1.0]), (r + 1) % n, tag=1),
               dist.P2POp(dist.irecv, bad if r == 0 else np.zeros(1), (r - 1) % n, tag=1)]
        try:
            await dist.batch_isend_irecv(ops)
            error = None
        except dist.AiodistError as e:
            error = type(e).__name__
        await dist.destroy_process_group()
        return got[0], error, dist.unawaited_operations()

    assert run4(main) == [(3.0, "CollectiveMismatchError", []), (0.0, None, []), (1.0, None, []), (2.0, None, [])]


def test_p2pop_refuses_what_is_not_isend_or_irecv() -> None:
    with pytest.raises(ValueError, match="isend or aiodist.irecv"):
        dist.P2POp(dist.all_reduce, np.ones(1), 1)
    with pytest.raises(ValueError, match="peer"):
        dist.P2POp(dist.isend, np.ones(1))
    with pytest.raises(ValueError, match="non-empty list"):
        dist.batch_isend_irecv([])


def test_send_and_recv_object_list_as_functions_and_group_methods() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        r = dist.get_rank()
        got: list[Any] = [None, None]
        if r == 0:
            await dist.send_object_list([{"a": 1}, "two"], dst=1)
            await pg.send_object_list([3, 4], 2, tag=7)
        elif r == 1:
            sender = await dist.recv_object_list(got)
            assert sender == 0
        elif r == 2:
            await pg.recv_object_list(got, 0, tag=7)
        await dist.destroy_process_group()
        return got

    assert run4(main) == [[None, None], [{"a": 1}, "two"], [3, 4], [None, None]]


def test_recv_object_list_into_a_list_of_another_length_is_a_mismatch_and_a_tensor_recv_refuses_objects() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        out = "-"
        if r == 0:
            await dist.send_object_list([1, 2, 3], dst=1)
            await dist.send_object_list([1], dst=2)
        elif r == 1:
            with pytest.raises(CollectiveMismatchError, match="sent 3 objects"):
                await dist.recv_object_list([None], src=0)
            out = "length"
        elif r == 2:
            with pytest.raises(CollectiveMismatchError, match="pickled objects"):
                await dist.recv(np.zeros(4, np.uint8), src=0)
            out = "kind"
        await dist.destroy_process_group()
        return out

    assert run4(main) == ["-", "length", "kind", "-"]


@pytest.mark.parametrize(
    "sent, into, words",
    [
        (np.array([7], np.int64), np.zeros(1, np.float64), "the dtype differs"),  # same bytes, another dtype
        (np.arange(4, dtype=np.float32), np.zeros(2, np.float32), "number of elements differs"),
        (np.arange(4, dtype=np.float32), np.zeros(8, np.float32), "number of elements differs"),
    ],
)
def test_a_p2p_receive_checks_the_senders_dtype_and_element_count(sent: Any, into: Any, words: str) -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        if r == 0:
            await dist.send(sent, dst=1)
            await dist.send(np.array([1.5]), dst=1, tag=1)
        elif r == 1:
            buf = into.copy()
            with pytest.raises(CollectiveMismatchError, match=words) as info:
                await dist.recv(buf, src=0)
            assert not buf.any(), "nothing is written into the buffer"
            assert info.value.calls  # who sent what, who received into what
            later = np.zeros(1)
            await dist.recv(later, src=0, tag=1)  # the link still works
            assert later[0] == 1.5
        await dist.destroy_process_group()
        return "ok"

    assert run4(main) == ["ok"] * 4


def test_a_p2p_receive_of_another_shape_with_as_many_elements_is_accepted_as_in_torch() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        got = np.zeros((2, 3))
        if r == 0:
            await dist.send(np.arange(6.0), dst=1)
        elif r == 1:
            await dist.recv(got, src=0)
        await dist.destroy_process_group()
        return got.tolist()

    assert run4(main)[1] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


# ------------------------------------------------------------------ coalesced, PREMUL_SUM


def test_coalesced_collectives() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        r = dist.get_rank()
        a, b = np.full(2, float(r)), np.full(3, 1.0)
        await dist.all_reduce_coalesced([a, b])
        outs = [[np.zeros(1), np.zeros(2)] for _ in range(4)]
        await pg.all_gather_coalesced(outs, [np.array([float(r)]), np.array([r, -r], float)])
        await dist.destroy_process_group()
        return a.tolist(), b.tolist(), [[o.tolist() for o in row] for row in outs]

    for a, b, outs in run4(main):
        assert a == [6.0, 6.0] and b == [4.0, 4.0, 4.0]
        assert outs == [[[float(q)], [float(q), float(-q)]] for q in range(4)]


def test_coalesced_lists_that_differ_between_ranks_are_a_mismatch() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        arrays = [np.ones(2), np.ones(3)] if r != 2 else [np.ones(3), np.ones(2)]
        with pytest.raises(CollectiveMismatchError):
            await dist.all_reduce_coalesced(arrays)
        await asyncio.sleep(1.0)  # (the others learn it before this rank leaves)
        await dist.destroy_process_group()
        return "mismatch"

    assert run4(main) == ["mismatch"] * 4


def test_premul_sum_scales_each_input_then_sums() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        r = dist.get_rank()
        x = np.full(2, float(r + 1))
        await dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.25))
        y = np.full(2, float(r + 1))
        await pg.reduce(y, 0, dist._make_nccl_premul_sum(2.0))
        with pytest.raises(UnsupportedReduceOpError, match="needs a factor"):
            dist.all_reduce(np.ones(1), op=dist.ReduceOp.PREMUL_SUM)
        with pytest.raises(UnsupportedReduceOpError, match="int64"):
            dist.all_reduce(np.ones(1, np.int64), op=dist._make_nccl_premul_sum(2.0))
        await dist.destroy_process_group()
        return x.tolist(), (y.tolist() if r == 0 else None)

    results = run4(main)
    assert [x for x, _ in results] == [[2.5, 2.5]] * 4
    assert results[0][1] == [20.0, 20.0]


# ------------------------------------------------------------------ groups


def test_new_subgroups_new_subgroups_by_enumeration_and_split_group() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        mine, all_pairs = await dist.new_subgroups(2)
        mine_e, _ = await dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
        split = await dist.split_group(split_ranks=[[0, 1, 2]])
        out = []
        for g in (mine, mine_e):
            x = np.array([float(r)])
            await dist.all_reduce(x, group=g)
            out.append((dist.get_process_group_ranks(g), x[0]))
        if split is None:
            out.append(None)
        else:
            x = np.array([1.0])
            await split.all_reduce(x)
            out.append((split.ranks, x[0]))
        await dist.destroy_process_group()
        return out, [g.ranks for g in all_pairs]

    results = run4(main)
    assert results[0] == ([([0, 1], 1.0), ([0, 3], 3.0), ([0, 1, 2], 3.0)], [[0, 1], [2, 3]])
    assert results[3][0][2] is None  # not in any split: None, as torch returns
    assert results[2][0][:2] == [([2, 3], 5.0), ([1, 2], 3.0)]


def test_device_mesh_indexing_by_dimension_name() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        mesh = await init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert isinstance(mesh, DeviceMesh) and mesh.device_type == "cpu"
        dp, tp = mesh["dp"], mesh["tp"]
        assert dp.get_group() is mesh.get_group("dp") and tp.get_group() is mesh.get_group("tp")
        both = mesh["dp", "tp"]
        assert both == mesh and mesh["dp"] == dp and hash(mesh["dp"]) == hash(dp) and dp != tp  # (before: identity)
        with pytest.raises(KeyError, match="not in the mesh's order"):
            mesh["tp", "dp"]  # torch refuses a transposed slice (before: the transposed mesh)
        x = np.array([float(r)])
        await dist.all_reduce(x, group=dp.get_group())
        with pytest.raises(KeyError):
            mesh["pp"]
        await dist.destroy_process_group()
        return dp.mesh.tolist(), tp.mesh.tolist(), both.mesh.tolist(), x[0]

    results = run4(main)
    assert results[0] == ([0, 2], [0, 1], [[0, 1], [2, 3]], 2.0)
    assert results[3] == ([1, 3], [2, 3], [[0, 1], [2, 3]], 4.0)


def test_torch_device_mesh_constructor_lays_out_the_ranks_as_given_once_awaited() -> None:
    # Before: TypeError (unexpected keyword argument 'mesh_dim_names'): torch's DeviceMesh(device_type, mesh).
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r = dist.get_rank()
        pending = DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("dp", "tp"))
        with pytest.raises(dist.GroupError, match="await DeviceMesh"):
            pending.get_group("dp")
        mesh = await pending
        assert mesh is pending and mesh.get_rank() == r and mesh.shape == (2, 2)
        x = np.array([float(r)])
        await dist.all_reduce(x, group=mesh.get_group("tp"))  # a row: [0, 2] or [1, 3]
        with pytest.raises(dist.InvalidArgumentError, match="each rank of the world"):
            await DeviceMesh("cpu", [[0, 1], [1, 3]])
        with pytest.raises(dist.InvalidArgumentError, match="must name each"):
            DeviceMesh("cpu", [0, 1, 2, 3], mesh_dim_names=("a", "b"))
        await dist.destroy_process_group()
        return mesh["tp"].mesh.tolist(), mesh.get_coordinate(), x[0]

    results = run4(main)
    assert results[0] == ([0, 2], (0, 0), 2.0) and results[1] == ([1, 3], (1, 0), 4.0)
    assert results[2] == ([0, 2], (0, 1), 2.0) and results[3] == ([1, 3], (1, 1), 4.0)


def test_a_mesh_listing_ranks_out_of_order_gives_local_ranks_in_its_groups_order() -> None:
    # Before: get_local_rank was the coordinate in the mesh, while the dimension's group keeps its ranks sorted:
    # with [[3, 0], [1, 2]], shards picked by local rank came back from all_gather over the group in the
    # wrong order, on every rank (differential probe 19 against torch, whose get_local_rank is the group rank).
    async def main() -> Any:
        await dist.init_process_group("gloo")
        mesh = await DeviceMesh("cpu", [[3, 0], [1, 2]], mesh_dim_names=("dp", "tp"))
        tp = mesh["tp"].get_group()
        local = mesh.get_local_rank("tp")
        full = np.arange(4, dtype=np.float32)
        out = np.zeros(4, dtype=np.float32)
        await dist.all_gather_into_tensor(out, full[2 * local:2 * local + 2].copy(), group=tp)
        await dist.destroy_process_group()
        return local, int(tp.rank), mesh.get_coordinate(), out.tolist()

    results = run4(main)
    assert [r[0] for r in results] == [r[1] for r in results] == [0, 0, 1, 1]
    assert [r[2] for r in results] == [(0, 1), (1, 0), (1, 1), (0, 0)]  # (the coordinates stay the mesh's)
    assert all(r[3] == [0.0, 1.0, 2.0, 3.0] for r in results)


def test_launcher_environment_helpers() -> None:
    async def main() -> Any:
        return dist.is_torchelastic_launched(), dist.get_node_local_rank(), dist.get_node_local_rank(fallback_rank=9)

    res = sim.run(main, world_size=2, seed=0, env={"TORCHELASTIC_RUN_ID": "job7"})
    assert res.ok and res.rank_results == [(True, 0, 0), (True, 1, 1)], res.summary()

    async def bare() -> Any:
        with pytest.raises(RuntimeError, match="LOCAL_RANK"):
            dist.get_node_local_rank()
        return dist.get_node_local_rank(fallback_rank=5)

    res = sim.run(bare, world_size=1, seed=0, env={"LOCAL_RANK": ""})
    assert res.ok and res.rank_results == [5], res.summary()


# ------------------------------------------------------------------ Work


def test_work_is_completed_and_get_future() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        x = np.ones(2)
        work = dist.all_reduce(x, async_op=True)
        fut = work.get_future()
        assert isinstance(fut, asyncio.Future)
        result = await fut
        done = work.is_completed()
        bad = dist.recv(np.zeros(1), src=(dist.get_rank() + 1) % 4, timeout=0.2)
        with pytest.raises(TimeoutError):  # (nobody sends: the receive times out; its future says so)
            await bad.get_future()
        await dist.barrier()  # (no rank leaves while another still waits in its receive)
        await dist.destroy_process_group()
        return result is x, done, x.tolist()

    assert run4(main) == [(True, True, [4.0, 4.0])] * 4


def test_cancelling_the_awaiter_of_a_receive_withdraws_it_and_a_bounded_wait_does_not() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        out: Any = None
        if r == 0:
            await dist.barrier()
            await dist.send(np.array([1.0]), dst=1)
            await dist.send(np.array([2.0]), dst=1)
        elif r == 1:
            abandoned = np.zeros(1)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(dist.recv(abandoned, src=0), 0.05)  # withdrawn with its awaiter
            kept = np.zeros(1)
            work = dist.recv(kept, src=0)
            with pytest.raises(TimeoutError):
                await work.wait(timeout=0.05)  # bounds only this wait: the receive stays posted
            await dist.barrier()
            await work
            later = np.zeros(1)
            await dist.recv(later, src=0)
            out = (abandoned[0], kept[0], later[0])
        else:
            await dist.barrier()
        await dist.destroy_process_group()
        return out

    assert run4(main)[1] == (0.0, 1.0, 2.0)


def test_a_bounded_wait_that_times_out_is_a_runtime_error_naming_the_operation_which_goes_on() -> None:
    # Before: a bare builtins.TimeoutError with an empty message (torch: RuntimeError "Operation timed out!"),
    # missed by a port's ``except RuntimeError:``.
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        if r == 3:
            await asyncio.sleep(0.5)
        x = np.ones(1)
        work = dist.all_reduce(x, async_op=True)
        caught = None
        if r != 3:
            try:
                await work.wait(timeout=timedelta(seconds=0.1))
            except RuntimeError as e:
                assert isinstance(e, TimeoutError) and isinstance(e, dist.WaitTimeoutError), repr(e)
                assert (e.op, e.seq, e.timeout) == ("all_reduce", 0, 0.1)
                caught = str(e)
        await work.wait()  # it went on
        await dist.destroy_process_group()
        return caught, float(x[0])

    out = run4(main)
    assert out[3] == (None, 4.0)
    for caught, value in out[:3]:
        assert caught is not None and caught.startswith("waiting for all_reduce (seq 0) of world timed out after 0.1s")
        assert value == 4.0


def test_a_finished_receive_work_tells_its_source_rank_as_torch_does() -> None:
    # Before: AttributeError (torch: work.source_rank() / work._source_rank() after an any-source irecv).
    async def main() -> Any:
        await dist.init_process_group("gloo", timeout=10)
        r = dist.get_rank()
        out: Any = None
        if r == 2:
            t = np.zeros(1)
            work = dist.irecv(t)
            with pytest.raises(asyncio.InvalidStateError):
                work.source_rank()
            await dist.barrier()
            await work.wait()
            out = (work.source_rank(), work._source_rank(), t[0])
            other = dist.all_reduce(np.ones(1))
            await other
            with pytest.raises(dist.GroupError, match="not all_reduce"):
                other.source_rank()
        else:
            await dist.barrier()
            if r == 3:
                await dist.send(np.array([9.0]), 2)
            await dist.all_reduce(np.ones(1))
        await dist.destroy_process_group()
        return out

    assert run4(main)[2] == (3, 3, 9.0)


# ------------------------------------------------------------------ what a port from torch passes as it is


def test_new_group_takes_numpy_integer_ranks_as_torch_does() -> None:
    # Before: TypeError "ranks must be ints" for list(np.arange(4)[::2]), which torch accepts.
    async def main() -> Any:
        await dist.init_process_group("gloo")
        g = await dist.new_group(list(np.arange(4)[::2]))
        ranks = dist.get_process_group_ranks(g)
        x = np.ones(1)
        if dist.get_rank() in (0, 2):
            await dist.all_reduce(x, group=g)
        with pytest.raises(TypeError, match="ranks must be ints"):
            await dist.new_group([np.True_, 1])
        await dist.destroy_process_group()
        return ranks, x[0], [type(r) for r in ranks]

    for r, (ranks, x, types) in enumerate(run4(main)):
        assert ranks == [0, 2] and types == [int, int]
        assert x == (2.0 if r in (0, 2) else 1.0)


def test_gather_object_fills_the_first_entries_of_a_longer_list_on_the_destination() -> None:
    # Before: ValueError on the destination only, so the other ranks went on and every rank then
    # failed its next collective with CollectiveMismatchError. torch fills the first world_size entries.
    async def main() -> Any:
        await dist.init_process_group("gloo")
        r, w = dist.get_rank(), dist.get_world_size()
        gl = ["pre"] * (w + 1) if r == 1 else None
        await dist.gather_object({"rank": r}, gl, dst=1)
        await dist.barrier()
        short = ["pre"] * (w - 1) if r == 1 else None
        if r == 1:
            with pytest.raises(ValueError, match="at least 4 entries"):
                await dist.gather_object(r, short, dst=1)
        await dist.destroy_process_group()
        return gl

    results = run4(main)
    assert results[1] == [{"rank": 0}, {"rank": 1}, {"rank": 2}, {"rank": 3}, "pre"]
    assert results[0] is None and results[2] is None


def test_ranks_and_sizes_keep_an_arrays_dtype_in_numpy_arithmetic_as_torchs_ints_do() -> None:
    """Before (porting probe): get_rank(), get_world_size(), pg.rank and pg.size were an int subclass, which
    numpy 2 promotes as an int64: a pipeline stage's ``x * 2 + rank`` became float64 (its send then mismatched
    the next stage's float32 receive), ``grad / world_size`` float64, an int16 histogram int64."""
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        r, p = dist.get_rank(), dist.get_world_size()
        assert type(r) is int and type(p) is int
        x = np.ones(4, np.float32)
        h = np.arange(3, dtype=np.int16)
        f16 = np.ones(2, np.float16)
        got = [(x * 2 + r).dtype, (x / p).dtype, (h + r).dtype, (x * pg.rank + pg.size).dtype, (f16 / pg.size()).dtype,
               (pg.rank * h).dtype, np.maximum(h, pg.rank).dtype]
        x /= pg.size
        assert x.dtype == np.float32 and float(x[0]) == 1 / p
        await dist.destroy_process_group()
        return [str(d) for d in got]

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results[1] == ["float32", "float32", "int16", "float32", "float16", "int16", "int16"]


def test_group_rank_and_size_are_numbers_that_torch_code_can_call() -> None:
    """torch code calls ``process_group.rank()`` / ``.size()`` (a DDP communication hook does); aiodist's
    ``pg.rank`` / ``pg.size`` are the numbers. Both forms give the same int. Before: TypeError, 'int' object
    is not callable."""
    async def main() -> Any:
        pg = await dist.init_process_group("gloo")
        sub = await dist.new_group([1, 2, 3])
        world = dist.group.WORLD
        x = np.ones(2)
        await dist.all_reduce(x, group=pg)
        x /= pg.size()  # (a hook's averaging)
        got = (pg.rank(), pg.size(), pg.rank, world.size(), sub.rank(), sub.size(), dist.get_rank(sub), float(x[0]))
        assert all(type(v()) is int for v in (pg.rank, pg.size, sub.rank))
        assert json.dumps([pg.rank, sub.size]) == f"[{pg.rank}, 3]" and f"{sub.rank:>2}" == f"{int(sub.rank):>2}"
        assert (pg.group_name, sub.group_name) == ("world", "group 1 (ranks [1, 2, 3])")  # (before: AttributeError)
        await dist.destroy_process_group()
        return got

    res = sim.run(main, world_size=4, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [(0, 4, 0, 4, -1, 3, -1, 1.0), (1, 4, 1, 4, 0, 3, 0, 1.0),
                                (2, 4, 2, 4, 1, 3, 1, 1.0), (3, 4, 3, 4, 2, 3, 2, 1.0)]
    assert sim.run(main, world_size=4, seed=0).digest == res.digest
