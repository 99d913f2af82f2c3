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
read), its listeners go away and nothing of it runs again. When ``main``
raises (and the run goes on: ``stop_on_error=False``), the rank first leaves
as a rank of ``aiodist run`` does, :func:`aiodist.api.finish_failed_rank`:
its peers and the store learn what failed (its own error, or the earlier
failure it learned of), so their errors name the root cause.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import inspect
import os
import random
import traceback as tb
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from aiodist import inflight
from aiodist.api import finish_failed_rank, finish_rank
from aiodist.launch.outcome import describe_exception, raised_text
from aiodist.context import new_rank_scope, rank_environ, rank_scope, set_network, set_rank_environ, set_token_source
from aiodist.errors import CollectiveTimeoutError, UnawaitedOperationError, innermost

from .errors import SimTimeLimitError
from .explore import Exploration, Explorer, TimingPlan, env_detector
from .fault_actions import FaultActions
from .faults import Fault
from .interrupts import is_stop, sigint_marked
from .locations import _await_location, _raise_location
from .loop import LANE, SimLoop
from .network import Fabric, Host, Network
from .plan import World, expand, validate
from .program import RUN, fresh_per_run, refuse_while_loading
from .process import PROCESS, ProcessExit, ProcessGlobals, RankNetwork, RankProcess, inherited_environment, job_secret
from .result import Failure as Failure
from .result import Result as Result
from .result import _ranks_text as _ranks_text  # (re-exported: tests import it from here)
from .storehost import STORE_HOST, StoreHost
from .trace import Tracer
from .waitfor import WORLD, wait_cycle
from .triggers import Watches

DEFAULT_MASTER_PORT = 29500


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


