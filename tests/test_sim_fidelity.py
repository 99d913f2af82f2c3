"""Fidelity: on an ideal alpha-beta network, simulated collective times match the closed form."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import sim

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from sim_bench import ALPHA, BANDWIDTH, timed_collective  # noqa: E402

from aiodist.collectives import selected_cost  # noqa: E402


@pytest.mark.parametrize(
    ("collective", "nbytes", "p"),
    [
        ("all_reduce", 1024, 8),
        ("all_reduce", 4 * 1024 * 1024, 4),
        ("broadcast", 1024, 8),  # non-powers of two finish early: the model counts rounds one port at a time
        ("all_gather", 4 * 1024 * 1024, 4),
        ("barrier", 0, 7),
        ("all_to_all", 4 * 1024 * 1024, 4),  # every exchange posted at once: they overlap
    ],
)
def test_simulated_time_matches_alpha_beta_cost(collective: str, nbytes: int, p: int) -> None:
    net = sim.Network.ideal(alpha=ALPHA, bandwidth=BANDWIDTH)
    res = sim.run(timed_collective, args=(collective, nbytes), world_size=p, network=net, trace=False, explore=False)
    assert res.ok, res.summary()
    _, model = selected_cost(collective, p, nbytes, ALPHA, 1.0 / BANDWIDTH, 0.0)
    assert max(res.rank_results) == pytest.approx(model, rel=0.01)


def test_contention_makes_a_many_to_one_pattern_slower_than_the_ideal() -> None:
    ideal = sim.Network.ideal(alpha=ALPHA, bandwidth=BANDWIDTH)
    contended = sim.Network(latency=ALPHA, bandwidth=BANDWIDTH, contention=True)
    args = ("all_to_all", 4 * 1024 * 1024)
    t_ideal = max(sim.run(timed_collective, args=args, world_size=4, network=ideal, explore=False).rank_results)
    t_cont = max(sim.run(timed_collective, args=args, world_size=4, network=contended, explore=False).rank_results)
    assert t_cont >= t_ideal
