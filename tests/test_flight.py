"""Flight recorder: in-flight table, history, dump on failure and the merged report."""

from __future__ import annotations

import asyncio
import contextvars
import json

import pytest

from aiodist import context, flight, inflight


async def test_waiting_in_records_state_and_history():
    ctx = contextvars.copy_context()
    ctx.run(context.new_rank_scope)

    async def prog():
        with inflight.waiting_in("all_reduce", seq=0, group="world"):
            assert [e["op"] for e in inflight.snapshot()] == ["all_reduce"]
            await asyncio.sleep(0)
        with pytest.raises(ValueError):
            with inflight.waiting_in("broadcast", seq=1, group="world"):
                raise ValueError("boom")
        task = asyncio.ensure_future(_blocked())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return inflight.snapshot(), inflight.recent()

    async def _blocked():
        with inflight.waiting_in("recv", peer=3):
            await asyncio.sleep(3600)

    now, hist = await ctx.run(asyncio.ensure_future, prog())
    assert now == []
    assert [(e["op"], e["state"]) for e in hist] == [
        ("all_reduce", "done"),
        ("broadcast", "failed: ValueError: boom"),
        ("recv", "cancelled"),
    ]
    assert all(e["end"] >= e["start"] for e in hist)
    # another rank's scope sees none of it
    other = contextvars.copy_context()
    other.run(context.new_rank_scope)
    assert other.run(inflight.recent) == []


def test_the_dump_line_says_it_is_a_note_the_program_may_handle(caplog):
    # Before: "rank 0: CollectiveTimeoutError: ...": a timeout the program caught read as the rank's end.
    context.new_rank_scope()
    with caplog.at_level("WARNING", logger="aiodist.flight"):
        flight.dump("CollectiveTimeoutError: recv timed out", rank=0)
    assert caplog.messages == ["rank 0: flight recorder, a first failure (the program may handle it): "
                               "CollectiveTimeoutError: recv timed out; in flight: nothing"]


async def test_dump_and_report_name_the_rank_behind(tmp_path):
    async def rank_prog(rank: int, last_seq: int):
        context.set_rank_environ({"RANK": str(rank), "AIODIST_FLIGHT_RECORDER_DIR": str(tmp_path)})
        context.new_rank_scope()
        for s in range(last_seq):
            with inflight.waiting_in("all_reduce", seq=s, group="world"):
                pass
        with inflight.waiting_in("all_reduce", seq=last_seq, group="world", peers=[2]):
            return flight.dump("timed out", world_size=3)

    paths = await asyncio.gather(
        asyncio.create_task(rank_prog(0, 5), context=contextvars.Context()),
        asyncio.create_task(rank_prog(1, 5), context=contextvars.Context()),
        asyncio.create_task(rank_prog(2, 3), context=contextvars.Context()),
    )
    assert [p.name for p in paths] == ["rank0.json", "rank1.json", "rank2.json"]
    rec = json.loads(paths[2].read_text())
    assert rec["rank"] == 2 and rec["inflight"][0]["seq"] == 3
    text = flight.report(flight.load(tmp_path))
    assert "behind: rank 2 at seq 3" in text
    assert "waiting in all_reduce group=world seq=5" in text


def test_trace_cli(tmp_path, capsys):
    from aiodist.flight import _cli_main
    import argparse

    assert _cli_main(argparse.Namespace(directory=str(tmp_path), json=False)) == 1
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "reason": "x", "inflight": [], "recent": []}))
    assert _cli_main(argparse.Namespace(directory=str(tmp_path), json=False)) == 0
    assert "rank 0: x" in capsys.readouterr().out


async def test_a_collective_in_flight_lists_the_peers_it_still_receives_from():
    import numpy as np
    from conftest import run_world

    async def body(pg):
        if pg.rank == 1:
            await asyncio.sleep(0.3)  # late: rank 0 waits for it meanwhile
            await pg.all_reduce(np.ones(2))
            return None
        w = pg.all_reduce(np.ones(2))
        await asyncio.sleep(0.1)
        during = [e for e in inflight.snapshot() if e["op"] == "all_reduce"]
        await w
        after = [e for e in inflight.recent() if e["op"] == "all_reduce"]
        return during, after

    (during, after), _ = await run_world(2, body)
    assert [e.get("peers") for e in during] == [[1]]  # a list (JSON-ready), the peer waited for
    assert after[-1]["state"] == "done" and "peers" not in after[-1]  # nobody left to wait for
    json.dumps(after)


def test_sources_whose_object_is_gone_do_not_pile_up() -> None:
    """Soak probe: every store client registers a source (its quick calls) and the list was pruned only when
    a snapshot was taken: a healthy process making clients one after another kept a dead reference for each
    (640 kB per 1,000 clients)."""

    class Client:
        def calls(self) -> list[dict[str, object]]:
            return [{"op": "store.set", "start": 0.0}]

    def body() -> tuple[int, int]:
        kept = Client()
        inflight.add_source(kept.calls)
        for _ in range(10_000):
            inflight.add_source(Client().calls)  # (dropped at once)
        return len(inflight._recorder().sources), len(inflight.snapshot())

    ctx = contextvars.copy_context()
    ctx.run(context.new_rank_scope)
    n, live = ctx.run(body)
    assert live == 1
    assert n <= 64, n  # (not 10,001)
