"""What torch programs use beyond the collectives: the Work's future in torch's form (``value``, ``wait``,
``then``), the ``DistError`` family (aiodist's errors are ``RuntimeError``s, as torch's are), and the
smaller names torch has (``get_pg_count``, ``is_backend_available``, ``default_pg_timeout``, ``HashStore``,
``all_gather_single``, ``reduce_scatter_single``). In the simulator, and one real-TCP run of DDP's hook."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from conftest import run_world
from rank_procs import free_port

import aiodist as dist
import sim
from aiodist.future import Future, torch_value


def run4(main: Any, **options: Any) -> list[Any]:
    res = sim.run(main, world_size=4, seed=0, **options)
    assert res.ok, res.summary()
    return list(res.rank_results)


# ------------------------------------------------------------------ the future


def test_an_operations_future_has_torchs_value_wait_and_then() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        w = dist.get_world_size()
        x = np.ones(3)
        fut = dist.all_reduce(x, async_op=True).get_future()
        assert isinstance(fut, asyncio.Future) and isinstance(fut, Future)
        with pytest.raises(asyncio.InvalidStateError):
            fut.value()  # (still running: torch's value() is for a finished future)
        averaged = fut.then(lambda f: f.value()[0] / w)  # (DDP's allreduce hook)
        doubled = averaged.then(lambda f: f.value() * 2)
        mean = await averaged.wait()
        assert (await fut) is x and fut.value()[0] is x and len(fut.value()) == 1
        assert (await doubled.wait()).tolist() == [2.0] * 3

        out = [np.zeros(1) for _ in range(w)]
        gathered = dist.all_gather(out, np.array([float(dist.get_rank())]), async_op=True).get_future()
        assert (await gathered.wait()) is out
        assert await dist.barrier(async_op=True).get_future().wait() == []
        b = np.zeros(2) + dist.get_rank()
        assert (await dist.broadcast(b, src=2, async_op=True).get_future().wait())[0] is b

        def boom(f: Future[Any]) -> Any:
            raise ValueError("boom")

        with pytest.raises(RuntimeError, match="raised ValueError: boom") as info:  # (before: a bare ValueError,
            await dist.all_reduce(np.ones(1), async_op=True).get_future().then(boom).wait()  # torch: RuntimeError)
        assert isinstance(info.value, dist.CallbackError) and isinstance(info.value.__cause__, ValueError)
        late = dist.recv(np.zeros(1), src=(dist.get_rank() + 1) % w, timeout=0.2).get_future()

        def handled(f: Future[Any]) -> str:
            try:
                f.value()
            except dist.DistBackendError as e:  # (a CollectiveTimeoutError is torch's DistBackendError)
                return type(e).__name__
            return "no error"

        said = await late.then(handled).wait()
        with pytest.raises(TimeoutError):
            await late.then(lambda f: f.value()).wait()  # (the error goes on down the chain)
        await dist.barrier()
        await dist.destroy_process_group()
        return mean.tolist(), [a.tolist() for a in out], b.tolist(), said

    want = ([1.0] * 3, [[0.0], [1.0], [2.0], [3.0]], [2.0, 2.0], "CollectiveTimeoutError")
    assert run4(main) == [want] * 4


def test_then_of_a_cancelled_future_is_cancelled_and_the_operation_is_not() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        x = np.ones(2)
        work = dist.all_reduce(x, async_op=True)
        fut = work.get_future()
        chained = fut.then(lambda f: "ran")
        fut.cancel()
        await asyncio.sleep(0)
        await work  # (the operation itself goes on)
        await dist.destroy_process_group()
        return chained.cancelled(), x.tolist()

    assert run4(main) == [(True, [4.0, 4.0])] * 4


def test_torch_value_shapes() -> None:
    a = np.ones(1)
    assert torch_value(None) == [] and torch_value(a)[0] is a and torch_value((a, a)) == [a, a]
    listed = [a]
    assert torch_value(listed) is listed and torch_value(3) == [3]


async def test_ddp_allreduce_hook_idiom_over_tcp() -> None:
    async def body(pg: Any) -> Any:
        x = np.full(4, float(pg.rank + 1))
        fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] / pg.size)
        return (await fut.wait()).tolist()

    assert await run_world(2, body) == [[1.5] * 4] * 2


# ------------------------------------------------------------------ errors


def test_aiodist_errors_are_runtime_errors_and_torchs_dist_error_family() -> None:
    assert dist.DistError is dist.AiodistError and issubclass(dist.AiodistError, RuntimeError)
    assert dist.DistStoreError is dist.StoreError
    for backend in (dist.PeerFailureError, dist.CollectiveTimeoutError, dist.CollectiveMismatchError):
        assert issubclass(backend, dist.DistBackendError) and issubclass(backend, dist.DistError)
    for network in (dist.ConnectionLost, dist.StoreConnectionLost, dist.StoreConnectTimeoutError):
        assert issubclass(network, dist.DistNetworkError)
    # (and the standard classes they were already)
    assert issubclass(dist.CollectiveTimeoutError, TimeoutError) and issubclass(dist.ConnectionLost, ConnectionError)
    assert issubclass(dist.InvalidArrayError, ValueError) and issubclass(dist.StoreTimeoutError, TimeoutError)


def test_a_torch_style_except_runtime_error_catches_a_timeout_and_a_store_timeout() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        caught = []
        try:
            if dist.get_rank() == 0:  # (rank 0 alone: it times out)
                await dist.all_reduce(np.ones(1), group=await dist.new_group([0, 1]), timeout=0.2)
            else:
                await dist.new_group([0, 1])
                await asyncio.sleep(0.5)
        except RuntimeError as e:
            caught.append(type(e).__name__)
        store = dist.HashStore()
        try:
            await store.wait(["never"], timedelta(seconds=0.1))
        except dist.DistStoreError as e:
            caught.append(type(e).__name__)
        await dist.barrier()
        await dist.destroy_process_group()
        return caught

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [["CollectiveTimeoutError", "StoreTimeoutError"], ["StoreTimeoutError"]]


async def test_a_store_that_cannot_be_reached_is_a_dist_network_error() -> None:
    with pytest.raises(dist.DistNetworkError):
        await dist.TCPStore.connect("127.0.0.1", free_port(), timeout=0.3)


# ------------------------------------------------------------------ smaller names


def test_pg_count_backends_default_timeout_and_single_collectives() -> None:
    async def main() -> Any:
        counts = [dist.get_pg_count()]
        await dist.init_process_group("gloo", timeout=dist.default_pg_timeout)
        counts.append(dist.get_pg_count())
        sub = await dist.new_group([0, 1])
        counts.append(dist.get_pg_count())
        r, w = dist.get_rank(), dist.get_world_size()
        out = np.zeros(2 * w)
        await dist.all_gather_single(out, np.full(2, float(r)))
        mine = np.zeros(1)
        await dist.reduce_scatter_single(mine, np.arange(w, dtype=np.float64))
        await dist.destroy_process_group(sub)
        counts.append(dist.get_pg_count())
        await dist.destroy_process_group()
        counts.append(dist.get_pg_count())
        return counts, out.tolist(), mine.tolist()

    got = run4(main)
    assert [g[0] for g in got] == [[0, 1, 2, 1, 0]] * 4
    assert got[1][1] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0] and [g[2] for g in got] == [[0.0], [4.0], [8.0], [12.0]]
    assert dist.default_pg_timeout == timedelta(seconds=300)
    assert dist.is_backend_available("gloo") and not dist.is_backend_available("nccl")
    assert not dist.is_ucc_available() and not dist.is_xccl_available()


def test_the_backend_a_tutorial_picks_for_its_device_initialises_the_group() -> None:
    """torch's tutorials write ``init_process_group(backend=dist.get_default_backend_for_device(device))``."""

    class Device:  # (a torch.device's shape: its kind in ``.type``)
        type = "cpu"

    async def main() -> Any:
        await dist.init_process_group(backend=dist.get_default_backend_for_device(Device()))
        backend = dist.get_backend()
        x = np.ones(2, dtype=np.complex128) * (1 + 1j)
        if dist.supports_complex(dist.ReduceOp.SUM):
            await dist.all_reduce(x)
        await dist.destroy_process_group()
        return backend, x.tolist()

    assert run4(main) == [("gloo", [4 + 4j, 4 + 4j])] * 4
    assert [dist.get_default_backend_for_device(d) for d in ("cpu", "cuda:1", "mps")] == ["gloo", "nccl", "gloo"]
    with pytest.raises(ValueError, match="meta"):
        dist.get_default_backend_for_device("meta")
    with pytest.raises(TypeError):
        dist.get_default_backend_for_device(3)
    assert [dist.supports_complex(op) for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX,
                                                   dist.ReduceOp.PRODUCT, dist.ReduceOp.BXOR)] == [
        True, True, False, False, False]


