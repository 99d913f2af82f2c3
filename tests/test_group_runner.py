"""The operation runner and the mismatch checker of a group: what failed operations leave behind, whom
a failure blames, and the failures of their own helpers (logged, never silent)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist.api as dist
import sim
from aiodist.comm import Transport
from aiodist.errors import AiodistError, CollectiveMismatchError, CollectiveTimeoutError, PeerFailureError
from aiodist.store.server import StoreServer


async def test_a_group_broken_by_a_failure_that_names_no_rank_blames_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    failure = PeerFailureError("the job's store went away", how="the store went away")  # no rank known
    broken: list[Any] = []  # the transports whose groups report that failure
    original = Transport.group_failure

    def group_failure(self: Transport, gid: Any) -> Any:
        return failure if any(self is t for t in broken) else original(self, gid)

    monkeypatch.setattr(Transport, "group_failure", group_failure)  # (on the class: transports are slotted)

    async def body(pg: Any) -> Any:
        broken.append(pg.transport)
        try:
            with pytest.raises(PeerFailureError) as e:
                await pg.all_reduce(np.ones(1))
        finally:
            broken.remove(pg.transport)
        return e.value.rank, e.value.global_rank, str(e.value)

    for rank, global_rank, message in await run_world(2, body):
        assert rank is None and global_rank is None, message
        assert "rank 0" not in message and "the store went away" in message


async def test_operations_that_time_out_leave_nothing_behind_in_the_router() -> None:
    """Each timed-out collective withdraws its receive; the message never comes (the peer never calls).

    The withdrawn slots are forgotten when the operation ends, not kept until the group is destroyed.
    """
    done = asyncio.Event()

    async def body(pg: Any) -> Any:
        if pg.rank == 1:
            await done.wait()  # never calls: rank 0's collectives time out
            return None
        try:
            for _ in range(20):
                with pytest.raises(CollectiveTimeoutError):
                    await pg.all_reduce(np.ones(1), timeout=0.02)
            table = pg.transport.router.table
            return len(table._abandoned), len(table.ops.calls), pg.transport.router.buffered(1)
        finally:
            done.set()

    res = await run_world(2, body)
    assert res[0] == (0, 0, (0, 0))


# ---------------------------------------------------------------------- failures of the helpers are logged


async def _store_gone_then_stalled_collective() -> Any:
    pg = await dist.init_process_group(timeout=5)
    x = np.ones(4, np.float32)
    await pg.all_reduce(x)
    await asyncio.sleep(1.0)  # the store host dies meanwhile
    out = None
    if pg.rank == 0:
        with pytest.raises(CollectiveTimeoutError):
            await pg.all_reduce(x, timeout=1.0)  # rank 1 never calls: the fingerprint check starts at 0.3 s
        out = "timeout"
    else:
        await asyncio.sleep(1.5)
    await dist.destroy_process_group()
    return out


def test_a_fingerprint_check_without_a_store_says_why_it_gave_up(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiodist.mismatch"):
        res = sim.run(_store_gone_then_stalled_collective, world_size=2, seed=0, faults=[sim.CrashStore(at=0.5)],
                      explore=False)  # (fixed timing: the store dies between the two all_reduces, no pause spans it)
    assert res.ok, res.summary()
    assert res.rank_results[0] == "timeout"
    gave_up = [r for r in caplog.records if r.name == "aiodist.mismatch" and "gave up" in r.getMessage()]
    assert gave_up and "StoreConnectionLost" in gave_up[0].getMessage(), caplog.text


async def _store_gone_then_mismatch() -> Any:
    pg = await dist.init_process_group(timeout=5)
    await pg.all_reduce(np.ones(4, np.float32))
    await asyncio.sleep(1.0)  # the store host dies meanwhile
    with pytest.raises(CollectiveMismatchError):
        await pg.all_reduce(np.ones(4, np.float64 if pg.rank == 0 else np.float32))
    await asyncio.sleep(0.5)
    await dist.destroy_process_group()
    return "mismatch"


def test_a_mismatch_that_cannot_be_marked_in_the_store_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiodist.mismatch"):
        res = sim.run(_store_gone_then_mismatch, world_size=2, seed=0, faults=[sim.CrashStore(at=0.5)],
                      explore=False)  # (fixed timing: the store dies between the two all_reduces)
    assert res.ok, res.summary()
    marks = [r for r in caplog.records if "could not mark the mismatch" in r.getMessage()]
    assert {r.getMessage().split(":")[0] for r in marks} == {"rank 0", "rank 1"}, caplog.text


async def _mismatch_with_a_dead_member() -> Any:
    pg = await dist.init_process_group(timeout=5)
    if pg.rank == 2:
        await asyncio.sleep(5)  # crashed meanwhile
        return None
    await asyncio.sleep(0.1)
    try:
        await pg.all_reduce(np.ones(4, np.float64 if pg.rank == 0 else np.float32))
        out = "completed"
    except AiodistError as e:
        out = type(e).__name__
    await asyncio.sleep(1.5)
    await dist.destroy_process_group()
    return out


def test_a_mismatch_report_that_cannot_reach_a_member_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiodist.comm"):
        res = sim.run(_mismatch_with_a_dead_member, world_size=3, seed=0, faults=[sim.Crash(2, at=0.05)],
                      stop_on_error=False)
    assert res.rank_results[:2] == ["CollectiveMismatchError"] * 2, res.summary()
    lost = [r for r in caplog.records if "could not report the mismatch" in r.getMessage()]
    assert lost and all("to rank 2" in r.getMessage() for r in lost), caplog.text


async def test_a_store_that_fails_to_close_at_the_end_of_the_job_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    close = StoreServer.close

    async def failing_close(self: StoreServer) -> None:
        await close(self)
        raise OSError("the listening socket was already gone")

    monkeypatch.setattr(StoreServer, "close", failing_close)

    async def body(pg: Any) -> int:
        return pg.rank

    with caplog.at_level(logging.DEBUG, logger="aiodist.api"):
        assert await run_world(2, body) == [0, 1]
    failed = [r for r in caplog.records if r.name == "aiodist.api" and "failed" in r.getMessage()]
    assert len(failed) == 1 and "already gone" in failed[0].getMessage(), caplog.text
