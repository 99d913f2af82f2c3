"""A deterministic asyncio event loop on a virtual clock.

Design (robust across CPython 3.11+): :class:`SimLoop` subclasses
:class:`asyncio.AbstractEventLoop` directly and owns all scheduling; it does
not touch ``BaseEventLoop`` internals. Every callback of program code is an
ordinary :class:`asyncio.Handle` / :class:`asyncio.TimerHandle` (so ``Task``,
``Future``, ``asyncio.sleep``, ``asyncio.timeout`` work unchanged); the
simulator's own events (message deliveries, wake-ups: :meth:`SimLoop.post`)
are lighter, non-cancellable ``_Event`` objects. All are ordered by ONE
(time, sequence) key:

* timers live in a heap of ``(when, seq, lane, handle)``; ``seq`` is a global
  counter, so callbacks due at the same virtual instant keep FIFO order
  (asyncio's own timer heap does not guarantee this);
* callbacks due now wait in a ready queue. When it is empty the clock *jumps*
  to the earliest timer and everything due at that instant becomes ready, so
  ``await asyncio.sleep(3600)`` costs nothing.

Lanes and schedule exploration: every callback belongs to a *lane* (one per
virtual process incarnation, read from the ``context`` the callback runs in,
see :data:`LANE`). Inside a lane, callbacks always run in FIFO order, as
asyncio guarantees to a real process. Across lanes, the order of callbacks
ready at the same instant is what a real distributed system leaves open; the
``schedule`` mode chooses it:

* ``"fifo"``: global (time, sequence) order;
* ``"random"``: at every step a seeded generator picks the lane to run next;
* ``"pct"``: PCT-style: each lane gets a random priority, the highest-priority
  ready lane runs, and at ``pct_depth - 1`` random steps the running lane's
  priority drops below all others.

Lanes can be *killed* (a crashed process): their pending callbacks are
dropped and never run, so no ``finally`` block of a crashed rank runs.

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
import weakref
from asyncio import events, futures
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from .errors import SimDeadlockError, SimLivelockError, SimTimeLimitError, SimUnsupportedError

LANE: contextvars.ContextVar[int] = contextvars.ContextVar("sim_lane", default=-1)
"""The lane of the code running in a context (-1: the simulator kernel)."""

SCHEDULES = ("fifo", "random", "pct")

NEAR = 1e-3
"""Seconds ahead of the clock that count as "near" (see :meth:`SimLoop._advance`): message
deliveries land there, long timers (timeouts, sleeps) beyond it."""

_sleep_callback = futures._set_result_unless_cancelled  # what asyncio.sleep schedules
_new_handle = object.__new__


class _Handle(asyncio.Handle):
    """An asyncio.Handle built without the debug-mode check (the hot path)."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class _TimerHandle(asyncio.TimerHandle):
    """An asyncio.TimerHandle built without the debug-mode check (the hot path)."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = False


class _Event:
    """A simulator-internal callback (message delivery, wake-up): a handle without asyncio's extras.

    The loop only reads ``_cancelled``, ``_context``, ``_callback`` and
    ``_args`` and writes ``_scheduled``; these are never cancelled and never
    handed to user code, so they skip TimerHandle's bookkeeping.
    """

    __slots__ = ("_context", "_callback", "_args", "_scheduled")
    _cancelled = False

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...],
                 context: contextvars.Context) -> None:
        self._context = context
        self._callback = callback
        self._args = args
        self._scheduled = False

    def __repr__(self) -> str:
        return f"<sim event {getattr(self._callback, '__qualname__', self._callback)!r}>"


class _Idle(Exception):
    """Internal: nothing ready, nothing scheduled."""


_read_now = operator.attrgetter("_now")
_read_debug = operator.attrgetter("_debug")


class SimLoop(asyncio.AbstractEventLoop):
    """Deterministic virtual-time event loop. See the module docstring.

    ``time_limit``: virtual time beyond which :meth:`run_until_complete` raises
    :class:`SimTimeLimitError` instead of jumping the clock;
    ``max_steps_per_instant``: callbacks allowed at one virtual instant before
    :class:`SimLivelockError` (a ``sleep(0)`` spin would otherwise never end).
    ``pct_steps`` is PCT's estimate k of the run's length in steps (where its
    change points fall). ``on_step`` is an optional callable invoked after
    every callback with the lane that ran (keep ``None`` for speed).
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
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self._now = 0.0
        # time() and create_future() run several times per simulated message: as C callables
        # (no Python frame) they shadow the methods below, which say what they do.
        self.time = functools.partial(_read_now, self)  # type: ignore[method-assign]
        self.create_future = functools.partial(asyncio.Future, loop=self)  # type: ignore[method-assign]
        self.get_debug = functools.partial(_read_debug, self)  # type: ignore[method-assign]  # (every Future asks)
        self._seq = itertools.count()
        # Timers in two heaps of (when, seq, lane, handle): every entry of ``_heap`` is due before
        # ``_bound`` and every entry of ``_far`` at or after it (see _advance).
        self._heap: list[tuple[float, int, int, asyncio.TimerHandle]] = []
        self._far: list[tuple[float, int, int, asyncio.TimerHandle]] = []
        self._bound = NEAR
        self._ncancelled = 0
        self._lane = -1
        self._dead: set[int] = set()
        self._stretch: dict[int, float] = {}
        self._closed = False
        self._discarding = False
        self._task_lane: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
        self._zombies: list[asyncio.Task[Any]] = []
        self._graveyard: list[asyncio.Handle] = []  # dropped callbacks of dead lanes, kept alive until discard()
        self._running = False
        self._stopping = False
        self._debug = False
        self._exc_handler: Callable[..., Any] | None = None
        self._task_factory: Callable[..., Any] | None = None
        self._thread_id: int | None = None
        self.time_limit = time_limit
        self.max_steps_per_instant = max_steps_per_instant
        self.steps = 0
        self.unhandled: list[dict[str, Any]] = []
        self.on_step: Callable[[int], None] | None = None
        self.schedule = schedule
        self._fifo = schedule == "fifo"
        self._rng = random.Random(f"{seed}:schedule")
        if schedule == "fifo":
            self._ready: deque[tuple[int, asyncio.Handle]] = deque()
            self._push = self._push_fifo
        else:
            self._lanes: dict[int, deque[asyncio.Handle]] = {}
            self._active: list[int] = []
            self._push = self._push_lane
            self._prio: dict[int, float] = {}
            self._pct_depth = max(1, pct_depth)
            self._change_points = sorted(self._rng.randrange(max(1, pct_steps)) for _ in range(self._pct_depth - 1))

    # ------------------------------------------------------------------ clock

    def time(self) -> float:
        """Virtual seconds since the loop was created."""
        return self._now

    # ------------------------------------------------------------------ scheduling

    def _push_fifo(self, lane: int, handle: asyncio.Handle) -> None:
        self._ready.append((lane, handle))

    def _new_lane(self, lane: int) -> deque[asyncio.Handle]:
        dq: deque[asyncio.Handle] = deque()
        self._lanes[lane] = dq
        if self.schedule == "pct":
            self._prio[lane] = self._pct_depth + self._rng.random()
        return dq

    def _push_lane(self, lane: int, handle: asyncio.Handle) -> None:
        dq = self._lanes.get(lane)
        if dq is None:
            dq = self._new_lane(lane)
        if not dq:
            self._active.append(lane)
        dq.append(handle)

    def call_soon(
        self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        if self._closed:
            if self._discarding:
                return asyncio.Handle(callback, args, self, context)
            raise RuntimeError("Event loop is closed")
        if context is None:
            lane = self._lane
            context = contextvars.copy_context()
        else:
            lane = context.get(LANE, self._lane)
        handle = _new_handle(_Handle)  # _Handle.__init__ inlined: the loop's most frequent allocation
        handle._context = context
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        if self._fifo:
            self._ready.append((lane, handle))
            return handle
        dq = self._lanes.get(lane)
        if dq:
            dq.append(handle)
        elif dq is not None:
            self._active.append(lane)
            dq.append(handle)
        else:
            self._push_lane(lane, handle)
        return handle

    def call_at(
        self, when: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        if self._closed:
            if self._discarding:
                return asyncio.TimerHandle(when, callback, args, self, context)
            raise RuntimeError("Event loop is closed")
        lane = self._lane if context is None else context.get(LANE, self._lane)
        if self._stretch and callback is _sleep_callback and lane in self._stretch and when > self._now:
            when = self._now + (when - self._now) * self._stretch[lane]
        handle = _TimerHandle(when, callback, args, self, context)
        if when <= self._now:
            self._push(lane, handle)
        else:
            handle._scheduled = True  # type: ignore[attr-defined]
            heapq.heappush(self._heap if when < self._bound else self._far, (when, next(self._seq), lane, handle))
        return handle

    def call_later(
        self, delay: float, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_in_lane(self, when: float, lane: int, callback: Callable[..., Any], *args: Any,
                     context: contextvars.Context | None = None) -> None:
        """Simulator-internal: run ``callback(*args)`` at ``when`` in an explicit ``lane`` (not cancellable)."""
        self.post(when, lane, callback, args, context if context is not None else contextvars.copy_context())

    def post(self, when: float, lane: int, callback: Callable[..., Any], args: tuple[Any, ...],
             context: contextvars.Context) -> None:
        """:meth:`call_in_lane` for the hot path: ``args`` as a tuple, ``context`` given."""
        event = _Event(callback, args, context)
        if when <= self._now:
            self._push(lane, event)  # type: ignore[arg-type]
        else:
            event._scheduled = True
            heapq.heappush(self._heap if when < self._bound else self._far,  # type: ignore[arg-type]
                           (when, next(self._seq), lane, event))

    def call_soon_threadsafe(
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

    # ------------------------------------------------------------------ lanes

    def kill_lane(self, lane: int) -> None:
        """Drop every pending and future callback of ``lane`` (a crashed process).

        Its tasks are kept referenced (never resumed, never garbage-collected
        mid-run, so no ``finally`` of theirs runs at a random moment) until
        :meth:`discard`.
        """
        self._dead.add(lane)
        for task, task_lane in list(self._task_lane.items()):
            if task_lane == lane and not task.done():
                self._zombies.append(task)

    def discard(self) -> None:
        """Close the loop and every coroutine of every unfinished task, silently.

        Their ``finally`` blocks run now; whatever they schedule is dropped and
        whatever they raise is swallowed. Use at the end of a simulation.
        """
        if self._running:
            raise RuntimeError("Cannot discard a running event loop")
        tasks = list(self._zombies) + list(self._task_lane.keys())  # before close() drops the queues
        self._zombies = []
        self._graveyard = []
        self.close()
        self._discarding = True
        for task in tasks:
            if task.done():
                continue
            coro = task.get_coro()
            try:
                coro.close()  # type: ignore[union-attr]
            except BaseException:  # noqa: BLE001 - a closed world: nothing can observe it
                pass

    def lane_alive(self, lane: int) -> bool:
        return lane not in self._dead

    def stretch_sleeps(self, lane: int, factor: float) -> None:
        """Make ``asyncio.sleep`` in ``lane`` last ``factor`` times longer (a straggler)."""
        if factor == 1.0:
            self._stretch.pop(lane, None)
        else:
            self._stretch[lane] = factor

    @property
    def current_lane(self) -> int:
        return self._lane

    # ------------------------------------------------------------------ running

    def _advance(self) -> tuple[int, asyncio.Handle] | None:
        """Jump the clock to the next timer and make everything due then ready.

        Fast path: when exactly one callback is due at that instant (the usual
        case: each delivery has its own random arrival time), return it as
        ``(lane, handle)`` instead of queueing it, and the run loop runs it at
        once. That is the order the ready queue would give (it is the only
        ready callback, and with one ready lane no schedule draws a random
        number), minus a push and a pop.
        """
        heap = self._heap
        pop = heapq.heappop
        while True:
            while heap and heap[0][3]._cancelled:  # type: ignore[attr-defined]
                pop(heap)[3]._scheduled = False  # type: ignore[attr-defined]
                self._ncancelled -= 1
            if heap:
                break
            if not self._far:
                raise _Idle
            self._bring_near(self._far[0][0] + NEAR)  # nothing near: the next far timers become near
        when, _, lane, handle = heap[0]
        if self.time_limit is not None and when > self.time_limit:
            self._now = max(self._now, self.time_limit)
            raise SimTimeLimitError(self.time_limit)
        if when > self._now:
            self._now = when
        if when + NEAR > self._bound:  # keep the near window ahead of the clock, a window at a time
            self._bring_near(when + 2 * NEAR)
        pop(heap)
        handle._scheduled = False  # type: ignore[attr-defined]
        if not heap or heap[0][0] > when:
            if not self._fifo and lane not in self._lanes:
                self._new_lane(lane)  # what _push_lane would do first (a PCT priority draw)
            return lane, handle
        if self._fifo:
            ready = self._ready
            ready.append((lane, handle))
            while heap and heap[0][0] <= when:
                _, _, lane, handle = pop(heap)
                handle._scheduled = False  # type: ignore[attr-defined]
                if handle._cancelled:  # type: ignore[attr-defined]
                    self._ncancelled -= 1
                else:
                    ready.append((lane, handle))
            return None
        self._push_lane(lane, handle)
        lanes = self._lanes
        while heap and heap[0][0] <= when:
            _, _, lane, handle = pop(heap)
            handle._scheduled = False  # type: ignore[attr-defined]
            if handle._cancelled:  # type: ignore[attr-defined]
                self._ncancelled -= 1
                continue
            dq = lanes.get(lane)
            if dq:
                dq.append(handle)
            elif dq is not None:
                self._active.append(lane)
                dq.append(handle)
            else:
                self._push_lane(lane, handle)
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

    def _callback_failed(self, handle: asyncio.Handle, exc: BaseException) -> None:
        self.call_exception_handler({
            "message": f"Exception in callback {handle._callback!r}",  # type: ignore[attr-defined]
            "exception": exc,
            "handle": handle,
        })

    def _run_fifo(self) -> None:
        ready = self._ready
        dead = self._dead
        on_step = self.on_step
        steps = 0
        limit = self.max_steps_per_instant
        deadline = limit
        try:
            while not self._stopping:
                if ready:
                    if steps >= deadline:
                        raise SimLivelockError(limit, self._now)
                    lane, handle = ready.popleft()
                    if handle._cancelled:  # type: ignore[attr-defined]
                        continue
                else:
                    before = self._now
                    due = self._advance()
                    if self._now != before:
                        deadline = steps + limit
                    if due is None:
                        continue
                    lane, handle = due  # the only callback due at this instant: run it without queueing
                    if steps >= deadline:  # (only with max_steps_per_instant=0: the clock just moved)
                        raise SimLivelockError(limit, self._now)
                if lane in dead:
                    self._graveyard.append(handle)
                    continue
                self._lane = lane
                try:  # Handle._run, inlined
                    handle._context.run(handle._callback, *handle._args)  # type: ignore[attr-defined]
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:  # noqa: BLE001 - asyncio reports, never dies
                    self._callback_failed(handle, exc)
                steps += 1
                if on_step is not None:
                    on_step(lane)
        finally:
            self.steps += steps
            self._lane = -1

    def _pick_pct(self) -> int:
        active = self._active
        prio = self._prio
        best = 0
        best_p = prio[active[0]]
        for i in range(1, len(active)):
            p = prio[active[i]]
            if p > best_p:
                best, best_p = i, p
        return best

    def _run_lanes(self) -> None:
        lanes = self._lanes
        active = self._active
        dead = self._dead
        on_step = self.on_step
        rand = self._rng.random
        is_random = self.schedule == "random"
        change_points = self._change_points
        steps = self.steps
        limit = self.max_steps_per_instant
        deadline = steps + limit
        try:
            while not self._stopping:
                n = len(active)
                if n:
                    if steps >= deadline:
                        raise SimLivelockError(limit, self._now)
                    if n == 1:
                        i = 0
                    elif is_random:
                        i = int(rand() * n)
                    else:
                        i = self._pick_pct()
                    lane = active[i]
                    dq = lanes[lane]
                    handle = dq.popleft()
                    if not dq:
                        active[i] = active[-1]
                        active.pop()
                    if handle._cancelled:  # type: ignore[attr-defined]
                        continue
                else:
                    before = self._now
                    due = self._advance()
                    if self._now != before:
                        deadline = steps + limit
                    if due is None:
                        continue
                    lane, handle = due  # the only callback due at this instant: run it without queueing
                    if steps >= deadline:  # (only with max_steps_per_instant=0: the clock just moved)
                        raise SimLivelockError(limit, self._now)
                if lane in dead:
                    self._graveyard.append(handle)
                    continue
                self._lane = lane
                try:  # Handle._run, inlined
                    handle._context.run(handle._callback, *handle._args)  # type: ignore[attr-defined]
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:  # noqa: BLE001 - asyncio reports, never dies
                    self._callback_failed(handle, exc)
                steps += 1
                if change_points and steps >= change_points[0]:
                    k = self._pct_depth - len(change_points)
                    change_points.pop(0)
                    self._prio[lane] = float(self._pct_depth - k)
                if on_step is not None:
                    on_step(lane)
        finally:
            self.steps = steps
            self._lane = -1

    def run_forever(self) -> None:
        """Run until :meth:`stop`. Raises SimTimeLimitError; returns when idle is impossible.

        Raises the internal ``_Idle`` when nothing can ever run again; use
        :meth:`run_until_complete` which turns that into SimDeadlockError.
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._running:
            raise RuntimeError("This event loop is already running")
        previous = events._get_running_loop()
        events._set_running_loop(self)
        self._running = True
        self._thread_id = threading.get_ident()
        try:
            if self.schedule == "fifo":
                self._run_fifo()
            else:
                self._run_lanes()
        finally:
            self._stopping = False
            self._running = False
            self._thread_id = None
            events._set_running_loop(previous)

    def run_until_complete(self, future: Any) -> Any:
        """Run until ``future`` is done and return its result.

        Raises :class:`SimDeadlockError` if nothing can run any more while it is
        pending, :class:`SimTimeLimitError` past ``time_limit``. In both cases
        the future is left pending (the caller decides whether to cancel it).
        """
        fut = asyncio.ensure_future(future, loop=self)
        fut.add_done_callback(self._stop_cb)
        try:
            self.run_until_idle_or_stopped()
        finally:
            fut.remove_done_callback(self._stop_cb)
        if not fut.done():
            raise SimDeadlockError(
                f"deadlock at virtual time {self._now:.6f}s: nothing is ready, no timer is pending, "
                "and the awaited work is not done"
            )
        return fut.result()

    def run_until_idle_or_stopped(self) -> bool:
        """Run until :meth:`stop` is called (True) or nothing can ever run again (False)."""
        try:
            self.run_forever()
        except _Idle:
            return False
        return True

    def _stop_cb(self, _fut: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping = True

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._running:
            raise RuntimeError("Cannot close a running event loop")
        self._closed = True
        self._heap.clear()
        self._far.clear()
        if self.schedule == "fifo":
            self._ready.clear()
        else:
            self._lanes.clear()
            self._active.clear()

    async def shutdown_asyncgens(self) -> None:
        return None

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        return None

    # ------------------------------------------------------------------ executors (threads), inline

    executor_cost: float | Callable[[Callable[..., Any], tuple[Any, ...]], float] = 0.0
    """Virtual seconds an offloaded call takes: a number, or ``cost(func, args)`` (see run_in_executor)."""

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``func(*args)`` now, inline, and resolve the future ``executor_cost`` virtual seconds later.

        What a thread pool (``asyncio.to_thread``, any ``executor``) would do,
        without a thread: the call runs to its end before anything else, in
        the caller's context; meanwhile the loop goes on, as it would beside a
        thread. Its result or exception is delivered when the charged time
        has passed. A function that blocks waiting for the loop (e.g.
        ``run_coroutine_threadsafe(...).result()``) cannot work this way.
        """
        fut = self.create_future()
        try:
            outcome, failed = func(*args), False
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - the thread's error goes to whoever awaits
            outcome, failed = exc, True
        cost = self.executor_cost
        delay = float(cost(func, args) if callable(cost) else cost)
        self.call_at(self._now + delay, _settle, fut, outcome, failed)
        return fut

    def set_default_executor(self, executor: Any) -> None:
        """Accepted and unused: offloaded calls run inline (see :meth:`run_in_executor`)."""

    # ------------------------------------------------------------------ futures and tasks

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        if self._closed:
            if self._discarding:  # a finally block of a discarded task: drop its new task quietly
                coro.close()
            raise RuntimeError("Event loop is closed")
        if self._task_factory is None:
            task = asyncio.Task(coro, loop=self, name=name, context=context)
        else:
            factory = self._task_factory
            task = factory(self, coro, context=context) if context is not None else factory(self, coro)
            if name is not None:
                task.set_name(name)
        self._task_lane[task] = self._lane if context is None else context.get(LANE, self._lane)
        return task

    def set_task_factory(self, factory: Callable[..., Any] | None) -> None:
        self._task_factory = factory

    def get_task_factory(self) -> Callable[..., Any] | None:
        return self._task_factory

    # ------------------------------------------------------------------ errors and debug

    def get_exception_handler(self) -> Callable[..., Any] | None:
        return self._exc_handler

    def set_exception_handler(self, handler: Callable[..., Any] | None) -> None:
        self._exc_handler = handler

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        """Record (never print) what asyncio reports: the simulation result lists it."""
        self.unhandled.append(context)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if self._exc_handler is None:
            self.default_exception_handler(context)
        else:
            try:
                self._exc_handler(self, context)
            except Exception as exc:  # noqa: BLE001 - mirror asyncio: never let the handler kill the loop
                self.default_exception_handler({"message": "exception in exception handler", "exception": exc})

    def get_debug(self) -> bool:
        return self._debug

    def set_debug(self, enabled: bool) -> None:
        self._debug = enabled


def _unsupported(name: str) -> Callable[..., Any]:
    def method(self: SimLoop, *args: Any, **kwargs: Any) -> Any:
        raise SimUnsupportedError(name)

    method.__name__ = name
    method.__doc__ = f"Not available in the simulator: raises SimUnsupportedError({name!r})."
    return method


def _settle(fut: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if fut.cancelled():
        return
    if failed:
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


_UNSUPPORTED = (
    "getaddrinfo", "getnameinfo", "create_connection",
    "create_server", "sendfile", "start_tls", "create_unix_connection", "create_unix_server",
    "connect_accepted_socket", "create_datagram_endpoint", "connect_read_pipe", "connect_write_pipe",
    "subprocess_shell", "subprocess_exec", "add_reader", "remove_reader", "add_writer", "remove_writer",
    "sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into", "sock_sendall", "sock_sendto",
    "sock_connect", "sock_accept", "sock_sendfile", "add_signal_handler", "remove_signal_handler",
)
for _name in _UNSUPPORTED:
    setattr(SimLoop, _name, _unsupported(_name))
del _name


def run(main: Coroutine[Any, Any, Any], *, seed: int | str = 0, schedule: str = "fifo",
        time_limit: float | None = None) -> Any:
    """Run one coroutine on a fresh :class:`SimLoop` (like ``asyncio.run``) and close the loop.

    Raises SimDeadlockError / SimTimeLimitError; remaining tasks are left
    unscheduled (never resumed) when the loop closes.
    """
    loop = SimLoop(seed=seed, schedule=schedule, time_limit=time_limit)
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()
