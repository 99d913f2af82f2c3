"""Faults as data: pass them to ``sim.run(faults=[...])`` or as CLI flags.

Each fault is a frozen dataclass that knows which hosts it names
(:meth:`hosts`, checked against the world before the run), how to install
itself into a run (:meth:`install`) and how to spell itself as a
``python -m sim run`` flag (:meth:`to_cli`, parsed back by
:mod:`sim.fault_flags`), so a failing run replays exactly.

Ranks are ints; other hosts are named: ``"store"`` is the store's own host
with ``store_host="separate"``. Faults that happen "when" take either ``at=``
(a virtual time) or ``on=`` (a :class:`~sim.triggers.MessageSent` /
:class:`~sim.triggers.MessageReceived` trigger: the n-th frame a rank sends
or receives); faults that last take ``duration=`` (or an end time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .errors import SimulationError
from .triggers import MessageReceived, MessageSent, Trigger

if TYPE_CHECKING:
    from .runner import Simulation

HostRef = int | str


class FaultError(SimulationError, ValueError):
    """A fault that cannot take effect in this world (an unknown rank or host, a bad time). ``.fault`` is it."""

    def __init__(self, fault: object, problem: str) -> None:
        super().__init__(f"{fault!r}: {problem}")
        self.fault = fault


class Fault(Protocol):
    """A fault: the hosts it names, how it is armed in a run, what it does when it fires, its CLI flag."""

    def hosts(self) -> Iterable[HostRef]: ...

    def install(self, sim: Simulation) -> None:
        """Arm it in ``sim`` (before the ranks start): ``apply`` runs at its time or trigger."""

    def apply(self, sim: Simulation) -> None:
        """Do it now (and schedule its end, if it lasts)."""

    def to_cli(self) -> str: ...


def _fmt(t: float) -> str:
    return repr(float(t))


def _hosts_cli(hosts: Iterable[HostRef]) -> str:
    return ",".join(str(h) for h in hosts)


def _when_cli(at: float | None, on: Trigger | None, own: HostRef) -> str:
    """``TIME``, ``sent:N`` (the fault's own rank) or ``R:sent:N``."""
    if on is None:
        return _fmt(at)  # type: ignore[arg-type]
    spec = on.to_cli()
    return spec if on.rank == own else f"{on.rank}:{spec}"


def _arm(sim: Simulation, at: float | None, on: Trigger | None, action: Callable[[], None], *,
         fatal: bool = False) -> None:
    if on is not None:
        sim.when(on, action, fatal=fatal)
    else:
        sim.at(at, action)  # type: ignore[arg-type]


def _check_when(fault: object, at: float | None, on: Trigger | None) -> None:
    if (at is None) == (on is None):
        raise FaultError(fault, "needs exactly one of at= (a time) or on= (a trigger)")
    if at is not None and not (math.isfinite(at) and at >= 0):
        raise FaultError(fault, f"at={at!r} is not a time >= 0")
    if on is not None and not (isinstance(on, (MessageSent, MessageReceived)) and on.n >= 1):
        raise FaultError(fault, f"on={on!r} is not a trigger with n >= 1")


def _check_duration(fault: object, name: str, value: float | None, *, zero_ok: bool = False) -> None:
    if value is not None and not (math.isfinite(value) and (value > 0 or (zero_ok and value == 0))):
        raise FaultError(fault, f"{name}={value!r} is not a positive number of seconds")


def _trigger_hosts(on: Trigger | None) -> tuple[HostRef, ...]:
    return () if on is None else (on.rank,)


# --------------------------------------------------------------------------- process faults


@dataclass(frozen=True)
class Crash:
    """Kill ``rank`` at virtual time ``at`` or when ``on`` fires.

    Its tasks stop for good (no ``finally`` runs), its listeners vanish, its
    connections deliver what was already sent, then close: peers see
    ConnectionLost. ``silent``: the whole machine vanishes instead, nothing
    closes: peers only notice through their own timeouts (or, when they send,
    after the network's retransmit timeout). ``rank`` may be ``"store"``.
    """

    rank: HostRef
    at: float | None = None
    on: Trigger | None = None
    silent: bool = False

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)

    def hosts(self) -> tuple[HostRef, ...]:
        return (self.rank, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim), fatal=True)

    def apply(self, sim: Simulation) -> None:
        why = "Crash fault" if self.on is None else f"Crash fault on {self.on}"
        sim.crash_host(self.rank, why, silent=self.silent)

    def to_cli(self) -> str:
        return f"--{'vanish' if self.silent else 'crash'} {self.rank}@{_when_cli(self.at, self.on, self.rank)}"


