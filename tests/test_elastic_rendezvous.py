"""Elastic rendezvous in the store: rounds, min/max, last call, late joiners, dead joiners; many at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sim
from aiodist.context import getenv
from aiodist.elastic import ElasticRendezvous
from aiodist.errors import RendezvousTimeoutError
from aiodist.rendezvous import _open_store
from aiodist.store.memory import MemoryStore


def _rdzv(store: Any, node: str, **kw: Any) -> ElasticRendezvous:
    kw.setdefault("min_nodes", 4)
    kw.setdefault("max_nodes", 8)
    kw.setdefault("last_call", 0.2)
    kw.setdefault("timeout", 30)
    kw.setdefault("poll", 0.01)
    return ElasticRendezvous(store, node, **kw)


async def _drain(store: Any, nodes: list[str], **kw: Any) -> list[list[tuple[str, Any]]]:
    """Every node joins at once; rounds are opened again until all got in. Returns the rounds' members."""
    pending = {n: asyncio.ensure_future(_rdzv(store, n, **kw).next_round()) for n in nodes}
    rounds: list[list[tuple[str, Any]]] = []
    opener = _rdzv(store, "opener", **kw)
    while pending:
        done, _ = await asyncio.wait(pending.values(), timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert done, "no round completed"
        await asyncio.sleep(0.3)  # let the round's members all return
        finished = [(n, t.result()) for n, t in pending.items() if t.done()]
        for n, _ in finished:
            del pending[n]
        rounds.append(finished)
        if pending:
            await opener.open_next_round(after=finished[0][1].round)
    return rounds


def _check_rounds(rounds: list[list[tuple[str, Any]]], n: int, lo: int, hi: int) -> None:
    seen: list[str] = []
    for k, members in enumerate(rounds):
        assert lo <= len(members) <= hi, [len(m) for m in rounds]
        parts = {tuple(r.participants) for _, r in members}
        assert len(parts) == 1, parts  # everyone agrees on who is in
        (order,) = parts
        assert sorted(order) == sorted(node for node, _ in members)
        assert sorted(r.rank for _, r in members) == list(range(len(members)))
        for node, r in members:
            assert r.round == members[0][1].round and r.world_size == len(members)
            assert order[r.rank] == node
        seen += [node for node, _ in members]
    assert sorted(seen) == sorted(f"n{i}" for i in range(n))  # nobody twice, nobody lost


@pytest.mark.parametrize("n", [5, 20, 37])
async def test_many_concurrent_joiners_never_corrupt_the_state(n: int) -> None:
    store = MemoryStore()
    rounds = await _drain(store, [f"n{i}" for i in range(n)])
    _check_rounds(rounds, n, 4 if n >= 4 else n, 8)
    assert len(rounds[0]) == min(n, 8)


async def test_below_min_nothing_completes_and_the_timeout_says_why() -> None:
    store = MemoryStore()
    with pytest.raises(RendezvousTimeoutError, match="min 4"):
        await asyncio.gather(*(_rdzv(store, f"n{i}", timeout=0.5).next_round() for i in range(3)))


async def test_last_call_lets_late_arrivals_in_then_freezes() -> None:
    store = MemoryStore()

    async def join(i: int, delay: float) -> Any:
        await asyncio.sleep(delay)
        return await _rdzv(store, f"n{i}", last_call=0.5).next_round()

    first = [asyncio.ensure_future(join(i, 0)) for i in range(4)]
    second = asyncio.ensure_future(join(4, 0.2))  # within the last call
    rounds = await asyncio.gather(*first, second)
    assert {r.world_size for r in rounds} == {5}
    late = asyncio.ensure_future(join(5, 0))  # after the freeze: waits for the next round
    await asyncio.sleep(0.3)
    assert not late.done()
    assert (await _rdzv(store, "x").state())["waiting"] == ["n5"]
    assert await _rdzv(store, "x").num_waiting() == 1
    late.cancel()


async def test_a_joiner_that_dies_is_dropped_from_the_round() -> None:
    store = MemoryStore()
    dead = asyncio.ensure_future(_rdzv(store, "dead").next_round())
    await asyncio.sleep(0.05)
    dead.cancel()  # joined, then stopped heartbeating
    rounds = await asyncio.gather(*(_rdzv(store, f"n{i}", min_nodes=3, last_call=0.1,
                                           heartbeat_timeout=0.3).next_round() for i in range(3)))
    assert all("dead" not in r.participants for r in rounds)
    assert {r.world_size for r in rounds} == {3}


async def sim_joiners_main() -> Any:
    """Each virtual rank is a node; rank 0 hosts the store (like the launcher's agent would)."""
    rank = int(getenv("RANK") or 0)
    store, _server, owned = await _open_store(getenv("MASTER_ADDR"), int(getenv("MASTER_PORT")), rank, 30)
    try:
        await asyncio.sleep(0.001 * (rank % 7))
        r = await ElasticRendezvous(store, f"n{rank}", min_nodes=4, max_nodes=6, last_call=0.1, poll=0.01,
                                    timeout=60).next_round()
        if r.rank == 0:
            await asyncio.sleep(0.5)  # let every member of the round see it, then open the next
            await ElasticRendezvous(store, "opener", min_nodes=4, max_nodes=6).open_next_round(after=r.round)
        await asyncio.sleep(5)  # keep the store (rank 0) up until all rounds are done
        return r.round, r.rank, r.world_size, tuple(r.participants)
    finally:
        for close in reversed(owned):
            await close()


@pytest.mark.parametrize("seed", [0, 1])
def test_concurrent_joiners_in_the_simulator(seed: int) -> None:
    res = sim.run(sim_joiners_main, world_size=16, seed=seed)
    assert res.ok, res.summary()
    by_round: dict[int, list[Any]] = {}
    for node, (k, rank, world, parts) in enumerate(res.rank_results):
        by_round.setdefault(k, []).append((f"n{node}", rank, world, parts))
    total = 0
    for members in by_round.values():
        parts = {m[3] for m in members}
        assert len(parts) == 1
        assert sorted(parts.pop()) == sorted(m[0] for m in members)
        assert sorted(m[1] for m in members) == list(range(len(members)))
        assert 4 <= len(members) <= 6
        total += len(members)
    assert total == 16
    assert sim.run(sim_joiners_main, world_size=16, seed=seed).digest == res.digest
