"""Which algorithm each collective uses, by message size and world size.

The choice depends only on (collective, p, nbytes), which every rank of a
well-formed call agrees on, so all ranks pick the same algorithm. (If ranks
pass arrays of different sizes they may pick different algorithms; the
transport then reports a size mismatch or the collective times out.)

Thresholds, in the spirit of MPICH's defaults but moved up because a Python
message costs tens of microseconds of CPU overhead (the LogP ``o``), so
saving messages pays for longer than in C:

=================  =============================================================
all_reduce         up to 4 KiB: recursive doubling (lg p messages of n bytes;
                   at p = 2 a single exchange, no task created). Below 1 MiB:
                   recursive doubling or Rabenseifner (recursive halving +
                   doubling: 2 lg p messages, about 2n bytes), whichever has
                   the lower alpha-beta-gamma cost under MODEL_ALPHA/BETA/GAMMA
                   (a message through Python and TCP costs 100 us or more, so
                   recursive doubling wins up to hundreds of KiB; measured at
                   p = 2 on loopback it beat the two-message algorithms up to
                   16 MiB, so with 2 ranks it is used below 32 MiB).
                   From 1 MiB (32 MiB at p = 2): a pipelined ring: the array
                   is cut into segments whose ring blocks are at most
                   RING_BLOCK_BYTES (4 MiB), RING_LANES (1) at a time.
broadcast          binomial tree below 512 KiB or for p <= 4 (BCAST_TREE_MAX_RANKS);
                   above, scatter down the binomial tree + ring allgather
                   (van de Geijn).
reduce             binomial tree below 512 KiB or for p <= 4 (BCAST_TREE_MAX_RANKS:
                   measured on loopback, the tree took 0.5 vs 2.1 ms at 2 ranks
                   1 MiB, 7.3 vs 19.0 ms at 2 ranks 16 MiB, 3.0 vs 6.0 ms at 4
                   ranks 1 MiB); above, ring reduce-scatter + gather of the
                   blocks at the root.
all_gather         below 256 KiB of output: recursive doubling (p a power of
                   two) or Bruck (any p); above, ring.
reduce_scatter     below 32 KiB of input: recursive-doubling all_reduce of a
                   copy; above, ring (p-1 steps, blocks reduced once).
                   Uneven blocks (the list form): the same by their total;
                   the ring over the blocks themselves unless rebalancing
                   (ring over p equal parts of their concatenation, then each
                   part's pieces to their blocks' ranks) moves at most
                   1/REBALANCE_MIN_GAIN (1/2) as many bytes per rank: the plain
                   ring's p-1 steps each move the largest block, the other's
                   p-1 steps a p-th of the total, then a block. (Measured
                   with one block holding all 16 MiB: 26 vs 97 ms at 8 ranks
                   on the simulator's 1.25 GB/s links, which the rule picks
                   rebalancing for; 63 vs 30 ms at 4 ranks on a 2-CPU
                   loopback, where copying the concatenation costs more than
                   the bytes saved, and the rule keeps the ring.)
all_to_all         messages <= 64 KiB: all sends posted then all receives
                   (linear, as gloo); above, every send and receive posted
                   at once (early payloads wait in the socket for their receive).
gather / scatter   linear (root talks to every rank), as gloo.
barrier            dissemination, ceil(lg p) rounds.
=================  =============================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from .alphabeta import alpha_beta_cost

__all__ = [
    "ALLREDUCE_RD_MAX_BYTES",
    "ALLREDUCE_RING_MIN_BYTES",
    "ALLREDUCE_P2_RING_MIN_BYTES",
    "RING_BLOCK_BYTES",
    "RING_LANES",
    "MODEL_ALPHA",
    "MODEL_BETA",
    "MODEL_GAMMA",
    "BCAST_SCATTER_MIN_BYTES",
    "BCAST_TREE_MAX_RANKS",
    "REDUCE_RS_MIN_BYTES",
    "ALLGATHER_RING_MIN_BYTES",
    "REDUCE_SCATTER_RING_MIN_BYTES",
    "choose_all_reduce",
    "choose_broadcast",
    "choose_reduce",
    "choose_all_gather",
    "choose_reduce_scatter",
    "choose_uneven_reduce_scatter",
    "REBALANCE_MIN_GAIN",
    "ALGORITHMS",
]

ALLREDUCE_RD_MAX_BYTES = 4 * 1024
"""At or below this, all_reduce always uses recursive doubling (latency-bound)."""
ALLREDUCE_RING_MIN_BYTES = 1024 * 1024
"""From this size on, all_reduce uses the pipelined ring (p > 2)."""
ALLREDUCE_P2_RING_MIN_BYTES = 32 * 1024 * 1024
"""With 2 ranks, all_reduce is one exchange (recursive doubling) below this size.

Measured over aiodist's TCP on loopback (2 ranks): the single exchange beat
the ring at 1, 4 and 16 MiB (1.5-2.1 vs 2.6-2.8 ms, 5.5-8.2 vs 8.6-10.5 ms,
22-27 vs 24-31 ms) and lost at 64 MiB (124-158 vs 92-97 ms)."""
MODEL_ALPHA = 100e-6
"""Seconds per message (CPU overhead + latency) assumed when choosing between algorithms."""
MODEL_BETA = 1e-9
"""Seconds per byte on the wire (1 GB/s) assumed when choosing."""
MODEL_GAMMA = 0.5e-9
"""Seconds per byte reduced (2 GB/s) assumed when choosing."""
RING_BLOCK_BYTES = 4 * 1024 * 1024
"""Largest ring block of one pipelined segment (a segment is p blocks).

