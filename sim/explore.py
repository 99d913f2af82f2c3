"""Timing exploration: per seed, draw perturbations that a correct program must tolerate.

A bug that shows only when one message is slow, or one rank stalls at the
wrong moment, hides from a sweep whose every seed has the same well-behaved
timing. So ``sim.run`` explores by default (``explore=True``): each seed draws,
from its own ``"<seed>:explore"`` generator, a :class:`TimingPlan` with some
of these switched on (swarm-style: a kind left out is itself a useful
configuration):

* a latency :class:`~sim.latency.Tail` on every link (a rare long extra delay:
  scheduling, a GC pause, a retransmission);
* pauses: after a frame it sends, a rank stops (SIGSTOP) for a while;
* clogs: after a frame it sends, the link it went out on holds everything for
  a while, then delivers it all, in order;
* stragglers: after a frame it sends, a rank runs slower for a while.

Pauses, clogs and stragglers fire at a per-seed *rate* per frame sent (so they
land inside whatever windows the program has, whatever its length), up to a
per-seed budget. Each one that fires is recorded as a concrete fault with a
frame-count trigger (``Pause(2, on=MessageSent(2, 17), duration=0.31)``):
the list is ``Result.explored``, and replaying the seed with exploration off
and those faults (plus the tail) is the same run.

*Benign by default*: nothing lasts long enough for aiodist's failure detector
to declare a live peer dead. The budget is the detector's timeout minus one
heartbeat interval, as the ranks have configured it (their groups' heartbeat
settings when they have one, else their environment); a pause takes at most
40% of it, a clog 30%, a tail 20%, a straggler's factor stays under what
would stretch its heartbeat past the timeout, and a rank gets no new
perturbation for an interval after one ends, nor while a straggler fault
slows it. So a correct program that does not handle failures passes every
seed. (Destructive faults: :mod:`sim.swarm`.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiodist.comm.transport import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES

from .faults import Clog, Fault, Pause, Straggler
from .latency import Tail
from .triggers import MessageSent

if TYPE_CHECKING:
    from .links import Host
    from .network import Network
    from .runner import Simulation

PAUSE_SHARE = 0.4
CLOG_SHARE = 0.3
TAIL_SHARE = 0.2


@dataclass(frozen=True)
class Exploration:
    """What exploration may draw: for each kind, the share of seeds that get it; ``budget`` caps one run.

    ``sim.run(explore=True)`` uses the defaults; ``explore=Exploration(...)``
    tunes them; ``explore=False`` turns exploration off (fixed timing).
    """

    tail: float = 0.6
    pauses: float = 0.6
    clogs: float = 0.35
    stragglers: float = 0.3
    budget: int = 16

    def draw(self, seed: int | str, detector: float) -> TimingPlan:
        """The plan of ``seed`` (pure); ``detector``: the failure detector's budget in seconds."""
        rng = random.Random(f"{seed}:explore")
        tail = None
        if rng.random() < self.tail:
            low = _log_uniform(rng, 2e-4, 2e-3)
            high = _log_uniform(rng, min(10 * low, TAIL_SHARE * detector), TAIL_SHARE * detector)
            tail = Tail(round(_log_uniform(rng, 0.002, 0.05), 4), _round(low), _round(max(high, low)))
        rates = {}
        for kind, share, lo, hi in (("pause", self.pauses, 0.004, 0.1), ("clog", self.clogs, 0.002, 0.05),
                                    ("straggle", self.stragglers, 0.002, 0.03)):
            on = rng.random() < share
            rate = _log_uniform(rng, lo, hi)
            rates[kind] = round(rate, 4) if on else 0.0
        budget = 1 + int(rng.random() * self.budget)
        return TimingPlan(tail, rates["pause"], rates["clog"], rates["straggle"], budget)


@dataclass(frozen=True)
class TimingPlan:
    """One seed's draw: the tail, and per frame sent the chance of a pause, a clog or a straggler spell."""

    tail: Tail | None
    pause_rate: float
    clog_rate: float
    straggle_rate: float
    budget: int
    explored: list[Fault] = field(default_factory=list, compare=False)

    def describe(self) -> str:
        parts = [f"tail {self.tail.p:g} x {self.tail.low:g}..{self.tail.high:g}s" if self.tail else "no tail"]
        for name, rate in (("pauses", self.pause_rate), ("clogs", self.clog_rate), ("stragglers", self.straggle_rate)):
            if rate:
                parts.append(f"{name} {rate:g}/frame")
        return ", ".join(parts) + f" (up to {self.budget})"


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    if hi <= lo:
        return lo
    return lo * (hi / lo) ** rng.random()


def _round(x: float) -> float:
    """Six significant digits: readable in a replay command, and replays the same (it is what ran)."""
    return float(f"{x:.6g}")


