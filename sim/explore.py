"""Timing exploration: per seed, draw perturbations that a correct program must tolerate.

A bug that shows only when one message is slow, or one rank stalls at the
wrong moment, hides from a sweep whose every seed has the same well-behaved
timing. So ``sim.run`` explores by default (``explore=True``): each seed draws,
from its own ``"<seed>:explore"`` generator, a :class:`TimingPlan` with some
of these switched on (swarm-style: a kind left out, or ranks left alone, is
itself a useful configuration):

* a wider band of base latencies (the default network's only), and a latency
  :class:`~sim.latency.Tail` on every link (a rare long extra delay:
  scheduling, a GC pause, a retransmission);
* pauses: a rank stops (SIGSTOP) for a while, after a frame it sends, before
  it reads a frame it received, or at a random moment;
* clogs: after a frame a rank sends, the link it went out on holds everything
  for a while, then delivers it all, in order;
* stragglers: after a frame it sends, a rank runs slower for a while;
* a slow rank: one rank runs a little slower (x1.1 to x1.5) for the whole
  run (a busier machine, a throttled CPU): what a short spell cannot do to
  work that lasts seconds (a lease held a little too long). A sleep of that
  rank is at most (factor - 1) x 40% of the detector's budget longer (0.5 s
  at x1.5 and the default detector): a long sleep is a timer more than work.

These fire at per-seed *rates* (per frame, per second), so they land inside
whatever windows the program has, whatever its length, up to a per-seed
number and total duration (exploring costs little). Each one that fires is
recorded as a concrete fault with its trigger (``Pause(2, on=MessageSent(2,
17), duration=0.31)``): the list is ``Result.explored``, and replaying the
seed with exploration off, the plan's band and tail, and those faults is the
same run (same digest).

*Benign by default*: nothing lasts long enough for aiodist's failure detector
to declare a live peer dead. Its budget is the silence it tolerates (the
timeout minus one heartbeat interval) as the ranks have configured it (their
groups' heartbeat settings when they have one, else their environment); a
pause takes at most 40% of it, a clog 30%, a tail 20% (pauses and clogs
less where the run's partitions take more than the rest: they may overlap;
:data:`sim.swarm.PARTITION_SHARE`); a straggler's factor
stays under what would stretch its heartbeats past the timeout (a slow
rank's pauses and clogs are shorter by what its slowness adds to a
heartbeat's gap and to a tail, and it gets no spell on top); after a
perturbation a rank runs a moment undisturbed (its overdue heartbeat goes
out) and none comes while a straggler fault slows it. So a correct program
that does not handle failures passes every seed. (Destructive faults:
:mod:`sim.swarm`.)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from aiodist.comm.settings import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES

from .faults import Clog, Fault, Partition, Pause, Straggler
from .latency import Tail, Uniform
from .triggers import MessageReceived, MessageSent, Trigger

if TYPE_CHECKING:
    from .links import Host
    from .network import Network
    from .runner import Simulation

PAUSE_SHARE = 0.4
CLOG_SHARE = 0.3
TAIL_SHARE = 0.2
MIN_SPAN = 1e-4  # seconds: a perturbation shorter than this is not worth its events
QUIET = 5e-3
"""Seconds a rank runs unperturbed after a perturbation ends: it resumes, its overdue heartbeat goes
out, so the silences its peers see never add up."""
SLOW_RANK = (1.1, 1.5)
"""A slow rank's factor (log-uniform): at most 1.5, so its heartbeats stay well inside the timeout
(they are ``factor`` intervals apart)."""
DEFAULT_BAND = Uniform(50e-6, 150e-6)
"""The default network's latency (:class:`sim.network.Network`): exploration may widen it, never another."""


