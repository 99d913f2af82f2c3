"""A timeout of 0 is a deadline reached already (a retry loop's ``deadline - now``), not a usage error.

Before: ``recv(x, src=1, tag=1, timeout=0)`` raised ``InvalidArgumentError: timeout must be > 0`` (a
ValueError) though its message was already here, while ``timeout=1e-9`` returned it (blind probe 19: a
correct deadline loop crashed). Now a message already here completes the receive; otherwise the operation
times out at once (``CollectiveTimeoutError``, a TimeoutError), as a collective does. A negative timeout is
still a usage error.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import aiodist_run_source, sim_run_source

PROG = textwrap.dedent(
    """
    import asyncio
    import json
    import numpy as np
    import aiodist

    async def outcome(work):
        try:
            return await work
        except TimeoutError as e:
            return type(e).__name__

    async def main():
        pg = await aiodist.init_process_group(timeout=30)
        out = {}
        if pg.rank == 1:
            await aiodist.send(np.full(1, 5.0), dst=0, tag=1)
        await aiodist.barrier()  # (rank 1's message is here)
        if pg.rank == 0:
            buf = np.zeros(1)
            out["here"] = [await outcome(aiodist.recv(buf, src=1, tag=1, timeout=0)), buf.tolist()]
            out["not here"] = await outcome(aiodist.recv(buf, src=1, tag=2, timeout=0))
            try:
                aiodist.recv(buf, src=1, tag=2, timeout=-1)
            except ValueError as e:
                out["negative"] = str(e)
        await aiodist.barrier()
        if pg.rank == 0:
            print("RESULT", json.dumps(out), flush=True)
        await aiodist.destroy_process_group()
        return out
    """
)


def _check(out: dict[str, object]) -> None:
    assert out["here"] == [1, [5.0]]  # (a receive returns the sender's rank)
    assert out["not here"] == "CollectiveTimeoutError"
    assert out["negative"] == "timeout must be >= 0, got -1"


def test_a_timeout_of_zero_takes_a_message_already_here_and_times_out_otherwise_in_the_simulator(tmp_path: Path) -> None:
    for ranks in sim_run_source(tmp_path, PROG, 2, range(4)):
        _check(ranks[0])


def test_a_timeout_of_zero_takes_a_message_already_here_and_times_out_otherwise_over_tcp(tmp_path: Path) -> None:
    out = aiodist_run_source(tmp_path, PROG, 2)
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = [ln for ln in out.stdout.splitlines() if "RESULT " in ln]
    _check(json.loads(line.split("RESULT ", 1)[1]))