def env_detector(env: Mapping[str, str]) -> tuple[float, int] | None:
    """The heartbeat (interval, misses) a rank with environment ``env`` starts with; None: heartbeats off.

    The environment variables of :mod:`aiodist.comm.transport` (``AIODIST_HEARTBEAT_INTERVAL``,
    ``_MISSES``, ``_TIMEOUT``), read the way the transport reads them.
    """
    interval, misses = HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
    try:
        misses = max(1, int(env.get("AIODIST_HEARTBEAT_MISSES") or misses))
        interval = float(env.get("AIODIST_HEARTBEAT_INTERVAL") or interval)
        raw = env.get("AIODIST_HEARTBEAT_TIMEOUT")
        if raw:
            if raw.strip().lower() in ("off", "no", "false", "none") or float(raw) <= 0:
                return None
            interval = float(raw) / misses
    except ValueError:  # the transport ignores a bad value too (with a warning)
        pass
    return (interval, misses) if interval > 0 else None


def budget_of(config: tuple[float, int] | None) -> tuple[float, float]:
    """(budget, interval): the silence a perturbation may cause, and the heartbeat interval.

    Heartbeats off: the default detector's numbers (a program without one
    still has timeouts of its own of about that size).
    """
    interval, misses = config or (HEARTBEAT_INTERVAL, HEARTBEAT_MISSES)
    return max(misses - 1, 0.5) * interval, interval


class Explorer:
    """Draws and applies one run's timing perturbations (see the module docstring)."""

    def __init__(self, sim: Simulation, plan: TimingPlan, seed: int | str) -> None:
        self.sim = sim
        self.plan = plan
        self.rng = random.Random(f"{seed}:explore:events")
        self.rate = plan.pause_rate + plan.clog_rate + plan.straggle_rate
        self.left = plan.budget
        self.quiet_until: dict[str, float] = {}

    @staticmethod
    def network(config: Network, plan: TimingPlan) -> Network:
        """The run's network with the plan's tail (a tail the user chose stays)."""
        if plan.tail is None or config.tail is not None:
            return config
        return replace(config, tail=plan.tail)

    def install(self, hosts: list[Host]) -> None:
        if not self.rate or not self.left:
            return
        for host in hosts:
            self._arm(host)

    def _arm(self, host: Host) -> None:
        u = self.rng.random()
        gap = 1 + int(math.log(1.0 - u) / math.log(1.0 - self.rate)) if self.rate < 1 else 1
        assert host.rank is not None
        self.sim.when(MessageSent(host.rank, host.sent + gap), lambda: self._fire(host))

    def _fire(self, host: Host) -> None:
        sim = self.sim
        now = sim.loop.time()
        rank = host.rank
        assert rank is not None
        n = host.sent
        if self.left > 0 and self.quiet_until.get(host.name, 0.0) <= now and host.alive and host.factor == 1.0:
            budget, interval = budget_of(self._detector())
            pick = self.rng.random() * self.rate
            span = _log_uniform(self.rng, 1e-3, 1.0)  # a fraction of the budget, log-uniform
            on = MessageSent(rank, n)
            fault: Fault | None = None
            if pick < self.plan.pause_rate:
                d = _round(span * PAUSE_SHARE * budget)
                fault = Pause(rank, on=on, duration=d)
            elif pick < self.plan.pause_rate + self.plan.clog_rate:
                d = _round(span * CLOG_SHARE * budget)
                peer = sim.watches.last_peer
                if peer is not None and peer is not host:
                    fault = Clog((rank, _ref(peer)), on=on, duration=d)
            else:
                d = _round(span * PAUSE_SHARE * budget)
                _, misses = self._detector() or (0.0, HEARTBEAT_MISSES)
                factor = _round(_log_uniform(self.rng, 1.5, max(1.5, min(4.0, (misses - 1) / 2))))
                fault = Straggler(rank, factor, on=on, duration=d)
            if fault is not None:
                fault.apply(sim)  # what the fault does when its trigger fires: a replay does the same
                self.left -= 1
                self.plan.explored.append(fault)
                self.quiet_until[host.name] = now + d + interval
        if self.left > 0:
            self._arm(host)

    def _detector(self) -> tuple[float, int] | None:
        """The tightest heartbeat configuration among the running ranks (their group's, else their environment's)."""
        best: tuple[float, int] | None = None
        for env, group in self.sim.live_ranks():
            config = _group_heartbeat(group) if group is not None else env_detector(env)
            if config is not None and (best is None or config[0] * config[1] < best[0] * best[1]):
                best = config
        return best


def _group_heartbeat(group: Any) -> tuple[float, int] | None:
    config: tuple[float, int] | None = group.transport.heartbeat
    return config


def _ref(host: Host) -> int | str:
    return host.rank if host.rank is not None else host.name


__all__ = ["Exploration", "TimingPlan", "Explorer", "env_detector", "budget_of"]
