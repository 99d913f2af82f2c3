"""The algorithm aiodist picks for a collective, and its time on an ideal alpha-beta network.

For the simulator's fidelity check: a simulated run with a linear network
should land near these numbers (CPU overheads aside). The closed forms are in
:mod:`.alphabeta` (re-exported here), the exact replay of each driver in
:mod:`.timing`.
"""

from __future__ import annotations

from . import tuning
from .alphabeta import COST_MODELS, alpha_beta_cost
from .timing import schedule_time
from .transfer import SMALL_SEND_BYTES

__all__ = ["alpha_beta_cost", "COST_MODELS", "selected_cost"]


def selected_cost(
    collective: str, p: int, nbytes: int, alpha: float, beta: float, gamma: float = 0.0, *, itemsize: int = 4
) -> tuple[str, float]:
    """The algorithm aiodist picks for ``collective`` at this size, and its time on an ideal network.

    ``nbytes`` is the per-rank array size for all_reduce/broadcast/reduce,
    the whole output for all_gather, the whole input for reduce_scatter and
    all_to_all (arrays of ``itemsize``-byte elements, at least one per rank).
    The time is exact for the implementation on a contention-free
    alpha-beta network (:func:`.timing.schedule_time`); it equals the
    closed form of :func:`alpha_beta_cost` whenever the algorithm sends one
    message at a time (e.g. any power-of-two p), and can be lower otherwise.
    """
    n = max(1, nbytes // itemsize)
    per = max(1, nbytes // itemsize // max(p, 1))
    if collective == "all_reduce":
        algo = tuning.choose_all_reduce(p, n * itemsize)
    elif collective == "broadcast":
        algo = tuning.choose_broadcast(p, n * itemsize)
    elif collective == "reduce":
        algo = tuning.choose_reduce(p, n * itemsize)
    elif collective == "all_gather":
        algo = tuning.choose_all_gather(p, per * p * itemsize)
    elif collective == "reduce_scatter":
        algo = tuning.choose_reduce_scatter(p, per * p * itemsize)
    elif collective == "all_to_all":
        algo = "linear" if per * itemsize <= SMALL_SEND_BYTES else "pairwise"
    elif collective == "barrier":
        algo = "dissemination"
    elif collective in ("gather", "scatter"):
        algo = "linear"
    else:
        raise KeyError(f"unknown collective {collective!r}")
    return f"{collective}.{algo}", schedule_time(collective, algo, p, nbytes, alpha, beta, gamma, itemsize=itemsize)
