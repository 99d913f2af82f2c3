"""The timing model: it mirrors the drivers message for message, and meets the closed forms."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from aiodist.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    alpha_beta_cost,
    barrier,
    broadcast,
    reduce,
    reduce_scatter,
    selected_cost,
    tuning,
)
from aiodist.collectives.memory import MemoryFabric
from aiodist.collectives.timing import Step, evaluate, programs_for, schedule_time

A, B, G = 1e-4, 1e-9, 0.0


def traffic(programs: dict[tuple[int, int], list[Step]], p: int) -> tuple[list[int], list[int]]:
    messages, nbytes = [0] * p, [0] * p
    for (rank, _), prog in programs.items():
        for step in prog:
            for _, _, b in step.sends:
                messages[rank] += 1
                nbytes[rank] += b
    return messages, nbytes


async def run_driver(collective: str, algorithm: str, p: int, nbytes: int) -> MemoryFabric:
    fabric = MemoryFabric(p)
    n = max(1, nbytes // 4)
    per = max(1, nbytes // 4 // p)

    def call(ch: Any) -> Any:
        r = ch.rank
        if collective == "all_reduce":
            return all_reduce(ch, 0, np.ones(n, np.float32), algorithm=algorithm)
        if collective == "broadcast":
            return broadcast(ch, 0, np.ones(n, np.float32), 0, algorithm=algorithm)
        if collective == "reduce":
            return reduce(ch, 0, np.ones(n, np.float32), 0, algorithm=algorithm)
        if collective == "all_gather":
            return all_gather(ch, 0, [np.empty(per, np.float32) for _ in range(p)], np.ones(per, np.float32), algorithm=algorithm)
        if collective == "reduce_scatter":
            return reduce_scatter(ch, 0, np.empty(per, np.float32), [np.ones(per, np.float32) for _ in range(p)], algorithm=algorithm)
        if collective == "all_to_all":
            return all_to_all(ch, 0, [np.empty(per, np.float32) for _ in range(p)], [np.ones(per, np.float32) for _ in range(p)])
        assert collective == "barrier" and r >= 0
        return barrier(ch, 0)

    async with asyncio.timeout(20):
        await asyncio.gather(*[call(ch) for ch in fabric.channels()])
    return fabric


CASES = [
    ("all_reduce", "recursive_doubling"),
    ("all_reduce", "rabenseifner"),
    ("all_reduce", "ring"),
    ("broadcast", "binomial"),
    ("broadcast", "scatter_allgather"),
    ("reduce", "binomial"),
    ("reduce", "reduce_scatter_gather"),
    ("all_gather", "ring"),
    ("all_gather", "bruck"),
    ("all_gather", "recursive_doubling"),
    ("reduce_scatter", "ring"),
    ("reduce_scatter", "all_reduce"),
    ("all_to_all", "linear"),
    ("barrier", "dissemination"),
]


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
async def test_programs_send_exactly_what_the_drivers_send(collective: str, algorithm: str, p: int, monkeypatch: Any) -> None:
    if algorithm == "recursive_doubling" and collective == "all_gather" and p & (p - 1):
        pytest.skip("power of two only")
    monkeypatch.setattr(tuning, "RING_BLOCK_BYTES", 256)  # several ring segments and lanes
    nbytes = 4000 if collective != "barrier" else 0
    fabric = await run_driver(collective, algorithm, p, nbytes)
    messages, nbytes_sent = traffic(programs_for(collective, algorithm, p, nbytes), p)
    assert messages == fabric.messages
    assert nbytes_sent == fabric.bytes_sent


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_powers_of_two_meet_the_reference_closed_forms(k: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(tuning, "RING_BLOCK_BYTES", 1 << 30)  # one ring segment, as in the closed form
    p = 1 << k
    n = 4 * 1024 * p  # divisible into p (and p2) equal blocks
    pairs = [
        (("all_reduce", "recursive_doubling"), "all_reduce.recursive_doubling"),
        (("all_reduce", "rabenseifner"), "all_reduce.rabenseifner"),
        (("all_reduce", "ring"), "all_reduce.ring"),
        (("broadcast", "binomial"), "broadcast.binomial"),
        (("all_gather", "ring"), "all_gather.ring"),
        (("all_gather", "recursive_doubling"), "all_gather.recursive_doubling"),
        (("all_gather", "bruck"), "all_gather.bruck"),
        (("reduce_scatter", "ring"), "reduce_scatter.ring"),
        (("barrier", "dissemination"), "barrier.dissemination"),
    ]
    for (collective, algorithm), model in pairs:
        for gamma in (0.0, 5e-10):
            got = schedule_time(collective, algorithm, p, n, A, B, gamma)
            want = alpha_beta_cost(model, p, n, A, B, gamma)
            assert got == pytest.approx(want, rel=1e-9), (collective, algorithm, p, gamma)


def test_non_powers_of_two_beat_the_one_port_formulas_where_sends_overlap() -> None:
    nb = 1024
    c = A + nb * B
    # the root sends to all its children at once: depth = most set bits below p, not ceil(lg p)
    assert schedule_time("broadcast", "binomial", 5, nb, A, B) == pytest.approx(2 * c)
    assert alpha_beta_cost("broadcast.binomial", 5, nb, A, B) == pytest.approx(3 * c)
    # folding 5 -> 4 overlaps the fold with the first exchange: 3 latencies, not 4
    assert schedule_time("all_reduce", "recursive_doubling", 5, nb, A, B) == pytest.approx(3 * c)


def test_ring_lanes_overlap_segments(monkeypatch: Any) -> None:
    p, nb = 2, 4 * 4096
    monkeypatch.setattr(tuning, "RING_BLOCK_BYTES", 4096)  # 2 segments of 2 blocks
    monkeypatch.setattr(tuning, "RING_LANES", 1)
    one_lane = schedule_time("all_reduce", "ring", p, nb, A, B)
    monkeypatch.setattr(tuning, "RING_LANES", 2)
    two_lanes = schedule_time("all_reduce", "ring", p, nb, A, B)
    seg = 2 * (A + 4096 * B)  # reduce-scatter step + allgather step of one segment
    assert one_lane == pytest.approx(2 * seg) and two_lanes == pytest.approx(seg)


def test_evaluate_reports_unmatched_receives() -> None:
    with pytest.raises(RuntimeError, match="deadlock"):
        evaluate({(0, 0): [Step(recvs=((1, "x"),))], (1, 0): [Step()]}, A, B)
    with pytest.raises(RuntimeError, match="twice"):
        evaluate({(0, 0): [Step(sends=((1, "x", 1),)), Step(sends=((1, "x", 1),))]}, A, B)


def test_selected_cost_names_and_times() -> None:
    name, t = selected_cost("all_to_all", 4, 64 * 1024, A, B)
    assert name == "all_to_all.linear" and t == pytest.approx(A + 16 * 1024 * B)
    name, t = selected_cost("all_to_all", 4, 4 << 20, A, B)
    # large blocks: every exchange posted at once, so on an ideal (contention-free) network they
    # overlap; the one-port closed form is what a rank sending one message at a time would take
    assert name == "all_to_all.pairwise" and t == pytest.approx(A + (1 << 20) * B)
    assert t < alpha_beta_cost("all_to_all.pairwise", 4, 4 << 20, A, B)
    assert selected_cost("barrier", 1, 0, A, B) == ("barrier.dissemination", 0.0)
    assert selected_cost("gather", 3, 400, A, B) == ("gather.linear", pytest.approx(A + 400 * B))
