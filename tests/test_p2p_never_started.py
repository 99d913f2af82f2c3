"""A point-to-point operation whose task never runs leaves no "coroutine ... was never awaited" behind.

Before: ``recv``, ``send`` and ``recv_object_list`` made their coroutine at the call and handed it to a
wrapper task; a task cancelled before its first step (``recv_object_list`` followed at once by
``destroy_process_group``) or dropped with its loop (a rank ending right after ``irecv``: the
simulator's world is discarded) left that coroutine un-awaited, and Python printed
``RuntimeWarning: coroutine 'recv_message.<locals>.run' was never awaited`` (or ``recv.<locals>.run``)
after the run, naming aiodist's internals instead of anything the program did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, aiodist_run_source

from aiodist.errors import InvalidArgumentTypeError


PROG = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import aiodist

    CASE = os.environ["CASE"]

    async def main():
        pg = await aiodist.init_process_group()
        if pg.rank == 1:
            if CASE == "recv_object_list_then_destroy":  # its task is cancelled before its first step
                w = aiodist.recv_object_list([None], src=0)
                await aiodist.destroy_process_group()
                try:
                    await w
                except aiodist.GroupError:
                    print("recv_object_list failed: GroupError")
                return
            if CASE == "irecv_then_exit":  # the world ends before its task's first step
                w = aiodist.irecv(np.zeros(2), src=0)
                sys.exit(3)
            if CASE == "recv_object_list_then_exit":
                w = aiodist.recv_object_list([None], src=0)
                sys.exit(3)
        await aiodist.destroy_process_group()
    """
)

CASES = ["recv_object_list_then_destroy", "irecv_then_exit", "recv_object_list_then_exit"]


def _coroutine_warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "coroutine '" in line and "never awaited" in line]


@pytest.mark.parametrize("case", CASES)
def test_no_coroutine_left_unawaited_in_the_simulator(tmp_path: Path, case: str) -> None:
    (tmp_path / "prog.py").write_text(PROG)
    env = {**os.environ, "CASE": case, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "sim", "run", "-n", "2", "prog.py", "--seed", "0"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == (0 if case.endswith("destroy") else 1), out.stdout + out.stderr
    assert _coroutine_warnings(out.stdout + out.stderr) == [], out.stdout + out.stderr


def test_no_coroutine_left_unawaited_in_real_processes(tmp_path: Path) -> None:
    out = aiodist_run_source(tmp_path, PROG, 2, env={"CASE": "recv_object_list_then_destroy"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "recv_object_list failed: GroupError" in out.stdout
    assert _coroutine_warnings(out.stdout + out.stderr) == [], out.stdout + out.stderr


def test_a_batch_with_a_refused_op_withdraws_the_receives_it_started_and_does_not_warn_about_them() -> None:
    """Before: the Work of the irecv started before the refused op was lost with the exception (a warning
    blamed the call's line for not awaiting it), and its receive stayed posted, swallowing the next message."""
    import asyncio
    import gc
    import warnings

    import numpy as np

    import aiodist
    import sim

    async def main() -> Any:
        pg = await aiodist.init_process_group()
        if pg.rank == 0:
            await aiodist.barrier()
            await aiodist.send(np.full(2, 7.0), dst=1)
        else:
            ops = [aiodist.P2POp(aiodist.irecv, np.zeros(2), 0), aiodist.P2POp(aiodist.irecv, np.zeros(2), 0, tag="x")]
            with pytest.raises(InvalidArgumentTypeError) as info:
                aiodist.batch_isend_irecv(ops)
            assert any("p2p_op_list[1] was refused" in n for n in getattr(info.value, "__notes__", [])), info.value
            await asyncio.sleep(0)
            await aiodist.barrier()
            buf = np.zeros(2)
            await aiodist.recv(buf, src=0, timeout=5)  # the message is this receive's, not the abandoned one's
            assert buf.tolist() == [7.0, 7.0]
        await aiodist.destroy_process_group()
        return pg.rank

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sim.run(main, world_size=2, seed=0, trace=False)
        gc.collect()
    assert res.ok, res.summary()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


def test_an_eager_start_on_a_closed_loop_closes_its_coroutine() -> None:
    """(A collective called as a closed loop's task is dropped: its coroutine was left never awaited.)"""
    import asyncio
    import inspect

    from aiodist.eager import start_eager

    async def op() -> None:
        await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    loop.close()
    coro = op()
    with pytest.raises(RuntimeError, match="closed"):
        start_eager(coro, loop)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
