"""Collective schedules: who sends which block to whom at step k. Pure, no I/O.

Every function here is a deterministic function of (world size ``p``, this
rank, maybe the root) and is cached, so a driver looks its plan up once per
call and then only moves bytes. Blocks are numbered ``0..k-1`` and map to
element ranges through :func:`partition`. Costs in the docstrings refer to
REFERENCE.md's alpha-beta formulas.

Conventions shared with the drivers in this package:

* "relative rank" for rooted collectives is ``(rank - root) % p``.
* Non-powers of two are handled by *folding*: with ``p2`` the largest power
  of two <= p and ``r = p - p2``, each even rank below ``2r`` ("extra")
  hands its data to the odd rank above it ("absorber") and sits out; the
  remaining ``p2`` ranks run the power-of-two algorithm under new numbers
  (``rank // 2`` for absorbers, ``rank - r`` above ``2r``); at the end each
  absorber hands the result back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = [
    "ceil_log2",
    "pof2_floor",
    "partition",
    "BinomialTree",
    "binomial_tree",
    "Fold",
    "fold",
    "recursive_doubling",
    "HalvingStep",
    "recursive_halving",
    "RingPlan",
    "ring",
    "BruckStep",
    "bruck_allgather",
    "DoublingGatherStep",
    "recursive_doubling_allgather",
    "pairwise_alltoall",
    "dissemination",
]


def ceil_log2(p: int) -> int:
    """Smallest k with 2**k >= p (0 for p <= 1)."""
    return max(0, (p - 1).bit_length())


def pof2_floor(p: int) -> int:
    """Largest power of two <= p (p >= 1)."""
    return 1 << (p.bit_length() - 1)


@functools.lru_cache(maxsize=4096)
def partition(n: int, k: int) -> tuple[int, ...]:
    """Offsets of ``n`` elements split into ``k`` nearly equal blocks (k+1 offsets).

    The first ``n % k`` blocks get one element more; blocks may be empty when n < k.
    """
    q, extra = divmod(n, k)
    offs = [0] * (k + 1)
    acc = 0
    for i in range(k):
        acc += q + (1 if i < extra else 0)
        offs[i + 1] = acc
    return tuple(offs)


# ----------------------------------------------------------------- binomial tree


@dataclass(frozen=True, slots=True)
class BinomialTree:
    """This rank's place in the binomial tree rooted at ``root``.

    ``parent`` is ``None`` at the root. ``parent_step`` is lg of the edge's mask
    (the key used on the parent edge). ``children`` lists ``(child, step)``
    largest subtree first (broadcast order); reduce receives them in reverse.
    ``subtree`` is the range of *relative* ranks ``[lo, hi)`` this rank's
    subtree covers, and ``child_subtrees`` the same for each child (for scatter).
    Depth ceil(lg p): cost ceil(lg p)(alpha + n beta) for broadcast.
    """

    parent: int | None
    parent_step: int
    children: tuple[tuple[int, int], ...]
    subtree: tuple[int, int]
    child_subtrees: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=4096)
def binomial_tree(p: int, rank: int, root: int) -> BinomialTree:
    """The binomial tree of ``p`` ranks rooted at ``root``, seen from ``rank``."""
    v = (rank - root) % p
    mask = 1
    parent: int | None = None
    parent_step = -1
    while mask < p:
        if v & mask:
            parent = (v - mask + root) % p
            parent_step = mask.bit_length() - 1
            break
        mask <<= 1
    # mask is now v's lowest set bit, or the first power of two >= p for the root
    hi = min(v + mask, p)
    children: list[tuple[int, int]] = []
    subtrees: list[tuple[int, int]] = []
    m = mask >> 1
    while m > 0:
        c = v + m
        if c < p:
            children.append(((c + root) % p, m.bit_length() - 1))
            subtrees.append((c, min(c + m, p)))
        m >>= 1
    return BinomialTree(parent, parent_step, tuple(children), (v, hi), tuple(subtrees))


# ----------------------------------------------------------------- folding


@dataclass(frozen=True, slots=True)
class Fold:
    """How a rank takes part when ``p`` is folded to a power of two ``p2 = p - r``.

    ``role`` is ``"extra"`` (hands its data to ``partner`` and waits for the
    result), ``"absorber"`` (takes ``partner``'s data, then returns the result)
    or ``"plain"``. ``newrank`` is the rank among the ``p2`` active ranks
    (``None`` for extras).
    """

    p2: int
    r: int
    role: str
    partner: int | None
    newrank: int | None

    def real(self, newrank: int) -> int:
        """The real rank of active rank ``newrank`` (monotonic in newrank)."""
        return 2 * newrank + 1 if newrank < self.r else newrank + self.r


@functools.lru_cache(maxsize=4096)
def fold(p: int, rank: int) -> Fold:
    """This rank's role when folding ``p`` ranks onto the largest power of two below."""
    p2 = pof2_floor(p)
    r = p - p2
    if rank < 2 * r:
        if rank % 2 == 0:
            return Fold(p2, r, "extra", rank + 1, None)
        return Fold(p2, r, "absorber", rank - 1, rank // 2)
    return Fold(p2, r, "plain", None, rank - r)


@functools.lru_cache(maxsize=4096)
def recursive_doubling(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Recursive-doubling exchanges of an active rank after folding: ``(step, partner)``.

    Step k pairs active ranks differing in bit k; lg p2 steps. Extras get ().
    Cost lg p (alpha + n beta + n gamma) plus two folding messages when p is
    not a power of two.
    """
    f = fold(p, rank)
    if f.newrank is None:
        return ()
    steps = []
    mask = 1
    while mask < f.p2:
        steps.append((mask.bit_length() - 1, f.real(f.newrank ^ mask)))
        mask <<= 1
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class HalvingStep:
    """One recursive-halving exchange over ``p2`` blocks.

    Send blocks ``[send_lo, send_hi)``, receive the partner's copy of
    ``[keep_lo, keep_hi)`` and reduce it into ours. The allgather phase replays
    the steps in reverse: send ``keep``, receive ``send`` in place.
    """

    step: int
    partner: int
    send_lo: int
    send_hi: int
    keep_lo: int
    keep_hi: int


@functools.lru_cache(maxsize=4096)
def recursive_halving(p: int, rank: int) -> tuple[HalvingStep, ...]:
    """Rabenseifner's reduce-scatter by recursive halving, after folding.

    Active rank ``newrank`` ends owning block ``newrank`` of ``p2`` blocks.
    The first step halves across the highest bit, so block ranges stay
    contiguous. lg p2 steps; cost lg p alpha + (p-1)/p n (beta + gamma).
    """
    f = fold(p, rank)
    if f.newrank is None:
        return ()
    nr = f.newrank
    lo, hi = 0, f.p2
    steps = []
    mask = f.p2 >> 1
    while mask >= 1:
        mid = lo + mask
        partner = f.real(nr ^ mask)
        if nr & mask:
            steps.append(HalvingStep(mask.bit_length() - 1, partner, lo, mid, mid, hi))
            lo = mid
        else:
            steps.append(HalvingStep(mask.bit_length() - 1, partner, mid, hi, lo, mid))
            hi = mid
        mask >>= 1
    return tuple(steps)


# ----------------------------------------------------------------- ring


@dataclass(frozen=True, slots=True)
class RingPlan:
    """Ring reduce-scatter then allgather over ``p`` blocks, seen from one rank.

    Send to ``right``, receive from ``left``. ``reduce_scatter[s]`` is
    ``(send_block, recv_block)`` for step s; after the p-1 steps this rank owns
    the fully reduced block ``rank``. ``allgather[s]`` likewise, starting from
    owning block ``rank``. Each phase: (p-1) alpha + (p-1)/p n beta.
    """

    left: int
    right: int
    reduce_scatter: tuple[tuple[int, int], ...]
    allgather: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=4096)
def ring(p: int, rank: int) -> RingPlan:
    """The ring schedule of ``rank`` among ``p`` ranks (blocks indexed by rank)."""
    rs = tuple(((rank - s - 1) % p, (rank - s - 2) % p) for s in range(p - 1))
    ag = tuple(((rank - s) % p, (rank - s - 1) % p) for s in range(p - 1))
    return RingPlan((rank - 1) % p, (rank + 1) % p, rs, ag)


# ----------------------------------------------------------------- allgather


@dataclass(frozen=True, slots=True)
class BruckStep:
    """One Bruck allgather step in the rotated buffer (block i = rank + i mod p).

    Send rotated blocks ``[0, count)`` to ``dst``, receive ``count`` blocks from
    ``src`` into rotated position ``[offset, offset + count)``.
    """

    step: int
    dst: int
    src: int
    count: int
    offset: int


@functools.lru_cache(maxsize=4096)
def bruck_allgather(p: int, rank: int) -> tuple[BruckStep, ...]:
    """Bruck's allgather for any p: ceil(lg p) steps, then one local rotation."""
    steps = []
    have = 1
    k = 0
    while have < p:
        count = min(have, p - have)
        steps.append(BruckStep(k, (rank - have) % p, (rank + have) % p, count, have))
        have += count
        k += 1
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class DoublingGatherStep:
    """One recursive-doubling allgather step (p a power of two): exchange block ranges."""

    step: int
    partner: int
    send_lo: int
    send_hi: int
    recv_lo: int
    recv_hi: int


@functools.lru_cache(maxsize=4096)
def recursive_doubling_allgather(p: int, rank: int) -> tuple[DoublingGatherStep, ...]:
    """Recursive-doubling allgather for a power-of-two ``p``: lg p steps, in place."""
    if p & (p - 1):
        raise ValueError(f"recursive doubling allgather needs a power of two, not {p}")
    steps = []
    mask = 1
    while mask < p:
        partner = rank ^ mask
        mine = rank & ~(mask - 1)
        theirs = partner & ~(mask - 1)
        steps.append(DoublingGatherStep(mask.bit_length() - 1, partner, mine, mine + mask, theirs, theirs + mask))
        mask <<= 1
    return tuple(steps)


# ----------------------------------------------------------------- all-to-all, barrier


@functools.lru_cache(maxsize=4096)
def pairwise_alltoall(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Pairwise exchange: step s (1..p-1) sends to rank+s and receives from rank-s."""
    return tuple(((rank + s) % p, (rank - s) % p) for s in range(1, p))


@functools.lru_cache(maxsize=4096)
def dissemination(p: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Dissemination barrier rounds ``(dst, src)``: round k talks to rank +- 2**k; ceil(lg p) rounds."""
    rounds = []
    d = 1
    while d < p:
        rounds.append(((rank + d) % p, (rank - d) % p))
        d <<= 1
    return tuple(rounds)
