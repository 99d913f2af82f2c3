"""aiodist run --nnodes MIN:MAX: agents meet in rounds, run the job, rejoin after a failure."""

from __future__ import annotations

import asyncio
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
