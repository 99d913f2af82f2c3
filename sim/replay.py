"""The run's plan on the command line: exploration, swarm and store-host options, and the replay of a run.

A run's *plan* is everything the seed drew besides the schedule and the
latencies: the exploration's latency band and tail and the perturbations it
applied, the faults a ``Swarm`` (or ``Chaos``) drew, and the faults given.
:func:`plan_args` spells a finished run's plan as explicit flags (with
``--no-explore``), so a printed replay command shows what happened, can be
edited or shrunk, and replays the same run (same digest).
"""

from __future__ import annotations

import argparse
import io
import logging
import shlex
from collections.abc import Callable
from typing import Any

from .chaos import Chaos
from .latency import Constant, LatencyModel, Tail, Uniform
from .result import Result
from .swarm import KINDS, parse_swarm
from .sweep_streams import capture_logs, routed


def add_plan_options(p: argparse.ArgumentParser) -> None:
    """The options of this module on ``python -m sim run``."""
    p.add_argument("--no-explore", action="store_true",
                   help="fixed timing: no latency band, tail, pauses, clogs or stragglers drawn per seed")
    p.add_argument("--store-host", choices=("rank0", "separate"), default="rank0",
                   help="where the store runs: on rank 0's host (env://, default) or on a host of its own "
                        "('store', which faults can name)")
    p.add_argument("--swarm", nargs="?", const="all", default=None, type=parse_swarm, metavar="KINDS",
                   help=f"draw a destructive fault plan per seed (from KINDS: {','.join(KINDS)}; default all)")
    p.add_argument("--latency-tail", type=Tail.parse, default=None, metavar="P:LOW:HIGH[:BUDGET]",
                   help="with probability P a message takes LOW..HIGH seconds (log-uniform) more "
                        "(BUDGET seconds of it at most)")
    p.add_argument("--slow-link", type=parse_slow_link, action="append", default=[], metavar="SRC-DSTxFACTOR",
                   help="the link SRC->DST's latency times FACTOR (SRC-SRC: a host's connections to itself)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run the program's module once per run, shared by the ranks, instead of once per rank "
                        "(a costly top level; module globals are then shared as in one process)")
    p.add_argument("--shrink", action="store_true",
                   help="on a failing seed: find the smallest plan that fails the same way, print its replay")


def parse_slow_link(spec: str) -> tuple[int | str, int | str, float]:
    """``SRC-DSTxFACTOR``."""
    link, _, factor = spec.rpartition("x")
    src, _, dst = link.partition("-")
    if not src or not dst or not factor:
        raise argparse.ArgumentTypeError(f"--slow-link {spec!r}: expected SRC-DSTxFACTOR")

    def host(h: str) -> int | str:
        return int(h) if h.isdigit() else h

    return host(src), host(dst), float(factor)


def network_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """What these options add to the run's :class:`~sim.network.Network`."""
    return {"tail": ns.latency_tail, "slow": {(a, b): f for a, b, f in ns.slow_link}}


def run_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """What these options add to ``sim.run``'s keywords (the swarm goes with the faults)."""
    return {"explore": not ns.no_explore, "store_host": ns.store_host}


def extra_faults(ns: argparse.Namespace) -> list[Any]:
    return [ns.swarm] if ns.swarm is not None else []


def latency_spec(m: LatencyModel) -> str:
    if isinstance(m, Constant):
        return f"const:{m.value!r}"
    if isinstance(m, Uniform):
        return f"uniform:{m.low!r}:{m.high!r}"
    return f"exp:{m.mean_extra!r}:{m.minimum!r}"


def explicit(ns: argparse.Namespace, result: Result | None) -> bool:
    """Whether the replay of ``result`` spells its plan out (it drew something: exploration, swarm, chaos)."""
    return result is not None and (result.timing is not None or ns.swarm is not None
                                   or any(isinstance(f, Chaos) for f in ns.faults))


def plan_args(ns: argparse.Namespace, result: Result | None) -> list[str]:
    """Flags for the run's plan: what ``result`` drew, explicitly, with every fault; without a result (or
    when it drew nothing), the options as given (the faults given are not repeated here)."""
    out: list[str] = []
    if ns.store_host != "rank0":
        out += ["--store-host", ns.store_host]
    if getattr(ns, "no_isolate", False):
        out.append("--no-isolate")
    if not explicit(ns, result):
        if ns.no_explore:
            out.append("--no-explore")
        if ns.swarm is not None:
            out += shlex.split(ns.swarm.to_cli())
        if ns.latency_tail is not None:
            out += ["--latency-tail", ns.latency_tail.to_cli()]
        for a, b, f in ns.slow_link:
            out += ["--slow-link", f"{a}-{b}x{f!r}"]
        return out
    assert result is not None
    out.append("--no-explore")
    if result.timing is not None and result.timing.band is not None and ns.latency is None:
        out += ["--latency", latency_spec(result.timing.band)]
    tail = ns.latency_tail or (result.timing.tail if result.timing is not None else None)
    if tail is not None:
        out += ["--latency-tail", tail.to_cli()]
    slow = ns.slow_link or (result.timing.slow if result.timing is not None else ())
    for a, b, f in slow:
        out += ["--slow-link", f"{a}-{b}x{f!r}"]
    for fault in [*result.faults, *result.explored]:
        out += shlex.split(fault.to_cli())
    return out


def shrink_and_report(ns: argparse.Namespace, main: Any, result: Result, network: Any, run_kwargs: dict[str, Any],
                      command: Callable[[argparse.Namespace, int, Result | None], str]) -> None:
    """``--shrink``: shrink ``result``'s plan (quietly: the replays' output is dropped), print the smallest one."""
    from .shrink import shrink

    print(f"shrinking the plan of seed {result.seed} ({len(result.faults) + len(result.explored)} faults and "
          "perturbations) ...", flush=True)
    # (the replays print nothing: not the program's output, nor aiodist's log records such as a flight
    # recorder's warning per replay, which the failing run already showed)
    with routed(stdout=io.StringIO(), stderr=io.StringIO(), argv=[ns.program, *ns.args]), \
            capture_logs(logging.NullHandler()):
        small = shrink(main, result, network=network, **run_kwargs)
    print(f"shrunk in {small.runs} runs to {len(small.faults)} fault(s)"
          f"{', the latency band' if small.band else ''}{', the latency tail' if small.tail else ''}"
          f"{', slow links' if small.slow else ''}; it still fails the same way ({small.signature}):")
    for fault in small.faults:
        print(f"  {fault.to_cli().lstrip('-')}")
    minimal = argparse.Namespace(**vars(ns))
    minimal.no_explore, minimal.swarm, minimal.shrink = True, None, False
    minimal.latency = small.band if small.band is not None else ns.latency
    minimal.latency_tail = small.tail if small.tail is not None else ns.latency_tail
    minimal.slow_link = list(small.slow) if small.slow else ns.slow_link
    minimal.faults = list(small.faults)  # (in the order they act: see sim.cli's fault flags)
    print(f"Minimal replay:\n  {command(minimal, int(result.seed), None)}")


