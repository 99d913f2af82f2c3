"""A forgotten ``await`` is never silent: warnings at the call site, the ledger, destroy / finish_rank raise."""

from __future__ import annotations

import asyncio
import gc
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist
import aiodist.api as dist
import sim
from aiodist.store import MemoryStore
from aiodist.work import UnawaitedOperationError, clear_unawaited, unawaited_operations
from test_launcher_run import launch_source


async def _world_of_one() -> Any:
    return await dist.init_process_group(store=MemoryStore(), rank=0, world_size=1)


def _forget(x: np.ndarray) -> None:
    dist.all_reduce(x)  # the forgotten await (this line is named below)


def _line_of(marker: str) -> int:
    """The line of this file that holds ``marker`` (in a comment)."""
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(marker))


FORGET_LINE = _line_of("# the forgotten await (this line is named below)")


@pytest.fixture(autouse=True)
async def _no_group_left() -> Any:
    yield
    clear_unawaited()
    if dist.is_initialized():
        await dist.abort()


async def test_a_collected_work_warns_at_the_users_line_and_destroy_raises() -> None:
    await _world_of_one()
    x = np.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _forget(x)
        gc.collect()
    (w,) = [c for c in caught if issubclass(c.category, RuntimeWarning)]
    assert Path(w.filename).name == "test_unawaited.py" and w.lineno == FORGET_LINE
    assert f"all_reduce #0 of world (test_unawaited.py:{FORGET_LINE} in _forget) was never awaited" in str(w.message)
    assert unawaited_operations() == [f"all_reduce #0 of world (test_unawaited.py:{FORGET_LINE} in _forget)"]
    with pytest.raises(UnawaitedOperationError) as info:
        await dist.destroy_process_group()
    assert info.value.operations == [f"all_reduce #0 of world (test_unawaited.py:{FORGET_LINE} in _forget)"]
    assert "never awaited" in str(info.value) and "rank 0" in str(info.value)
    assert unawaited_operations() == [] and not dist.is_initialized()  # destroyed all the same, and forgotten


async def test_every_way_of_looking_at_the_result_counts_as_awaiting() -> None:
    await _world_of_one()
    x = np.ones(2)
    await dist.all_reduce(x)
    await dist.broadcast(x).wait()
    done = dist.barrier()
    await asyncio.sleep(0)
    assert done.done() and done.result() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert dist.all_reduce(x).then(lambda v: v.sum()) is not None  # a then() carries the booking ...
    assert len(unawaited_operations()) == 1  # ... and is itself not awaited
    clear_unawaited()
    held = dist.all_reduce(x)  # alive: destroy does not count it, finish_rank does
    await dist.destroy_process_group()
    line = _line_of("# alive: destroy does not count it, finish_rank does")
    assert unawaited_operations() == [f"all_reduce #4 of world (test_unawaited.py:{line} in {_fn()})"]
    with pytest.raises(UnawaitedOperationError, match="all_reduce #4"):
        await dist.finish_rank()
    del held


async def test_operations_beyond_the_ledgers_cap_are_counted_and_awaiting_them_takes_them_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: past 10,000 operations in flight, every awaited one still counted as never awaited, and the
    rank failed at its end with UnawaitedOperationError ("1 operation ... and 1 more", no call site)."""
    import aiodist.work

    monkeypatch.setattr(aiodist.work, "MAX_ENTRIES", 3)
    await _world_of_one()
    x = np.ones(2)
    works = [dist.all_reduce(x) for _ in range(5)]  # 3 with their call site, 2 only counted
    await asyncio.gather(*works)
    assert unawaited_operations() == []
    await dist.finish_rank()  # nothing left: no error
    await _world_of_one()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        kept = [dist.all_reduce(x) for _ in range(5)]
        await asyncio.gather(*kept[:2])
    with pytest.raises(UnawaitedOperationError) as info:
        await dist.finish_rank()
    assert "3 operations started" in str(info.value) and "2 more (their call sites were not kept" in str(info.value)
    del kept


def _fn() -> str:
    return "test_every_way_of_looking_at_the_result_counts_as_awaiting"


async def test_finish_rank_destroys_the_group_and_is_a_no_op_afterwards() -> None:
    await _world_of_one()
    await dist.all_reduce(np.ones(2))
    await dist.finish_rank()
    assert not dist.is_initialized()
    await dist.finish_rank()


def test_each_simulated_rank_has_its_own_ledger_even_when_another_rank_collects_the_work() -> None:
    shared: list[Any] = []

    async def main() -> Any:
        pg = await dist.init_process_group()
        if pg.rank == 0:
            shared.append(dist.barrier())  # rank 0 starts it, never awaits it
        await asyncio.sleep(0.01)
        if pg.rank == 1:
            await dist.barrier()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                shared.clear()  # collected while rank 1 runs: still rank 0's
        await asyncio.sleep(0.01)
        mine = unawaited_operations()
        clear_unawaited()
        await dist.destroy_process_group()
        return mine

    res = sim.run(main, world_size=2, seed=0)
    res.raise_on_failure()
    assert len(res.rank_results[0]) == 1 and res.rank_results[0][0].startswith("barrier #0 of world (")
    assert res.rank_results[1] == []


async def test_awaited_point_to_point_and_collectives_leave_nothing_behind_over_tcp() -> None:
    async def body(pg: Any) -> Any:
        x = np.ones(4)
        if pg.rank == 0:
            await dist.send(x, 1)
            h = dist.isend(x, 1)
            await h.wait()
        else:
            await dist.recv(x, 0)
            await dist.irecv(x, 0)
        await dist.all_reduce(x)
        return unawaited_operations()

    assert await run_world(2, body) == [[], []]


async def test_a_launched_rank_that_forgot_an_await_fails_naming_it(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group()
            g = np.ones(4)
            aiodist.all_reduce(g)
            await aiodist.barrier()
        """,
        2,
    )
    blame = run.result.root_cause
    assert not run.result.ok and blame is not None and blame.kind == "raised", run.logs
    assert "UnawaitedOperationError" in blame.message and "all_reduce #0 of world (prog.py:8 in main)" in blame.message
    err = "\n".join(run.lines("err", blame.rank))
    assert "prog.py:8: RuntimeWarning: all_reduce #0 of world (prog.py:8 in main) was never awaited" in err


