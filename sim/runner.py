"""``sim.run``: the same program as N virtual ranks on one deterministic loop.

Each virtual rank (each *incarnation* of it, after restarts) runs ``main`` in
its own :class:`contextvars.Context` where aiodist's per-rank seams are set:
its environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, restart counts), its network view (a
:class:`~sim.network.HostNetwork`) and a fresh rank scope; plus the loop
lane that identifies its callbacks. Rank r lives on host ``"rank{r}"``;
MASTER_ADDR is ``"rank0"`` (rank 0 hosts the store, as with env://).

One seed fixes everything: the schedule, the network's latencies and each
rank's process state (see :mod:`sim.process`: its ``os.environ``, its own
``random``, numpy and torch generators, nonces and job secret).

When ``main`` returns, the rank finishes as a process does: the runtime's
:func:`aiodist.api.finish_rank` (destroys the default group in order, and
fails with ``kind="unawaited"`` for operations never awaited), then its
remaining tasks are cancelled and awaited (as :func:`asyncio.run` does), then
the process exits: its connections close (reset when they hold data it never
read), its listeners go away and nothing of it runs again.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import random
import re
import traceback as tb
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiodist import inflight
from aiodist.api import finish_rank
from aiodist.context import (get_default_group, new_rank_scope, rank_environ, rank_scope, set_network,
                             set_rank_environ, set_token_source)
from aiodist.errors import UnawaitedOperationError

from .errors import SimTimeLimitError
from .explore import Exploration, Explorer, TimingPlan, env_detector
from .faults import Block, Fault, HostRef
from .loop import LANE, SimLoop
from .network import Fabric, Host, Network
from .plan import World, expand, validate
from .process import PROCESS, ProcessGlobals, RankNetwork, RankProcess, inherited_environment, job_secret
from .storehost import STORE_HOST, StoreHost
from .trace import TraceEvent, Tracer
from .triggers import Trigger, Watches

DEFAULT_MASTER_PORT = 29500


@dataclass
class Failure:
    """Something that went wrong in a run.

    ``kind``: "exception" (a rank's main raised), "deadlock" (nothing ready,
    no timer pending, ranks still running), "time_limit" or "unawaited" (a
    rank finished with operations it never awaited). ``blocked`` maps
    each still-running rank to the operations it waits in (from
    :mod:`aiodist.inflight`), ``where`` to its innermost await location.
    """

    kind: str
    rank: int | None
    message: str
    traceback: str = ""
    time: float = 0.0
    blocked: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    where: dict[int, str] = field(default_factory=dict)
    location: str = ""
    """For an exception: the program's own innermost line it came through (file:line in function)."""

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "run"
        lines = [f"[{self.kind}] {who} at t={self.time:.6f}s: {self.message}"]
        if self.location:
            lines.append(f"    raised at {_display_path(self.location)}")
        described: list[tuple[int, str]] = []
        for r in sorted(set(self.blocked) | set(self.where)):
            ops = self.blocked.get(r) or []
            desc = "; ".join(_describe_op(op) for op in ops) or "no registered operation"
            loc = f"  ({_display_path(self.where[r])})" if r in self.where else ""
            described.append((r, f"{desc}{loc}"))
        if len(described) <= self.MAX_RANK_LINES:
            lines += [f"    rank {r} blocked in: {text}" for r, text in described]
        else:  # a big run: one line per distinct place, with the ranks waiting there
            places: dict[str, list[int]] = {}
            for r, text in described:
                places.setdefault(text, []).append(r)
            for text, ranks in places.items():
                who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({_ranks_text(ranks)})"
                lines.append(f"    {who} blocked in: {text}")
        return "\n".join(lines)

    MAX_RANK_LINES = 16
    """Beyond this many blocked ranks, ranks blocked in the same place share one line."""


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _display_path(where: str) -> str:
    """``file:line in f`` with the file relative to the working directory when it is under it."""
    path, sep, rest = where.partition(":")
    if sep and os.path.isabs(path):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel + sep + rest
    return where


def _shape(text: str) -> str:
    """``text`` with its numbers blanked: lines that differ only in rank numbers or times group together."""
    return _NUMBER.sub("#", text)


