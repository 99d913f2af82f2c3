"""The example programs through the launcher with real ranks, and a smoke run of benchmarks/collectives_bench.py."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

from conftest import load_file

from aiodist.launch.cli import build_command
from aiodist.launch.supervisor import LaunchConfig, free_port, launch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_dp.py"
HELLO = ROOT / "examples" / "hello_store.py"


def test_reference_training_learns() -> None:
    example = load_file(EXAMPLE, "train_dp_example")
    x, y = example.make_data()
    w = example.train_single_process(x, y)
    loss, accuracy = example.loss_and_accuracy(w, x, y)
    assert accuracy > 0.75 and loss < 0.6


async def _launch_example(path: Path, n: int) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    config = LaunchConfig(command=build_command(str(path), []), nproc_per_node=n, env=env, timeout=60)
    out, err, logs = io.BytesIO(), io.BytesIO(), []
    async with asyncio.timeout(90):
        result = await launch(config, stdout=out, stderr=err, log=logs.append, handle_signals=False)
    assert result.ok, (logs, err.getvalue().decode()[-3000:])
    return out.getvalue().decode()


async def test_hello_store_under_the_launcher_with_3_ranks() -> None:
    text = await _launch_example(HELLO, 3)
    assert text.splitlines() == [f"[rank0]: hello from rank {r} of 3" for r in range(3)]


async def test_hello_store_as_two_nodes_of_two_ranks() -> None:
    """Two launchers (``--nnodes 2 --node-rank 0/1``) sharing one master port make one 4-rank job."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    port = free_port()
    outs = [io.BytesIO(), io.BytesIO()]
    configs = [
        LaunchConfig(command=build_command(str(HELLO), []), nproc_per_node=2, nnodes=2, node_rank=node,
                     master_port=port, env=env, timeout=60)
        for node in range(2)
    ]
    async with asyncio.timeout(90):
        results = await asyncio.gather(
            *(launch(c, stdout=o, stderr=io.BytesIO(), log=lambda m: None, handle_signals=False)
              for c, o in zip(configs, outs, strict=True))
        )
    assert [r.ok for r in results] == [True, True]
    assert outs[0].getvalue().decode().splitlines() == [f"[rank0]: hello from rank {r} of 4" for r in range(4)]
    assert outs[1].getvalue() == b""


async def test_train_dp_under_the_launcher_with_4_ranks() -> None:
    text = await _launch_example(EXAMPLE, 4)
    assert "[rank0]: OK: weights equal the single-process reference" in text
    assert "[rank0]: world size 4" in text


# ------------------------------------------------------------------ benchmarks/collectives_bench.py

BENCH = ROOT / "benchmarks" / "collectives_bench.py"


def test_bench_busbw_factors_and_plan() -> None:
    bench = load_file(BENCH, "collectives_bench_under_test")
    assert bench.busbw_factor("all_reduce", 4) == 1.5
    assert bench.busbw_factor("all_gather_into_tensor", 4) == 0.75
    assert bench.busbw_factor("broadcast", 4) == 1.0
    assert bench.parse_size("64M") == 64 << 20 and bench.parse_size("4") == 4 and bench.parse_size("1KiB") == 1024
    assert bench.sizes(4, 64 << 20, 4)[-1] == 64 << 20 and len(bench.sizes(4, 64 << 20, 4)) == 13
    plan = bench.make_plan(4, ["all_gather_into_tensor", "barrier"], [4, 16, 64], quick=True)
    # 4 B and 16 B both round up to one float32 per rank: the duplicate is dropped
    assert [(c.op, c.nbytes) for c in plan] == [
        ("all_gather_into_tensor", 16), ("all_gather_into_tensor", 64), ("barrier", 0),
    ]


def test_bench_quick_run_prints_a_table() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-torch", "--world-sizes", "2", "--max-bytes", "1K",
         "--ops", "all_reduce,all_to_all_single,barrier"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith(("#", "op", "("))]
    assert [r[0] for r in rows] == ["all_reduce"] * 5 + ["all_to_all_single"] * 5 + ["barrier"]
    for row in rows:
        assert float(row[3 if row[0] != "barrier" else 2]) > 0  # a positive time in microseconds


def test_loopback_ceiling_moves_bytes_both_ways_between_two_processes() -> None:
    """benchmarks/loopback_bench.py's bandwidth probe (what collectives_bench --loopback prints): two positive rates."""
    sys.path.insert(0, str(ROOT / "benchmarks"))  # (the probe's child process imports it from there too)
    try:
        import loopback_bench

        rates = loopback_bench.measure(256 << 10, 2)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert set(rates) == {"one way", "both ways"} and all(r > 0 for r in rates.values())


RESTARTED_JOB = """
import os
import numpy as np
import aiodist

async def main():
    await aiodist.init_process_group(timeout=30)
    x = np.ones(4)
    await aiodist.all_reduce(x)
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and aiodist.get_rank() == 1:
        os._exit(1)  # dies mid-job on the first attempt
    await aiodist.all_reduce(x)
    assert x.tolist() == [4.0] * 4, x
    if aiodist.get_rank() == 0:
        print("done on attempt", os.environ["TORCHELASTIC_RESTART_COUNT"])
    await aiodist.destroy_process_group()
"""


async def test_process_group_job_restarted_after_a_rank_dies(tmp_path: Path) -> None:
    prog = tmp_path / "job.py"
    prog.write_text(RESTARTED_JOB)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    config = LaunchConfig(command=build_command(str(prog), []), nproc_per_node=2, max_restarts=1, env=env, timeout=60)
    out, logs = io.BytesIO(), []
    async with asyncio.timeout(90):
        result = await launch(config, stdout=out, stderr=io.BytesIO(), log=logs.append, handle_signals=False)
    assert result.ok and result.attempts == 2, logs
    # the others may notice the dead peer and fail too before they are stopped; rank 1 is named either way
    assert any("rank 1 (pid " in m and m.endswith("failed with exit code 1") for m in logs), logs
    assert out.getvalue().decode().splitlines() == ["[rank0]: done on attempt 1"]