def test_every_error_class_can_be_raised_anew_keeping_its_message() -> None:
    """An ended connection raises its kept error anew (``errors.anew``); the launcher pickles errors."""
    import inspect
    import pickle

    import aiodist.errors as errors

    import aiodist.auth
    import sim.errors

    classes = [c for module in (errors, aiodist.auth, sim.errors) for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, errors.AiodistError)]
    assert len(classes) > 25
    for cls in classes:
        exc = cls.__new__(cls)  # (no __init__: some take keyword-only data)
        exc.args = ("what went wrong",)
        exc.rank = 3
        again = errors.anew(exc)
        assert type(again) is cls and again.args == exc.args and again.rank == 3 and again is not exc
        assert str(again) == str(exc) == "what went wrong"
    timeout = errors.StoreConnectionLost("store gone", host="h", port=1)  # (an OSError with its own __init__)
    assert str(errors.anew(timeout)) == "store gone" and errors.anew(timeout).host == "h"
    lost = errors.ConnectionLost("peer closed")
    assert pickle.loads(pickle.dumps(lost)).args == ("peer closed",)


def test_get_group_rank_of_a_non_member_raises_a_value_error_as_in_torch() -> None:
    async def main() -> Any:
        await dist.init_process_group("gloo")
        sub = await dist.new_group([2, 0])
        ranks = [dist.get_group_rank(sub, 0), dist.get_group_rank(sub, 2)]
        with pytest.raises(ValueError, match="global rank 1 is not a member") as info:
            dist.get_group_rank(sub, 1)
        assert isinstance(info.value, dist.InvalidRankError) and info.value.rank == 1
        assert str(info.value).count("(ranks [0, 2])") == 1, str(info.value)  # (it was said twice)
        if dist.get_rank() in (0, 2):
            with pytest.raises(ValueError, match="dst=1 is not a member") as info:
                await dist.send(np.ones(1), 1, group=sub)
            assert str(info.value).count("ranks [0, 2]") == 1, str(info.value)
        await dist.destroy_process_group()
        return ranks

    assert run4(main) == [[0, 1]] * 4


def test_init_device_mesh_initializes_the_default_group_when_there_is_none_as_torch_does() -> None:
    # Before: GroupError "the default process group is not initialized" (the TP/FSDP tutorials call it first).
    async def main() -> Any:
        from aiodist.device_mesh import init_device_mesh

        mesh = await init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        x = np.ones(1)
        await dist.all_reduce(x, group=mesh["tp"].get_group())
        initialized = dist.is_initialized()
        await dist.destroy_process_group()
        return initialized, x.tolist()

    assert run4(main) == [(True, [2.0])] * 4
