"""The verbs faults act through on a running simulation (see :mod:`sim.faults`).

:class:`FaultActions` is the part of :class:`~sim.runner.Simulation` that
faults and exploration call: run something at a time, after a delay or on a
trigger; crash, restart, pause or slow a rank; crash the store; block and
unblock links; reset connections.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aiodist.context import get_default_group

from .faults import Block, Fault, HostRef
from .loop import SimLoop
from .network import Fabric, Host
from .storehost import STORE_HOST, StoreHost
from .trace import Tracer
from .triggers import Trigger, Watches

if TYPE_CHECKING:
    from .runner import _Incarnation


class FaultActions:
    """What faults do to the run; :class:`~sim.runner.Simulation` holds the state named here."""

    loop: SimLoop
    kernel: contextvars.Context
    fabric: Fabric
    hosts: list[Host]
    store: StoreHost | None
    current: list[_Incarnation | None]
    restarts: dict[int, int]
    pending_restarts: dict[int, int]
    _starting: dict[int, float]
    _ended: int
    watches: Watches
    faults: list[Fault]
    tracer: Tracer
    master_port: int

    if TYPE_CHECKING:
        def rank_env(self, rank: int, restart_count: int) -> dict[str, str]: ...
        def _start_rank(self, rank: int) -> None: ...
        def _maybe_finish(self) -> None: ...

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the simulator kernel at virtual time ``t``."""
        self.loop.schedule(t, -1, fn, (), self.kernel)

    def after(self, delay: float, fn: Callable[[], None], *, daemon: bool = False) -> None:
        """Run ``fn`` in the simulator kernel ``delay`` seconds from now (``daemon``: only if the run goes on)."""
        self.loop.schedule(self.loop.time() + delay, -1, fn, (), self.kernel, daemon=daemon)

    def when(self, trigger: Trigger, fn: Callable[[], None], *, fatal: bool = False) -> None:
        """Run ``fn`` (synchronously, inside the triggering step) when ``trigger`` fires (``fatal``: it may kill)."""
        self.watches.add(self.hosts[trigger.rank], trigger, fn, fatal=fatal)

    def host_names(self, hosts: Iterable[HostRef]) -> frozenset[str]:
        return frozenset(f"rank{h}" if isinstance(h, int) else h for h in hosts)

    def _host(self, h: HostRef) -> Host:
        name = f"rank{h}" if isinstance(h, int) else h
        return self.fabric.hosts[name]

    def crash_host(self, ref: HostRef, reason: str, *, silent: bool = False) -> None:
        if isinstance(ref, int):
            self.crash_rank(ref, reason, silent=silent)
        elif self.store is not None and ref == STORE_HOST:
            self.store.crash(reason, silent=silent)

    def crash_rank(self, rank: int, reason: str, *, silent: bool = False) -> None:
        inc = self.current[rank]
        if inc is None or not inc.alive:
            return
        inc.state = "crashed"
        self._ended += 1
        self.fabric.crash(self.hosts[rank], reason, silent=silent)
        self._maybe_finish()

    def expect_restart(self, ref: HostRef, at: float | None) -> None:
        """A restart at ``at`` is coming: the run does not end before it (one on a trigger counts once it fires)."""
        if at is not None and isinstance(ref, int):
            self.pending_restarts[ref] = self.pending_restarts.get(ref, 0) + 1

    def restart_host(self, ref: HostRef, delay: float, *, counted: bool = False) -> None:
        """Crash ``ref`` now (if it still runs) and start it again ``delay`` later.

        A rank that finished, or whose start is already due (an earlier
        restart), is left alone: one process per rank at a time. ``counted``:
        :meth:`expect_restart` counted it already (a restart at a time).
        """
        if not isinstance(ref, int):
            if self.store is not None and ref == STORE_HOST and not self.store.starting:
                self.store.crash("Restart fault")
                self.store.starting = True
                self.after(delay, self.store.start)
            return
        inc = self.current[ref]
        if (inc is not None and inc.state in ("done", "failed")) or ref in self._starting:
            if counted:
                self.pending_restarts[ref] -= 1  # nothing to restart
            self._maybe_finish()
            return
        if not counted:
            self.pending_restarts[ref] = self.pending_restarts.get(ref, 0) + 1
        self.crash_rank(ref, "Restart fault")
        self._starting[ref] = self.loop.time() + delay
        self.after(delay, lambda: self.restart_rank(ref))

    def restart_rank(self, rank: int) -> None:
        self._starting.pop(rank, None)
        self.pending_restarts[rank] -= 1
        inc = self.current[rank]
        others = [o for o in self.current if o is not None and o.rank != rank]
        if (inc is not None and inc.state in ("done", "failed")) or (others and not any(o.alive for o in others)):
            # It finished before the restart was due, or the job is over (every other rank ended):
            # nothing to restart, as a launcher would not restart a worker of a finished job.
            self._maybe_finish()
            return
        self.restarts[rank] = self.restarts.get(rank, 0) + 1
        self.tracer.emit(self.loop.time(), "restart", f"rank{rank}", detail=f"restart {self.restarts[rank]}")
        self._start_rank(rank)

    def pause_host(self, ref: HostRef, duration: float) -> None:
        """Stop ``ref``'s process for ``duration`` seconds (SIGSTOP, then SIGCONT); nothing if it is not running."""
        host = self._host(ref)
        if host.alive:
            self.loop.pause_lane(host.lane, self.loop.time() + duration)
            self.tracer.emit(self.loop.time(), "fault", host.name, detail=f"pause {duration:g}s")

    def set_straggler(self, rank: int, factor: float, duration: float | None = None, most: float | None = None) -> None:
        """``rank`` runs ``factor`` times slower for ``duration`` seconds (None: for good); ``most``: at most that
        many seconds more for any one sleep (None: no bound)."""
        host = self.hosts[rank]
        host.factor = factor
        host.stretch = (math.inf if duration is None else self.loop.time() + duration, most)
        self.loop.stretch_sleeps(host.lane, factor, *host.stretch)
        self.tracer.emit(self.loop.time(), "fault", host.name, detail=f"straggler x{factor:g}")
        if duration is not None:
            self.after(duration, lambda: self._end_straggler(host, factor))

    def _end_straggler(self, host: Host, factor: float) -> None:
        if host.factor == factor:
            host.factor = 1.0
            host.stretch = (math.inf, None)
            self.loop.stretch_sleeps(host.lane, 1.0)
            self.tracer.emit(self.loop.time(), "fault", host.name, detail="straggler ends")

    def crash_store(self) -> None:
        if self.store is not None:
            self.store.crash("CrashStore fault")
            return
        addr = self.rank_env(0, 0)["MASTER_ADDR"]
        host = self.fabric.hosts.get(addr)
        if host is None or not self.fabric.crash_listener(host, self.master_port, "CrashStore fault"):
            self.tracer.emit(self.loop.time(), "fault", addr, detail="CrashStore: no store listening")

    def add_block(self, block: Block) -> None:
        self.fabric.links.add_block(block)
        self.tracer.emit(self.loop.time(), "fault", "net", detail=f"begin {block!r}")

    def remove_block(self, block: Block) -> None:
        if block in self.fabric.links.blocks:
            self.tracer.emit(self.loop.time(), "fault", "net", detail=f"end {block!r}")
            self.fabric.links.remove_block(block)
            self.fabric.release()

    def reset_connections(self, a: HostRef, b: HostRef) -> None:
        self.fabric.reset(self._host(a), self._host(b))

    def live_ranks(self) -> Iterator[tuple[Mapping[str, str], Any]]:
        """(environment, default group or None) of every running rank."""
        for inc in self.current:
            if inc is not None and inc.alive:
                yield inc.env, inc.ctx.copy().run(get_default_group)  # (a copy: this one may be running)

