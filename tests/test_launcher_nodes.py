"""A job of several nodes (several launchers): every launcher and every rank names the rank whose own failure started it.

A rank's own error reaches the peers connected to it in its ``bye``. Its
launcher then stops its other ranks (SIGTERM): a rank stopped so says, in its
``bye``, which failure its launcher stopped it for, so that the ranks of the
other nodes (whose launchers know nothing of that failure) blame that rank,
not the one whose connections broke first.
"""

from __future__ import annotations

import asyncio
import io
import textwrap
from pathlib import Path

import pytest

from aiodist.comm import frames as F
from aiodist.comm.links import Links
from aiodist.errors import PeerFailureError
from aiodist.launch.cli import build_command
from aiodist.launch import outcome
from aiodist.launch.outcome import Blame, describe_exception, root_cause
from aiodist.launch.supervisor import LaunchConfig, free_port, launch
from test_comm_links import ready, sent
from test_launcher_run import child_env

RAISES = """
import asyncio, os
import numpy as np
import aiodist

async def main():
    pg = await aiodist.init_process_group(timeout=30)
    x = np.ones(4)
    for i in range(5):
        await aiodist.all_reduce(x)
        if pg.rank == int(os.environ["BAD"]) and i == 2:
            raise ValueError(f"boom from rank {pg.rank}")
        await asyncio.sleep(0.3)
"""


