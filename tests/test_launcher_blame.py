"""The launcher names the rank whose own failure started a job's failure, and says how; ``--on-failure``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiodist.launch.outcome import root_cause
from test_launcher_run import launch_source

# ------------------------------------------------------------------ pure: root_cause


def test_an_own_exception_is_the_cause_even_when_a_consequence_exited_first() -> None:
    records = {
        0: {"kind": "raised", "type": "PeerFailureError", "blames": 2, "op": "all_reduce #5", "time": 1.0},
        2: {"kind": "raised", "type": "RuntimeError", "message": "boom", "where": "train.py:41", "time": 2.0},
    }
    blame = root_cause([(0, 1), (2, 1)], records)
    assert blame is not None and (blame.rank, blame.kind) == (2, "raised")
    assert blame.message == "rank 2 raised RuntimeError: boom (train.py:41)"


def test_the_earliest_own_failure_wins_and_a_record_counts_before_the_exit() -> None:
    records = {
        1: {"kind": "raised", "type": "ValueError", "message": "late", "time": 5.0},
        3: {"kind": "raised", "type": "KeyError", "message": "'x'", "time": 4.0},
    }
    blame = root_cause([(1, 1)], records)  # rank 3 has recorded its error but not exited yet
    assert blame is not None and blame.rank == 3


def test_a_signal_or_a_bare_exit_code_is_an_own_failure_unless_the_launcher_stopped_it() -> None:
    blame = root_cause([(0, 1), (1, -9)], {0: {"kind": "raised", "blames": 1, "time": 1.0}})
    assert blame is not None and blame.kind == "signal" and blame.message == "rank 1 was killed by signal SIGKILL (9)"
    blame = root_cause([(0, 1), (1, -15)], {0: {"kind": "raised", "blames": 1, "time": 1.0}}, stopped=[1])
    assert blame is not None and blame.rank == 1 and blame.kind == "unknown"
    blame = root_cause([(2, 3)], {2: {"kind": "exit", "code": 3}})
    assert blame is not None and blame.message == "rank 2 exited with code 3"


def test_a_killed_rank_is_placed_among_the_records_by_when_its_exit_was_seen() -> None:
    # Before (shm probe, 45 of 45 runs under --on-failure continue): the survivors caught the PeerFailureError
    # and called sys.exit(3); their records had times, the SIGKILLed rank none (inf): "rank 2 exited with code 3".
    records = {2: {"kind": "exit", "code": 3, "time": 10.05}, 0: {"kind": "exit", "code": 3, "time": 10.08}}
    exits = [(2, 3), (0, 3), (1, -9)]
    blame = root_cause(exits, records, exit_times={1: 10.001, 2: 10.06, 0: 10.09})
    assert blame is not None and (blame.rank, blame.kind) == (1, "signal"), blame
    blame = root_cause(exits, records, exit_times={1: 10.2, 2: 10.06, 0: 10.09})  # (it really died later)
    assert blame is not None and blame.rank == 2
    # An exit while handling a peer's failure is that peer's consequence, whatever the clocks say (the kernel
    # resets a killed rank's sockets before its parent hears of its death: survivors' records came first).
    lost = {"kind": "exit", "code": 3, "blames": 1, "op": "all_reduce #1", "cause": "connection lost"}
    records = {2: {**lost, "time": 10.0}, 0: {**lost, "time": 10.01}}
    blame = root_cause(exits, records, exit_times={1: 10.02, 2: 10.06, 0: 10.09})
    assert blame is not None and (blame.rank, blame.kind) == (1, "signal"), blame


async def test_under_on_failure_continue_a_killed_rank_is_the_root_cause_not_those_that_exit_after_it(
    tmp_path: Path,
) -> None:
    source = """
        import os, signal, sys
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group(timeout=20)
            await aiodist.barrier()
            if os.environ["RANK"] == "1":
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                await aiodist.all_reduce(np.ones(4))
            except aiodist.PeerFailureError:
                sys.exit(3)
        """
    run = await launch_source(tmp_path, source, 3, on_failure="continue", timeout=60)
    blame = run.result.root_cause
    assert blame is not None and (blame.rank, blame.kind) == (1, "signal"), run.logs


def test_a_clean_exit_that_the_others_lost_is_named_with_what_they_wait_in() -> None:
    records = {
        3: {"kind": "returned"},
        1: {"kind": "raised", "blames": 3, "op": "all_reduce #7"},
        2: {"kind": "raised", "blames": 3, "op": "all_reduce #7"},
        0: {"kind": "raised", "blames": 1, "op": "all_reduce #7"},  # lost rank 1, which lost rank 3
    }
    blame = root_cause([(3, 0), (1, 1), (2, 1), (0, 1)], records)
    assert blame is not None and (blame.rank, blame.kind) == (3, "returned")
    assert blame.message == "rank 3 exited cleanly while ranks 0\u20132 wait in all_reduce #7"


def test_a_mismatch_is_blamed_on_the_rank_that_found_it_not_on_the_first_rank_it_told() -> None:
    from aiodist.errors import CollectiveMismatchError
    from aiodist.launch.outcome import describe_exception

    finding = "collective mismatch in world at seq 0: rank 2 called 'broadcast' but rank 0 called 'all_reduce'"
    told = describe_exception(CollectiveMismatchError(f"all_reduce (seq 0) of world: reported by rank 2: {finding}",
                                                      found_by=2, finding=finding))
    assert told["found_by"] == 2 and "blames" not in told
    own = {"kind": "raised", "type": "CollectiveMismatchError", "message": finding, "where": "p.py:8", "time": 1.2}
    records = {0: {**told, "time": 1.0}, 1: {**told, "time": 1.1}, 2: own}
    blame = root_cause([(0, 1), (1, 1), (2, 1)], records)
    assert blame is not None and (blame.rank, blame.kind) == (2, "raised") and blame.message == f"rank 2 raised " \
        f"CollectiveMismatchError: {finding} (p.py:8)"
    blame = root_cause([(0, 1), (1, 1)], {0: records[0], 1: records[1]})  # the finder's record is not there
    assert blame is not None and blame.rank == 0


def test_nothing_failed_means_no_cause() -> None:
    assert root_cause([(0, 0), (1, 0)], {0: {"kind": "returned"}, 1: {"kind": "returned"}}) is None


# ------------------------------------------------------------------ real processes

RAISES = """
import numpy as np
import aiodist


