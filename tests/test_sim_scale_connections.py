"""Connection set-up at scale in the simulator: one dial per pair, deterministic digests."""

from __future__ import annotations

from collections import Counter

import numpy as np
from conftest import printed_by_fresh_interpreters

import sim
from aiodist import api


async def rendezvous_and_allreduce() -> float:
    await api.init_process_group(timeout=600)
    x = np.ones(256, dtype=np.float32)
    for _ in range(2):
        await api.all_reduce(x)
    await api.destroy_process_group()
    return float(x[0])


def test_a_symmetric_all_reduce_dials_each_pair_once() -> None:
    """Recursive doubling: both partners of each exchange need the connection; only one dials it
    (before, both did, and one connection per pair was answered "dup" and closed)."""
    n = 64
    res = sim.run(rendezvous_and_allreduce, world_size=n, seed=2, trace=True, explore=False)  # (nominal timing)
    assert res.ok and res.rank_results == [float(n) ** 2] * n, res.summary()
    store_port = "29500"
    peer_connects = [e for e in res.trace if e.kind == "connect" and e.detail != store_port]
    pairs = Counter(frozenset((e.host, e.peer)) for e in peer_connects)
    assert len(pairs) == n * 6 // 2  # log2(64) partners per rank
    assert max(pairs.values()) == 1, [p for p, c in pairs.items() if c > 1][:5]
    # each connection dialed by the lower rank of its pair
    assert all(int(e.host[4:]) < int(e.peer[4:]) for e in peer_connects)


def test_the_scale_digest_is_the_same_across_hash_seeds() -> None:
    code = (
        "import sys; sys.path.insert(0, 'tests'); import sim, test_sim_scale_connections as t; "
        "print(sim.run(t.rendezvous_and_allreduce, world_size=32, seed=5, trace=False).digest)"
    )
    digests = printed_by_fresh_interpreters(code, ("3", "4242"))
    digests.add(sim.run(rendezvous_and_allreduce, world_size=32, seed=5, trace=False).digest)
    assert len(digests) == 1