Measured on loopback (2 shared cores, medians of 3 alternated runs): 4 MiB
blocks in one lane beat 1 MiB blocks in 2 lanes at 2 ranks (64 MiB: 88 vs
118 ms) and at 4 ranks (16 MiB: 74 vs 100 ms; 64 MiB: 126-130 vs 142-253 ms):
each step is a wake-up of a peer process, and fewer, larger steps pay fewer
of them; 2 MiB blocks in 2 lanes were in between."""
RING_LANES = 1
"""Segments in flight at once (each lane walks its own segments)."""
BCAST_SCATTER_MIN_BYTES = 512 * 1024
BCAST_TREE_MAX_RANKS = 4
"""Up to this many ranks broadcast always uses the binomial tree.

Measured at p = 4 on loopback (medians of 3 alternated runs): the tree took
2.7 vs 6.3 ms at 1 MiB, 5.4 vs 10.8 ms at 4 MiB, 24.5 vs 40.8 ms at 16 MiB and
109 vs 136 ms at 64 MiB against scatter + allgather: with so few ranks the
tree's lg p full copies cost less than the allgather's extra p - 1 dependent
steps (each one a wake-up of a peer process)."""
REDUCE_RS_MIN_BYTES = 512 * 1024
ALLGATHER_RING_MIN_BYTES = 256 * 1024
REDUCE_SCATTER_RING_MIN_BYTES = 32 * 1024

REBALANCE_MIN_GAIN = 2.0
"""How many times fewer bytes per rank rebalancing must move than the ring over uneven blocks to be chosen."""

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("recursive_doubling", "rabenseifner", "ring"),
    "broadcast": ("binomial", "scatter_allgather"),
    "reduce": ("binomial", "reduce_scatter_gather"),
    "all_gather": ("recursive_doubling", "bruck", "ring"),
    "reduce_scatter": ("all_reduce", "ring"),
}
"""Algorithm names each collective accepts as ``algorithm=`` (to force one)."""


def _check(collective: str, algorithm: str) -> str:
    if algorithm not in ALGORITHMS[collective]:
        raise ValueError(f"{collective} has no algorithm {algorithm!r}; choose from {ALGORITHMS[collective]}")
    return algorithm


def choose_all_reduce(p: int, nbytes: int, algorithm: str | None = None) -> str:
    """The all_reduce algorithm for ``nbytes`` per rank among ``p`` ranks."""
    if algorithm is not None:
        return _check("all_reduce", algorithm)
    if nbytes <= ALLREDUCE_RD_MAX_BYTES or (p == 2 and nbytes < ALLREDUCE_P2_RING_MIN_BYTES):
        return "recursive_doubling"
    if nbytes >= ALLREDUCE_RING_MIN_BYTES:
        return "ring"
    rd = alpha_beta_cost("all_reduce.recursive_doubling", p, nbytes, MODEL_ALPHA, MODEL_BETA, MODEL_GAMMA)
    rab = alpha_beta_cost("all_reduce.rabenseifner", p, nbytes, MODEL_ALPHA, MODEL_BETA, MODEL_GAMMA)
    return "recursive_doubling" if rd <= rab else "rabenseifner"


def choose_broadcast(p: int, nbytes: int, algorithm: str | None = None) -> str:
    """The broadcast algorithm."""
    if algorithm is not None:
        return _check("broadcast", algorithm)
    if p <= BCAST_TREE_MAX_RANKS or nbytes < BCAST_SCATTER_MIN_BYTES:
        return "binomial"
    return "scatter_allgather"


def choose_reduce(p: int, nbytes: int, algorithm: str | None = None) -> str:
    """The reduce algorithm."""
    if algorithm is not None:
        return _check("reduce", algorithm)
    if p <= BCAST_TREE_MAX_RANKS or nbytes < REDUCE_RS_MIN_BYTES:
        return "binomial"
    return "reduce_scatter_gather"


def choose_all_gather(p: int, out_nbytes: int, algorithm: str | None = None) -> str:
    """The all_gather algorithm for ``out_nbytes`` of output per rank."""
    if algorithm is not None:
        algo = _check("all_gather", algorithm)
        if algo == "recursive_doubling" and p & (p - 1):
            raise ValueError(f"recursive_doubling all_gather needs a power-of-two group, not {p} ranks")
        return algo
    if out_nbytes >= ALLGATHER_RING_MIN_BYTES:
        return "ring"
    return "recursive_doubling" if p & (p - 1) == 0 else "bruck"


def choose_reduce_scatter(p: int, in_nbytes: int, algorithm: str | None = None) -> str:
    """The reduce_scatter algorithm for ``in_nbytes`` of input per rank."""
    if algorithm is not None:
        return _check("reduce_scatter", algorithm)
    return "ring" if in_nbytes >= REDUCE_SCATTER_RING_MIN_BYTES else "all_reduce"


def choose_uneven_reduce_scatter(sizes: Sequence[int]) -> str:
    """``"ring"`` or ``"rebalanced"`` for a ring reduce-scatter of blocks of ``sizes`` elements (see the module doc)."""
    p, largest = len(sizes), max(sizes)
    plain = (p - 1) * largest
    rebalanced = (p - 1) * -(-sum(sizes) // p) + largest
    return "rebalanced" if plain >= REBALANCE_MIN_GAIN * rebalanced else "ring"
