"""The six torch-style example programs: the same per-rank output under ``aiodist run -n 4`` and ``python -m sim run -n 4``, and the right one."""

from __future__ import annotations

import asyncio
import ast
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ["torch_ddp_sgd", "torch_param_server", "torch_object_metrics", "torch_subgroups_mesh",
            "torch_async_overlap", "torch_dtypes"]
HAVE_TORCH = importlib.util.find_spec("torch") is not None


async def _run(*args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        async with asyncio.timeout(240):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    text = out.decode()
    assert proc.returncode == 0, (args, text[-4000:])
    return text


def _per_rank(text: str) -> dict[int, list[str]]:
    """Each rank's lines, in the order it printed them (the ranks' lines interleave differently every run)."""
    ranks: dict[int, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("[rank"):
            head, _, rest = line.partition("]: ")
            ranks.setdefault(int(head[5:]), []).append(rest)
    return ranks


@pytest.fixture(scope="module")
def outputs() -> dict[str, tuple[dict[int, list[str]], dict[int, list[str]]]]:
    """Every example under both runners (run concurrently: they are independent jobs)."""

    async def both(name: str) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        path = f"examples/{name}.py"
        real = await _run("-m", "aiodist", "run", "-n", "4", path)
        simulated = await _run("-m", "sim", "run", "-n", "4", path)
        return _per_rank(real), _per_rank(simulated)

    async def everything() -> list[tuple[dict[int, list[str]], dict[int, list[str]]]]:
        limit = asyncio.Semaphore(2)  # (a 2-core machine)

        async def one(name: str) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
            async with limit:
                return await both(name)

        return await asyncio.gather(*(one(n) for n in EXAMPLES))

    return dict(zip(EXAMPLES, asyncio.run(everything()), strict=True))


@pytest.mark.parametrize("name", EXAMPLES)
def test_an_example_gives_the_same_output_for_real_and_simulated(name: str, outputs) -> None:
    real, simulated = outputs[name]
    assert sorted(real) == [0, 1, 2, 3], real
    assert real == simulated


def _only(outputs, name: str) -> list[str]:
    real, _ = outputs[name]
    return [real[r][0] for r in range(4)]


def test_data_parallel_sgd_converges_with_equal_weights_on_every_rank(outputs) -> None:
    lines = _only(outputs, "torch_ddp_sgd")
    assert len({line.split(": ", 1)[1] for line in lines}) == 1, lines  # the same loss and weights everywhere
    loss = float(lines[0].split("loss ")[1].split()[0])
    assert loss < 0.05, lines


def test_the_parameter_server_gives_every_rank_the_server_s_parameters(outputs) -> None:
    lines = _only(outputs, "torch_param_server")
    assert len({line.split(": ", 1)[1] for line in lines}) == 1, lines


def test_object_collectives_fill_the_callers_lists(outputs) -> None:
    lines = _only(outputs, "torch_object_metrics")
    for r, line in enumerate(lines):
        shard, summary = line.split(": ", 1)[1].split(" ", 2)[1:]
        assert shard == f"{r * 10}..{r * 10 + 9}"
        got = ast.literal_eval(summary)
        assert got["means"] == [4.5, 14.5, 24.5, 34.5] and got["lr"] == 0.1
        assert got.get("ring_total") == (78.0 if r == 0 else None)


def test_subgroups_and_the_mesh_sum_over_the_right_ranks(outputs) -> None:
    lines = _only(outputs, "torch_subgroups_mesh")
    got = [ast.literal_eval(line.split(": ", 1)[1]) for line in lines]
    for r, out in enumerate(got):
        pair = [0, 1] if r < 2 else [2, 3]
        parity = [0, 2] if r % 2 == 0 else [1, 3]
        assert out["backend"] == "gloo"
        assert out["pair"] == [pair, float(sum(pair))]
        assert out["parity"] == [parity, float(sum(parity))]
        assert out["first_three"] == (3.0 if r < 3 else float(r))  # a non-member's all_reduce does nothing
        assert out["first_three_size"] == (3 if r < 3 else -1)
        assert out["split"] == ([[0, 3], 30.0] if r in (0, 3) else [[1, 2], 30.0])
        assert out["dp"] == [parity, float(sum(parity))]  # mesh [[0, 1], [2, 3]]: "dp" is the column
        assert out["tp"] == [pair, float(sum(pair))]


def test_overlapped_handles_all_complete_with_the_same_sums(outputs) -> None:
    lines = _only(outputs, "torch_async_overlap")
    assert len({line.split(": ", 1)[1] for line in lines}) == 1, lines


def test_unusual_dtypes_and_torch_tensors(outputs) -> None:
    real, _ = outputs["torch_dtypes"]
    for r in range(4):
        lines = [line.split(": ", 1)[1] for line in real[r]]
        for name in ("bfloat16", "float16", "int8", "uint64"):
            assert f"{name}:[6.0, 10.0, 14.0, 18.0]" in lines, lines
        assert "bool:[True, True, False]" in lines
        assert "fortran:[[0.0, 10.0, 20.0], [30.0, 40.0, 50.0]]" in lines
        assert "premul_sum:[3.0, 3.0, 3.0]" in lines
        if not HAVE_TORCH:
            assert "torch: not installed" in lines
            continue
        assert "torch bfloat16:[6.0, 10.0, 14.0, 18.0]" in lines and "torch int16:[6, 10, 14, 18]" in lines
        assert f"torch column:[6.0, 6.0, 6.0, 6.0] rest {[float(r)] * 4}" in lines
        assert "torch parameter:[4.0, 4.0, 4.0] requires_grad=True" in lines
        assert ("torch recv:[7.0, 8.0]" in lines) == (r == 1)