async def main():
    await aiodist.init_process_group()
    x = np.ones(1000)
    for _ in range(3):
        await aiodist.all_reduce(x)
    if aiodist.get_rank() == 2:
        raise RuntimeError("boom")
    for _ in range(10000):
        await aiodist.all_reduce(x)
"""


async def test_rank_2_raising_is_named_not_the_first_rank_to_exit(tmp_path: Path, monkeypatch) -> None:
    flight = tmp_path / "flight"
    monkeypatch.setenv("AIODIST_FLIGHT_RECORDER_DIR", str(flight))
    for _ in range(3):
        run = await launch_source(tmp_path, RAISES, 4)
        blame = run.result.root_cause
        assert blame is not None and blame.rank == 2 and blame.kind == "raised", run.logs
        assert blame.message == "rank 2 raised RuntimeError: boom (prog.py:12)"
        assert run.result.failures[0].rank == 2 and run.result.exit_code == 1
        assert "root cause: rank 2 raised RuntimeError: boom (prog.py:12)" in run.logs
    # the rank that raised leaves a flight record of its own, and `aiodist trace` names it
    record = json.loads((flight / "rank2.json").read_text())
    assert record["outcome"]["type"] == "RuntimeError" and record["reason"] == "raised RuntimeError: boom (prog.py:12)"
    from aiodist.flight import load, report

    assert report(load(flight)).splitlines()[0] == "root cause: rank 2 raised RuntimeError: boom (prog.py:12)"


async def test_a_rank_that_returns_early_is_named_as_such(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group()
            x = np.ones(10)
            for _ in range(7):
                await aiodist.all_reduce(x)
            if aiodist.get_rank() == 3:
                return
            await aiodist.all_reduce(x)
        """,
        4,
    )
    blame = run.result.root_cause
    assert blame is not None and (blame.rank, blame.kind) == (3, "returned"), run.logs
    assert blame.message == "rank 3 exited cleanly while ranks 0\u20132 wait in all_reduce #7"