class Simulation(FaultActions):
    """One run in progress. Faults drive it through the methods of :class:`~sim.fault_actions.FaultActions`."""

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
        self.loop.on_system_exit = self._system_exit
        self.loop.on_keyboard_interrupt = self._keyboard_interrupt
        self._timed_out: dict[int, tuple[int, list[int]]] = {}  # failure index -> (rank, the ranks it waited for)
        self._own_interrupts = False  # (set by run: can a plain KeyboardInterrupt only be a program's own?)
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
        self._starting: dict[int, float] = {}  # ranks whose restart's start is due: when
        self.failures: list[Failure] = []
        self.returned: dict[int, float] = {}  # rank -> when its main last returned (virtual time)
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

    def add_fault(self, fault: Fault) -> None:
        """Install one concrete fault."""
        self.faults.append(fault)
        fault.install(self)

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
            "TORCHELASTIC_RUN_ID": run_id, "AIODIST_RUN_ID": run_id, "ROLE_NAME": "default",
        }
        if self.world_size > 1 and "OMP_NUM_THREADS" not in os.environ:  # (as `aiodist run` and torchrun set it)
            env["OMP_NUM_THREADS"] = "1"
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
            RUN.set(self)
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
        try:
            coro = ctx.run(self.main, *self.args)  # even a plain function returning an awaitable runs as the rank
        except Exception as e:  # noqa: BLE001 - a plain ``def main()`` that failed as it was called: the rank's error
            coro = _raise(_not_async(self.main, e))
        if not asyncio.iscoroutine(coro):
            coro = _as_coroutine(coro, self.main)
        inc.task = self.loop.create_task(coro, name=f"sim-rank{rank}", context=ctx)
        inc.task.add_done_callback(lambda t, inc=inc: self._rank_done(inc, t), context=self.kernel)

    def _rank_done(self, inc: _Incarnation, task: Any) -> None:
        if inc.state != "running":
            return
        if task.cancelled():
            inc.state = "failed"
            self.failures.append(Failure("exception", inc.rank, "main was cancelled", time=self.loop.time()))
        elif task.exception() is not None:
            if self._raised(inc, task.exception()):
                return
        else:
            inc.state = "finishing"
            inc.result = task.result()
            self.returned[inc.rank] = self.loop.time()
        self._exit(inc, normal=inc.state == "finishing",
                   error=None if task.cancelled() else task.exception())

    def _raised(self, inc: _Incarnation, exc: BaseException) -> bool:
        """The program of ``inc`` raised ``exc``, which ends it: its failure. True when that stops the run."""
        now = self.loop.time()
        inc.state = "failed"
        text = "".join(tb.format_exception(exc))
        self.tracer.emit(now, "exit", f"rank{inc.rank}", detail=f"raised {type(exc).__name__}")
        first = innermost(exc)  # (a TaskGroup's group: its first error, and that error's line)
        self.failures.append(Failure("exception", inc.rank, f"{type(first).__name__}: {first}", text, now,
                                     location=_raise_location(first) or _raise_location(exc)))
        if isinstance(first, CollectiveTimeoutError) and f" of {WORLD} " in str(first):  # (see _blocked_at_end)
            self._timed_out[len(self.failures) - 1] = (inc.rank, first.waiting_for)
        if self.stop_on_error:
            self._ended += 1
            self.loop.stop()
            return True
        return False

    def _exit(self, inc: _Incarnation, *, normal: bool, error: BaseException | None = None) -> None:
        """The process ends as asyncio.run ends under ``aiodist run``: finish_rank after a normal return,
        finish_failed_rank after ``error`` (the peers learn what failed), then cancel what is left, exit."""
        inc.exiting = self.loop.create_task(self._finish(inc, normal=normal, error=error),
                                            name=f"sim-rank{inc.rank}-exit", context=inc.ctx)
        inc.exiting.add_done_callback(lambda t, inc=inc: self._exited(inc, t), context=self.kernel)

    def _ended_by(self, lane: int, kind: type[BaseException]) -> _Incarnation | None:
        """The live incarnation on ``lane``, whose process an exception of ``kind`` raised in its code ends (None:
        none lives there). The task it came from ended with it: its exception is taken here (seen: no "exception
        was never retrieved" report later)."""
        inc = next((i for i in self.current if i is not None and i.lane == lane), None)
        if inc is None or not inc.alive:
            return None
        for t in self.loop.lane_tasks(lane):
            if t.done() and isinstance(getattr(t, "_exception", None), kind):
                t.exception()
        return inc

    def _system_exit(self, lane: int, exc: SystemExit) -> bool:
        """``sys.exit`` in a rank: its process exits with that code, as ``asyncio.run`` lets it (what is left
        of it is cancelled first; no orderly finish). Code 0 or None is a normal end (result None)."""
        inc = self._ended_by(lane, SystemExit)
        if inc is None:
            return False
        exc = _from_program(exc)
        if isinstance(exc, ProcessExit):  # os._exit: the process ends here and now, without cleanup
            self._os_exit(inc, exc)
            return True
        if inc.state == "running":
            if exc.code is None or exc.code == 0:
                inc.state, inc.result = "finishing", None
                self.returned[inc.rank] = self.loop.time()
            elif self._raised(inc, exc):
                return True
            self._exit(inc, normal=False, error=None if exc.code in (None, 0) else exc)
        return True

    def _keyboard_interrupt(self, lane: int, exc: KeyboardInterrupt) -> bool:
        """``raise KeyboardInterrupt`` in a rank's code (not Ctrl-C, see :mod:`sim.interrupts`): its process dies
        of it, as ``asyncio.run`` lets it through: the rank's failure; what is left of it is cancelled."""
        if is_stop(exc) or not self._own_interrupts:
            return False
        inc = self._ended_by(lane, KeyboardInterrupt)
        if inc is None:
            return False
        exc = _from_program(exc)
        if inc.state == "running":
            if self._raised(inc, exc):
                return True
            self._exit(inc, normal=False)
        return True

    def _os_exit(self, inc: _Incarnation, exc: ProcessExit) -> None:
        """``os._exit(code)`` in ``inc``: nothing of it runs again, the OS closes its sockets (a code other than
        0 is its failure; 0 ends it as a return would, but without any teardown: peers may lose data)."""
        now = self.loop.time()
        code = exc.code
        self.tracer.emit(now, "exit", f"rank{inc.rank}", detail=f"os._exit({code})")
        if code in (0, None):
            inc.state = "done"
            self.returned[inc.rank] = now
        else:
            inc.state = "failed"
            self.failures.append(Failure("exception", inc.rank, f"os._exit({code}): the rank's process exited at "
                                         "once, without cleanup", "".join(tb.format_exception(exc)), now,
                                         location=_raise_location(exc)))
        self._ended += 1
        host = self.hosts[inc.rank]
        self.loop.kill_lane(inc.lane)
        self.fabric.exit(host)
        if code not in (0, None) and self.stop_on_error:
            self.loop.stop()
            return
        self._maybe_finish()

    async def _finish(self, inc: _Incarnation, *, normal: bool, error: BaseException | None = None) -> Failure | None:
        failure = None
        if error is not None:  # (as the launcher does, naming the program's line: see aiodist.launch.runner)
            what = raised_text(describe_exception(error)) if isinstance(error, Exception) else None
            await finish_failed_rank(error, what=what)
        elif normal:
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
        if self._running_count == 0 and not self._restart_due():
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

    def _restart_due(self) -> bool:
        """Is a restart at a time still to come for a rank it would start again? (One whose main returned or
        raised is left alone by it: see restart_host; the run does not wait for that time.)"""
        for rank, n in self.pending_restarts.items():
            inc = self.current[rank]
            if n > 0 and (inc is None or inc.state not in ("done", "failed")):
                return True
        return False

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

    def at_end(self) -> dict[str, Any]:
        """What the ranks are in as the run ends, as a :class:`Failure`'s fields: the operations of those still
        running (``blocked``), their innermost await location (``where``), when those paused resume
        (``paused``), when those down between a restart fault's crash and its restart start again
        (``restarting``)."""
        ops: dict[int, list[dict[str, Any]]] = {}
        where: dict[int, str] = {}
        paused: dict[int, float] = {}
        for inc in self.current:
            if inc is None or not inc.alive:
                continue
            ops[inc.rank] = inc.ctx.run(inflight.snapshot)
            loc = _await_location(inc.task if inc.state == "running" else inc.exiting)
            if loc:
                where[inc.rank] = loc if inc.state == "running" else f"finishing: {loc}"
            until = self.loop.paused_until(self.hosts[inc.rank].lane)
            if until is not None:
                paused[inc.rank] = until
        restarting = {r: self._starting[r] for r in sorted(self._starting)}
        return {"blocked": ops, "where": where, "paused": paused, "restarting": restarting}

    def run(self) -> Result:
        with self.globals:
            if self.globals.torch is not None:  # (else the loop's own create_task, one frame less per task)
                self.loop.create_task = self._create_task  # type: ignore[method-assign]
            with sigint_marked(self.loop) as self._own_interrupts:
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
            self.failures.append(Failure("time_limit", None, str(e), time=self.loop.time(), **self.at_end()))
        if idle and any(inc is not None and inc.alive for inc in self.current):
            state = self.at_end()
            self.failures.append(Failure(
                "deadlock", None,
                f"deadlock: nothing is ready and no timer is pending, ranks {sorted(state['blocked'])} still running",
                time=self.loop.time(), **state))
        elif self.failures and self.stop_on_error and any(
                inc is not None and inc.alive for inc in self.current):
            last = self.failures[-1]
            for name, value in self.at_end().items():
                setattr(last, name, value)
            timed_out = self._timed_out.get(len(self.failures) - 1)
            if timed_out is not None:  # a world operation timed out: did the ranks wait for each other in a ring?
                last.cycle = wait_cycle(timed_out[0], timed_out[1], last.blocked)
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
            returned=dict(sorted(self.returned.items())),
            restarts=dict(self.restarts),
            unhandled=unhandled,
            faults=list(self.faults),
            explored=list(self.timing.explored) if self.timing is not None else [],
            timing=self.timing,
            ops={inc.rank: inc.ctx.run(inflight.recent) for inc in self.current if inc is not None},
        )

    def close(self) -> None:
        self.loop.discard()


