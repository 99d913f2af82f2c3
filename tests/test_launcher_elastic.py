"""aiodist run --nnodes MIN:MAX: agents meet in rounds, run the job, rejoin after a failure."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from pathlib import Path

import pytest

from aiodist.launch.elastic import parse_nnodes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "elastic_train.py"

PROG = '''
import os, numpy as np, aiodist
async def main():
    await aiodist.init_process_group(timeout=30)
    x = np.ones(2)
    await aiodist.all_reduce(x)
    print("RESULT", os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["AIODIST_RESTART_COUNT"],
          os.environ["TORCHELASTIC_RESTART_COUNT"], int(x[0]), flush=True)
    await aiodist.destroy_process_group()
'''


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start_two_agents(args: list[str]) -> list[asyncio.subprocess.Process]:
    """Two agents of ``aiodist run *args``, the second 0.5 s after the first (which hosts the store)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    for delay in (0.0, 0.5):
        await asyncio.sleep(delay)
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiodist", "run", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT))
    return procs


async def _agents(n_agents: int, args: list[str], env_extra: dict[str, str] | None = None,
                  delays: list[float] | None = None) -> list[tuple[int, str]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    procs = []
    for i in range(n_agents):
        if delays:
            await asyncio.sleep(delays[i])
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiodist", "run", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT))
    try:
        async with asyncio.timeout(90):
            outs = [(await p.communicate())[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
    return [(p.returncode or 0, o) for p, o in zip(procs, outs)]


def test_parse_nnodes() -> None:
    from aiodist.launch.cli import _nnodes_arg

    assert _nnodes_arg("3") == 3 and _nnodes_arg("2:4") == (2, 4)
    assert parse_nnodes("3") == (3, 3)
    assert parse_nnodes("1:4") == (1, 4)
    for bad in ("0", "3:2", "a:b", ""):
        with pytest.raises(ValueError):
            parse_nnodes(bad)


async def test_two_agents_form_one_round_of_four_ranks(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    port = _port()
    res = await _agents(2, ["--nnodes", "1:2", "--rdzv-last-call", "1.5", "--master-port", str(port),
                            "-n", "2", str(prog)])
    lines = []
    for code, out in res:
        assert code == 0, out
        lines += [ln.split("RESULT ", 1)[1].split() for ln in out.splitlines() if "RESULT" in ln]
    assert sorted(int(f[0]) for f in lines) == [0, 1, 2, 3]
    assert {(f[1], f[2], f[3], f[4]) for f in lines} == {("4", "0", "0", "4")}


async def test_elastic_needs_a_master_port(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    [(code, out)] = await _agents(1, ["--nnodes", "1:2", "-n", "1", str(prog)])
    assert code != 0 and "master-port" in out


async def test_a_killed_worker_makes_every_agent_rejoin_and_the_job_resumes(tmp_path: Path) -> None:
    port = _port()
    res = await _agents(
        2,
        ["--nnodes", "2:3", "--rdzv-last-call", "0.5", "--master-port", str(port), "--max-restarts", "1",
         "-n", "2", str(EXAMPLE), "--ckpt-dir", str(tmp_path)],
        {"ELASTIC_KILL": "3@37"},
    )
    text = "\n".join(o for _, o in res)
    for code, out in res:
        assert code == 0, text[-4000:]
    assert "killing myself (SIGKILL) at step 37" in text
    assert "round 1: node" in text, text[-4000:]
    assert "resumed at step 30, restart 1" in text, text[-4000:]
    assert "OK: weights equal the single-process reference" in text


# A node lost between its round and its ranks' rendezvous: the other node's ranks would wait in the
# workers' rendezvous for ranks that never come, for their whole init timeout (60 s here, 300 s by
# default). Its agent watches the round's nodes in the rendezvous store and rejoins without the lost one.
LATE_JOINER = '''
import asyncio, os, aiodist
async def main():
    if os.environ["GROUP_RANK"] == "1" and os.environ["AIODIST_RESTART_COUNT"] == "0":
        await asyncio.sleep(60)  # (node 1's ranks certainly do not join before their launcher is killed)
    pg = await aiodist.init_process_group(timeout=60)
    await aiodist.barrier()
    print("RESULT", pg.rank, pg.size, os.environ["AIODIST_RESTART_COUNT"], flush=True)
'''


async def _two_agents_kill_node_1(prog: Path, signame: str, limit: float) -> tuple[int, str, int, str, float]:
    """Start two agents (the first hosts the store); kill the one that is node 1 of round 0 as it says so.

    Returns the survivor's exit code and output, the victim's, and how long the survivor took after the kill.
    """
    import signal as signals

    port = _port()
    args = ["--nnodes", "1:2", "--rdzv-last-call", "4", "--master-port", str(port), "-n", "2",
            "--max-restarts", "1", "--rdzv-timeout", "30", str(prog)]
    procs = await _start_two_agents(args)
    outs: list[list[str]] = [[], []]
    victim: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def read(i: int) -> None:
        stream = procs[i].stdout
        assert stream is not None
        async for raw in stream:
            line = raw.decode(errors="replace")
            outs[i].append(line)
            if "round 0: node 1 of 2" in line and not victim.done():
                victim.set_result(i)

    readers = [asyncio.create_task(read(i)) for i in range(2)]
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(30):
            v = await victim
        procs[v].send_signal(getattr(signals, signame))
        killed_at = loop.time()
        s = 1 - v
        try:
            async with asyncio.timeout(limit):
                await procs[s].wait()
        except TimeoutError:
            pass
        took = loop.time() - killed_at
        if procs[s].returncode is None:  # (still waiting for the lost node: the test fails on its output)
            procs[s].kill()
        async with asyncio.timeout(10):
            await procs[v].wait()
            await asyncio.gather(*readers)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        for r in readers:
            r.cancel()
    return (procs[s].returncode if procs[s].returncode is not None else -9, "".join(outs[s]),
            procs[v].returncode or 0, "".join(outs[v]), took)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
async def test_a_node_lost_before_its_ranks_joined_is_noticed_and_the_survivor_rejoins_alone(
        tmp_path: Path, signame: str) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(LATE_JOINER)
    code, out, _, victim_out, took = await _two_agents_kill_node_1(prog, signame, limit=25)
    assert code == 0 and took < 20, (took, out[-3000:], victim_out[-2000:])
    how = "its launcher left (SIGTERM)" if signame == "SIGTERM" else "its launcher stopped responding"
    assert f"root cause: node 1 (ranks 2, 3) was lost before its ranks joined the rendezvous: {how}" in out, out
    assert "still running" not in out and "did not join" not in out, out
    assert "round 1: node 0 of 1" in out, out
    assert sorted(ln.split("RESULT ", 1)[1].split() for ln in out.splitlines() if "RESULT" in ln) == [
        ["0", "2", "1"], ["1", "2", "1"]], out
    if signame == "SIGTERM":
        assert "received SIGTERM" in victim_out, victim_out


FAILS_TO_START = '''
import os, aiodist
if os.environ["GROUP_RANK"] == "1" and os.environ["AIODIST_RESTART_COUNT"] == "0":
    raise SystemExit("node 1 cannot start")
async def main():
    pg = await aiodist.init_process_group(timeout=60)
    await aiodist.barrier()
    print("RESULT", pg.rank, pg.size, os.environ["AIODIST_RESTART_COUNT"], flush=True)
'''


async def test_ranks_that_fail_before_joining_end_the_round_for_every_node(tmp_path: Path) -> None:
    # Node 1's ranks fail before the rendezvous: its agent opens round 1; node 0's agent sees the round
    # given up and rejoins at once (its ranks would otherwise wait 60 s in the rendezvous for ranks 2, 3).
    prog = tmp_path / "prog.py"
    prog.write_text(FAILS_TO_START)
    port = _port()
    loop = asyncio.get_running_loop()
    start = loop.time()
    res = await _agents(2, ["--nnodes", "1:2", "--rdzv-last-call", "4", "--master-port", str(port), "-n", "2",
                            "--max-restarts", "1", str(prog)], delays=[0.0, 0.5])
    took = loop.time() - start
    text = "\n".join(o for _, o in res)
    assert all(code == 0 for code, _ in res) and took < 30, (took, text[-4000:])
    assert "round 0 was given up by another node" in text, text
    assert sorted(ln.split("RESULT ", 1)[1].split()[:2] for ln in text.splitlines() if "RESULT" in ln) == [
        ["0", "4"], ["1", "4"], ["2", "4"], ["3", "4"]], text


async def test_ranks_that_never_join_are_given_up_after_the_rdzv_timeout(tmp_path: Path) -> None:
    # Every node is there, but node 1's ranks do not reach the rendezvous (stuck before it): the ranks
    # waiting in it for them are stopped after --rdzv-timeout (6 s), not their own init timeout (60 s),
    # and the round is run again.
    prog = tmp_path / "prog.py"
    prog.write_text(LATE_JOINER)
    port = _port()
    loop = asyncio.get_running_loop()
    start = loop.time()
    res = await _agents(2, ["--nnodes", "1:2", "--rdzv-last-call", "4", "--rdzv-timeout", "6", "--master-port",
                            str(port), "-n", "2", "--max-restarts", "1", str(prog)], delays=[0.0, 0.5])
    took = loop.time() - start
    text = "\n".join(o for _, o in res)
    assert all(code == 0 for code, _ in res) and took < 40, (took, text[-4000:])
    assert "root cause: ranks 2, 3 did not join the rendezvous within --rdzv-timeout 6s (ranks 0, 1 waited" in text
    assert sorted(ln.split("RESULT ", 1)[1].split() for ln in text.splitlines() if "RESULT" in ln) == [
        ["0", "4", "1"], ["1", "4", "1"], ["2", "4", "1"], ["3", "4", "1"]], text


FAILS_IN_ROUND_0 = '''
import os, sys, aiodist
async def main():
    await aiodist.init_process_group(timeout=30)
    print("MAX", os.environ["AIODIST_RESTART_COUNT"], os.environ["TORCHELASTIC_MAX_RESTARTS"],
          os.environ["AIODIST_MAX_RESTARTS"], flush=True)
    if os.environ["AIODIST_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        sys.exit(3)
    await aiodist.destroy_process_group()
'''


async def test_the_ranks_see_the_agents_max_restarts_in_every_round(tmp_path: Path) -> None:
    # Before: TORCHELASTIC_MAX_RESTARTS was 0 in round 0 and 1 after one restart (each round is a launch
    # with max_restarts=0, plus the restarts so far), whatever --max-restarts said.
    prog = tmp_path / "prog.py"
    prog.write_text(FAILS_IN_ROUND_0)
    [(code, out)] = await _agents(1, ["--nnodes", "1:2", "--rdzv-last-call", "0.2", "--master-port", str(_port()),
                                      "--max-restarts", "2", "-n", "2", str(prog)])
    assert code == 0, out
    seen = sorted(ln.split("MAX ", 1)[1].split() for ln in out.splitlines() if "MAX " in ln)
    assert seen == [["0", "2", "2"], ["0", "2", "2"], ["1", "2", "2"], ["1", "2", "2"]], out


async def test_too_few_nodes_end_the_agent_with_an_error_not_a_traceback(tmp_path: Path) -> None:
    # Before: an uncaught RendezvousTimeoutError (a traceback through asyncio.run) after --rdzv-timeout.
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    [(code, out)] = await _agents(1, ["--nnodes", "2:3", "--rdzv-timeout", "2", "--master-port", str(_port()),
                                      "-n", "1", str(prog)])
    assert code == 1 and "Traceback" not in out, out
    [error] = [ln for ln in out.splitlines() if ln.startswith("aiodist run: error: ")]
    assert "no complete round formed with this node" in error and "within --rdzv-timeout 2s" in error, out
    assert "Start the other nodes" in error and "--nnodes 2:3" in error, out


SLOW = '''
import asyncio, aiodist
async def main():
    await aiodist.init_process_group(timeout=30)
    await asyncio.sleep(3)
    await aiodist.destroy_process_group()
'''


async def test_a_node_waiting_for_a_round_when_the_host_finishes_ends_with_an_error_not_a_traceback(
        tmp_path: Path) -> None:
    # The host's round (of 1 node) formed before the second node came: it waits for a next round, until the
    # host finishes and closes the store. Before: an uncaught StoreConnectionLost traceback.
    prog = tmp_path / "prog.py"
    prog.write_text(SLOW)
    args = ["--nnodes", "1:2", "--rdzv-last-call", "0.2", "--master-port", str(_port()), "-n", "1", str(prog)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    host = await asyncio.create_subprocess_exec(sys.executable, "-m", "aiodist", "run", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert host.stdout is not None
        async with asyncio.timeout(20):
            while b"round 0: node 0 of 1" not in await host.stdout.readline():
                pass
        [(code, out)] = await _agents(1, args)
        async with asyncio.timeout(20):
            host_out = (await host.communicate())[0].decode()
    finally:
        if host.returncode is None:
            host.kill()
            await host.wait()
    assert host.returncode == 0, host_out
    assert code == 1 and "Traceback" not in out, out
    [error] = [ln for ln in out.splitlines() if ln.startswith("aiodist run: error: ")]
    assert error.startswith("aiodist run: error: the job finished on the other nodes without this node"), out


@pytest.mark.parametrize("nnodes", ["2", "2:2"])
async def test_nodes_started_alike_without_a_node_rank_get_their_ranks_from_the_rendezvous(
        tmp_path: Path, nnodes: str) -> None:
    # torchrun's quickstart form, the same command on every node. Before: both launchers were node 0 ("rank 1
    # joined rendezvous round 0 twice", "could not start the store server ... Address already in use").
    prog = tmp_path / "prog.py"
    prog.write_text(PROG)
    res = await _agents(2, ["--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-id", "J", "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", f"127.0.0.1:{_port()}", str(prog)], delays=[0.0, 0.5])
    text = "\n".join(o for _, o in res)
    assert [code for code, _ in res] == [0, 0], text[-4000:]
    assert "round 0: node 0 of 2" in res[0][1] and "round 0: node 1 of 2" in res[1][1], text[-4000:]
    lines = [ln.split("RESULT ", 1)[1].split() for ln in text.splitlines() if "RESULT" in ln]
    assert sorted(f[0] for f in lines) == ["0", "1", "2", "3"] and {(f[1], f[4]) for f in lines} == {("4", "4")}, text


LONG = '''
import asyncio, numpy as np, aiodist
async def main():
    await aiodist.init_process_group(timeout=30)
    print("TRAINING", flush=True)
    for _ in range(600):
        await aiodist.all_reduce(np.ones(2))
        await asyncio.sleep(0.1)
    await aiodist.destroy_process_group()
'''


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    for _ in range(10_000):  # (bounded)
        if not todo:
            break
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


async def test_a_frozen_node_hosting_the_store_ends_the_other_nodes_in_seconds(tmp_path: Path) -> None:
    """Elastic probe: node 0 (its agent hosts the rendezvous store) is frozen (SIGSTOP: a VM pause); node 1's
    ranks fail it in 3 s and its agent goes to open the next round on the frozen store -- where it waited the
    whole --rdzv-timeout (300 s by default), then died with the store's timeout as a raw traceback."""
    import signal as signals

    prog = tmp_path / "prog.py"
    prog.write_text(LONG)
    port = _port()
    args = ["--nnodes", "1:2", "--rdzv-last-call", "1", "--master-port", str(port), "-n", "2",
            "--max-restarts", "2", str(prog)]
    procs = await _start_two_agents(args)
    frozen: list[int] = []
    loop = asyncio.get_running_loop()
    try:
        out1 = procs[1].stdout
        assert out1 is not None
        lines: list[str] = []
        async with asyncio.timeout(40):
            async for raw in out1:  # until node 1's ranks train
                lines.append(raw.decode(errors="replace"))
                if lines[-1].count("TRAINING"):
                    break
        await asyncio.sleep(1.0)
        frozen = _descendants(procs[0].pid)
        for pid in frozen:
            os.kill(pid, signals.SIGSTOP)
        t0 = loop.time()
        async with asyncio.timeout(45):
            rest = (await out1.read()).decode(errors="replace")
            await procs[1].wait()
        took = loop.time() - t0
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signals.SIGKILL)
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
    assert procs[1].returncode != 0, rest
    assert "cannot rejoin: the rendezvous store did not answer" in rest, rest
    own = [line for line in rest.splitlines() if not line.startswith("[rank")]  # (the launcher's own lines)
    assert not any("Traceback" in line for line in own), rest
    assert took < 30, took