async def test_a_script_with_its_own_asyncio_run_is_blamed_the_same_way(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import asyncio, os

        async def main():
            if os.environ["RANK"] == "1":
                raise ValueError("bad input")
            await asyncio.sleep(30)

        if __name__ == "__main__":
            asyncio.run(main())
        """,
        2,
    )
    blame = run.result.root_cause
    assert blame is not None and blame.message == "rank 1 raised ValueError: bad input (prog.py:6)", run.logs
    # the traceback is the program's, without the bootstrap's frames
    err = "\n".join(run.lines("err", 1))
    assert "Traceback (most recent call last):" in err and "launch_bootstrap" not in err and "runpy" not in err


async def test_on_failure_continue_lets_the_survivors_finish_and_reports_at_the_end(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(5)
        time.sleep(1.0)
        print("finished")
        """,
        3,
        on_failure="continue",
    )
    assert not run.result.ok and run.result.exit_code == 5
    assert [f.rank for f in run.result.failures] == [1]
    for r in (0, 2):
        assert run.lines("out", r) == ["finished"]
    assert any("the others go on" in m for m in run.logs)
    assert run.logs[-2:] == ["root cause: rank 1 exited with code 5", run.result.failures[0].message]


async def test_on_failure_stop_is_the_default(tmp_path: Path) -> None:
    run = await launch_source(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(5)
        time.sleep(20)
        print("finished")
        """,
        3,
    )
    assert run.result.exit_code == 5 and run.elapsed < 15
    assert not run.lines("out", 0) and not run.lines("out", 2)


# ------------------------------------------------------------------ leaving without destroy_process_group

ROOT = Path(__file__).resolve().parents[1]


async def test_the_tutorials_ring_all_reduce_without_destroy_finishes_cleanly(tmp_path: Path) -> None:
    source = (ROOT / "examples" / "tutorial_ring.py").read_text()
    assert "destroy_process_group()`" in source and "await aiodist.destroy_process_group" not in source
    for _ in range(5):  # (base: 12 of 30 runs failed with "PeerFailureError ... connection lost")
        run = await launch_source(tmp_path, source, 4)
        assert run.result.ok, run.logs + [run.err[-2000:]]
        for r in range(4):
            assert run.lines("out", r) == [f"Rank {r} has data 10.0"]


async def test_elastic_shrink_goes_on_under_the_launcher_with_on_failure_continue(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ELASTIC_KILL", "2@37")
    source = (ROOT / "examples" / "elastic_train.py").read_text()
    (tmp_path / "train_dp.py").write_text((ROOT / "examples" / "train_dp.py").read_text())
    run = await launch_source(tmp_path, source, 4, args=("--ckpt-dir", str(tmp_path / "ckpt"), "--shrink"),
                              on_failure="continue")
    assert run.result.exit_code == 128 + 9 and [f.rank for f in run.result.failures] == [2], run.logs
    assert run.result.root_cause is not None and run.result.root_cause.kind == "signal"
    assert any(line.endswith("going on with 3 ranks") for line in run.lines("out", 0))
    assert "OK: weights equal the single-process reference" in "\n".join(run.lines("out", 0))


async def test_the_culprits_exit_is_the_one_reported_even_when_another_rank_exits_first(tmp_path: Path) -> None:
    # Rank 0 raises and is slow to exit (an atexit hook); rank 1 learns of it and exits first. Before: the
    # launcher said "rank 1 ... failed" and then "also: rank 1 ... failed", and never rank 0's exit.
    run = await launch_source(
        tmp_path,
        """
        import atexit, time
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group()
            x = np.ones(10)
            await aiodist.all_reduce(x)
            if aiodist.get_rank() == 0:
                atexit.register(time.sleep, 1.0)
                raise ValueError("boom")
            await aiodist.all_reduce(x)
        """,
        2,
    )
    blame = run.result.root_cause
    assert blame is not None and blame.rank == 0 and blame.kind == "raised", run.logs
    said = [line for line in run.logs if "failed with" in line and not line.startswith("root cause")]
    assert said and said[0].startswith("rank 0 "), run.logs
    assert len({line.removeprefix("also: ") for line in said}) == len(said), run.logs  # nothing said twice
    assert run.result.failures[0].rank == 0 and run.result.exit_code == 1


def test_a_call_failed_elsewhere_blames_that_rank_even_when_its_own_record_comes_later() -> None:
    # Before: PeerCallFailedError counted as the rank's own failure, so when the rank whose call failed
    # took a moment before re-raising (logging, say), the launcher named a rank that had merely been told.
    from aiodist.errors import PeerCallFailedError
    from aiodist.launch.outcome import describe_exception

    told = describe_exception(PeerCallFailedError("the call failed on global rank 2: ...", global_rank=2, seq=0))
    assert told["blames"] == 2
    records = {0: {**told, "time": 1.0}, 1: {**told, "time": 1.1},
               2: {"kind": "raised", "type": "InvalidArrayError", "message": "bad splits", "time": 1.4}}
    blame = root_cause([(0, 1), (1, 1)], records)  # rank 2 has not even exited yet
    assert blame is not None and (blame.rank, blame.kind) == (2, "raised"), blame


async def test_a_mismatch_is_blamed_on_the_rank_that_found_it_and_no_report_nests_another(tmp_path: Path) -> None:
    # Before: the first rank *told* of the mismatch was named (the earliest record), and a told rank re-told it
    # as its own: "reported by rank 3: all_reduce (seq 0) of world: reported by rank 2: ...".
    for _ in range(2):
        run = await launch_source(
            tmp_path,
            """
            import numpy as np
            import aiodist

            async def main():
                await aiodist.init_process_group(timeout=30)
                x = np.ones(4, dtype=np.float32)
                if aiodist.get_rank() == 2:
                    await aiodist.broadcast(x, src=0)
                else:
                    await aiodist.all_reduce(x)
            """,
            4,
        )
        blame = run.result.root_cause
        assert blame is not None and blame.kind == "raised", run.logs
        assert "reported by" not in blame.message and "rank 2 called 'broadcast src=0" in blame.message, run.logs
        every = "\n".join(run.logs + [line for r in range(4) for line in run.lines("err", r)])
        assert every.count("CollectiveMismatchError") >= 4, every
        assert not any(line.count("reported by") > 1 for line in every.splitlines()), every


async def test_on_failure_continue_stops_a_hung_rank_the_others_declared_failed(tmp_path: Path) -> None:
    # Before: the others detected rank 1 (a busy loop) and exited; the launcher then waited for it forever.
    run = await launch_source(
        tmp_path,
        """
        import time
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group(timeout=30)
            x = np.ones(4)
            for i in range(20):
                if aiodist.get_rank() == 1 and i == 3:
                    time.sleep(600)  # hung: its event loop never runs again
                await aiodist.all_reduce(x)
        """,
        3,
        on_failure="continue",
        timeout=120,
    )
    assert not run.result.timed_out and run.elapsed < 60, run.logs
    assert "stopping the 1 rank(s) still running: the others declared them failed" in run.logs, run.logs
    blame = run.result.root_cause
    assert blame is not None and blame.rank == 1 and "stopped responding" in blame.message, run.logs


async def test_a_rank_gone_before_rendezvous_is_the_root_cause_not_a_rank_that_timed_out_waiting(tmp_path: Path) -> None:
    # Before: "root cause: rank 0 raised RendezvousTimeoutError ... ranks [1] did not join" (the first rank to
    # time out), and rank 1's clean exit was not named; the same under --on-failure continue with a SIGKILL.
    # And (elastic probe s20, finding 4) a clean exit was named only once the others' init timeout ran out
    # (300 s by default): now the launcher stops them as soon as it sees them wait for a rank that is gone.
    source = """
        import os, signal
        import numpy as np
        import aiodist

        async def main():
            if os.environ["RANK"] == "1":
                {leave}
            await aiodist.init_process_group(timeout={timeout})
            await aiodist.all_reduce(np.ones(4))
        """
    run = await launch_source(tmp_path, source.replace("{leave}", "return").replace("{timeout}", "120"), 3,
                              max_restarts=1)
    blame = run.result.root_cause
    assert blame is not None and (blame.rank, blame.kind) == (1, "returned"), run.logs
    assert blame.message.startswith("rank 1 exited cleanly while rank") and blame.message.endswith(" in rendezvous")
    assert run.result.exit_code == 1 and run.result.attempts == 2 and run.elapsed < 20, (run.elapsed, run.logs)
    assert not any("failed with exit code 0" in line for line in run.logs), run.logs
    source = source.replace("{timeout}", "3")
    run = await launch_source(tmp_path, source.replace("{leave}", "os.kill(os.getpid(), signal.SIGKILL)"), 3,
                              on_failure="continue")
    blame = run.result.root_cause
    assert blame is not None and (blame.rank, blame.kind) == (1, "signal"), run.logs


async def test_a_store_host_that_never_reaches_its_rendezvous_is_the_root_cause_not_a_rank_that_could_not_reach_it(
    tmp_path: Path,
) -> None:
    # Before (elastic probe s20, finding 3, 10 of 10 runs): "root cause: rank 1 raised RendezvousError: rank 1
    # could not reach the store ... Connection refused", a healthy rank that changed from run to run; rank 0,
    # which starts that store in its rendezvous, hung or left before it, was not named.
    source = """
        import asyncio, os
        import aiodist

        async def main():
            if os.environ["RANK"] == "0":
                {stall}
            await aiodist.init_process_group(timeout=2)
        """
    run = await launch_source(tmp_path, source.replace("{stall}", "await asyncio.sleep(60)"), 3)
    blame = run.result.root_cause
    assert blame is not None and blame.rank == 0, run.logs
    assert blame.message == "rank 0 stopped responding (still running) while ranks 1, 2 wait in rendezvous", run.logs
    run = await launch_source(tmp_path, source.replace("{stall}", "return"), 3)
    blame = run.result.root_cause
    assert blame is not None and (blame.rank, blame.kind) == (0, "returned"), run.logs
    assert blame.message in ("rank 0 exited cleanly while ranks 1, 2 wait in rendezvous",  # (the ranks that
                             "rank 0 exited cleanly while rank 1 waits in rendezvous",  # had begun theirs when
                             "rank 0 exited cleanly while rank 2 waits in rendezvous"), run.logs  # it was seen)


async def test_a_clean_exit_stops_no_one_who_does_not_wait_for_it(tmp_path: Path) -> None:
    # The launcher stops a round early only for ranks that wait in a rendezvous of its own world: here rank 2
    # leaves at once while ranks 0 and 1 work without it (a world of two of their own), then rank 0 alone
    # works without any rendezvous. Every run succeeds.
    source = """
        import asyncio, os
        import numpy as np
        import aiodist

        async def main():
            r = int(os.environ["RANK"])
            if r == 2:
                return
            await asyncio.sleep(0.6)  # (past the launcher's first look after rank 2 left)
            await aiodist.init_process_group(rank=r, world_size=2, timeout=20)
            x = await aiodist.all_reduce(np.ones(4))
            assert x[0] == 2
            await aiodist.destroy_process_group()
        """
    run = await launch_source(tmp_path, source, 3)
    assert run.result.ok and run.result.root_cause is None, run.logs
    run = await launch_source(tmp_path, """
        import asyncio, os

        async def main():
            if os.environ["RANK"] != "0":
                return
            await asyncio.sleep(1.0)
        """, 3)
    assert run.result.ok and run.result.root_cause is None, run.logs


def test_a_rendezvous_mark_is_written_only_for_the_launchers_world(tmp_path: Path, monkeypatch) -> None:
    from aiodist.launch_marks import JOINED, STATUS_DIR_ENV, WAITING, load_marks, mark_rendezvous

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    mark_rendezvous(WAITING, rank=1, world_size=4)
    assert load_marks(tmp_path) == {}  # (not launched: no status directory)
    monkeypatch.setenv(STATUS_DIR_ENV, str(tmp_path))
    mark_rendezvous(WAITING, rank=1, world_size=4)
    assert load_marks(tmp_path) == {1: WAITING}
    mark_rendezvous(JOINED, rank=1, world_size=4)
    mark_rendezvous(JOINED, rank=0, world_size=2)  # a world of the program's own: not the launcher's
    mark_rendezvous(JOINED, rank=1, world_size=2)
    assert load_marks(tmp_path) == {1: JOINED}
    (tmp_path / "rdzv3").write_text("garbage")
    (tmp_path / "rank3.json").write_text("{}")
    assert load_marks(tmp_path) == {1: JOINED}


def test_a_rank_that_found_an_impostor_at_a_peers_address_is_the_root_cause_not_that_peer() -> None:
    # Before: its PeerFailureError ("rank 1 failed: authentication failed: ... did not prove the job's secret")
    # counted as a consequence of rank 1, and the launcher said "rank 1 stopped responding (still running)".
    from aiodist.comm.links import AUTH_FAILED
    from aiodist.errors import PeerFailureError
    from aiodist.launch.outcome import describe_exception

    how = (f"{AUTH_FAILED}: the listening side did not prove the job's secret (a different secret, or an impostor: "
           "a stranger at that address, or a rewritten address)")
    found = describe_exception(PeerFailureError(f"all_reduce (seq 0) of world: rank 1 failed: {how}", rank=1, how=how))
    assert "blames" not in found
    lost = describe_exception(PeerFailureError("all_reduce (seq 0) of world: rank 0 failed: connection lost", rank=0,
                                               how="connection lost"))
    blame = root_cause([(0, 1)], {0: {**found, "time": 1.0}, 2: {**lost, "time": 1.1}})
    assert blame is not None and (blame.rank, blame.kind) == (0, "raised") and "impostor" in blame.message


def test_a_rank_the_others_declared_failed_is_not_among_those_that_lost_it() -> None:
    # Before: "rank 1 failed; ranks 0-2 lost it in all_reduce #21" (rank 1's EvictedError blames itself).
    evicted = {"kind": "raised", "type": "EvictedError", "blames": 1, "op": "all_reduce #21",
               "message": "declared failed by its peers: hung or unreachable"}
    lost = {"kind": "raised", "type": "PeerFailureError", "blames": 1, "op": "all_reduce #21"}
    blame = root_cause([(0, 1), (2, 1), (1, 1)], {0: lost, 1: evicted, 2: lost})
    assert blame is not None and blame.rank == 1
    assert blame.message == ("rank 1 stopped responding (the others declared it failed); ranks 0, 2 lost it in "
                             "all_reduce #21"), blame.message


def test_a_rank_cut_off_for_what_it_sent_is_not_said_to_have_stopped_responding() -> None:
    # Before: "rank 0 stopped responding (the others declared it failed)": rank 0 was healthy and ran ahead of a
    # late receiver, which refused to buffer more of its messages (probe: 1 MiB broadcasts, a leaf 6 s late).
    why = "too many messages nobody waits for: 1024 frames and 1073741824 bytes buffered"
    evicted = {"kind": "raised", "type": "EvictedError", "blames": 0, "op": "broadcast #1030",
               "message": f"declared failed by its peers (rank 1 reports: rank 1 closed its connection: sent bad "
                          f"input: {why})"}
    lost = {"kind": "raised", "type": "PeerFailureError", "blames": 0, "op": "broadcast #1030"}
    blame = root_cause([(0, 1), (1, 1)], {0: evicted, 1: lost})
    assert blame is not None and blame.rank == 0
    assert blame.message == (f"rank 0 was cut off by its peers, which refused what it sent: {why}; rank 1 lost it "
                             "in broadcast #1030"), blame.message


async def test_a_rank_that_calls_sys_exit_with_a_code_tells_its_peers_so(tmp_path: Path) -> None:
    # Before: its peers saw "rank 1 failed: connection lost".
    run = await launch_source(
        tmp_path,
        """
        import sys
        import numpy as np
        import aiodist

        async def main():
            await aiodist.init_process_group(timeout=30)
            x = np.ones(4)
            await aiodist.all_reduce(x)
            if aiodist.get_rank() == 1:
                sys.exit(3)
            try:
                await aiodist.all_reduce(x)
            except aiodist.PeerFailureError as e:
                print("SAW", e, flush=True)
        """,
        3,
        on_failure="continue",
    )
    saw = [line for r in (0, 2) for line in run.lines("out", r) if line.startswith("SAW")]
    assert len(saw) == 2 and all(line.endswith("rank 1 failed: left the job after: exited with code 3") for line in saw), \
        run.out + run.err
    assert run.result.root_cause is not None and run.result.root_cause.message == "rank 1 exited with code 3"


def test_a_rank_that_exited_with_code_0_without_a_record_is_named_as_such() -> None:
    # os._exit(0) mid-run. Before: "rank 1 failed; ranks 0, 2 lost it".
    lost = {"kind": "raised", "type": "PeerFailureError", "blames": 1, "op": "all_reduce #3"}
    blame = root_cause([(1, 0), (0, 1), (2, 1)], {0: lost, 2: lost})
    assert blame is not None and (blame.rank, blame.kind) == (1, "returned")
    assert blame.message == ("rank 1 exited with code 0 (without returning from its main) while ranks 0, 2 wait in "
                             "all_reduce #3")


async def test_a_rank_interrupted_by_sigint_says_where_and_is_the_root_cause(tmp_path: Path) -> None:
    # Before: "rank 0 raised CancelledError (prog.py:10)", the interrupt recorded as an error of its own.
    run = await launch_source(
        tmp_path,
        """
        import asyncio, os, signal
        import aiodist
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts with SIGINT ignored)

        async def main():
            await aiodist.init_process_group(timeout=30)
            if aiodist.get_rank() == 0:
                asyncio.get_running_loop().call_later(0.5, os.kill, os.getpid(), signal.SIGINT)
                await asyncio.sleep(10)
            await aiodist.barrier()
        """,
        2,
    )
    assert "rank 0: interrupted at prog.py:10" in run.lines("err", 0), run.err
    blame = run.result.root_cause
    assert blame is not None and blame.message == "rank 0 was interrupted (CancelledError) at prog.py:10", run.logs


def test_an_exception_group_is_recorded_by_its_first_error_and_that_errors_line() -> None:
    # Before: "rank 1 raised ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)" at the
    # `async with` line; the ValueError and its line were only in the traceback.
    import asyncio

    from aiodist.errors import innermost
    from aiodist.launch.outcome import describe_exception

    async def step() -> None:
        raise ValueError("loss is NaN")

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(step())

    try:
        asyncio.run(main())
    except BaseExceptionGroup as e:
        group = e
    rec = describe_exception(group)
    assert (rec["type"], rec["message"]) == ("ValueError", "loss is NaN"), rec
    assert rec["where"] == f"test_launcher_blame.py:{step.__code__.co_firstlineno + 1}", rec
    nested = BaseExceptionGroup("outer", [asyncio.CancelledError(), ExceptionGroup("inner", [KeyError("k")])])
    assert isinstance(innermost(nested), KeyError)
    only_cancelled = BaseExceptionGroup("g", [asyncio.CancelledError()])
    assert innermost(only_cancelled) is only_cancelled


def test_a_compiled_extensions_frame_is_not_the_users_line() -> None:
    # Before: under uvloop the root cause named "loop.pyx:1427" (a frame of uvloop's), not the user's line.
    from aiodist.launch.outcome import describe_exception

    space: dict[str, object] = {}
    exec(compile("def create_task(coro):\n    raise TypeError('a coroutine was expected')\n", "loop.pyx", "exec"),
         space)

    def user() -> None:
        space["create_task"](None)  # type: ignore[operator]

    try:
        user()
    except TypeError as e:
        rec = describe_exception(e)
    assert rec["where"] == f"test_launcher_blame.py:{user.__code__.co_firstlineno + 1}", rec


def test_a_rank_of_another_node_is_not_said_to_be_still_running() -> None:
    # Before: node 0's launcher said "rank 2 stopped responding (still running)" of a rank on node 1 that had
    # been killed, stopped, or never started.
    lost = {"kind": "raised", "type": "PeerFailureError", "blames": 2, "op": "all_reduce #4"}
    blame = root_cause([(0, 1), (1, 1)], {0: lost, 1: lost}, local={0, 1})
    assert blame is not None and blame.rank == 2
    assert blame.message == "rank 2 (on another node) failed or left; ranks 0, 1 lost it in all_reduce #4"


LATE = """
import asyncio
import numpy as np
import aiodist