def _ranks_text(ranks: Iterable[int]) -> str:
    """``[0, 2, 3, 4, 7]`` as ``"0, 2-4, 7"``."""
    parts: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(_span(start, prev))  # type: ignore[arg-type]
        start = prev = r
    if start is not None:
        parts.append(_span(start, prev))  # type: ignore[arg-type]
    return ", ".join(parts)


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"


def _describe_op(op: Mapping[str, Any]) -> str:
    rest = ", ".join(f"{k}={v!r}" for k, v in op.items() if k != "op")
    return f"{op.get('op', '?')}({rest})"


@dataclass
class Result:
    """What a run produced. ``ok`` is true when there are no failures."""

    ok: bool
    seed: int | str
    world_size: int
    virtual_time: float
    digest: str
    rank_results: list[Any]
    failures: list[Failure]
    trace: list[TraceEvent] = field(repr=False)
    steps: int = 0
    messages: int = 0
    crashed: list[int] = field(default_factory=list)
    restarts: dict[int, int] = field(default_factory=dict)
    unhandled: list[str] = field(default_factory=list)
    faults: list[Any] = field(default_factory=list)
    """Every fault of the run, ``Chaos`` and ``Swarm`` expanded into the concrete faults they drew."""
    explored: list[Any] = field(default_factory=list)
    """The timing perturbations exploration applied, as concrete faults (see :mod:`sim.explore`)."""
    timing: TimingPlan | None = None
    """What exploration drew for this seed (None: ``explore=False``)."""
    ops: dict[int, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    """Per rank, its last operations from aiodist's flight recorder (start/end virtual times)."""

    def summary(self) -> str:
        head = (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} — {self.world_size} ranks, "
                f"virtual time {self.virtual_time:.6f}s, {self.messages} messages, digest {self.digest}")
        lines = [head]
        if self.faults:
            lines.append("  faults: " + "; ".join(f.to_cli().lstrip("-") for f in self.faults))
        if self.timing is not None:
            lines.append(f"  explored: {self.timing.describe()}"
                         + "".join(f"; {f.to_cli().lstrip('-')}" for f in self.explored))
        if len(self.failures) <= Failure.MAX_RANK_LINES:
            lines += [str(f) for f in self.failures]
        else:  # a big run: failures that differ only in numbers (ranks, times) share one entry
            groups: dict[tuple[str, str], list[Failure]] = {}
            for f in self.failures:
                groups.setdefault((f.kind, _shape(f.message)), []).append(f)
            for members in groups.values():
                lines.append(str(members[0]))
                others = [f.rank for f in members[1:] if f.rank is not None]
                if len(members) > 1:
                    who = f" (ranks {_ranks_text(others)})" if others else ""
                    lines.append(f"    ... and {len(members) - 1} more like it{who}")
        if self.unhandled:
            lines.append(f"  {len(self.unhandled)} error(s) were only logged (handler tasks, unretrieved task errors):")
            lines += [f"    {u}" for u in self.unhandled[:5]]
        return "\n".join(lines)

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


class _Incarnation:
    __slots__ = ("rank", "count", "lane", "ctx", "scope", "task", "state", "result", "exiting", "env")

    def __init__(self, rank: int, count: int, lane: int, ctx: contextvars.Context, scope: dict[str, Any]) -> None:
        self.rank, self.count, self.lane, self.ctx, self.scope = rank, count, lane, ctx, scope
        self.task: Any = None
        self.exiting: Any = None  # the task finishing the process after main ended
        self.state = "running"  # running | finishing | done | failed | crashed
        self.result: Any = None
        self.env: Mapping[str, str] = {}

    @property
    def alive(self) -> bool:
        return self.state in ("running", "finishing")


