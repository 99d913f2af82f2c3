"""Who waits for whom when an operation timed out: a cycle of ranks is a deadlock the timeout only ended.

Pure: the blocked operations of the other ranks (from :mod:`aiodist.inflight`)
and the ranks the timed-out one still waited for, in; a cycle, or nothing, out.
Only operations of the world group count: another group numbers its ranks its
own way, and the entries name group ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["waits_of", "wait_cycle"]

WORLD = "world"


def waits_of(ops: Sequence[Mapping[str, Any]]) -> list[int]:
    """The ranks a rank blocked in ``ops`` waits for (its world operations' peers), sorted, each once."""
    peers: set[int] = set()
    for op in ops:
        if op.get("group") != WORLD:
            continue
        peer = op.get("peer")
        if op.get("op") == "recv" and type(peer) is int:
            peers.add(peer)
        many = op.get("peers")
        if isinstance(many, (list, tuple)):
            peers.update(p for p in many if type(p) is int)
    return sorted(peers)


def wait_cycle(start: int, waiting_for: Sequence[int], blocked: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[int]:
    """The shortest cycle of waits from ``start`` back to it (``[start, a, ..., start]``), else ``[]``.

    ``start`` waited for ``waiting_for``; every other rank waits for what its
    blocked operations name (:func:`waits_of`); a rank blocked in nothing waits
    for nobody.
    """
    edges = {r: waits_of(ops) for r, ops in blocked.items() if r != start}
    edges[start] = sorted(set(waiting_for))
    came_from: dict[int, int] = {}
    frontier = [start]
    for _ in range(len(edges)):  # (bounded: a shortest cycle visits each rank at most once)
        nxt: list[int] = []
        for r in frontier:
            for peer in edges.get(r, []):
                if peer == start:
                    path = [r]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if peer not in came_from and peer in edges:
                    came_from[peer] = r
                    nxt.append(peer)
        frontier = nxt
        if not frontier:
            break
    return []