async def main():
    await aiodist.init_process_group(timeout=2)
    x = np.ones(4)
    for step in range(3):
        if aiodist.get_rank() == 2 and step == 1:
            await asyncio.sleep(30)  # late: the others time out waiting for it
        await aiodist.all_reduce(x)
"""


async def test_a_rank_that_had_not_reached_the_collective_the_others_timed_out_in_is_named(tmp_path: Path) -> None:
    # torch24 probe, finding 3: rank 2 was late, every rank's error said "the store shows no sign of rank 2",
    # yet the launcher's root cause was "rank 1 raised CollectiveTimeoutError", and it exited with 143.
    run = await launch_source(tmp_path, LATE, 4)
    blame = run.result.root_cause
    assert blame is not None and blame.rank == 2, run.logs
    assert blame.message.startswith("rank 2 had not reached all_reduce #1 when rank"), blame.message
    assert "timed out in it (it is still running: slow, or stuck before it?)" in blame.message
    assert run.result.exit_code == 1, run.logs
    assert any("rank 2" in m and "SIGTERM" in m for m in run.logs), run.logs  # (stopped: and said so)


SKIPS = """
import asyncio
import numpy as np
import aiodist


async def main():
    await aiodist.init_process_group(timeout=10)
    rank = aiodist.get_rank()
    x = np.ones(5 if rank == {odd} and {shape} else 4)
    try:
        if rank != {odd} or {shape}:
            await aiodist.all_reduce(x)
        await aiodist.barrier()
    except aiodist.CollectiveMismatchError:
        await asyncio.sleep(1)  # (every rank hears of it before one leaves: else a peer may see it leave first)
        raise