async def _two_nodes(tmp_path: Path, bad: int) -> list[tuple[int, Blame | None, list[str], str]]:
    """Two launchers of 2 ranks each (ranks 0, 1 and 2, 3); rank ``bad`` raises: each one's (exit code, root
    cause, log lines, ranks' stderr)."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(RAISES))
    env = {**child_env(), "BAD": str(bad)}
    port = free_port()
    logs: list[list[str]] = [[], []]
    errs = [io.BytesIO(), io.BytesIO()]
    configs = [LaunchConfig(command=build_command(str(prog), []), nproc_per_node=2, nnodes=2, node_rank=node,
                            master_port=port, env=env, timeout=40) for node in range(2)]
    async with asyncio.timeout(50):
        results = await asyncio.gather(*(
            launch(c, stdout=io.BytesIO(), stderr=e, log=log.append, handle_signals=False)
            for c, e, log in zip(configs, errs, logs, strict=True)
        ))
    return [(r.exit_code, r.root_cause, log, e.getvalue().decode())
            for r, log, e in zip(results, logs, errs, strict=True)]


@pytest.mark.parametrize("bad", [3, 1], ids=["rank3-of-node1", "rank1-of-node0-whose-store-host-is-stopped"])
async def test_a_rank_that_raises_is_the_root_cause_on_every_node(tmp_path: Path, bad: int) -> None:
    # Before: the launcher of the other node said "rank 2 (on another node) failed or left" (with bad=3; its
    # ranks: "rank 2 failed: connection lost"): the rank that the failing rank's launcher stopped afterwards,
    # whose connections broke first. The ValueError appeared nowhere on that node.
    error = f"ValueError: boom from rank {bad} (prog.py:12)"
    stopped = bad ^ 1  # (the other rank of its node, which its launcher stops)
    own, other = (1, 0) if bad >= 2 else (0, 1)
    nodes = await _two_nodes(tmp_path, bad)
    code, blame, logs, err = nodes[own]
    assert code == 1 and blame is not None and (blame.rank, blame.kind) == (bad, "raised"), (logs, err)
    assert f"root cause: rank {bad} raised {error}" in logs
    code, blame, logs, err = nodes[other]
    assert code == 1 and blame is not None and blame.rank == bad, (logs, err)
    assert logs[0].startswith(f"root cause: rank {bad} (on another node) raised {error}; "), (logs, err)
    # every rank of that node names the ValueError, none a lost connection
    for r in (2 * other, 2 * other + 1):
        said = [line for line in err.splitlines() if line.startswith(f"[rank{r}]: aiodist.errors.PeerFailureError")]
        assert len(said) == 1 and said[0].endswith(f"raised {error}"), err
        assert f"rank {stopped} failed: connection lost" not in err, err
    said = [line for line in err.splitlines() if f"rank {stopped} failed:" in line]
    # (stopped by its launcher; or, when it learned of the failure and raised before the stop came, it left
    # saying so: either way naming rank ``bad``'s error, never a lost connection)
    assert all(f"rank {stopped} failed: stopped by its launcher after rank {bad} failed: raised {error}" in line
               or f"rank {stopped} failed: left the job after rank {bad} failed: raised {error}" in line
               for line in said), err


# ------------------------------------------------------------------ the pieces: pure


def test_a_stopped_ranks_bye_names_the_failure_its_launcher_stopped_it_for() -> None:
    m = Links(2, 4, dial_defer=0)
    c0, c3 = ready(m, 0), ready(m, 3)
    m.bye(3, 3, "raised ValueError: boom (prog.py:11)")  # rank 3's own error
    assert m.first_failure == (3, "raised ValueError: boom (prog.py:11)")  # (was (None, ...): rank 3 not named)
    assert m.stopped_for(3, "raised ValueError: boom (prog.py:11)")
    assert sent(m.close(), F.BYE) == [(c0, F.bye((3, "raised ValueError: boom (prog.py:11)"), stopped=True))]
    assert F.bye((3, "x"), stopped=True) == {F.KIND: F.BYE, F.RANK: 3, F.HOW: "x", F.STOPPED: True}
    assert not m.stopped_for(1, "later")  # (it left already)
    n = Links(1, 4, dial_defer=0)
    assert not n.stopped_for(1, "itself") and not n.stopped_for(7, "outside the job") and not n.stopped
    del c3


def test_a_peer_stopped_for_another_ranks_failure_blames_that_rank() -> None:
    m = Links(0, 4, dial_defer=0)
    for r in (2, 1):
        ready(m, r)
    m.bye(2, 3, "raised ValueError: boom (prog.py:11)", True)
    e = m.peer_error(2)
    assert str(e) == "rank 2 failed: stopped by its launcher after rank 3 failed: raised ValueError: boom (prog.py:11)"
    assert (e.rank, e.culprit, e.cause) == (2, 3, "raised ValueError: boom (prog.py:11)")
    assert m.first_failure == (3, "raised ValueError: boom (prog.py:11)") and m.failed() == []
    m.bye(1, 1, "raised KeyError: 'k'", "yes")  # (not True: not stopped) its own error
    e = m.peer_error(1)
    assert str(e) == "rank 1 failed: left the job after: raised KeyError: 'k'" and (e.culprit, e.cause) == (1, "raised KeyError: 'k'")
    # the record of a rank whose operation failed so blames the root cause, and says how it failed
    rec = describe_exception(m.peer_error(2))
    assert (rec["blames"], rec["cause"]) == (3, "raised ValueError: boom (prog.py:11)")
    plain = describe_exception(PeerFailureError("rank 2 failed: connection lost", rank=2, how="connection lost"))
    assert plain["blames"] == 2 and "cause" not in plain


def test_a_culprit_on_another_node_is_named_with_how_its_peers_were_told_it_failed() -> None:
    lost = {"kind": "raised", "type": "PeerFailureError", "blames": 3, "op": "all_reduce #3",
            "cause": "raised ValueError: boom (prog.py:11)"}
    blame = root_cause([(0, 1), (1, 1)], {0: lost, 1: {**lost, "cause": None}}, local={0, 1})
    assert blame is not None and (blame.rank, blame.cause) == (3, "raised ValueError: boom (prog.py:11)")
    assert blame.message == ("rank 3 (on another node) raised ValueError: boom (prog.py:11); ranks 0, 1 lost it "
                             "in all_reduce #3")
    seen = {**lost, "cause": "connection lost"}  # (what a peer of it saw, passed on in that peer's bye)
    blame = root_cause([(0, 1)], {0: seen}, local={0, 1})
    assert blame is not None and blame.message == "rank 3 (on another node) failed: connection lost; rank 0 lost it in all_reduce #3"


def test_the_stop_reason_goes_from_the_launcher_to_the_ranks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIODIST_STATUS_DIR", str(tmp_path))
    stop_reason, write_stop_reason = outcome.stop_reason, outcome.write_stop_reason
    assert stop_reason() is None
    write_stop_reason(tmp_path, Blame(3, "unknown", "rank 3 stopped responding (still running)"))  # no cause: none
    assert stop_reason() is None
    own = root_cause([(3, 1)], {3: {"kind": "raised", "type": "ValueError", "message": "boom", "where": "p.py:2"}})
    assert own is not None and own.cause == "raised ValueError: boom (p.py:2)"
    write_stop_reason(tmp_path, own)
    assert stop_reason() == (3, "raised ValueError: boom (p.py:2)")
    killed = root_cause([(1, -9)], {})
    assert killed is not None and killed.cause == "was killed by signal SIGKILL (9)"


def test_ranks_of_another_node_that_never_joined_are_said_to_have_never_joined() -> None:
    """Before (launcher probe): with the other node never started, node 0's launcher said "rank 2 (on another
    node) failed or left; ranks 0, 1 lost it in rendezvous": nothing had failed or been lost, it never came."""
    from aiodist.errors import RendezvousTimeoutError

    rec = describe_exception(RendezvousTimeoutError("rendezvous round 0 timed out: ranks [2, 3] did not join",
                                                    missing=[2, 3], timeout=20.0))
    assert (rec["blames"], rec["op"], rec["cause"]) == (2, "rendezvous",
                                                         "never joined the rendezvous (ranks 2, 3 missing after 20s)")
    blame = root_cause([(0, 1), (1, 1)], {0: rec, 1: rec}, local={0, 1})
    assert blame is not None and blame.rank == 2
    assert blame.message == ("rank 2 (on another node) never joined the rendezvous (ranks 2, 3 missing after 20s); "
                             "ranks 0, 1 waited for it: is that node started, with the same --master-addr/--master-port "
                             "(or --rdzv-endpoint)?")
