"""Collectives of one group whose arrays overlap run in call order.

Several collectives may be in flight at once (call order defines matching),
but two in flight on the same memory (``h1 = all_reduce(x); h2 =
all_reduce(x)``, or an all_to_all of views of ``x`` issued while ``x`` is
being reduced) would read and write it at the same time: each rank would
get some mix of the two, a different one on each rank. So a collective
whose arrays overlap those of an earlier one of its group still in flight
starts only once that one ended (whatever its outcome), which is the order
torch's stream-ordered backends give. Collectives on separate memory still
run at once. Only numpy arrays are looked at (the arguments, and the arrays
in a list or tuple argument); overlap is decided by
:func:`numpy.shares_memory`, within a bounded amount of work (past it,
the arrays count as overlapping).

Every member orders its own collectives the same way (they are called in
the same order on every member), so waiting for an earlier collective of
the same group cannot deadlock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["HeldArrays", "arrays_of", "wait_for_earlier"]

_MAX_WORK = 1000
"""numpy.shares_memory's bound on the work of deciding an overlap (strided views); past it: overlapping."""


def arrays_of(args: Sequence[Any]) -> tuple[np.ndarray, ...]:
    """The numpy arrays among ``args`` and in the lists and tuples among them (one level)."""
    out: list[np.ndarray] = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [x for x in a if isinstance(x, np.ndarray)]
    return tuple(out)


def _overlap(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    for x in a:
        for y in b:
            if np.may_share_memory(x, y):
                try:
                    if np.shares_memory(x, y, max_work=_MAX_WORK):  # type: ignore[arg-type]  # (a bound: documented, not in the stubs)
                        return True
                except RuntimeError:  # (numpy's TooHardError: the bound was reached)
                    return True
    return False


class HeldArrays:
    """The arrays of a group's collectives in flight on this rank, by sequence number."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[int, tuple[tuple[np.ndarray, ...], asyncio.Future[Any]]] = {}

    def __repr__(self) -> str:
        return f"<HeldArrays seqs={list(self._held)}>"

    def earlier(self, arrays: tuple[np.ndarray, ...]) -> tuple[asyncio.Future[Any], ...]:
        """The collectives in flight whose arrays overlap ``arrays``: the new one waits for them to end."""
        if not arrays or not self._held:
            return ()
        return tuple(task for held, task in self._held.values() if _overlap(arrays, held))

    def hold(self, seq: int, arrays: tuple[np.ndarray, ...], task: asyncio.Future[Any]) -> None:
        """Collective ``seq`` (run by ``task``) is in flight on ``arrays``."""
        if arrays:
            self._held[seq] = (arrays, task)

    def release(self, seq: int) -> None:
        """Collective ``seq`` ended (idempotent)."""
        self._held.pop(seq, None)


async def wait_for_earlier(earlier: tuple[asyncio.Future[Any], ...]) -> None:
    """Wait until every collective of ``earlier`` has ended, whatever its outcome (they are not cancelled
    when this wait is)."""
    await asyncio.wait(earlier)