@dataclass(frozen=True)
class Exploration:
    """What exploration may draw: for each kind, the share of seeds that get it.

    ``sim.run(explore=True)`` uses the defaults; ``explore=Exploration(...)``
    tunes them; ``explore=False`` turns exploration off (fixed timing).
    ``max_events`` and ``max_seconds`` bound one run's perturbations (their
    number, and their durations added up), so exploring costs little.
    """

    band: float = 0.5
    slow_links: float = 0.4
    tail: float = 0.6
    pauses: float = 0.7
    clogs: float = 0.35
    stragglers: float = 0.3
    focus: float = 0.5
    max_events: int = 32
    max_seconds: float = 4.0
    slow_rank: float = 0.25

    def draw(self, seed: int | str, detector: float, world_size: int) -> TimingPlan:
        """The plan of ``seed`` (pure); ``detector``: the failure detector's budget in seconds."""
        rng = random.Random(f"{seed}:explore")
        band = None
        if rng.random() < self.band:  # a wider band of base latencies (the default network's only)
            band = Uniform(DEFAULT_BAND.low, _round(_log_uniform(rng, DEFAULT_BAND.high, 2e-3)))
        slow: tuple[tuple[int, int, float], ...] = ()
        if rng.random() < self.slow_links:  # a link or two much slower than the others (a host's own included)
            slow = tuple((int(rng.random() * world_size), int(rng.random() * world_size),
                          _round(_log_uniform(rng, 4.0, 40.0))) for _ in range(1 + int(rng.random() < 0.4)))
        tail = None
        if rng.random() < self.tail:
            low = _log_uniform(rng, 5e-4, 3e-3)
            cap = TAIL_SHARE * detector
            high = _log_uniform(rng, min(10 * low, cap), cap)
            tail = Tail(_round(_log_uniform(rng, 0.005, 0.1)), _round(low), _round(max(high, low)),
                        budget=_round(_log_uniform(rng, 0.05, self.max_seconds / 2)))
        rates = {}
        for kind, share, lo, hi in (("pause", self.pauses, 0.01, 0.3), ("clog", self.clogs, 0.002, 0.05),
                                    ("straggle", self.stragglers, 0.002, 0.03), ("clock", self.pauses, 0.3, 10.0)):
            on = rng.random() < share
            rate = _log_uniform(rng, lo, hi)
            rates[kind] = _round(rate) if on else 0.0
        events = 1 + int(rng.random() * self.max_events)
        seconds = _round(_log_uniform(rng, 0.3, self.max_seconds))
        focus = None
        if rng.random() < self.focus:  # swarm-style: some seeds perturb one or two ranks only
            focus = (rng.random(), rng.random() if rng.random() < 0.5 else None)
        # (drawn last, and always: the draws before it are those of a plan without it)
        slow_rank = rng.random() < self.slow_rank
        which, factor = rng.random(), _round(_log_uniform(rng, SLOW_RANK[0], SLOW_RANK[1]))
        return TimingPlan(band, tail, rates["pause"], rates["clog"], rates["straggle"], events, seconds, focus,
                          rates["clock"], slow, (which, factor) if slow_rank else None)