@dataclass(frozen=True)
class Restart:
    """Crash ``rank`` at ``at`` (or when ``on`` fires) and start its main again ``delay`` later.

    The new incarnation sees TORCHELASTIC_RESTART_COUNT / AIODIST_RESTART_COUNT
    one higher, a fresh rank scope, and none of the old process's state: its
    own environment, generators, pid and connections, and, for a program file
    run by ``python -m sim run`` or a ``main`` imported from a module
    (``sim.run``'s ``isolate``, on by default), the module run afresh (a
    ``main`` that runs as it is keeps its module's globals: see the README's
    known limits). (A restarted ``"store"`` host starts an empty store.)
    """

    rank: HostRef
    at: float | None = None
    delay: float = 0.0
    on: Trigger | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)
        _check_duration(self, "delay", self.delay, zero_ok=True)

    def hosts(self) -> tuple[HostRef, ...]:
        return (self.rank, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        sim.expect_restart(self.rank, self.at)
        _arm(sim, self.at, self.on, lambda: self.apply(sim), fatal=True)

    def apply(self, sim: Simulation) -> None:
        sim.restart_host(self.rank, self.delay, counted=self.at is not None)

    def to_cli(self) -> str:
        extra = f"+{_fmt(self.delay)}" if self.delay else ""
        return f"--restart {self.rank}@{_when_cli(self.at, self.on, self.rank)}{extra}"


@dataclass(frozen=True)
class Pause:
    """Stop ``rank`` (SIGSTOP) at ``at`` or when ``on`` fires, for ``duration`` seconds (then SIGCONT).

    Nothing of it runs meanwhile: its timers fire late, what arrives for it
    waits in its kernel, its peers hear nothing from it (heartbeats included).
    Connections stay up. ``rank`` may be ``"store"``.
    """

    rank: HostRef
    at: float | None = None
    duration: float = 0.0
    on: Trigger | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)
        _check_duration(self, "duration", self.duration)

    def hosts(self) -> tuple[HostRef, ...]:
        return (self.rank, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        sim.pause_host(self.rank, self.duration)

    def to_cli(self) -> str:
        return f"--pause {self.rank}@{_when_cli(self.at, self.on, self.rank)}+{_fmt(self.duration)}"


@dataclass(frozen=True)
class Straggler:
    """Make ``rank`` ``factor`` times slower from ``at`` (or when ``on`` fires) for ``duration`` (None: for good).

    Slower: its messages' latency and transmission time, and its sleeps (a
    sleep that outlasts the spell only while the spell lasts); ``most``: a
    sleep at most that many seconds longer (None: no bound; exploration's slow
    rank has one: a busier machine slows a step of work, not a long wait).
    """

    rank: int
    factor: float
    at: float | None = None
    duration: float | None = None
    on: Trigger | None = None
    most: float | None = None

    def __post_init__(self) -> None:
        if self.at is None and self.on is None:
            object.__setattr__(self, "at", 0.0)  # from the start
        _check_when(self, self.at, self.on)
        _check_duration(self, "duration", self.duration)
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise FaultError(self, f"factor={self.factor!r} is not a positive number")
        _check_duration(self, "most", self.most, zero_ok=True)

    def hosts(self) -> tuple[HostRef, ...]:
        return (self.rank, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        sim.set_straggler(self.rank, self.factor, self.duration, self.most)

    def to_cli(self) -> str:
        when = "" if self.at == 0.0 and self.duration is None else f"@{_when_cli(self.at, self.on, self.rank)}"
        span = f"+{_fmt(self.duration)}" if self.duration is not None else ""
        most = f"~{_fmt(self.most)}" if self.most is not None else ""
        return f"--straggler {self.rank}x{self.factor:g}{most}{when}{span}"


@dataclass(frozen=True)
class CrashStore:
    """Kill the store at ``at`` (or when ``on`` fires).

    With the store on rank 0's host (the default) only the service listening
    on MASTER_ADDR:MASTER_PORT dies: its connections break (clients see
    ConnectionLost), rank 0 keeps running. With ``store_host="separate"`` the
    store's whole host crashes.
    """

    at: float | None = None
    on: Trigger | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)

    def hosts(self) -> tuple[HostRef, ...]:
        return _trigger_hosts(self.on)

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        sim.crash_store()

    def to_cli(self) -> str:
        return f"--crash-store {_when_cli(self.at, self.on, -1)}"


# --------------------------------------------------------------------------- network faults


class Block:
    """A partition or clog in force: which directions it cuts, whether TCP gives up behind it.

    ``stalled``: per stream flowing against a one-way partition, when it stops
    (see :meth:`stalls`; kept by :class:`sim.links.Links`).
    """

    def __init__(self, a: frozenset[str], b: frozenset[str], one_way: bool, breaks: bool, label: str) -> None:
        self.a, self.b, self.one_way, self.breaks, self.label = a, b, one_way, breaks, label
        self.stalled: dict[int, float] = {}

    def blocks(self, src: str, dst: str) -> bool:
        if src in self.a and dst in self.b:
            return True
        return not self.one_way and src in self.b and dst in self.a

    def stalls(self, src: str, dst: str) -> bool:
        """Whether a connection's ``src -> dst`` direction runs against this one-way partition: the cut drops
        the acknowledgements of its data, so TCP soon stops sending it too (a clog delays, drops nothing)."""
        return self.one_way and self.breaks and src in self.b and dst in self.a

    def __repr__(self) -> str:
        return self.label


def _block_now(sim: Simulation, block: Block, duration: float | None) -> None:
    """Put ``block`` in force now, for ``duration`` (None: for good)."""
    sim.add_block(block)
    if duration is not None:
        sim.after(duration, lambda: sim.remove_block(block))


def _span_cli(at: float | None, on: Trigger | None, own: HostRef, until: float | None,
              duration: float | None) -> str:
    when = _when_cli(at, on, own)
    if until is not None:
        return f"{when}:{_fmt(until)}"
    return f"{when}+{_fmt(duration)}" if duration is not None else when


@dataclass(frozen=True)
class Partition:
    """From ``at`` (or when ``on`` fires) until ``heal_at`` / for ``duration`` (neither: for good), ``a`` cannot reach ``b``.

    ``one_way``: only a -> b is cut: b's data reaches a, but a's
    acknowledgements of it are lost, so on a connection between them b
    stops sending :data:`sim.links.ACK_STALL` s after its first frame under
    the cut (TCP waits for them after its retransmission timeout) and what it
    sends from then on is held too. Messages on live connections are held in
    order (TCP retransmits) and delivered on heal; held longer than the
    network's ``retransmit_timeout`` they break the connection. Connects
    across the cut wait likewise, either way.
    """

    a: tuple[HostRef, ...]
    b: tuple[HostRef, ...]
    at: float | None = None
    heal_at: float | None = None
    one_way: bool = False
    on: Trigger | None = None
    duration: float | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)
        _check_duration(self, "duration", self.duration)
        if not self.a or not self.b:
            raise FaultError(self, "both sides need at least one host")
        if set(self.a) & set(self.b):
            raise FaultError(self, f"hosts {sorted(map(str, set(self.a) & set(self.b)))} are on both sides")
        if self.heal_at is not None and (self.duration is not None or self.at is None or self.heal_at < self.at):
            raise FaultError(self, "heal_at needs at= and comes after it (or give duration= instead)")

    def hosts(self) -> tuple[HostRef, ...]:
        return (*self.a, *self.b, *_trigger_hosts(self.on))

    @property
    def length(self) -> float | None:
        """How long the cut lasts, in seconds (None: for good)."""
        return self.duration if self.heal_at is None else self.heal_at - self.at  # type: ignore[operator]

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        block = Block(sim.host_names(self.a), sim.host_names(self.b), self.one_way, True, self.to_cli())
        _block_now(sim, block, self.length)

    def to_cli(self) -> str:
        flag = "--one-way-partition" if self.one_way else "--partition"
        span = _span_cli(self.at, self.on, -1, self.heal_at, self.duration)  # (a trigger names its rank)
        return f"{flag} {_hosts_cli(self.a)}/{_hosts_cli(self.b)}@{span}"


