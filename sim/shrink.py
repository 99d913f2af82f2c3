"""Shrinking: the smallest plan that still fails the same way (delta debugging over faults and perturbations).

A failing seed's plan may hold a dozen faults and perturbations (a swarm's,
the exploration's) where two matter. :func:`shrink` replays the seed with
explicit plans (exploration off, so nothing new is drawn), and keeps a
smaller one whenever it still fails *the same way* (:func:`signature`, as a
sweep groups failures: the same exception type raised from the same line of
the program; a deadlock blocked in the same places). It

1. drops faults and perturbations with ddmin (Zeller and Hildebrandt, 2002:
   halves, then quarters, ... of the list, and their complements), the
   latency band and tail counting as two more items ("simplify latency");
2. shortens what is left: each duration (a pause's, a clog's, ...) is halved
   while the failure stays.

Every candidate is one run of the same seed, so shrinking costs a few dozen
runs. What it returns replays exactly (``Shrunk.result`` is that run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .explore import Explorer
from .faults import Fault
from .latency import Tail, Uniform
from .network import Network
from .result import Result
from .runner import run
from .sweep import signature as failure_signature

def signature(result: Result) -> str:
    """How ``result`` failed, as a sweep groups failures (:func:`sim.sweep.signature` of its first); "ok" if it did not."""
    return failure_signature(result.failures[0]) if result.failures else "ok"


@dataclass
class Shrunk:
    """A smallest plan found: its faults (given, drawn and explored ones alike), latency band and tail."""

    faults: list[Fault]
    band: Uniform | None
    tail: Tail | None
    slow: tuple[tuple[int, int, float], ...]
    runs: int
    result: Result
    signature: str


_BAND = "latency band"
_TAIL = "latency tail"
_SLOW = "slow links"


def shrink(main: Callable[..., Awaitable[Any]], failing: Result, *, network: Network | None = None,
           max_runs: int = 300, **run_kwargs: Any) -> Shrunk:
    """Shrink ``failing`` (a run of ``main`` with ``network`` and ``run_kwargs``, as ``sim.run`` took them).

    ``run_kwargs`` are the other keywords of that run (``world_size``,
    ``env``, ``store_host``, ...), except ``seed``, ``faults``, ``explore``
    (taken from ``failing``). At most ``max_runs`` replays.
    """
    want = signature(failing)
    if want == "ok":
        raise ValueError("shrink needs a failing run")
    base = network or Network()
    timing = failing.timing
    band = timing.band if timing is not None else None
    tail = timing.tail if timing is not None else None
    slow = timing.slow if timing is not None else ()
    items: list[Any] = [*failing.faults, *failing.explored]
    if band is not None:
        items.append(_BAND)
    if tail is not None:
        items.append(_TAIL)
    if slow:
        items.append(_SLOW)
    runs = 0
    last: Result = failing
    for key in ("seed", "faults", "explore", "network"):
        run_kwargs.pop(key, None)

    def attempt(chosen: Sequence[Any]) -> bool:
        nonlocal runs, last
        if runs >= max_runs:
            return False
        runs += 1
        faults = [f for f in chosen if f not in (_BAND, _TAIL, _SLOW)]
        plan = dataclasses.replace(timing, band=band if _BAND in chosen else None,
                                   tail=tail if _TAIL in chosen else None,
                                   slow=slow if _SLOW in chosen else ()) if timing is not None else None
        net = Explorer.network(base, plan) if plan is not None else base
        res = run(main, seed=failing.seed, network=net, faults=faults, explore=False, trace=False, **run_kwargs)
        if signature(res) == want:
            last = res
            return True
        return False

    if not attempt(items):  # the explicit plan must fail the same way before anything is dropped
        return Shrunk(list(failing.faults) + list(failing.explored), band, tail, slow, runs, failing, want)
    kept = _ddmin(items, attempt)
    kept = _shorten(kept, attempt)
    attempt(kept)  # (the run ``result`` reports: the last one that failed may have been a bigger plan)
    return Shrunk([f for f in kept if f not in (_BAND, _TAIL, _SLOW)], band if _BAND in kept else None,
                  tail if _TAIL in kept else None, slow if _SLOW in kept else (), runs, last, want)


def _ddmin(items: list[Any], fails: Callable[[Sequence[Any]], bool]) -> list[Any]:
    """Zeller's ddmin: a 1-minimal sublist of ``items`` for which ``fails`` holds (it holds for ``items``)."""
    n = 2
    while len(items) >= 2:
        chunk = max(1, len(items) // n)
        subsets = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        reduced = False
        for subset in subsets:
            if fails(subset):
                items, n, reduced = subset, 2, True
                break
        if not reduced:
            for i in range(len(subsets)):
                complement = [x for j, s in enumerate(subsets) if j != i for x in s]
                if fails(complement):
                    items, n, reduced = complement, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(items):
                break
            n = min(len(items), 2 * n)
    if len(items) == 1 and fails([]):
        return []
    return items


def _shorten(items: list[Any], fails: Callable[[Sequence[Any]], bool]) -> list[Any]:
    """Halve each fault's duration (or delay) while the failure stays."""
    items = list(items)
    for i, item in enumerate(items):
        field_name = next((f for f in ("duration", "delay") if getattr(item, f, None)), None)
        if field_name is None:
            continue
        for _ in range(12):
            value = getattr(item, field_name)
            shorter = replace(item, **{field_name: float(f"{value / 2:.6g}")})
            trial = items[:i] + [shorter] + items[i + 1:]
            if not fails(trial):
                break
            items[i] = item = shorter
    return items
