"""Exact alpha-beta timing of the algorithms as implemented. Pure, no I/O.

REFERENCE.md's closed forms (:mod:`.cost`) assume a rank sends one message
at a time. The drivers here are not always that strict: a binomial root
sends to all its children at once, non-powers of two overlap the fold with
the first exchange, all_to_all posts every send (and, when large, every
receive) at once. So this
module replays each driver's message pattern as per-rank programs and
computes when every rank finishes on an ideal network: a message of b bytes
sent at time t arrives at t + alpha + b*beta, links never contend, sends
never block, and reducing b bytes takes b*gamma. On such a network (the
simulator's ``Network.ideal``) the computed time is the simulated one, for
any p.

A program is a list of :class:`Step`: at its start the step's sends depart;
it ends when its receives have all arrived, plus the time to reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import tuning
from .schedules import (
    Fold,
    binomial_tree,
    bruck_allgather,
    dissemination,
    fold,
    pairwise_alltoall,
    partition,
    recursive_doubling,
    recursive_doubling_allgather,
    recursive_halving,
    ring,
)
from .transfer import SMALL_SEND_BYTES

__all__ = ["Step", "evaluate", "programs_for", "schedule_time"]

Key = Any


@dataclass(frozen=True, slots=True)
class Step:
    """Send ``sends`` ((dst, key, nbytes)...), then wait for ``recvs`` ((src, key)...), then reduce."""

    sends: tuple[tuple[int, Key, int], ...] = ()
    recvs: tuple[tuple[int, Key], ...] = ()
    reduce_bytes: int = 0


Programs = dict[tuple[int, int], list[Step]]
"""(rank, thread) -> steps. Threads of a rank run concurrently (the ring's lanes)."""


def evaluate(programs: Programs, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """The time at which the last program finishes (all start at 0).

    Raises RuntimeError if some receive is never matched (a schedule bug).
    """
    arrivals: dict[tuple[int, int, Key], float] = {}
    pos = {tid: 0 for tid in programs}
    now = {tid: 0.0 for tid in programs}
    sent = {tid: -1 for tid in programs}
    order = sorted(programs)
    progress = True
    while progress:
        progress = False
        for tid in order:
            prog = programs[tid]
            rank = tid[0]
            while pos[tid] < len(prog):
                step = prog[pos[tid]]
                t = now[tid]
                if sent[tid] < pos[tid]:
                    for dst, key, nbytes in step.sends:
                        slot = (rank, dst, key)
                        if slot in arrivals:
                            raise RuntimeError(f"rank {rank} sends twice to {dst} under {key!r}")
                        arrivals[slot] = t + alpha + nbytes * beta
                    sent[tid] = pos[tid]
                    progress = True
                due = [arrivals.get((src, rank, key)) for src, key in step.recvs]
                times = [x for x in due if x is not None]
                if len(times) < len(due):
                    break
                now[tid] = max([t, *times]) + step.reduce_bytes * gamma
                pos[tid] += 1
                progress = True
    stuck = [tid for tid in order if pos[tid] < len(programs[tid])]
    if stuck:
        raise RuntimeError(f"schedule deadlock: {stuck[:5]} wait for messages never sent")
    return max(now.values(), default=0.0)


# ------------------------------------------------------------------ programs, one per driver


def _one(p: int, build: Callable[[int], list[Step]]) -> Programs:
    return {(r, 0): build(r) for r in range(p)}


def _folded(f: Fold, nb: int, active: Callable[[], list[Step]]) -> list[Step]:
    """The whole program of an extra, or ``active()`` with an absorber's fold before and unfold after."""
    if f.role == "plain":
        return active()
    partner = f.partner
    assert partner is not None  # extras and absorbers have one
    if f.role == "extra":
        return [Step(sends=((partner, "fold", nb),)), Step(recvs=((partner, "unfold"),))]
    return [Step(recvs=((partner, "fold"),), reduce_bytes=nb), *active(), Step(sends=((partner, "unfold", nb),))]


def _all_reduce_rd(p: int, nb: int) -> Programs:
    def build(r: int) -> list[Step]:
        return _folded(fold(p, r), nb, lambda: [
            Step(((partner, ("rd", k), nb),), ((partner, ("rd", k)),), nb) for k, partner in recursive_doubling(p, r)
        ])

    return _one(p, build)


def _all_reduce_rabenseifner(p: int, n: int, isz: int) -> Programs:
    nb = n * isz

    def build(r: int) -> list[Step]:
        f = fold(p, r)
        offs = partition(n, f.p2)

        def size(lo: int, hi: int) -> int:
            return (offs[hi] - offs[lo]) * isz

        def active() -> list[Step]:
            prog: list[Step] = []
            steps = recursive_halving(p, r)
            for st in steps:
                key = ("rs", st.step)
                prog.append(Step(((st.partner, key, size(st.send_lo, st.send_hi)),), ((st.partner, key),), size(st.keep_lo, st.keep_hi)))
            for st in reversed(steps):
                key = ("ag", st.step)
                prog.append(Step(((st.partner, key, size(st.keep_lo, st.keep_hi)),), ((st.partner, key),)))
            return prog

        return _folded(f, nb, active)

    return _one(p, build)


def _all_reduce_ring(p: int, n: int, isz: int) -> Programs:
    block_elems = max(1, tuning.RING_BLOCK_BYTES // isz)
    nseg = max(1, -(-n // (block_elems * p)))
    segs = partition(n, nseg)
    nlanes = max(1, min(tuning.RING_LANES, nseg))
    programs: Programs = {}
    for r in range(p):
        plan = ring(p, r)
        for lane in range(nlanes):
            prog: list[Step] = []
            for j in range(lane, nseg, nlanes):
                offs = partition(segs[j + 1] - segs[j], p)
                for s, (sb, rb) in enumerate(plan.reduce_scatter):
                    key = (j, s)
                    prog.append(Step(((plan.right, key, (offs[sb + 1] - offs[sb]) * isz),), ((plan.left, key),), (offs[rb + 1] - offs[rb]) * isz))
                for s, (sb, _) in enumerate(plan.allgather, start=p - 1):
                    key = (j, s)
                    prog.append(Step(((plan.right, key, (offs[sb + 1] - offs[sb]) * isz),), ((plan.left, key),)))
            programs[(r, lane)] = prog
    return programs


def _broadcast_binomial(p: int, nb: int, root: int = 0) -> Programs:
    def build(r: int) -> list[Step]:
        t = binomial_tree(p, r, root)
        prog = [Step(recvs=((t.parent, "b"),))] if t.parent is not None else []
        prog.append(Step(sends=tuple((c, "b", nb) for c, _ in t.children)))
        return prog

    return _one(p, build)


def _broadcast_scatter_allgather(p: int, n: int, isz: int, root: int = 0) -> Programs:
    offs = partition(n, p)

    def size(lo: int, hi: int) -> int:
        return (offs[hi] - offs[lo]) * isz

    def build(r: int) -> list[Step]:
        t = binomial_tree(p, r, root)
        prog = [Step(recvs=((t.parent, "s"),))] if t.parent is not None else []
        prog.append(Step(sends=tuple((c, "s", size(lo, hi)) for (c, _), (lo, hi) in zip(t.children, t.child_subtrees))))
        plan = ring(p, (r - root) % p)
        left, right = (r - 1) % p, (r + 1) % p
        for s, (sb, _) in enumerate(plan.allgather):
            prog.append(Step(((right, ("ag", s), size(sb, sb + 1)),), ((left, ("ag", s)),)))
        return prog

    return _one(p, build)


def _ring_reduce_scatter_steps(p: int, r: int, sizes: list[int]) -> list[Step]:
    plan = ring(p, r)
    return [
        Step(((plan.right, ("rs", s), sizes[sb]),), ((plan.left, ("rs", s)),), sizes[rb])
        for s, (sb, rb) in enumerate(plan.reduce_scatter)
    ]


def _reduce_binomial(p: int, nb: int, root: int = 0) -> Programs:
    def build(r: int) -> list[Step]:
        t = binomial_tree(p, r, root)
        prog = [Step(recvs=((c, "r"),), reduce_bytes=nb) for c, _ in reversed(t.children)]
        if t.parent is not None:
            prog.append(Step(sends=((t.parent, "r", nb),)))
        return prog

    return _one(p, build)


def _reduce_rs_gather(p: int, n: int, isz: int, root: int = 0) -> Programs:
    offs = partition(n, p)
    sizes = [(offs[i + 1] - offs[i]) * isz for i in range(p)]

    def build(r: int) -> list[Step]:
        prog = _ring_reduce_scatter_steps(p, r, sizes)
        if r == root:
            prog.append(Step(recvs=tuple((i, "g") for i in range(p) if i != root)))
        else:
            prog.append(Step(sends=((root, "g", sizes[r]),)))
        return prog

    return _one(p, build)


def _all_gather(p: int, m: int, algorithm: str) -> Programs:
    def build(r: int) -> list[Step]:
        if algorithm == "ring":
            plan = ring(p, r)
            return [Step(((plan.right, s, m),), ((plan.left, s),)) for s in range(p - 1)]
        if algorithm == "recursive_doubling":
            return [
                Step(((st.partner, st.step, (st.send_hi - st.send_lo) * m),), ((st.partner, st.step),))
                for st in recursive_doubling_allgather(p, r)
            ]
        return [Step(((st.dst, st.step, st.count * m),), ((st.src, st.step),)) for st in bruck_allgather(p, r)]

    return _one(p, build)


def _linear_all_to_all(p: int, m: int) -> Programs:
    def build(r: int) -> list[Step]:
        pairs = pairwise_alltoall(p, r)
        sends = tuple((dst, "a", m) for dst, _ in pairs)
        recvs = tuple((src, "a") for _, src in pairs)
        if m <= SMALL_SEND_BYTES:
            return [Step(sends=sends), Step(recvs=recvs)]
        # large: every send and receive posted at once, in pairwise order (see alltoall._exchange);
        # on a contention-free network the p-1 exchanges overlap: alpha + m beta, where the
        # one-port closed form of REFERENCE.md is (p-1)(alpha + m beta)
        return [Step(sends, recvs)]

    return _one(p, build)


def programs_for(collective: str, algorithm: str, p: int, nbytes: int, *, itemsize: int = 4) -> Programs:
    """The per-rank programs of ``collective`` run with ``algorithm``.

    ``nbytes`` follows :mod:`.cost`'s convention (the array for all_reduce,
    broadcast and reduce; the whole output of all_gather; the whole input of
    reduce_scatter and all_to_all), rounded down to whole elements of
    ``itemsize`` bytes, at least one element (per rank where it is split).
    """
    n = max(1, nbytes // itemsize)
    per = max(1, nbytes // itemsize // p)
    if collective == "all_reduce":
        if algorithm == "recursive_doubling":
            return _all_reduce_rd(p, n * itemsize)
        if algorithm == "rabenseifner":
            return _all_reduce_rabenseifner(p, n, itemsize)
        return _all_reduce_ring(p, n, itemsize)
    if collective == "broadcast":
        if algorithm == "binomial":
            return _broadcast_binomial(p, n * itemsize)
        return _broadcast_scatter_allgather(p, n, itemsize)
    if collective == "reduce":
        if algorithm == "binomial":
            return _reduce_binomial(p, n * itemsize)
        return _reduce_rs_gather(p, n, itemsize)
    if collective == "all_gather":
        return _all_gather(p, per * itemsize, algorithm)
    if collective == "reduce_scatter":
        if algorithm == "all_reduce":
            return _all_reduce_rd(p, per * p * itemsize)
        return _one(p, lambda r: _ring_reduce_scatter_steps(p, r, [per * itemsize] * p))
    if collective == "all_to_all":
        return _linear_all_to_all(p, per * itemsize)
    if collective == "barrier":
        return _one(p, lambda r: [Step(((dst, k, 0),), ((src, k),)) for k, (dst, src) in enumerate(dissemination(p, r))])
    if collective in ("gather", "scatter"):
        m = n * itemsize

        def build(r: int) -> list[Step]:
            if collective == "gather":
                return [Step(recvs=tuple((i, "g") for i in range(1, p)))] if r == 0 else [Step(sends=((0, "g", m),))]
            return [Step(sends=tuple((i, "s", m) for i in range(1, p)))] if r == 0 else [Step(recvs=((0, "s"),))]

        return _one(p, build)
    raise KeyError(f"unknown collective {collective!r}")


def schedule_time(
    collective: str, algorithm: str, p: int, nbytes: int, alpha: float, beta: float, gamma: float = 0.0, *, itemsize: int = 4
) -> float:
    """Seconds ``collective`` takes with ``algorithm`` on an ideal alpha-beta network (see the module doc)."""
    if p <= 1:
        return 0.0
    return evaluate(programs_for(collective, algorithm, p, nbytes, itemsize=itemsize), alpha, beta, gamma)