class Simulation:
    """One run in progress. Faults drive it through the methods below."""

    def __init__(
        self,
        main: Callable[..., Awaitable[Any]],
        *,
        world_size: int,
        seed: int | str,
        network: Network,
        faults: Sequence[Fault],
        time_limit: float | None,
        env: Mapping[str, str] | None,
        args: Sequence[Any],
        schedule: str,
        pct_depth: int = 3,
        keep_trace: bool,
        stop_on_error: bool,
        master_port: int,
        compute: float | Callable[[Callable[..., Any], tuple[Any, ...]], float] = 0.0,
        explore: bool | Exploration = True,
        store_host: str = "rank0",
    ) -> None:
        if world_size < 1:
            raise ValueError("world_size must be >= 1")
        if store_host not in ("rank0", "separate"):
            raise ValueError(f"store_host must be 'rank0' or 'separate', got {store_host!r}")
        self.main = main
        self.world_size = world_size
        self.seed = seed
        self.args = tuple(args)
        self.extra_env = dict(env or {})
        self.stop_on_error = stop_on_error
        self.master_port = master_port
        self.store_separate = store_host == "separate"
        world = World(seed, world_size, self.store_separate, env_detector(self.extra_env))
        concrete = expand(faults, world)
        validate(concrete, world)
        self.timing: TimingPlan | None = None
        if explore:
            self.timing = (explore if isinstance(explore, Exploration) else Exploration()).draw(
                seed, world.budget, world_size)
            network = Explorer.network(network, self.timing)
        self.loop = SimLoop(seed=seed, schedule=schedule, time_limit=time_limit, pct_depth=pct_depth)  # type: ignore[abstract]
        self.loop.executor_cost = compute
        self.globals = ProcessGlobals()
        self.base_env = inherited_environment(os.environ)
        self.tracer = Tracer(keep=keep_trace)
        self.fabric = Fabric(network, self.loop, random.Random(f"{seed}:net"), self.tracer)
        self.kernel = self.fabric.kernel_ctx
        self.hosts = [self.fabric.add_host(f"rank{r}", r) for r in range(world_size)]
        self.store: StoreHost | None = None
        self.current: list[_Incarnation | None] = [None] * world_size
        self.restarts: dict[int, int] = {}
        self.pending_restarts: dict[int, int] = {}
        self._starting: set[int] = set()  # ranks whose restart's start is due
        self.failures: list[Failure] = []
        self._started = 0  # incarnations started ...
        self._ended = 0  # ... and ended (returned, raised or crashed)
        self._next_lane = world_size
        self.watches = Watches(self.fabric.links)
        if self.store_separate:
            self.store = StoreHost(self, self.fabric.add_host(STORE_HOST), master_port)
        self.faults: list[Fault] = []  # every concrete fault installed (Chaos and Swarm expanded)
        self.max_restarts = sum(1 for f in concrete if type(f).__name__ == "Restart")
        for fault in concrete:
            self.add_fault(fault)
        self.explorer = Explorer(self, self.timing, seed) if self.timing is not None else None
        if self.explorer is not None:
            self.explorer.install(self.hosts)

    # -- fault API (what faults do to the run; see sim.faults) ------------------------

    def add_fault(self, fault: Fault) -> None:
        """Install one concrete fault."""
        self.faults.append(fault)
        fault.install(self)

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
        self._starting.add(ref)
        self.after(delay, lambda: self.restart_rank(ref))

    def restart_rank(self, rank: int) -> None:
        self._starting.discard(rank)
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

    def set_straggler(self, rank: int, factor: float, duration: float | None = None) -> None:
        host = self.hosts[rank]
        host.factor = factor
        self.loop.stretch_sleeps(host.lane, factor)
        self.tracer.emit(self.loop.time(), "fault", host.name, detail=f"straggler x{factor:g}")
        if duration is not None:
            self.after(duration, lambda: self._end_straggler(host, factor))

    def _end_straggler(self, host: Host, factor: float) -> None:
        if host.factor == factor:
            host.factor = 1.0
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

    def new_lane(self) -> int:
        lane = self._next_lane
        self._next_lane += 1
        return lane

    # -- ranks ----------------------------------------------------------------------

    def store_host(self) -> Host:
        """The host of the store (where MASTER_ADDR points; rank 0's if it names no virtual host)."""
        addr = self.rank_env(0, 0)["MASTER_ADDR"]
        return self.fabric.hosts.get(addr) or self.hosts[0]

    def rank_env(self, rank: int, restart_count: int) -> dict[str, str]:
        n = str(self.world_size)
        run_id = f"sim-{self.seed}"
        env = {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": n, "LOCAL_WORLD_SIZE": n, "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": n,
            "MASTER_ADDR": STORE_HOST if self.store_separate else "rank0", "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(restart_count), "AIODIST_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(self.max_restarts), "AIODIST_MAX_RESTARTS": str(self.max_restarts),
            "TORCHELASTIC_RUN_ID": run_id, "AIODIST_RUN_ID": run_id,
        }
        if self.store_separate:  # (the store runs on its own host: rank 0 does not start one)
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        env.update(self.extra_env)
        if not any(k in self.extra_env for k in ("AIODIST_SECRET", "AIODIST_SECRET_FILE", "AIODIST_INSECURE")):
            env["AIODIST_SECRET"] = job_secret(self.seed)  # as `aiodist run` gives every rank a fresh one
        return env

    def _create_task(self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None
                     ) -> asyncio.Task[Any]:
        """``loop.create_task`` when torch is loaded: the task swaps in its rank's torch generator."""
        coro = self.globals.wrap(coro, PROCESS.get() if context is None else context.get(PROCESS))
        return SimLoop.create_task(self.loop, coro, name=name, context=context)

    def _start_rank(self, rank: int) -> None:
        count = self.restarts.get(rank, 0)
        lane = rank if count == 0 else self.new_lane()
        host = self.hosts[rank]
        env = dict(self.base_env)
        env.update(self.rank_env(rank, count))
        ctx = contextvars.copy_context()
        net = RankNetwork(host.net, host, self.fabric, self.store_host)

        def setup() -> tuple[dict[str, Any], RankProcess]:
            set_rank_environ(env)
            process = RankProcess(self.seed, rank, count, rank_environ())  # type: ignore[arg-type]
            self.globals.enter_rank(process)
            set_token_source(process.token_bytes)
            set_network(net)
            new_rank_scope()
            LANE.set(lane)
            return rank_scope(), process

        scope, _ = ctx.run(setup)
        inc = _Incarnation(rank, count, lane, ctx, scope)
        inc.env = env
        self._started += 1
        self.current[rank] = inc
        self.fabric.boot(host, lane, ctx)
        self.tracer.emit(self.loop.time(), "start", host.name, detail=f"incarnation {count}")
        coro = ctx.run(self.main, *self.args)  # even a plain function returning an awaitable runs as the rank
        if not asyncio.iscoroutine(coro):
            coro = _as_coroutine(coro)
        inc.task = self.loop.create_task(coro, name=f"sim-rank{rank}", context=ctx)
        inc.task.add_done_callback(lambda t, inc=inc: self._rank_done(inc, t), context=self.kernel)

    def _rank_done(self, inc: _Incarnation, task: Any) -> None:
        if inc.state != "running":
            return
        now = self.loop.time()
        if task.cancelled():
            inc.state = "failed"
            self.failures.append(Failure("exception", inc.rank, "main was cancelled", time=now))
        elif task.exception() is not None:
            exc = task.exception()
            inc.state = "failed"
            text = "".join(tb.format_exception(exc))
            self.tracer.emit(now, "exit", f"rank{inc.rank}", detail=f"raised {type(exc).__name__}")
            self.failures.append(Failure("exception", inc.rank, f"{type(exc).__name__}: {exc}", text, now,
                                         location=_raise_location(exc)))
            if self.stop_on_error:
                self._ended += 1
                self.loop.stop()
                return
        else:
            inc.state = "finishing"
            inc.result = task.result()
        # The process ends as asyncio.run ends: (finish_rank after a normal return,) cancel what is left.
        inc.exiting = self.loop.create_task(self._finish(inc, normal=inc.state == "finishing"),
                                            name=f"sim-rank{inc.rank}-exit", context=inc.ctx)
        inc.exiting.add_done_callback(lambda t, inc=inc: self._exited(inc, t), context=self.kernel)

    async def _finish(self, inc: _Incarnation, *, normal: bool) -> Failure | None:
        failure = None
        if normal:
            try:
                await finish_rank()
            except UnawaitedOperationError as e:
                failure = Failure("unawaited", inc.rank, str(e), time=self.loop.time())
            except Exception as e:  # noqa: BLE001 - the rank's own teardown failed: its failure
                failure = Failure("exception", inc.rank, f"{type(e).__name__} while the rank finished: {e}",
                                  "".join(tb.format_exception(e)), self.loop.time(), location=_raise_location(e))
        me = asyncio.current_task()
        left = [t for t in self.loop.lane_tasks(inc.lane) if t is not me and not t.done()]
        for t in left:
            t.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
        return failure

    def _exited(self, inc: _Incarnation, task: asyncio.Task[Any]) -> None:
        """The process of ``inc`` exits: connections closed (reset if data is left unread), nothing runs again."""
        if not inc.alive and inc.state != "failed":
            return  # crashed while finishing
        failure = task.result() if not task.cancelled() and task.exception() is None else None
        self._ended += 1
        if inc.state == "finishing":
            inc.state = "done" if failure is None else "failed"
        host = self.hosts[inc.rank]
        self.tracer.emit(self.loop.time(), "exit", host.name, detail="ok" if failure is None else failure.kind)
        self.loop.retire_lane(inc.lane)  # (its tasks have all ended: nothing to keep, no scan of them)
        self.fabric.exit(host)
        if failure is not None:
            self.failures.append(failure)
            if self.stop_on_error:
                self.loop.stop()
                return
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self._running_count == 0 and not any(self.pending_restarts.values()):
            self.loop.stop()
        elif self._job_finished():
            # What still runs are restarted ranks whose job is over: every other rank returned.
            # (A launcher tears a finished job down; left alone, they would wait for a store
            # and peers that are gone.)
            for inc in self.current:
                if inc is not None and inc.alive:
                    self.tracer.emit(self.loop.time(), "exit", f"rank{inc.rank}",
                                     detail="stopped: the job finished (every other rank returned)")
            self.loop.stop()

    def _job_finished(self) -> bool:
        if not self.restarts:  # (only restarted ranks can outlive their job)
            return False
        running = [inc for inc in self.current if inc is not None and inc.alive]
        others = [inc for inc in self.current if inc is not None and not inc.alive]
        return bool(running) and bool(others) and all(inc.count > 0 for inc in running) and all(
            inc.state == "done" for inc in others)

    @property
    def _running_count(self) -> int:
        return self._started - self._ended

    # -- reporting -------------------------------------------------------------------

    def blocked(self) -> tuple[dict[int, list[dict[str, Any]]], dict[int, str]]:
        ops: dict[int, list[dict[str, Any]]] = {}
        where: dict[int, str] = {}
        for inc in self.current:
            if inc is None or not inc.alive:
                continue
            ops[inc.rank] = inc.ctx.run(inflight.snapshot)
            loc = _await_location(inc.task if inc.state == "running" else inc.exiting)
            if loc:
                where[inc.rank] = loc if inc.state == "running" else f"finishing: {loc}"
        return ops, where

    def run(self) -> Result:
        with self.globals:
            if self.globals.torch is not None:  # (else the loop's own create_task, one frame less per task)
                self.loop.create_task = self._create_task  # type: ignore[method-assign]
            return self._run()

    def _run(self) -> Result:
        if self.store is not None:
            self.store.start()
        for r in range(self.world_size):
            self._start_rank(r)
        idle = False
        try:
            stopped = self.loop.run_until_idle_or_stopped()
            idle = not stopped
        except SimTimeLimitError as e:
            ops, where = self.blocked()
            self.failures.append(Failure("time_limit", None, str(e), time=self.loop.time(), blocked=ops,
                                         where=where))
        if idle and any(inc is not None and inc.alive for inc in self.current):
            ops, where = self.blocked()
            self.failures.append(Failure(
                "deadlock", None,
                f"deadlock: nothing is ready and no timer is pending, ranks {sorted(ops)} still running",
                time=self.loop.time(), blocked=ops, where=where))
        elif self.failures and self.stop_on_error and any(
                inc is not None and inc.alive for inc in self.current):
            ops, where = self.blocked()
            self.failures[-1].blocked, self.failures[-1].where = ops, where
        now = self.loop.time()
        self.tracer.emit(now, "end", "sim", detail=f"{len(self.failures)} failure(s)")
        results = [inc.result if inc is not None else None for inc in self.current]
        crashed = [inc.rank for inc in self.current if inc is not None and inc.state == "crashed"]
        unhandled = [str(c.get("message", "")) + (f": {c['exception']!r}" if c.get("exception") else "")
                     for c in self.loop.unhandled] + list(self.fabric.handler_errors)
        return Result(
            ok=not self.failures,
            seed=self.seed,
            world_size=self.world_size,
            virtual_time=now,
            digest=self.tracer.digest,
            rank_results=results,
            failures=self.failures,
            trace=self.tracer.events,
            steps=self.loop.steps,
            messages=self.fabric.messages,
            crashed=crashed,
            restarts=dict(self.restarts),
            unhandled=unhandled,
            faults=list(self.faults),
            explored=list(self.timing.explored) if self.timing is not None else [],
            timing=self.timing,
            ops={inc.rank: inc.ctx.run(inflight.recent) for inc in self.current if inc is not None},
        )

    def close(self) -> None:
        self.loop.discard()


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _await_location(task: Any) -> str:
    """Where ``task`` is suspended: the innermost frame of the program's own code (outside aiodist,
    asyncio and sim), or the innermost one outside asyncio and sim if the program has none on the way."""
    if task is None or task.done():
        return ""
    coro = task.get_coro()
    user = inner = ""
    for _ in range(200):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            inner = _frame_text(filename, frame.f_lineno, frame.f_code.co_name)
            if not filename.startswith(_RUNTIME_DIR):
                user = inner
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nxt is None or not (hasattr(nxt, "cr_frame") or hasattr(nxt, "gi_frame")):
            break
        coro = nxt
    return user or inner


