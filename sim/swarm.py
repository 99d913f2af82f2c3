"""``Swarm``: a random destructive fault plan per seed, its kinds switched on and off (swarm testing).

``faults=[sim.Swarm()]`` draws, for each seed, a plan from every kind of
fault a distributed program may meet; ``sim.Swarm(kinds={"partition",
"restart"})`` only from the kinds a program claims to tolerate. Per seed a
subset of the allowed kinds is switched on, small subsets most often
(:data:`SUBSET`; Groce et al., ISSTA 2012: a run without some kinds is itself
a useful configuration, and different subsets expose different bugs;
FoundationDB's BUGGIFY likewise enables each site per run), then each kind
that is on draws a few faults (:data:`MOST`):

* ``crash``: a rank dies (now and then silently: its machine vanishes);
* ``restart``: a rank dies and starts again (``AIODIST_RESTART_COUNT`` one
  higher), after up to a second;
* ``partition``: a set of hosts cut from the others, both ways or one way,
  healed after a while. A plan's partitions together last at most
  :data:`PARTITION_SHARE` of the silence the failure detector tolerates, so
  however they overlap or follow each other, and with exploration's pauses
  and clogs (shortened to what the partitions leave of 80%) and latency
  tail (20%) on top, no cut outlasts the detector: a program written for
  partitions survives them;
* ``pause``: a rank stops for longer than the failure detector tolerates (its
  peers linked to it declare it failed: an operation of theirs that needs it
  fails; a program that only uses the store meanwhile sees a slow rank);
* ``clog``: one link holds its messages for a while: from 0.05 s up to twice
  the silence the detector tolerates (unlike partitions, a clog may outlast
  it: the peers on that link may then declare each other failed);
* ``store``: the store dies.

A fault happens at a virtual time or on a rank's n-th frame (both drawn
log-uniform, so short and long programs both get hit). A crash, restart or
pause of the host the store runs on is also a store fault: with the store on
rank 0 (the default) it happens only in a seed that drew the ``store`` kind; with
``store_host="separate"`` every rank may be hit (and partitions may cut the
store's host). The drawn faults are concrete ones (``Result.faults``), so a
failing seed prints its plan and its replay command lists them.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .faults import Clog, Crash, CrashStore, Fault, FaultError, HostRef, Partition, Pause, Restart
from .storehost import STORE_HOST
from .triggers import MessageSent, Trigger

if TYPE_CHECKING:
    from .plan import World

KINDS = ("crash", "restart", "partition", "pause", "clog", "store")
SUBSET = (0.5, 0.8)
"""How many of the allowed kinds are on in a seed: one with chance 0.5, two with 0.3, else three or more
(uniformly up to all). Small subsets first: a bug that needs one kind of fault is most often hidden by
another kind that breaks the run first (a crash, the store's loss), and a kind combined with every
other is the rarest configuration (swarm testing's point); a given pair on its own stays about as
common as when each kind was switched on with chance 0.4 (2.0% of seeds against 2.1%)."""
PARTITION_SHARE = 0.7
"""The share of the failure detector's budget a plan's partitions may take, all of them together: with
exploration's latency tail (:data:`sim.explore.TAIL_SHARE`) and its pauses and clogs, which get what the
partitions leave (:class:`sim.explore.Explorer`), it adds up to the budget. (Each on its own is not
enough: overlapping partitions of one pair of hosts are one long cut.) 0.7: a cut of up to 1.75 s at the
default detector, so a program's own timeout of a second or more (a standby that promotes after 1.5 s
without heartbeats) is reached by partitions; with 0.4 it never was (hard-variant probe s23)."""
MOST = {"crash": 1, "restart": 4, "partition": 3, "pause": 2, "clog": 3, "store": 1}
"""At most this many faults of a kind per seed (1 to MOST, uniformly): a program survives a restart
or a healed partition, so several of them give a short window several chances; it does not survive
a crash it was not written for."""


@dataclass(frozen=True)
class Swarm:
    """Draw a destructive fault plan per seed from ``kinds`` (default: all of :data:`KINDS`)."""

    kinds: frozenset[str] = field(default_factory=lambda: frozenset(KINDS))

    def __post_init__(self) -> None:
        kinds = frozenset(self.kinds)
        unknown = sorted(kinds - set(KINDS))
        if unknown or not kinds:
            raise FaultError(self, f"kinds must be a non-empty subset of {', '.join(KINDS)}; unknown: {unknown}")
        object.__setattr__(self, "kinds", kinds)

    def __repr__(self) -> str:
        return f"Swarm(kinds={{{', '.join(repr(k) for k in sorted(self.kinds))}}})"

    def expand(self, world: World) -> list[Fault]:
        """The plan of ``world.seed`` (pure: the same seed and world give the same faults)."""
        return _Draw(self.kinds, world).plan()

    def to_cli(self) -> str:
        if self.kinds == frozenset(KINDS):
            return "--swarm"
        return f"--swarm {','.join(k for k in KINDS if k in self.kinds)}"


def parse_swarm(spec: str) -> Swarm:
    """``all`` or ``KIND,KIND``."""
    if spec in ("", "all"):
        return Swarm()
    return Swarm(kinds=frozenset(k.strip() for k in spec.split(",") if k.strip()))


class _Draw:
    """One seed's draw (the generator is the seed's ``"<seed>:swarm"`` stream)."""

    def __init__(self, kinds: frozenset[str], world: World) -> None:
        self.world = world
        self.rng = random.Random(f"{world.seed}:swarm")
        self.allowed = kinds
        ranks = list(range(world.world_size))
        self.ranks = ranks
        self.victims = ranks  # (see plan: rank 0 only in a seed that drew the store kind, or a separate store)
        self.hosts: list[HostRef] = [*ranks, STORE_HOST] if world.store_separate else list(ranks)
        self.budget = world.budget

    def _log(self, lo: float, hi: float) -> float:
        return float(f"{lo * (hi / lo) ** self.rng.random():.6g}")

    def _when(self, rank: int) -> tuple[float | None, Trigger | None]:
        """A virtual time, or this rank's n-th frame sent (log-uniform: short and long programs alike)."""
        if self.rng.random() < 0.5:
            return self._log(2e-3, 5.0), None
        return None, MessageSent(rank, max(1, int(self._log(2.0, 500.0))))

    def plan(self) -> list[Fault]:
        rng = self.rng
        allowed = [k for k in KINDS if k in self.allowed]
        u = rng.random()
        n = 1 if u < SUBSET[0] else 2 if u < SUBSET[1] else 3 + int(rng.random() * max(0, len(allowed) - 2))
        chosen = rng.sample(allowed, min(n, len(allowed)))
        on = [k for k in allowed if k in chosen]
        if not (self.world.store_separate or "store" in on):
            # The store's host (rank 0) is crashed, restarted or paused only in a seed that drew the store kind
            # (it runs there): else every such fault is a store loss too, and hides the bugs of the kinds drawn.
            self.victims = [r for r in self.ranks if r != 0]
        out: list[Fault] = []
        for kind in on:
            for _ in range(1 + int(rng.random() * MOST[kind])):
                fault = getattr(self, f"_{kind}")()
                if fault is not None:
                    out.append(fault)
        return self._fit_partitions(out)

    def _fit_partitions(self, plan: list[Fault]) -> list[Fault]:
        """``plan`` with its partitions shortened in proportion when together they last longer than
        :data:`PARTITION_SHARE` of the budget (their times or triggers are unknown here: any may overlap)."""
        cap = PARTITION_SHARE * self.budget
        total = sum(f.duration or 0.0 for f in plan if isinstance(f, Partition))
        if total <= cap:
            return plan
        scale = cap / total
        return [replace(f, duration=float(f"{(f.duration or 0.0) * scale:.6g}"))
                if isinstance(f, Partition) else f for f in plan]

    def _victim(self) -> int | None:
        return self.rng.choice(self.victims) if self.victims else None

    def _crash(self) -> Fault | None:
        victim = self._victim()
        if victim is None:
            return None
        at, on = self._when(victim)
        return Crash(victim, at=at, on=on, silent=self.rng.random() < 0.3)

    def _restart(self) -> Fault | None:
        victim = self._victim()
        if victim is None:
            return None
        at, on = self._when(victim)
        delay = 0.0 if self.rng.random() < 0.3 else self._log(1e-3, 1.0)
        return Restart(victim, at=at, delay=delay, on=on)

    def _partition(self) -> Fault | None:
        hosts = list(self.hosts)
        if len(hosts) < 2:
            return None
        self.rng.shuffle(hosts)
        cut = 1 + int(self.rng.random() * (len(hosts) - 1))
        a, b = tuple(sorted(hosts[:cut], key=str)), tuple(sorted(hosts[cut:], key=str))
        one_way = self.rng.random() < 0.5
        # Shorter than the failure detector tolerates (see _fit_partitions): a program written for
        # partitions survives them; silences the detector sees through are the pause kind's.
        duration = self._log(0.05, PARTITION_SHARE * self.budget)
        trigger_rank = self.rng.choice(self.ranks)
        at, on = self._when(trigger_rank)
        return Partition(a, b, at=at, one_way=one_way, on=on, duration=duration)

    def _pause(self) -> Fault | None:
        victim = self._victim()
        if victim is None:
            return None
        at, on = self._when(victim)
        return Pause(victim, at=at, duration=self._log(1.1 * self.budget, 3 * self.budget), on=on)

    def _clog(self) -> Fault | None:
        hosts = list(self.hosts)
        if len(hosts) < 2:
            return None
        src, dst = self.rng.sample(hosts, 2)
        rank = src if isinstance(src, int) else self.rng.choice(self.ranks)
        at, on = self._when(rank)
        return Clog((src, dst), at=at, on=on, duration=self._log(0.05, 2 * self.budget))

    def _store(self) -> Fault | None:
        at, on = self._when(self.rng.choice(self.ranks))
        return CrashStore(at=at, on=on)


def kinds_of(faults: Iterable[Fault]) -> list[str]:
    """The swarm kinds of concrete faults (for reports)."""
    names = {Crash: "crash", Restart: "restart", Partition: "partition", Pause: "pause", Clog: "clog",
             CrashStore: "store"}
    return [names.get(type(f), type(f).__name__) for f in faults]
