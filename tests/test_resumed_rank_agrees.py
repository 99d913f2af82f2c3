"""Real processes: a rank stopped past the failure detector's timeout, then resumed, agrees with its peers on
which collectives happened.

Three ranks run all_reduce in a loop; rank 2 sleeps between its calls. It is
stopped (SIGSTOP) while it sleeps: its peers have started the next all_reduce
and sent it their part. They declare it failed after the heartbeats' 3 s and
their call fails. On SIGCONT its sleep is over: it makes the same call, finds
its peers' parts waiting (they came before the news of its eviction) and,
without the eviction notice naming the operations its senders failed, used to
complete it: the ranks then disagreed on whether that all_reduce happened.

Run as a script (``--worker``) it is the worker.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import pytest
from rank_procs import RankProcs, emit

WORLD = 3
VICTIM = 2


def worker() -> None:
    import asyncio
    import os

    import numpy as np

    import aiodist.api as dist
    from aiodist.eventloop import run

    async def main() -> None:
        pg = await dist.init_process_group(timeout=60.0)
        done = -1  # the last step whose all_reduce completed here
        try:
            for step in range(100_000):
                x = np.full(4, float(pg.rank + 1))
                await dist.all_reduce(x)
                assert x[0] == 6.0, x
                done = step
                if step == 50:
                    emit("ready")
                if step >= 50 and pg.rank == VICTIM:
                    await asyncio.sleep(0.5)  # (stopped in here: its peers are in the next step)
        except Exception as e:  # noqa: BLE001 - reported whatever it is
            emit("error", type=type(e).__name__, msg=str(e)[:400], rank=getattr(e, "rank", None), done=done)
            os._exit(0)

    run(main())


pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="signals")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
async def test_a_resumed_rank_fails_the_collective_its_peers_failed_while_it_was_stopped(transport: str) -> None:
    async with await RankProcs.start([__file__, "--worker"], WORLD, env={"AIODIST_TRANSPORT": transport}) as ranks:
        await ranks.all_ready(60)
        ranks.kill(VICTIM, signal.SIGSTOP)
        peers = [r for r in range(WORLD) if r != VICTIM]
        assert await ranks.until(lambda: ranks.reported("error", peers), 15), ranks.of("error")
        ranks.procs[VICTIM].send_signal(signal.SIGCONT)
        assert await ranks.until(lambda: ranks.reported("error", [VICTIM]), 15), ranks.of("error")
    events = ranks.of("error")
    for r in peers:
        assert events[r]["type"] == "PeerFailureError" and events[r]["rank"] == VICTIM, events
    assert events[0]["done"] == events[1]["done"], events
    victim = events[VICTIM]
    assert victim["type"] == "EvictedError" and victim["rank"] == VICTIM, events
    assert victim["done"] == events[0]["done"], f"the ranks disagree on which all_reduce happened: {events}"


def test_a_failure_notice_names_the_operations_waiting_here_and_voids_them_where_it_comes() -> None:
    """Pure: the sender names the collectives with a receive waiting in the failed rank's groups; where the
    notice comes, those operations are void even where their messages came (what completes an operation
    checks :meth:`Router.void_error`); a malformed list is bad input, a destroyed group is skipped."""
    from test_badinput_router import feed, keyed

    from aiodist.comm import frames as F
    from aiodist.comm.mismatch_reports import apply_voids
    from aiodist.comm.router import Router
    from aiodist.errors import EvictedError

    sender = Router()
    for src, key, group in [(1, (4, 0), 0), (2, (4, 1), 0), (1, (5, 0), 0), (1, (2, 0), 7)]:
        sender.post_keyed(keyed(src, key, group)[0])
    assert sender.waiting_ops(lambda gid: gid == 0) == [(0, 4), (0, 5)]  # (each once, oldest first)

    accused = Router()  # rank 2: its part of seq 4 came before the news, no receive waits any more
    accused.know_group(0, (0, 1, 2))
    r, sink = keyed(1, (4, 0))
    accused.post_keyed(r)
    feed(accused, 1, F.message(0, [4, 0], None), b"x")
    assert len(sink.results) == 1 and not isinstance(sink.results[0], BaseException)
    assert accused.void_error(0, 4) is None
    evicted = lambda rank: EvictedError("declared failed by its peers", rank=rank)  # noqa: E731
    assert apply_voids(accused, 1, 2, [[0, 4], [0, 5]], evicted) is None
    e = accused.void_error(0, 4)
    assert isinstance(e, EvictedError) and e.rank == 2
    assert accused.void_error(0, 3) is None  # (only what the notice names)
    later, s_later = keyed(1, (5, 0))  # a receive of a named operation posted later fails at once
    accused.post_keyed(later)
    assert isinstance(s_later.results[0], EvictedError)
    for bad in ([0, 4], [[0]], [[0, "4"]], [[0, -1]], [[[0], 4]], "x"):
        assert isinstance(apply_voids(accused, 1, 2, bad, evicted), str), bad
    # not bad input, skipped: a group that is not this rank's (a subgroup it is not in), a destroyed one
    assert apply_voids(accused, 1, 2, [[7, 1]], evicted) is None and accused.void_error(7, 1) is None
    accused.know_group(9, (0, 1, 2))
    accused.forget_group(9, lambda r: RuntimeError("destroyed"))
    assert apply_voids(accused, 1, 2, [[9, 1]], evicted) is None and accused.void_error(9, 1) is None


async def _steps(pause_at: int, waits: int, seconds: float) -> tuple[int, str | None]:
    """Simulator program: all_reduce 20 times; rank ``waits`` sleeps ``seconds`` before step ``pause_at``
    (and rank 2 before each later one, when ``waits`` is 2). (last step completed, error type or None)."""
    import asyncio

    import numpy as np

    import aiodist

    pg = await aiodist.init_process_group(timeout=60)
    done = -1
    try:
        for step in range(20):
            if pg.rank == waits and (step == pause_at or (waits == VICTIM and step > pause_at)):
                await asyncio.sleep(seconds)
            x = np.full(4, float(pg.rank + 1))
            await aiodist.all_reduce(x)
            assert x[0] == 6.0, x
            done = step
    except aiodist.AiodistError as e:
        return done, type(e).__name__
    return done, None


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("waits", "what"), [(VICTIM, "between steps"), (0, "in a step")])
def test_in_the_simulator_a_paused_rank_agrees_with_its_peers(seed: int, waits: int, what: str) -> None:
    """Paused past the detector's timeout between two steps (its peers failed the next one), or in a step
    whose every message it had sent (its peers completed it): either way the ranks agree on which steps
    happened, and the paused rank learns that it was evicted."""
    import functools

    import sim

    main = functools.partial(_steps, 5, waits, 0.3 if waits == VICTIM else 1.0)
    res = sim.run(main, world_size=WORLD, seed=seed, faults=[sim.Pause(VICTIM, at=1.0 if waits == VICTIM else 0.5,
                                                                        duration=5.0)], explore=False)
    (d0, e0), (d1, e1), (d2, e2) = res.rank_results
    assert e0 == e1 == "PeerFailureError" and e2 == "EvictedError", res.rank_results
    assert d0 == d1 == d2 >= 4, (what, res.rank_results)


async def _two_subgroups() -> tuple[str, str | None]:
    """Subgroups A = {0, 2} and B = {0, 1, 3} each run all_reduce in a loop (rank 2 is paused in A's)."""
    import asyncio

    import numpy as np

    import aiodist

    await aiodist.init_process_group(timeout=60)
    r = aiodist.get_rank()
    a = await aiodist.new_group([0, 2])
    b = await aiodist.new_group([0, 1, 3])

    async def loop(g: Any, n: int) -> None:
        for _ in range(n):
            await aiodist.all_reduce(np.ones(4), group=g)
            await asyncio.sleep(0.1)

    mine = [(a, 100)] if r in (0, 2) else []
    mine += [(b, 80)] if r in (0, 1, 3) else []
    results = await asyncio.gather(*(loop(g, n) for g, n in mine), return_exceptions=True)
    errors = [f"{type(e).__name__} rank={getattr(e, 'rank', None)}" for e in results if isinstance(e, BaseException)]
    return (", ".join(errors) or "ok"), None


def test_a_failure_notice_naming_a_subgroup_a_peer_is_not_in_is_no_bad_input() -> None:
    """Rank 0 declares rank 2 (paused) failed and names its operation of subgroup {0, 2} in the notice it sends
    every peer: ranks 1 and 3, not in that subgroup, took it for bad input, closed rank 0's connection and
    broke their subgroup with it ({0, 1, 3}, which rank 2 is not in)."""
    import sim

    res = sim.run(_two_subgroups, world_size=4, seed=0, explore=False,
                  faults=[sim.Pause(2, at=1.0, duration=5.0)])
    said = [r[0] for r in res.rank_results]
    assert said[1] == said[3] == "ok", res.rank_results  # B never breaks
    assert said[0].startswith("PeerFailureError rank=1"), res.rank_results  # A: its rank 1 is global rank 2


if __name__ == "__main__" and len(sys.argv) == 2 and sys.argv[1] == "--worker":
    worker()