def _raise_location(exc: BaseException) -> str:
    """The innermost line of the program's own code an exception came through ("" if none)."""
    where = ""
    tb_ = exc.__traceback__
    for _ in range(1000):
        if tb_ is None:
            break
        code = tb_.tb_frame.f_code
        if not code.co_filename.startswith(_SKIP_DIRS + (_RUNTIME_DIR,)):
            where = _frame_text(code.co_filename, tb_.tb_lineno, code.co_name)
        tb_ = tb_.tb_next
    return where


def _frame_text(filename: str, line: int, name: str) -> str:
    return f"{filename}:{line} in {name}"


_SKIP_DIRS = (os.path.dirname(asyncio.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep)
_RUNTIME_DIR = os.path.dirname(os.path.abspath(inflight.__file__)) + os.sep


def run(
    main: Callable[..., Awaitable[Any]],
    *,
    world_size: int = 8,
    seed: int | str = 0,
    network: Network | None = None,
    faults: Sequence[Fault] = (),
    time_limit: float | None = 3600.0,
    env: Mapping[str, str] | None = None,
    args: Sequence[Any] = (),
    schedule: str = "random",
    pct_depth: int = 3,
    trace: bool = True,
    stop_on_error: bool = True,
    master_port: int = DEFAULT_MASTER_PORT,
    compute: float | Callable[[Callable[..., Any], tuple[Any, ...]], float] = 0.0,
    explore: bool | Exploration = True,
    store_host: str = "rank0",
) -> Result:
    """Run ``main(*args)`` as ``world_size`` virtual ranks; return a :class:`Result`.

    ``explore`` (default on): draw this seed's timing perturbations, each
    short enough for a correct program to tolerate (see :mod:`sim.explore`);
    False: fixed timing. ``store_host="separate"``: the store runs on a host
    of its own (``"store"``), so faults can hit it apart from rank 0.
    Faults naming a rank or host the world does not have raise
    :class:`~sim.faults.FaultError` before anything runs.

    ``schedule``: "fifo", "random" (default) or "pct" with ``pct_depth`` - 1
    priority change points (see :mod:`sim.loop`).
    ``trace=False`` keeps only the digest (for big runs). ``stop_on_error``:
    stop at the first rank exception (like the launcher), reporting where
    the other ranks were. ``env`` adds/overrides environment variables.
    ``compute``: virtual seconds a call offloaded to a thread (``asyncio.to_thread``,
    ``loop.run_in_executor``) takes; such calls run inline. A number, or
    ``compute(func, args) -> seconds``.
    Everything still pending when the run ends is dropped without running.
    """
    thresholds = gc.get_threshold()
    # Fewer young collections: a run keeps many young containers alive (handles, futures, frames in
    # flight, ~250 per rank) and each collection walks all of them, freeing next to nothing. The
    # threshold grows with the world, so that the collector's share of a run does not (at 1024
    # ranks a young collection walked ~400k live objects for 0.25 s and freed none). The count is
    # of live new containers: garbage is still freed by reference counting; only cyclic garbage
    # waits longer.
    gc.set_threshold(max(thresholds[0], 400_000, 1000 * world_size), *thresholds[1:])
    sim = Simulation(main, world_size=world_size, seed=seed, network=network or Network(), faults=faults,
                     time_limit=time_limit, env=env, args=args, schedule=schedule, pct_depth=pct_depth,
                     keep_trace=trace, stop_on_error=stop_on_error, master_port=master_port, compute=compute,
                     explore=explore, store_host=store_host)
    try:
        return sim.run()
    finally:
        sim.close()
        gc.set_threshold(*thresholds)
