"""Closed-form alpha-beta(-gamma) costs of the algorithms, from REFERENCE.md. Pure: imports nothing of aiodist.

``alpha`` seconds per message, ``beta`` seconds per byte sent, ``gamma``
seconds per byte reduced, ``nbytes`` the vector size (the whole output for
all_gather, the whole input for reduce_scatter and all_to_all, as in
nccl-tests). :mod:`.tuning` weighs algorithms with it; :mod:`.cost` gives
the time of the one aiodist picks.
"""

from __future__ import annotations

import math

__all__ = ["COST_MODELS", "alpha_beta_cost"]


def _lg(p: int) -> float:
    return math.log2(p) if p > 1 else 0.0


def _clg(p: int) -> int:
    return max(0, (p - 1).bit_length())


COST_MODELS: dict[str, str] = {
    "broadcast.binomial": "ceil(lg p)(alpha + n beta)",
    "broadcast.scatter_allgather": "(lg p + p - 1) alpha + 2 (p-1)/p n beta",
    "reduce.binomial": "ceil(lg p)(alpha + n beta + n gamma)",
    "reduce.rabenseifner": "2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    "reduce.reduce_scatter_gather": "2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    "all_gather.ring": "(p-1) alpha + (p-1)/p n beta",
    "all_gather.recursive_doubling": "lg p alpha + (p-1)/p n beta",
    "all_gather.bruck": "ceil(lg p) alpha + (p-1)/p n beta",
    "reduce_scatter.recursive_halving": "lg p alpha + (p-1)/p n (beta + gamma)",
    "reduce_scatter.ring": "(p-1) alpha + (p-1)/p n (beta + gamma)",
    "reduce_scatter.all_reduce": "lg p (alpha + n beta + n gamma)",
    "all_reduce.recursive_doubling": "lg p (alpha + n beta + n gamma)",
    "all_reduce.rabenseifner": "2 lg p alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    "all_reduce.ring": "2 (p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    "all_reduce.lower_bound": "ceil(lg p) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma",
    "all_to_all.pairwise": "(p-1) alpha + (p-1)/p n beta",
    "all_to_all.linear": "alpha + (p-1)/p n beta (all sends posted at once; one port)",
    "all_to_all.bruck": "ceil(lg p) alpha + (n/2) lg p beta",
    "barrier.dissemination": "ceil(lg p) alpha",
}
"""Every model :func:`alpha_beta_cost` knows, with its formula."""


def alpha_beta_cost(name: str, p: int, nbytes: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """The modelled time in seconds of algorithm ``name`` (a key of :data:`COST_MODELS`).

    Non-powers of two use the formulas as written (lg p real-valued) except
    where REFERENCE.md says ceil. For recursive doubling and Rabenseifner
    all_reduce the folding of r = p - p' extra ranks adds 2 (alpha + n beta)
    (their data term about doubles).
    """
    if name not in COST_MODELS:
        raise KeyError(f"no cost model {name!r}; known: {sorted(COST_MODELS)}")
    if p <= 1:
        return 0.0
    n = float(nbytes)
    lg, clg = _lg(p), _clg(p)
    frac = (p - 1) / p
    pow2 = p & (p - 1) == 0
    fold = 0.0 if pow2 else 2 * (alpha + n * beta) + n * gamma
    if name == "broadcast.binomial":
        return clg * (alpha + n * beta)
    if name == "broadcast.scatter_allgather":
        return (lg + p - 1) * alpha + 2 * frac * n * beta
    if name == "reduce.binomial":
        return clg * (alpha + n * beta + n * gamma)
    if name == "reduce.rabenseifner":
        return 2 * lg * alpha + 2 * frac * n * beta + frac * n * gamma
    if name == "reduce.reduce_scatter_gather":
        return 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * gamma
    if name == "all_gather.ring":
        return (p - 1) * alpha + frac * n * beta
    if name == "all_gather.recursive_doubling":
        return lg * alpha + frac * n * beta
    if name == "all_gather.bruck":
        return clg * alpha + frac * n * beta
    if name == "reduce_scatter.recursive_halving":
        return lg * alpha + frac * n * (beta + gamma)
    if name == "reduce_scatter.ring":
        return (p - 1) * alpha + frac * n * (beta + gamma)
    if name == "reduce_scatter.all_reduce":
        p2 = 1 << (p.bit_length() - 1)
        return _lg(p2) * (alpha + n * beta + n * gamma) + fold
    if name == "all_reduce.recursive_doubling":
        p2 = 1 << (p.bit_length() - 1)
        return _lg(p2) * (alpha + n * beta + n * gamma) + fold
    if name == "all_reduce.rabenseifner":
        p2 = 1 << (p.bit_length() - 1)
        f2 = (p2 - 1) / p2
        return 2 * _lg(p2) * alpha + 2 * f2 * n * beta + f2 * n * gamma + fold
    if name == "all_reduce.ring":
        return 2 * (p - 1) * alpha + 2 * frac * n * beta + frac * n * gamma
    if name == "all_reduce.lower_bound":
        return clg * alpha + 2 * frac * n * beta + frac * n * gamma
    if name == "all_to_all.pairwise":
        return (p - 1) * alpha + frac * n * beta
    if name == "all_to_all.linear":
        return alpha + frac * n * beta
    if name == "all_to_all.bruck":
        return clg * alpha + (n / 2) * lg * beta
    assert name == "barrier.dissemination"
    return clg * alpha
