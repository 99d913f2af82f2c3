"""A deterministic asyncio event loop on a virtual clock.

:class:`SimLoop` subclasses :class:`asyncio.AbstractEventLoop` directly and
owns all scheduling (no ``BaseEventLoop`` internals), robust across CPython
3.11+. Program code gets ordinary :class:`asyncio.Handle` /
:class:`asyncio.TimerHandle` objects (so ``Task``, ``Future``,
``asyncio.sleep``, ``asyncio.timeout`` work unchanged); the simulator's own
callbacks (message deliveries, fault actions, wake-ups) come in through ONE
method, :meth:`SimLoop.schedule`, as lighter non-cancellable events.

Every callback, of either kind, enters one of two places:

* the *timers*: due later, ordered by ``(when, seq)`` with ``seq`` a global
  counter, so callbacks due at the same instant keep FIFO order (asyncio's own
  heap does not promise this). They live in two heaps, a small "near" one
  (what is due within ~:data:`NEAR`: deliveries in flight) and a "far" one
  (timeouts, sleeps), so a delivery never sifts through long timers;
* the *ready queue*: due now. When it is empty the clock jumps to the
  earliest timer and everything due then becomes ready, so
  ``await asyncio.sleep(3600)`` costs nothing.

One run loop takes callbacks from the ready queue; the *strategy* of that
queue (:mod:`sim.ready`: ``"fifo"``, ``"random"`` or ``"pct"``) decides the
order, across lanes, of callbacks ready at the same instant. A *lane* is one
virtual process incarnation (read from the callback's ``context``, see
:data:`LANE`); inside a lane the order is always FIFO.

Lanes can be *killed* (a crashed process: its callbacks never run again, no
``finally`` of it runs) or *paused* until a virtual time (SIGSTOP: nothing of
it runs meanwhile, its timers fire late, then it resumes in order).

No wall clock, real I/O, threads, subprocesses or signals: those loop
methods raise :class:`~sim.errors.SimUnsupportedError`. Calls handed to an
executor (``asyncio.to_thread``, ``run_in_executor``) run inline, at a
virtual cost (:meth:`SimLoop.run_in_executor`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import heapq
import operator
import itertools
import random
import threading
from asyncio import futures
from collections.abc import Callable, Coroutine
from typing import Any

from .errors import SimLivelockError, SimTimeLimitError, SimUnsupportedError
from .handles import KernelEvent, LoopHandle, LoopTimerHandle
from .loop_interface import LoopInterface, _Idle
from .loop_lanes import LaneControl, stretched
from .ready import SCHEDULES, PctReady, new_ready

LANE: contextvars.ContextVar[int] = contextvars.ContextVar("sim_lane", default=-1)
"""The lane of the code running in a context (-1: the simulator kernel)."""


class SimTask(asyncio.Task):  # type: ignore[type-arg]
    """A task whose hash is drawn from the run's seed (not its address), and whose default name counts per run.

    A set of tasks (the ``done`` and ``pending`` sets of ``asyncio.wait``,
    ``asyncio.all_tasks()``) iterates in hash order. Hashed by address, that
    order changed with whatever the process had allocated before, so a seed
    run in a sweep's worker and its replay in a fresh process could take the
    tasks of one ``done`` set in different orders. Drawn from the seed, the
    order is one of the seed's draws: it replays, differs from seed to seed
    and from rank to rank (as addresses differ between real processes), so a
    program that issues collectives in a set's order is caught on some seed,
    not passed or failed by chance. Equality stays identity.
    """

    __slots__ = ("_sim_hash",)

    def __init__(self, coro: Coroutine[Any, Any, Any], *, loop: SimLoop, hash_value: int, name: str,
                 context: contextvars.Context | None = None, eager_start: bool = False) -> None:
        self._sim_hash = hash_value  # (before the base registers the task in a set: that hashes it)
        if eager_start:  # (asyncio.eager_task_factory's, 3.12+: see SimLoop.set_task_factory)
            super().__init__(coro, loop=loop, name=name, context=context, eager_start=True)  # type: ignore[call-arg, unused-ignore]
        else:
            super().__init__(coro, loop=loop, name=name, context=context)

    def __hash__(self) -> int:
        return self._sim_hash


_EAGER = getattr(asyncio, "eager_task_factory", None)  # (3.12+)

SimTask.__name__ = SimTask.__qualname__ = "Task"  # (what asyncio's messages and reprs say: "Task exception was ...")

__all__ = ["LANE", "SCHEDULES", "SimLoop", "run"]

NEAR = 1e-3
"""Seconds ahead of the clock that count as "near" (see :meth:`SimLoop._advance`): message
deliveries land there, long timers (timeouts, sleeps) beyond it."""

_sleep_callback = futures._set_result_unless_cancelled  # type: ignore[attr-defined]  # what asyncio.sleep schedules
_new_handle = object.__new__


_read_now = operator.attrgetter("now")
_read_debug = operator.attrgetter("_debug")


class SimLoop(LaneControl, LoopInterface):
    """Deterministic virtual-time event loop. See the module docstring.

    ``schedule``: the ready-queue strategy, ``"fifo"``, ``"random"`` or
    ``"pct"`` (``pct_depth`` - 1 change points over an estimated
    ``pct_steps`` steps); ``seed`` seeds its generator. ``time_limit``:
    virtual time beyond which :meth:`run_until_complete` raises
    :class:`SimTimeLimitError` instead of jumping the clock;
    ``max_steps_per_instant``: callbacks allowed at one virtual instant
    before :class:`SimLivelockError` (a ``sleep(0)`` spin would otherwise
    never end).
    """

    def __init__(
        self,
        *,
        seed: int | str = 0,
        schedule: str = "fifo",
        pct_depth: int = 3,
        pct_steps: int = 100_000,
        time_limit: float | None = None,
        max_steps_per_instant: int = 20_000_000,
    ) -> None:
        self.now = 0.0
        """The virtual clock (read-only): what :meth:`time` returns, without a call."""
        # time() and create_future() run several times per simulated message: as C callables
        # (no Python frame) they shadow the methods below, which say what they do.
        self._now_reader = functools.partial(_read_now, self)
        self.time = self._now_reader  # type: ignore[method-assign]  # (the method while a lane blocks: see _clocks)
        self.create_future = functools.partial(asyncio.Future, loop=self)  # type: ignore[method-assign]
        self.get_debug = functools.partial(_read_debug, self)  # type: ignore[method-assign]  # (every Future asks)
        self.strategy = schedule
        self._ready = new_ready(schedule, random.Random(f"{seed}:schedule"), pct_depth=pct_depth,
                                pct_steps=pct_steps)
        self._push = self._ready.push
        self._note_lane = self._ready.note_lane if isinstance(self._ready, PctReady) else None
        self._seq = itertools.count()
        # Timers in two heaps of (when, seq, lane, handle): every entry of ``_heap`` is due before
        # ``_bound`` and every entry of ``_far`` at or after it (see _advance).
        self._heap: list[tuple[float, int, int, Any]] = []
        self._far: list[tuple[float, int, int, Any]] = []
        self._bound = NEAR
        self._daemons: list[tuple[float, int, int, Any]] = []  # (see schedule(daemon=True))
        self._ncancelled = 0
        self.lane = -1
        """The lane of the callback running now (-1: the simulator kernel, or nothing running). Read-only."""
        self.dead_lanes: set[int] = set()
        """Killed lanes (read-only). ``loop.lane in loop.dead_lanes``: the rest of a step of a process
        that was just killed runs (it must have no effect)."""
        self._stopped: set[int] = set()  # dead or paused lanes: the run loop diverts their callbacks
        self._paused: dict[int, list[Any]] = {}  # paused lane -> its callbacks held until it resumes
        self._resume_at: dict[int, float] = {}
        self._blocked: dict[int, float] = {}  # lane -> when its blocking call (time.sleep) ends
        # ``sys.exit`` in a callback of ``lane``: the owner ends that lane's process and says True (else it
        # propagates, as from asyncio's own loop)
        self.on_system_exit: Callable[[int, SystemExit], bool] | None = None
        # the same for a ``KeyboardInterrupt`` the program raised itself (not Ctrl-C: see sim.interrupts)
        self.on_keyboard_interrupt: Callable[[int, KeyboardInterrupt], bool] | None = None
        self._firsts: dict[int, int] = {}  # paused lane -> how many held callbacks go before the others
        self._stretch: dict[int, tuple[float, float, float | None]] = {}
        self._closed = False
        self._discarding = False
        # Every task, by lane, in creation order: what a killed lane leaves behind, and what a finishing
        # process cancels (as asyncio.run does) without a scan of every rank's tasks. Plain lists with
        # the ended tasks dropped now and then (see create_task): no weak reference per task.
        self._lane_tasks: dict[int, list[asyncio.Task[Any]]] = {}
        self._task_numbers = itertools.count(1)  # (SimTask: default names and hashes that replay)
        self._task_factory_given: Callable[..., Any] | None = None
        self._task_hash = random.Random(f"{seed}:task-hashes").getrandbits
        self._zombies: list[asyncio.Task[Any]] = []
        self._graveyard: list[Any] = []  # dropped callbacks of dead lanes, kept alive until discard()
        self._running = False
        self._stopping = False
        self._interrupt: BaseException | None = None  # (see interrupt)
        self._debug = False
        self._exc_handler: Callable[..., Any] | None = None
        self._task_factory: Callable[..., Any] | None = None
        self._thread_id: int | None = None
        self.time_limit = time_limit
        self.max_steps_per_instant = max_steps_per_instant
        self.steps = 0
        self.unhandled: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._running else "idle"
        return f"<SimLoop {state} t={self.now:.6f}s {self.strategy} ready={len(self._ready)}>"

    # ------------------------------------------------------------------ clock

    def time(self) -> float:
        """Virtual seconds since the loop was created, as the running lane sees them: later than the loop's
        while a blocking call of its step lasts (``time.sleep``; see :meth:`lane_clock`), so that a deadline
        set after the call counts from its end, as in a real process."""
        blocked = self._blocked
        if blocked:
            until = blocked.get(self.lane)
            if until is not None and until > self.now:
                return until
        return self.now

    # ------------------------------------------------------------------ the way in

    def schedule(self, when: float, lane: int, callback: Callable[..., Any], args: tuple[Any, ...],
                 context: contextvars.Context, *, daemon: bool = False) -> None:
        """Run ``callback(*args)`` in ``context`` at virtual time ``when``, as a callback of ``lane``.

        The simulator's own way in (deliveries, fault actions, wake-ups): the
        event is not cancellable and costs less than a TimerHandle. Lane -1 is
        the simulator kernel (never killed, never paused). A ``daemon`` event
        does not keep the run going: when nothing else is left it never runs
        (the loop is idle, as without it).
        """
        event = _new_handle(KernelEvent)  # KernelEvent.__init__ inlined (a delivery each)
        event._context = context
        event._callback = callback
        event._args = args
        if daemon:
            event._scheduled = True
            heapq.heappush(self._daemons, (max(when, self.now), next(self._seq), lane, event))
            return
        if when <= self.now:
            event._scheduled = False
            self._push(lane, event)
        else:
            event._scheduled = True
            heapq.heappush(self._heap if when < self._bound else self._far, (when, next(self._seq), lane, event))

    def _enqueue(self, when: float, lane: int, handle: Any) -> None:
        """A handle into the ready queue (due now) or the timers."""
        if when <= self.now:
            self._push(lane, handle)
        else:
            handle._scheduled = True
            heapq.heappush(self._heap if when < self._bound else self._far, (when, next(self._seq), lane, handle))

    def call_soon(  # type: ignore[override]  # (any callback, as asyncio's own loop takes)
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if self._closed:
            if self._discarding:
                return asyncio.Handle(callback, args, self, context)
            raise RuntimeError("Event loop is closed")
        if context is None:
            lane = self.lane
            context = contextvars.copy_context()
        else:
            lane = context.get(LANE, self.lane)
        handle = _new_handle(LoopHandle)  # LoopHandle.__init__ inlined: the loop's most frequent allocation
        handle._context = context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._push(lane, handle)  # (_enqueue's due-now case)
        return handle

    def call_at(  # type: ignore[override]  # (any callback, as asyncio's own loop takes)
        self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        if self._closed:
            if self._discarding:
                return asyncio.TimerHandle(when, callback, args, self, context)
            raise RuntimeError("Event loop is closed")
        lane = self.lane if context is None else context.get(LANE, self.lane)
        if self._stretch and callback is _sleep_callback and lane in self._stretch and when > self.now:
            when = self.now + stretched(when - self.now, *self._stretch[lane], now=self.now)
        handle = LoopTimerHandle(when, callback, args, self, context)
        self._enqueue(when, lane, handle)
        return handle

    def call_later(  # type: ignore[override]  # (any callback, as asyncio's own loop takes)
        self, delay: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        return self.call_at(self.now + delay, callback, *args, context=context)

    def call_soon_threadsafe(  # type: ignore[override]  # (any callback, as asyncio's own loop takes)
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if self._thread_id is not None and threading.get_ident() != self._thread_id:
            raise SimUnsupportedError("call_soon_threadsafe (from another thread)")
        return self.call_soon(callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        self._ncancelled += 1
        if self._ncancelled > 256 and self._ncancelled * 2 > len(self._heap) + len(self._far):
            self._heap = self._without_cancelled(self._heap)
            self._far = self._without_cancelled(self._far)
            self._ncancelled = 0

    @staticmethod
    def _without_cancelled(heap: list[Any]) -> list[Any]:
        kept = []
        for entry in heap:
            if entry[3]._cancelled:
                entry[3]._scheduled = False
            else:
                kept.append(entry)
        heapq.heapify(kept)
        return kept

    def pending_timers(self) -> int:
        """Timers and events scheduled for later (cancelled ones not yet dropped included)."""
        return len(self._heap) + len(self._far)

    # ------------------------------------------------------------------ running

    def _advance(self) -> tuple[int, Any] | None:
        """Jump the clock to the next timer and make everything due then ready.

        Fast path: when exactly one callback is due at that instant (the usual
        case: each delivery has its own random arrival time), return it as
        ``(lane, handle)`` instead of queueing it, and the run loop runs it at
        once. That is the order the ready queue would give (it is the only
        ready callback, and with one ready lane no strategy draws a random
        number), minus a push and a pop.
        """
        heap = self._heap
        pop = heapq.heappop
        while True:
            while heap and heap[0][3]._cancelled:
                pop(heap)[3]._scheduled = False
                self._ncancelled -= 1
            if heap:
                break
            if not self._far:
                raise _Idle
            self._bring_near(self._far[0][0] + NEAR)  # nothing near: the next far timers become near
        when, seq, lane, handle = heap[0]
        if self.time_limit is not None and when > self.time_limit:
            self.now = max(self.now, self.time_limit)
            raise SimTimeLimitError(self.time_limit)
        daemons = self._daemons
        if daemons and daemons[0][:2] < (when, seq):  # a daemon comes first (only while there is a next event)
            when, _, lane, handle = pop(daemons)
            handle._scheduled = False
            if when > self.now:
                self.now = when
            if self._note_lane is not None:
                self._note_lane(lane)
            return lane, handle
        if when > self.now:
            self.now = when
        if when + NEAR > self._bound:  # keep the near window ahead of the clock, a window at a time
            self._bring_near(when + 2 * NEAR)
        pop(heap)
        handle._scheduled = False
        if not heap or heap[0][0] > when:
            if self._note_lane is not None:
                self._note_lane(lane)  # what pushing it would do first (a PCT priority draw)
            return lane, handle
        push = self._push
        push(lane, handle)
        while heap and heap[0][0] <= when:
            _, _, lane, handle = pop(heap)
            handle._scheduled = False
            if handle._cancelled:
                self._ncancelled -= 1
            else:
                push(lane, handle)
        return None

    def _bring_near(self, bound: float) -> None:
        """Move the near/far boundary up to ``bound``: far timers due before it join the near heap.

        Why two heaps: a big run keeps tens of thousands of long timers pending
        (timeouts, sleeps), and each message delivery would pay for sifting
        through them (cache misses on every level). Deliveries land within
        ``NEAR`` of the clock, so they only ever touch the small near heap.
        The order is unchanged: every near entry is due before every far one,
        and both heaps order by (time, sequence).
        """
        self._bound = bound
        far = self._far
        if far and far[0][0] < bound:
            heap = self._heap
            pop = heapq.heappop
            push = heapq.heappush
            while far and far[0][0] < bound:
                push(heap, pop(far))

    def _callback_failed(self, handle: Any, exc: BaseException) -> None:
        self.call_exception_handler({
            "message": f"Exception in callback {handle._callback!r}",
            "exception": exc,
            "handle": handle,
        })

    def _run(self) -> None:
        """The run loop: take the next ready callback (the strategy's pick), run it; when none, advance the clock."""
        pop = self._ready.pop
        ready = self._ready.any
        stopped = self._stopped
        steps = self.steps
        limit = self.max_steps_per_instant
        deadline = steps + limit
        try:
            while not self._stopping:
                if ready:
                    lane, handle = pop()
                else:
                    before = self.now
                    due = self._advance()
                    if self.now != before:
                        deadline = steps + limit
                    if due is None:
                        continue
                    lane, handle = due  # the only callback due at this instant: run it without queueing
                if steps >= deadline:
                    raise SimLivelockError(limit, self.now)
                if handle._cancelled:
                    continue
                if lane in stopped:
                    self._divert(lane, handle)
                    continue
                self.lane = lane
                try:  # Handle._run, inlined
                    handle._context.run(handle._callback, *handle._args)
                except KeyboardInterrupt as exc:  # Ctrl-C stops the run; a rank's own ends its process
                    if lane < 0 or self.on_keyboard_interrupt is None or not self.on_keyboard_interrupt(lane, exc):
                        raise
                except SystemExit as exc:  # a process exits (sys.exit in a rank), or the simulator's own
                    if lane < 0 or self.on_system_exit is None or not self.on_system_exit(lane, exc):
                        raise
                except BaseException as exc:  # noqa: BLE001 - asyncio reports, never dies
                    self._callback_failed(handle, exc)
                steps += 1
        finally:
            self.steps = steps
            self.lane = -1

    # ------------------------------------------------------------------ futures and tasks

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def set_task_factory(self, factory: Callable[..., Any] | None) -> None:
        """As asyncio's; ``asyncio.eager_task_factory`` (3.12+) makes SimTasks started eagerly (their hashes
        from the seed, as every task of the loop's own), not tasks hashed by address."""
        self._task_factory_given = factory
        self._task_factory = self._eager_task if factory is not None and factory is _EAGER else factory

    def get_task_factory(self) -> Callable[..., Any] | None:
        return self._task_factory_given

    def _eager_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], *, name: str | None = None,
                    context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        return SimTask(coro, loop=self, hash_value=self._task_hash(62),
                       name=f"Task-{next(self._task_numbers)}" if name is None else name, context=context,
                       eager_start=True)

    def create_task(  # type: ignore[override, unused-ignore]  # (a coroutine, as asyncio's own loop takes); 3.12's stubs agree
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        if self._closed:
            if self._discarding:  # a finally block of a discarded task: drop its new task quietly
                coro.close()
            raise RuntimeError("Event loop is closed")
        if self._task_factory is None:
            task: asyncio.Task[Any] = SimTask(coro, loop=self, hash_value=self._task_hash(62),
                                              name=f"Task-{next(self._task_numbers)}" if name is None else name,
                                              context=context)
        else:
            factory = self._task_factory
            task = factory(self, coro, context=context) if context is not None else factory(self, coro)
            if name is not None:
                task.set_name(name)
        lane = self.lane if context is None else context.get(LANE, self.lane)
        tasks = self._lane_tasks.get(lane)
        if tasks is None:
            self._lane_tasks[lane] = [task]
            return task
        n = len(tasks)
        if n >= 8 and n & (n - 1) == 0:  # at powers of two: drop the ended ones (amortized O(1); few kept: memory)
            tasks[:] = [t for t in tasks if not t.done()]
        tasks.append(task)
        return task



def run(main: Coroutine[Any, Any, Any], *, seed: int | str = 0, schedule: str = "fifo",
        time_limit: float | None = None) -> Any:
    """Run one coroutine on a fresh :class:`SimLoop` (like ``asyncio.run``) and close the loop.

    Raises SimDeadlockError / SimTimeLimitError; remaining tasks are left
    unscheduled (never resumed) when the loop closes.
    """
    loop = SimLoop(seed=seed, schedule=schedule, time_limit=time_limit)  # type: ignore[abstract]  # (see _UNSUPPORTED)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()