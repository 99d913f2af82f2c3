"""Faults as data: pass them to ``sim.run(faults=[...])`` or as CLI flags.

Each fault is a frozen dataclass that knows how to install itself into a run
(:meth:`install`, called once before the ranks start) and how to spell itself
as a ``python -m sim run`` flag (:meth:`to_cli`), so that a failing run can be
replayed exactly. Ranks are ints; hosts may also be given by name ("store").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .triggers import MessageReceived, MessageSent, Trigger

if TYPE_CHECKING:
    from .runner import Simulation


# --------------------------------------------------------------------------- faults


class Fault(Protocol):
    def install(self, sim: Simulation) -> None: ...

    def to_cli(self) -> str: ...


def _fmt(t: float) -> str:
    return repr(float(t))


def _hosts_cli(hosts: tuple[int | str, ...]) -> str:
    return ",".join(str(h) for h in hosts)


# --------------------------------------------------------------------------- process faults


@dataclass(frozen=True)
class Crash:
    """Kill ``rank`` at virtual time ``at`` or when ``on`` fires.

    Its tasks stop for good (no ``finally`` runs), its listeners vanish, its
    connections deliver what was already sent, then close: peers see
    ConnectionLost. ``silent``: the whole machine vanishes instead, nothing
    closes: peers only notice through their own timeouts (or, when they send,
    after the network's retransmit timeout).
    """

    rank: int
    at: float | None = None
    on: Trigger | None = None
    silent: bool = False

    def __post_init__(self) -> None:
        if (self.at is None) == (self.on is None):
            raise ValueError("Crash needs exactly one of at= or on=")

    def install(self, sim: Simulation) -> None:
        if self.at is not None:
            sim.at(self.at, lambda: sim.crash_rank(self.rank, "Crash fault", silent=self.silent))
        else:
            assert self.on is not None
            sim.when(self.on, lambda: sim.crash_rank(self.rank, f"Crash fault on {self.on}", silent=self.silent))

    def to_cli(self) -> str:
        when = _fmt(self.at) if self.at is not None else self.on.to_cli()  # type: ignore[union-attr]
        return f"--{'vanish' if self.silent else 'crash'} {self.rank}@{when}"


@dataclass(frozen=True)
class Restart:
    """Crash ``rank`` at ``at`` (if it still runs) and start its main again ``delay`` later.

    The new incarnation sees TORCHELASTIC_RESTART_COUNT / AIODIST_RESTART_COUNT
    one higher, a fresh rank scope, and none of the old process's state.
    """

    rank: int
    at: float
    delay: float = 0.0

    def install(self, sim: Simulation) -> None:
        sim.expect_restart(self.rank)
        sim.at(self.at, lambda: sim.crash_rank(self.rank, "Restart fault"))
        sim.at(self.at + self.delay, lambda: sim.restart_rank(self.rank))

    def to_cli(self) -> str:
        extra = f"+{_fmt(self.delay)}" if self.delay else ""
        return f"--restart {self.rank}@{_fmt(self.at)}{extra}"


@dataclass(frozen=True)
class Straggler:
    """Make ``rank`` ``factor`` times slower from ``at`` on: its messages' delays and its sleeps."""

    rank: int
    factor: float
    at: float = 0.0

    def install(self, sim: Simulation) -> None:
        sim.at(self.at, lambda: sim.set_straggler(self.rank, self.factor))

    def to_cli(self) -> str:
        at = f"@{_fmt(self.at)}" if self.at else ""
        return f"--straggler {self.rank}x{self.factor:g}{at}"


@dataclass(frozen=True)
class CrashStore:
    """Kill the service listening on MASTER_ADDR:MASTER_PORT (the store) at ``at``.

    Its connections break (clients see ConnectionLost) and its handler tasks
    are cancelled; the rank hosting it keeps running.
    """

    at: float

    def install(self, sim: Simulation) -> None:
        sim.at(self.at, sim.crash_store)

    def to_cli(self) -> str:
        return f"--crash-store {_fmt(self.at)}"


# --------------------------------------------------------------------------- network faults


class _Block:
    """An active partition or clog: which directions it blocks, whether it breaks TCP."""

    def __init__(self, a: frozenset[str], b: frozenset[str], one_way: bool, breaks: bool, label: str) -> None:
        self.a, self.b, self.one_way, self.breaks, self.label = a, b, one_way, breaks, label

    def blocks(self, src: str, dst: str) -> bool:
        if src in self.a and dst in self.b:
            return True
        return not self.one_way and src in self.b and dst in self.a

    def __repr__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Partition:
    """From ``at`` to ``heal_at`` (None: never), hosts ``a`` cannot reach hosts ``b``.

    ``one_way``: only a -> b is cut. Messages on live connections are held in
    order (TCP retransmits) and delivered on heal; held longer than the
    network's ``retransmit_timeout`` they break the connection. Connects
    across the cut wait likewise.
    """

    a: tuple[int | str, ...]
    b: tuple[int | str, ...]
    at: float
    heal_at: float | None = None
    one_way: bool = False

    def install(self, sim: Simulation) -> None:
        block = _Block(sim.host_names(self.a), sim.host_names(self.b), self.one_way, True, self.to_cli())
        sim.at(self.at, lambda: sim.add_block(block))
        if self.heal_at is not None:
            sim.at(self.heal_at, lambda: sim.remove_block(block))

    def to_cli(self) -> str:
        heal = f":{_fmt(self.heal_at)}" if self.heal_at is not None else ""
        flag = "--one-way-partition" if self.one_way else "--partition"
        return f"{flag} {_hosts_cli(self.a)}/{_hosts_cli(self.b)}@{_fmt(self.at)}{heal}"


@dataclass(frozen=True)
class Clog:
    """Hold every message on the link ``link = (src, dst)`` from ``at`` until ``until``; never breaks it."""

    link: tuple[int | str, int | str]
    at: float
    until: float

    def install(self, sim: Simulation) -> None:
        src, dst = self.link
        block = _Block(sim.host_names((src,)), sim.host_names((dst,)), True, False, self.to_cli())
        sim.at(self.at, lambda: sim.add_block(block))
        sim.at(self.until, lambda: sim.remove_block(block))

    def to_cli(self) -> str:
        return f"--clog {self.link[0]}-{self.link[1]}@{_fmt(self.at)}:{_fmt(self.until)}"


@dataclass(frozen=True)
class ResetConnection:
    """At ``at``, reset every connection between ``a`` and ``b``: both ends see ConnectionLost."""

    a: int | str
    b: int | str
    at: float

    def install(self, sim: Simulation) -> None:
        sim.at(self.at, lambda: sim.reset_connections(self.a, self.b))

    def to_cli(self) -> str:
        return f"--reset {self.a}-{self.b}@{_fmt(self.at)}"


# --------------------------------------------------------------------------- CLI parsing


def _host(s: str) -> int | str:
    return int(s) if s.isdigit() else s


def _hosts(s: str) -> tuple[int | str, ...]:
    return tuple(_host(x) for x in s.split(",") if x)


def _span(s: str) -> tuple[float, float | None]:
    if ":" in s:
        a, b = s.split(":", 1)
        return float(a), float(b)
    return float(s), None


def parse_crash(spec: str, *, silent: bool = False) -> Crash:
    """``RANK@TIME``, ``RANK@sent:N`` or ``RANK@recv:N``."""
    rank_s, when = spec.split("@", 1)
    rank = int(rank_s)
    if when.startswith("sent:"):
        return Crash(rank, on=MessageSent(rank, int(when[5:])), silent=silent)
    if when.startswith("recv:"):
        return Crash(rank, on=MessageReceived(rank, int(when[5:])), silent=silent)
    return Crash(rank, at=float(when), silent=silent)


def parse_restart(spec: str) -> Restart:
    """``RANK@TIME`` or ``RANK@TIME+DELAY``."""
    rank_s, when = spec.split("@", 1)
    delay = 0.0
    if "+" in when:
        when, d = when.split("+", 1)
        delay = float(d)
    return Restart(int(rank_s), at=float(when), delay=delay)


def parse_partition(spec: str, *, one_way: bool = False) -> Partition:
    """``A,B/C,D@START[:HEAL]``."""
    sides, when = spec.split("@", 1)
    a, b = sides.split("/", 1)
    at, heal = _span(when)
    return Partition(_hosts(a), _hosts(b), at=at, heal_at=heal, one_way=one_way)


def parse_clog(spec: str) -> Clog:
    """``SRC-DST@START:END``."""
    link, when = spec.split("@", 1)
    src, dst = link.split("-", 1)
    at, until = _span(when)
    if until is None:
        raise ValueError("--clog needs START:END")
    return Clog((_host(src), _host(dst)), at=at, until=until)


def parse_straggler(spec: str) -> Straggler:
    """``RANKxFACTOR`` or ``RANKxFACTOR@TIME``."""
    at = 0.0
    if "@" in spec:
        spec, t = spec.split("@", 1)
        at = float(t)
    rank_s, factor = spec.split("x", 1)
    return Straggler(int(rank_s), float(factor), at=at)


def parse_reset(spec: str) -> ResetConnection:
    """``A-B@TIME``."""
    link, when = spec.split("@", 1)
    a, b = link.split("-", 1)
    return ResetConnection(_host(a), _host(b), at=float(when))


def parse_crash_store(spec: str) -> CrashStore:
    return CrashStore(at=float(spec))


# --------------------------------------------------------------------------- random faults


@dataclass(frozen=True)
class Chaos:
    """Random faults drawn from the run's seed (FoundationDB/VOPR style): same seed, same faults.

    Draws ``crashes`` crashes, ``partitions`` partitions (random halves, healed
    after up to ``max_duration``), ``clogs`` clogged links, ``resets``
    connection resets and ``stragglers`` slow ranks (x2..x10), at times
    uniform in ``window``. Ranks in ``spare`` are never crashed (rank 0 hosts
    the store by default). The concrete faults are listed in
    ``Result.faults`` and marked in the trace.
    """

    crashes: int = 0
    partitions: int = 0
    clogs: int = 0
    resets: int = 0
    stragglers: int = 0
    window: tuple[float, float] = (0.0, 1.0)
    max_duration: float = 1.0
    spare: tuple[int, ...] = (0,)

    def draw(self, seed: int | str, world_size: int) -> list[Fault]:
        """The concrete faults for ``seed`` (pure: no simulation needed)."""
        import random

        rng = random.Random(f"{seed}:chaos")
        lo, hi = self.window
        ranks = list(range(world_size))
        victims = [r for r in ranks if r not in self.spare]
        out: list[Fault] = []

        def when() -> float:
            return round(lo + (hi - lo) * rng.random(), 6)

        def duration() -> float:
            return round(self.max_duration * rng.random(), 6)

        for _ in range(self.crashes):
            if victims:
                out.append(Crash(victims.pop(rng.randrange(len(victims))), at=when()))
        if world_size >= 2:
            for _ in range(self.partitions):
                shuffled = ranks[:]
                rng.shuffle(shuffled)
                cut = rng.randrange(1, world_size)
                at = when()
                out.append(Partition(tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])), at=at,
                                     heal_at=round(at + duration(), 6), one_way=rng.random() < 0.25))
            for _ in range(self.clogs):
                a, b = rng.sample(ranks, 2)
                at = when()
                out.append(Clog((a, b), at=at, until=round(at + duration(), 6)))
            for _ in range(self.resets):
                a, b = rng.sample(ranks, 2)
                out.append(ResetConnection(a, b, at=when()))
        for _ in range(self.stragglers):
            out.append(Straggler(rng.choice(ranks), float(rng.randint(2, 10)), at=when()))
        return out

    def install(self, sim: Simulation) -> None:
        for fault in self.draw(sim.seed, sim.world_size):
            sim.add_fault(fault)

    def to_cli(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("crashes", "partitions", "clogs", "resets", "stragglers")
                 if getattr(self, k)]
        parts.append(f"window={self.window[0]!r}:{self.window[1]!r}")
        if self.max_duration != 1.0:
            parts.append(f"max_duration={self.max_duration!r}")
        if self.spare != (0,):
            parts.append(f"spare={'/'.join(str(r) for r in self.spare)}")
        return f"--chaos {','.join(parts)}"


def parse_chaos(spec: str) -> Chaos:
    """``crashes=1,partitions=2,clogs=1,resets=1,stragglers=1,window=0:5,max_duration=2,spare=0/1``."""
    kw: dict[str, object] = {}
    for item in spec.split(","):
        if not item:
            continue
        key, _, value = item.partition("=")
        if key in ("crashes", "partitions", "clogs", "resets", "stragglers"):
            kw[key] = int(value)
        elif key == "window":
            a, b = value.split(":", 1)
            kw[key] = (float(a), float(b))
        elif key == "max_duration":
            kw[key] = float(value)
        elif key == "spare":
            kw[key] = tuple(int(r) for r in value.split("/") if r)
        else:
            raise ValueError(f"unknown --chaos option {key!r}")
    return Chaos(**kw)  # type: ignore[arg-type]