@dataclass(frozen=True)
class TimingPlan:
    """One seed's draw: the latency band and tail, and per frame the chance of a pause, a clog or a straggler spell.

    Pauses come after a frame a rank sends or before one it receives is
    read; clogs and straggler spells after a frame it sends. At most
    ``max_events`` of them, ``max_seconds`` long in all.
    """

    band: Uniform | None
    tail: Tail | None
    pause_rate: float
    clog_rate: float
    straggle_rate: float
    max_events: int
    max_seconds: float
    focus: tuple[float, float | None] | None = None
    """Perturb only one or two ranks (drawn as fractions of the world size), or None: all of them."""
    pause_clock: float = 0.0
    """Pauses per second of virtual time per rank, besides those after frames (a rank that computes
    or sleeps sends nothing, and may still be stopped there)."""
    slow: tuple[tuple[int, int, float], ...] = ()
    """Slow links: (src rank, dst rank, latency multiplier)."""
    slow_rank: tuple[float, float] | None = None
    """One rank slower for the whole run: (its rank as a fraction of the world size, the factor), or None."""
    explored: list[Fault] = field(default_factory=list, compare=False)

    def focused(self, world_size: int) -> list[int] | None:
        """The ranks this seed perturbs (None: all)."""
        if self.focus is None:
            return None
        ranks = {int(f * world_size) for f in self.focus if f is not None}
        return sorted(ranks)

    def describe(self) -> str:
        parts = [f"latency {self.band.low:g}..{self.band.high:g}s" if self.band else "default latency",
                 *(f"link {a}->{b} x{f:g}" for a, b, f in self.slow),
                 f"tail {self.tail.p:g} x {self.tail.low:g}..{self.tail.high:g}s" if self.tail else "no tail"]
        for name, rate in (("pauses", self.pause_rate), ("clogs", self.clog_rate), ("stragglers", self.straggle_rate)):
            if rate:
                parts.append(f"{name} {rate:g}/frame")
        if self.pause_clock:
            parts.append(f"pauses {self.pause_clock:g}/s")
        if self.slow_rank is not None:
            parts.append(f"a rank x{self.slow_rank[1]:g} slower throughout")
        who = "" if self.focus is None else " on some ranks"
        return ", ".join(parts) + f"{who} (at most {self.max_events}, {self.max_seconds:g}s)"


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    if hi <= lo:
        return lo
    return float(lo * (hi / lo) ** rng.random())


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
        self.send_rate = plan.pause_rate + plan.clog_rate + plan.straggle_rate
        self.events_left = plan.max_events
        self.seconds_left = plan.max_seconds
        self.quiet_until: dict[str, float] = {}
        self.slowed: dict[str, float] = {}  # host -> the slow rank's factor (plan.slow_rank)
        # The run's partitions, all together (a pause or clog may overlap them; forever: no room at all)
        self.partitioned = sum(math.inf if f.length is None else f.length for f in sim.faults
                               if isinstance(f, Partition))

    @staticmethod
    def network(config: Network, plan: TimingPlan) -> Network:
        """The run's network with the plan's band and tail (what the user chose stays)."""
        changes: dict[str, Any] = {}
        if plan.band is not None and config.latency == DEFAULT_BAND and not config.links:
            changes["latency"] = plan.band
        if plan.tail is not None and config.tail is None:
            changes["tail"] = plan.tail
        if plan.slow and not config.slow:
            changes["slow"] = {(a, b): f for a, b, f in plan.slow}
        return replace(config, **changes) if changes else config

    def install(self, hosts: list[Host]) -> None:
        if self.plan.slow_rank is not None and hosts:
            self._slow_rank(hosts)
        focus = self.plan.focused(len(hosts))
        for host in hosts:
            if focus is not None and host.rank not in focus:
                continue
            if self.send_rate:
                self._arm(host, True)
            if self.plan.pause_rate:
                self._arm(host, False)
            if self.plan.pause_clock:
                self._arm_clock(host)

    def _slow_rank(self, hosts: list[Host]) -> None:
        """The plan's slow rank: a Straggler for good, installed first (a replay installs it where this does:
        right after the run's own faults), unless the ranks' detector tolerates fewer than 3 missed beats."""
        assert self.plan.slow_rank is not None
        which, factor = self.plan.slow_rank
        config = env_detector(self.sim.rank_env(0, 0))
        if config is not None and config[1] < 3:
            return
        host = hosts[min(int(which * len(hosts)), len(hosts) - 1)]
        assert host.rank is not None
        # A step of work is slower; a long wait (a sleep of seconds: a polling interval, a renewal period) only
        # as much as a pause may be long, times its slowness: it stands for a timer, which a busy machine keeps.
        budget, _ = budget_of(config)
        fault = Straggler(host.rank, factor, most=_round((factor - 1.0) * PAUSE_SHARE * budget))
        fault.install(self.sim)
        self.plan.explored.append(fault)
        self.slowed[host.name] = factor

    def _arm_clock(self, host: Host) -> None:
        if self.events_left <= 0 or self.seconds_left < MIN_SPAN:
            return
        wait = -math.log(1.0 - self.rng.random()) / self.plan.pause_clock
        self.sim.after(wait, lambda: self._fire(host, None), daemon=True)  # (it keeps no run alive)

    def _gap(self, rate: float) -> int:
        if rate >= 1:
            return 1
        return 1 + int(math.log(1.0 - self.rng.random()) / math.log(1.0 - rate))

    def _arm(self, host: Host, sent: bool) -> None:
        if self.events_left <= 0 or self.seconds_left < MIN_SPAN:
            return
        assert host.rank is not None
        if sent:
            trigger: Trigger = MessageSent(host.rank, host.sent + self._gap(self.send_rate))
        else:
            trigger = MessageReceived(host.rank, host.received + self._gap(self.plan.pause_rate))
        self.sim.when(trigger, lambda: self._fire(host, trigger))

    def _fire(self, host: Host, on: Trigger | None) -> None:
        """A perturbation is due on ``host``: after a frame it sent or before one it reads (``on``), or now (None)."""
        sim = self.sim
        now = sim.loop.time()
        rank = host.rank
        assert rank is not None
        sent = isinstance(on, MessageSent)
        slowed = self.slowed.get(host.name, 1.0)
        if self.events_left > 0 and self.quiet_until.get(host.name, 0.0) <= now and host.alive and \
                host.factor == slowed:
            budget, interval = budget_of(self._detector())
            # (a slow rank's silences are longer by what its slowness adds to a heartbeat's gap and a tail)
            extra = (slowed - 1.0) * (interval + TAIL_SHARE * budget)
            # After a send: a pause, a clog or a straggler spell, as their rates say; else a pause.
            pick = self.rng.random() * self.send_rate if sent else 0.0
            kind = ("pause" if not sent or pick < self.plan.pause_rate else
                    "clog" if pick < self.plan.pause_rate + self.plan.clog_rate else "straggle")
            span = _log_uniform(self.rng, 5e-4, 1.0)  # a fraction of the budget, log-uniform
            share = min((CLOG_SHARE if kind == "clog" else PAUSE_SHARE) * budget,
                        (1.0 - TAIL_SHARE) * budget - self.partitioned)
            d = _round(min(span * max(share - extra, 0.0), self.seconds_left))
            fault: Fault | None = None
            if d < MIN_SPAN or (kind == "straggle" and slowed != 1.0):
                pass  # the run's budget is spent (or a spell on a slow rank: none on top)
            elif kind == "pause":
                fault = Pause(rank, at=now if on is None else None, duration=d, on=on)
            elif kind == "clog":
                peer = sim.watches.last_peer
                if peer is not None:
                    fault = Clog((rank, _ref(peer)), on=on, duration=d)
            else:
                _, misses = self._detector() or (0.0, HEARTBEAT_MISSES)
                factor = _round(_log_uniform(self.rng, 1.5, max(1.5, min(4.0, (misses - 1) / 2))))
                fault = Straggler(rank, factor, on=on, duration=d)
            if fault is not None:
                fault.apply(sim)  # what the fault does when its trigger fires: a replay does the same
                self.events_left -= 1
                self.seconds_left -= d
                self.plan.explored.append(fault)
                self.quiet_until[host.name] = now + d + QUIET
        if on is None:
            self._arm_clock(host)
        else:
            self._arm(host, sent)

    def _detector(self) -> tuple[float, int] | None:
        """The tightest heartbeat configuration among the running ranks (their group's, else their environment's)."""
        best: tuple[float, int] | None = None
        for env, group in self.sim.live_ranks():
            config = _group_heartbeat(group) if group is not None else env_detector(env)
            if config is not None and (best is None or config[0] * config[1] < best[0] * best[1]):
                best = config
        return best


def replay_plan(result: Any, network: Network | None = None) -> dict[str, Any]:
    """``sim.run`` keywords that replay ``result`` (run with ``network``) with its plan spelled out.

    Exploration off, the plan's latency band, slow links and tail in the
    network, and every fault the run had (given, drawn by a swarm, applied by
    the exploration): with the same ``main``, seed and other keywords, the
    same run (same digest).
    """
    from .network import Network

    base = network or Network()
    net = Explorer.network(base, result.timing) if result.timing is not None else base
    return {"network": net, "faults": [*result.faults, *result.explored], "explore": False}


def _group_heartbeat(group: Any) -> tuple[float, int] | None:
    config: tuple[float, int] | None = group.transport.heartbeat
    return config


def _ref(host: Host) -> int | str:
    return host.rank if host.rank is not None else host.name


__all__ = ["Exploration", "TimingPlan", "Explorer", "env_detector", "budget_of", "replay_plan"]