async def _as_coroutine(awaitable: Awaitable[Any], main: Any) -> Any:
    if not inspect.isawaitable(awaitable):
        raise TypeError(f"{_name(main)}() returned {type(awaitable).__name__}, not an awaitable: {_ASYNC_MAIN}")
    return await awaitable


async def _raise(exc: BaseException) -> Any:
    raise exc


_ASYNC_MAIN = ("the simulator runs each rank's main as a coroutine on the rank's own event loop: make it "
               "`async def main()` (or run the file's coroutine function: prog.py:NAME)")


_E = TypeVar("_E", bound=BaseException)


def _from_program(exc: _E) -> _E:
    """``exc`` (a SystemExit or KeyboardInterrupt the loop let through) with its traceback starting at the
    program's frame: the loop that caught it is not the user's business."""
    here = exc.__traceback__
    while here is not None and here.tb_frame.f_code is SimLoop._run.__code__:
        here = here.tb_next
    return exc.with_traceback(here)


def _name(main: Any) -> str:
    return str(getattr(main, "__qualname__", None) or getattr(main, "__name__", None) or "main")


def _not_async(main: Any, exc: Exception) -> Exception:
    """What a ``main`` that raised as it was called failed with: as it is for a coroutine function (whose call
    runs nothing), and for a plain function that ran code of its own (``asyncio.run(...)`` above all: it cannot
    start a loop of its own inside the simulator) an error that says why."""
    fn = getattr(main, "function", None)
    target = fn(main.first) if callable(fn) and hasattr(main, "first") else main  # (a CLI program: sim/program.py)
    if inspect.iscoroutinefunction(target):
        return exc
    error = TypeError(f"{_name(main)}() is not `async def` and failed as it was called "
                      f"({type(exc).__name__}: {exc}): {_ASYNC_MAIN}")
    error.__cause__ = exc
    return error




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
    isolate: bool = True,
) -> Result:
    """Run ``main(*args)`` as ``world_size`` virtual ranks; return a :class:`Result`.

    ``isolate`` (default on): a ``main`` imported from a module file runs
    from a fresh copy of that module in every rank, as in a process of its
    own: each rank has the module's globals to itself, and nothing a run
    leaves there reaches the next run (so a seed runs the same alone or after
    others, as its replay command runs it). False: every rank calls ``main``
    as it is, sharing its module's globals with the other ranks and with the
    caller (a harness may read what the ranks left there). A closure, a
    partial or a function of the running script (``__main__``) always runs
    as it is (:func:`sim.program.fresh_per_run`).

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
    refuse_while_loading("sim.run")
    if isolate:
        main = fresh_per_run(main)
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