"""


@pytest.mark.parametrize("odd, shape", [(0, False), (2, False), (1, True)])
async def test_a_mismatch_names_the_rank_the_others_disagree_with_not_its_finder(
        tmp_path: Path, odd: int, shape: bool) -> None:
    # torch24 probe, finding 3: rank 0 skipped an all_reduce (the others called it), and the root cause was
    # "rank 1 raised CollectiveMismatchError" (the rank that found it); each rank's record now lists what it
    # knows each rank called, and together they name the odd one out.
    run = await launch_source(tmp_path, SKIPS.format(odd=odd, shape=shape), 4)
    blame = run.result.root_cause
    others = "1–3" if odd == 0 else "0, 1, 3" if odd == 2 else "0, 2, 3"
    assert blame is not None and blame.rank == odd, run.logs
    call = "all_reduce SUM float64 n=5" if shape else "barrier"
    assert blame.message.startswith(f"rank {odd} called {call!r} where ranks "), blame.message
    assert "a collective mismatch at seq 0 of world, found by rank" in blame.message
    assert run.result.exit_code == 1
    assert f"ranks {others} called" in blame.message, blame.message


def test_the_odd_one_out_of_a_mismatch_from_the_ranks_records() -> None:
    def rec(calls: dict[int, str], **more: object) -> dict[str, object]:
        return {"kind": "raised", "type": "CollectiveMismatchError", "message": "collective mismatch", "time": 1.0,
                "mismatch": {"group": "world", "seq": 3, "calls": {str(r): c for r, c in calls.items()}}, **more}

    pair = {0: "barrier", 1: "all_reduce"}
    records = {1: rec(pair), 0: rec(pair, found_by=1), 2: rec({**pair, 2: "all_reduce"}, found_by=1),
               3: rec({**pair, 3: "all_reduce"}, found_by=1)}
    blame = root_cause([(1, 1), (0, 1), (2, 1), (3, 1)], records)
    assert blame is not None and blame.rank == 0
    assert blame.message == ("rank 0 called 'barrier' where ranks 1–3 called 'all_reduce' "
                             "(a collective mismatch at seq 3 of world, found by rank 1)")
    # only the pair known (or two against two): the finder, as before
    for known in ({1: rec(pair), 0: rec(pair, found_by=1)},
                  {1: rec(pair), 0: rec({**pair, 2: "barrier", 3: "all_reduce"}, found_by=1)}):
        blame = root_cause([(1, 1), (0, 1)], known)
        assert blame is not None and blame.rank == 1 and blame.message.startswith("rank 1 raised"), blame


def test_every_rank_absent_from_a_timed_out_collective_is_named() -> None:
    # review24 probe: with ranks 2 and 3 both late, only rank 2 was named.
    from aiodist.errors import CollectiveTimeoutError
    from aiodist.launch.outcome import describe_exception

    def timed_out(rank: int) -> dict:
        e = CollectiveTimeoutError(f"all_reduce (seq 1) of world timed out on rank {rank}", op="all_reduce", seq=1,
                                   waiting_for=[2], timeout=3.0, absent=[2, 3])
        return {**describe_exception(e), "time": 1.0}

    blame = root_cause([(0, 1), (1, 1)], {0: timed_out(0), 1: timed_out(1)})
    assert blame is not None and blame.rank == 2
    assert blame.message.startswith("rank 2 had not reached all_reduce #1, nor had rank 3, when ranks 0, 1 timed "
                                    "out in it"), blame.message
