"""Collective algorithms over a :class:`~aiodist.channel.Channel`.

Every driver takes the group's Channel and the call's sequence number
``seq`` (all message keys start with it, so concurrent collectives never
mix), works in place on C-contiguous numpy arrays, validates its arguments
before sending anything, and works for any world size >= 1. Algorithm
choice by size and world size lives in :mod:`.tuning`, schedules in
:mod:`.schedules` (pure), reduction operators in :mod:`.ops`.
"""

from __future__ import annotations

from .allgather import all_gather, all_gather_into_tensor
from .allreduce import all_reduce
from .alltoall import all_to_all, all_to_all_single, barrier
from .cost import alpha_beta_cost, selected_cost
from .objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .ops import ReduceOp, check_op_dtype, finish_avg, reduce_into
from .reducescatter import reduce_scatter, reduce_scatter_tensor
from .rooted import broadcast, gather, reduce, scatter
from . import tuning  # noqa: F401  (algorithm thresholds, tests and benchmarks tune them)

__all__ = [
    "ReduceOp",
    "check_op_dtype",
    "reduce_into",
    "finish_avg",
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "alpha_beta_cost",
    "selected_cost",
]