@dataclass(frozen=True)
class Clog:
    """Hold every message on the link ``link = (src, dst)`` from ``at`` (or ``on``) until ``until`` / for ``duration``.

    Never breaks the link: held messages are delivered, in order, when it ends.
    ``src == dst`` clogs the host's connections to itself (a client of a
    service on its own machine).
    """

    link: tuple[HostRef, HostRef]
    at: float | None = None
    until: float | None = None
    on: Trigger | None = None
    duration: float | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)
        _check_duration(self, "duration", self.duration)
        if (self.until is None) == (self.duration is None):
            raise FaultError(self, "needs exactly one of until= (a time) or duration=")
        if self.until is not None and (self.at is None or self.until < self.at):
            raise FaultError(self, "until needs at= and comes after it (or give duration= instead)")

    def hosts(self) -> tuple[HostRef, ...]:
        return (*self.link, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        src, dst = self.link
        block = Block(sim.host_names((src,)), sim.host_names((dst,)), True, False, self.to_cli())
        _block_now(sim, block, self.duration if self.until is None else self.until - self.at)  # type: ignore[operator]

    def to_cli(self) -> str:
        return f"--clog {self.link[0]}-{self.link[1]}@{_span_cli(self.at, self.on, self.link[0], self.until, self.duration)}"


@dataclass(frozen=True)
class ResetConnection:
    """At ``at`` (or when ``on`` fires), reset every connection between ``a`` and ``b``: both ends see ConnectionLost."""

    a: HostRef
    b: HostRef
    at: float | None = None
    on: Trigger | None = None

    def __post_init__(self) -> None:
        _check_when(self, self.at, self.on)

    def hosts(self) -> tuple[HostRef, ...]:
        return (self.a, self.b, *_trigger_hosts(self.on))

    def install(self, sim: Simulation) -> None:
        _arm(sim, self.at, self.on, lambda: self.apply(sim))

    def apply(self, sim: Simulation) -> None:
        sim.reset_connections(self.a, self.b)

    def to_cli(self) -> str:
        return f"--reset {self.a}-{self.b}@{_when_cli(self.at, self.on, self.a)}"


CONCRETE: tuple[type, ...] = (Crash, Restart, Pause, Straggler, CrashStore, Partition, Clog, ResetConnection)
"""The fault types a plan is made of (what ``Chaos`` and ``Swarm`` draw, what shrinking works on)."""