def test_mypy_flags_a_dropped_work_with_unused_awaitable(tmp_path: Path) -> None:
    api = pytest.importorskip("mypy.api")
    prog = tmp_path / "forgot.py"
    prog.write_text(textwrap.dedent("""
        import numpy as np
        import aiodist

        async def step(x: np.ndarray) -> None:
            aiodist.all_reduce(x)
            await aiodist.broadcast(x)
    """))
    out, _, status = api.run([str(prog), "--enable-error-code", "unused-awaitable", "--follow-imports=silent",
                              "--no-incremental", "--python-executable", __import__("sys").executable,
                              "--cache-dir", str(tmp_path / "cache")])
    assert status == 1 and 'forgot.py:6: error: Value of type "Work[Any]" must be used  [unused-awaitable]' in out, out
    assert out.count("error:") == 1, out


async def test_a_script_that_destroys_its_group_still_fails_for_a_work_it_held_but_never_awaited(tmp_path: Path) -> None:
    """Before (torch probe): a script's own ``asyncio.run(main())`` that destroyed its group itself ended with
    only a RuntimeWarning for an operation whose Work it still held (exit 0), while the simulator failed the
    same program ("main returned: 1 operation ... never awaited"). Now both fail it."""
    run = await launch_source(
        tmp_path,
        """
        import asyncio
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group()
            g = np.ones(4)
            w = aiodist.all_reduce(g)
            await asyncio.sleep(0.2)
            await aiodist.destroy_process_group()

        if __name__ == "__main__":
            asyncio.run(main())
        """,
        2,
    )
    blame = run.result.root_cause
    assert not run.result.ok and blame is not None and blame.kind == "raised", run.logs
    assert "UnawaitedOperationError" in blame.message and "all_reduce #0 of world (prog.py:9 in main)" in blame.message


def test_polling_is_completed_consumes_a_success_and_keeps_a_failure_booked() -> None:
    """torch code polls ``req.is_completed()`` and then reads the tensor. Before (torch probe): such a Work still
    counted as never awaited, and the simulator failed the program at its end. A failed one stays booked (its
    error would be lost otherwise)."""
    async def main() -> Any:
        pg = await dist.init_process_group()
        x = np.zeros(1)
        if pg.rank == 0:
            req = dist.irecv(x, src=1)
            for _ in range(1000):
                if req.is_completed():
                    break
                await asyncio.sleep(0.001)
            bad = dist.recv(np.zeros(3), src=1, tag=1)  # (a 1-element message: it fails)
            for _ in range(1000):
                if bad.is_completed():
                    break
                await asyncio.sleep(0.001)
            left = unawaited_operations()
            assert isinstance(bad.exception(), dist.CollectiveMismatchError)  # (looked at: no longer booked)
        else:
            await dist.send(np.array([5.0]), 0)
            await dist.send(np.array([1.0]), 0, tag=1)
            left = []
        await dist.destroy_process_group()
        return float(x[0]), [op.split()[0] for op in left]

    res = sim.run(main, world_size=2, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [(5.0, ["recv"]), (0.0, [])]


async def test_a_future_got_from_a_work_carries_its_duty_to_be_awaited() -> None:
    # torch24 probe, finding 1: ``w.get_future()`` counted as awaiting the Work, so a port that took the future
    # and never waited on it read an unreduced tensor with no warning, exit code 0 and "ok" in the simulator.
    await _world_of_one()
    x = np.ones(2)
    forgotten = dist.all_reduce(x, async_op=True).get_future()  # the future nobody looks at
    line = _line_of("# the future nobody looks at")
    await asyncio.sleep(0)
    name = "test_a_future_got_from_a_work_carries_its_duty_to_be_awaited"
    assert unawaited_operations() == [f"all_reduce #0 of world (test_unawaited.py:{line} in {name})"]
    assert forgotten.value() == [x]  # (looking at it counts)
    assert unawaited_operations() == []
    for consume in (lambda f: f.wait(), lambda f: f, lambda f: f.then(lambda g: g.value()).wait()):
        fut = dist.all_reduce(x, async_op=True).get_future()
        await consume(fut)
        assert unawaited_operations() == [], consume
    polled = dist.all_reduce(x, async_op=True).get_future()
    while not polled.done():  # torch's polling, yielding to the loop: a success seen done counts
        await asyncio.sleep(0)
    assert unawaited_operations() == []
