"""Ctrl-C stops the simulator; a rank that raises KeyboardInterrupt itself is only that rank dying of it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import aiodist
import sim


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler, as in a terminal (a background job, as CI's, starts with SIGINT ignored)."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


async def _raises_keyboard_interrupt() -> Any:
    pg = await aiodist.init_process_group()
    if pg.rank == 2:
        raise KeyboardInterrupt("rank 2 gives up")
    await aiodist.barrier()


def _check_rank_2_died_of_it(res: sim.Result) -> None:
    assert not res.ok
    first = res.failures[0]
    assert (first.kind, first.rank) == ("exception", 2), res.summary()
    assert first.message == "KeyboardInterrupt: rank 2 gives up"
    assert "sim/loop.py" not in first.traceback and "raise KeyboardInterrupt" in first.traceback
    line = _raises_keyboard_interrupt.__code__.co_firstlineno + 3  # (its raise)
    assert first.location.endswith(f"test_sim_interrupts.py:{line} in _raises_keyboard_interrupt"), first.location
    assert sorted(first.blocked) == [0, 1, 3]  # the others wait in the barrier for it


def test_a_rank_raising_keyboard_interrupt_is_that_ranks_failure(python_sigint: None) -> None:
    # Before (exp probe 11): it went through the simulator: a traceback through sim/loop.py, no verdict.
    _check_rank_2_died_of_it(sim.run(_raises_keyboard_interrupt, world_size=4, seed=1))


def test_the_same_with_sigint_ignored_and_in_a_thread() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _check_rank_2_died_of_it(sim.run(_raises_keyboard_interrupt, world_size=4, seed=1))
    finally:
        signal.signal(signal.SIGINT, before)
    results: list[sim.Result] = []
    t = threading.Thread(target=lambda: results.append(sim.run(_raises_keyboard_interrupt, world_size=4, seed=1)))
    t.start()
    t.join(60)
    _check_rank_2_died_of_it(results[0])


def test_keep_going_lets_the_others_see_it_leave() -> None:
    res = sim.run(_raises_keyboard_interrupt, world_size=4, seed=1, stop_on_error=False)
    assert [f.rank for f in res.failures if f.kind == "exception"][0] == 2
    assert {f.rank for f in res.failures} == {0, 1, 2, 3}  # its peers fail: it left (PeerFailureError)


async def _runs_long(timers: list[threading.Timer]) -> Any:
    import _thread

    pg = await aiodist.init_process_group()
    if pg.rank == 0:  # (from inside the run: the simulator's SIGINT handler is in place by then)
        timers.append(threading.Timer(0.2, _thread.interrupt_main))  # as Ctrl-C: SIGINT's handler, main thread
        timers[-1].start()
    for _ in range(10**6):  # (bounded; minutes of wall time: Ctrl-C comes first)
        await aiodist.barrier()


def test_ctrl_c_while_the_ranks_run_still_stops_the_simulator(python_sigint: None) -> None:
    timers: list[threading.Timer] = []
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            sim.run(_runs_long, args=(timers,), world_size=4, seed=1)
    finally:
        for t in timers:
            t.cancel()
            t.join(5)
    assert type(e.value).__name__ == "CtrlC"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


async def _catches_everything() -> Any:
    pg = await aiodist.init_process_group()
    if pg.rank == 0:
        try:  # Ctrl-C lands in code that catches everything (as a retry loop or a finalizer may)
            signal.raise_signal(signal.SIGINT)
        except BaseException:  # noqa: BLE001
            pass
    await aiodist.barrier()
    return pg.rank


def test_ctrl_c_in_code_that_catches_everything_still_stops_the_simulator(python_sigint: None) -> None:
    # Before: the handler raised CtrlC in the rank's code, which swallowed it: the run went on and ended ok.
    with pytest.raises(KeyboardInterrupt) as e:
        sim.run(_catches_everything, world_size=2, seed=1)
    assert type(e.value).__name__ == "CtrlC"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_another_sigint_handler_is_left_alone() -> None:
    def mine(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("mine")

    before = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(KeyboardInterrupt):  # (it may raise plain ones: every KeyboardInterrupt stops the run)
            sim.run(_raises_keyboard_interrupt, world_size=4, seed=1)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, before)
