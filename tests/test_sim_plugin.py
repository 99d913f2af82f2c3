"""The pytest plugin: @pytest.mark.sim async tests and the sim_run fixture, with replay hints."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

TESTS = '''
import asyncio
import pytest
import sim
from aiodist.context import getenv

@pytest.mark.sim(world_size=4, seeds=range(3))
async def test_ranks_run_in_sim():
    loop = asyncio.get_running_loop()
    assert type(loop).__name__ == "SimLoop"
    await asyncio.sleep(60)
    assert loop.time() >= 60  # (exactly 60 unless the seed's exploration slowed this rank)
    assert getenv("WORLD_SIZE") == "4"

@pytest.mark.sim(world_size=3, seeds=range(20))
async def test_rank_two_fails_on_seed_four():
    if getenv("RANK") == "2" and getenv("AIODIST_RUN_ID") == "sim-4":  # the run id names the seed
        raise RuntimeError("planted failure")

def test_fixture(sim_run):
    async def main():
        await asyncio.sleep(1)
        return getenv("RANK")
    results = sim_run(main, world_size=2, seeds=[0, 1])
    assert [r.rank_results for r in results] == [["0", "1"], ["0", "1"]]
'''


def run_pytest(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_prog=TESTS)
    return pytester.runpytest_subprocess(
        "-p", "no:aiodist_sim", "-p", "sim.pytest_plugin", "-p", "asyncio", "-o", "asyncio_mode=auto", *args
    )


@pytest.fixture
def pytester_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return pytester


def test_marker_runs_async_tests_in_the_simulator_and_prints_replay(pytester_env: pytest.Pytester) -> None:
    result = run_pytest(pytester_env)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*sim: seed 4 failed (3 ranks)*", "*planted failure*",
                                 "*replay with: pytest 'test_prog.py::test_rank_two_fails_on_seed_four' --sim-seed 4*"])


def test_sim_seed_option_replays_one_seed(pytester_env: pytest.Pytester) -> None:
    result = run_pytest(pytester_env, "--sim-seed", "3", "-k", "seed_four")
    result.assert_outcomes(passed=1)
    result = run_pytest(pytester_env, "--sim-seed", "4", "-k", "seed_four")
    result.assert_outcomes(failed=1)
