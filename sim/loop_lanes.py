"""Lanes of the simulated loop: kill, retire, pause and slow one virtual process's callbacks.

A *lane* is one virtual process incarnation (see :data:`sim.loop.LANE`).
:class:`LaneControl` is the part of :class:`~sim.loop.SimLoop` that faults
and the runner use on a lane: kill it (a crash: its callbacks never run
again), retire it (the process ended), pause it until a virtual time
(SIGSTOP: its callbacks are held, in order, and run after it resumes),
stretch its sleeps (a straggler), and, at the end of a simulation, discard
every task left.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiodist.collectives.buffers import abandon

from .handles import KernelEvent

if TYPE_CHECKING:
    from .ready import FifoReady, PctReady, RandomReady

_new_handle = object.__new__

_KERNEL_CONTEXT = contextvars.Context()
"""The context of the loop's own kernel events (resuming a paused lane)."""


def stretched(delay: float, factor: float, until: float, most: float | None, *, now: float) -> float:
    """How long a sleep of ``delay`` seconds started at ``now`` lasts in a lane ``factor`` times slower until
    ``until``, at most ``most`` seconds longer (see :meth:`LaneControl.stretch_sleeps`)."""
    if until < math.inf and delay * factor > until - now:  # (it outlasts the spell: slower only during it)
        longer = max(until - now, 0.0) * (1.0 - 1.0 / factor)
    else:
        longer = delay * (factor - 1.0)
    if most is not None and longer > most:
        longer = most
    return delay + longer


class LaneControl:
    """Per-lane control of the loop; :class:`~sim.loop.SimLoop` holds the state named here."""

    now: float
    dead_lanes: set[int]
    _stopped: set[int]
    _paused: dict[int, list[Any]]
    _resume_at: dict[int, float]
    _blocked: dict[int, float]
    _now_reader: Callable[[], float]
    _firsts: dict[int, int]
    _stretch: dict[int, tuple[float, float, float | None]]  # lane -> (factor, until, most)
    _lane_tasks: dict[int, list[asyncio.Task[Any]]]
    _zombies: list[asyncio.Task[Any]]
    _graveyard: list[Any]
    _ready: FifoReady | RandomReady | PctReady
    _running: bool
    _discarding: bool

    if TYPE_CHECKING:
        def schedule(self, when: float, lane: int, callback: Callable[..., Any], args: tuple[Any, ...],
                     context: contextvars.Context, *, daemon: bool = False) -> None: ...
        def close(self) -> None: ...

    def lane_alive(self, lane: int) -> bool:
        return lane not in self.dead_lanes

    def kill_lane(self, lane: int) -> None:
        """Drop every pending and future callback of ``lane`` (a crashed process).

        Its tasks are kept referenced (never resumed, never garbage-collected
        mid-run, so no ``finally`` of theirs runs at a random moment) until
        :meth:`discard`.
        """
        self.dead_lanes.add(lane)
        self._stopped.add(lane)
        held = self._paused.pop(lane, None)
        if held:
            self._graveyard.extend(held)
        self._resume_at.pop(lane, None)
        if self._blocked.pop(lane, None) is not None:
            self._clocks()
        for task in self._lane_tasks.get(lane, ()):
            if not task.done():
                self._zombies.append(task)

    def retire_lane(self, lane: int) -> None:
        """``lane``'s process ended and none of its tasks is left: nothing of it runs again (no scan for tasks)."""
        self.dead_lanes.add(lane)
        self._stopped.add(lane)
        self._lane_tasks.pop(lane, None)

    def lane_tasks(self, lane: int) -> list[asyncio.Task[Any]]:
        """The tasks of ``lane`` that may not have ended yet, in creation order (a copy)."""
        return list(self._lane_tasks.get(lane, ()))

    def pause_lane(self, lane: int, until: float) -> None:
        """Stop ``lane`` until virtual time ``until`` (SIGSTOP, then SIGCONT).

        Nothing of it runs meanwhile: its ready callbacks, timers that fall due
        and deliveries to it wait, in order, and run after it resumes (its
        timers fire late). Pausing a paused lane extends the pause.
        """
        if lane < 0 or lane in self.dead_lanes or until <= self.now:
            return
        if lane in self._paused:
            if until <= self._resume_at[lane]:
                return
        else:
            self._paused[lane] = []
            self._firsts.pop(lane, None)
            self._stopped.add(lane)
        self._resume_at[lane] = until
        self.schedule(until, -1, self._resume_lane, (lane,), _KERNEL_CONTEXT)

    def lane_paused(self, lane: int) -> bool:
        return lane in self._paused

    def paused_until(self, lane: int) -> float | None:
        """When ``lane`` resumes, if it is paused (else None)."""
        return self._resume_at.get(lane) if lane in self._paused else None

    def block_lane(self, lane: int, seconds: float) -> float:
        """A blocking call of ``seconds`` in the running step of ``lane`` (``time.sleep``); when it ends.

        The process is stopped for that long, as by a pause: nothing else of it
        runs, its timers fire late, what it sends in the rest of this step
        leaves when the call ends (:meth:`lane_clock`), and its own clocks read
        that time. Blocking calls in one step add up.
        """
        start = self._blocked.get(lane, self.now)
        until = (start if start > self.now else self.now) + seconds
        if until > self.now:
            self._blocked[lane] = until
            self._clocks()
            self.pause_lane(lane, until)
        return until

    def _clocks(self) -> None:
        """``time()`` reads ``now`` directly while no lane blocks, else per lane (:meth:`lane_clock`)."""
        per_lane: Callable[[], float] = getattr(type(self), "time").__get__(self)  # (SimLoop.time, the method)
        setattr(self, "time", per_lane if self._blocked else self._now_reader)

    def lane_clock(self, lane: int) -> float:
        """The virtual time as ``lane`` sees it: later than the loop's while a blocking call of its step lasts."""
        until = self._blocked.get(lane)
        return until if until is not None and until > self.now else self.now

    def first_on_resume(self, lane: int, callback: Callable[..., Any], args: tuple[Any, ...],
                        context: contextvars.Context) -> None:
        """The rest of the running step of ``lane``, which was just paused: it runs first when the lane resumes.

        (Before the lane's callbacks that were due meanwhile, even those already ready at this
        instant: a receive that paused its process is read before anything that came after it.)
        """
        event = _new_handle(KernelEvent)
        event._context = context
        event._callback = callback
        event._args = args
        event._scheduled = False
        held = self._paused[lane]
        held.insert(self._firsts.get(lane, 0), event)
        self._firsts[lane] = self._firsts.get(lane, 0) + 1

    def _resume_lane(self, lane: int) -> None:
        if lane not in self._paused or self._resume_at[lane] > self.now:
            return  # killed meanwhile, or the pause was extended
        held = self._paused.pop(lane)
        del self._resume_at[lane]
        if self._blocked.pop(lane, None) is not None:
            self._clocks()
        self._firsts.pop(lane, None)
        self._stopped.discard(lane)
        if held:
            self._ready.requeue_front(lane, held)

    def _divert(self, lane: int, handle: Any) -> None:
        """A callback of a dead or paused lane came up: drop it, or hold it until the lane resumes."""
        held = self._paused.get(lane)
        if held is None:
            self._graveyard.append(handle)
        else:
            held.append(handle)

    def stretch_sleeps(self, lane: int, factor: float, until: float = math.inf, most: float | None = None) -> None:
        """Make ``asyncio.sleep`` in ``lane`` run ``factor`` times slower until ``until`` (a straggler): a sleep
        that outlasts that time is slower only while it lasts (a spell of 1 ms does not double a 10 s sleep).
        ``most``: a sleep is at most that many seconds longer (None: no bound)."""
        if factor == 1.0:
            self._stretch.pop(lane, None)
        else:
            self._stretch[lane] = (factor, until, most)

    def discard(self) -> None:
        """Close the loop and every coroutine of every unfinished task, silently.

        Their ``finally`` blocks run now; whatever they schedule is dropped and
        whatever they raise is swallowed, also what Python reports as "ignored"
        (an async generator whose cleanup awaits: nothing can run it any more).
        Use at the end of a simulation.
        """
        if self._running:
            raise RuntimeError("Cannot discard a running event loop")
        tasks = list(self._zombies) + [t for lane in self._lane_tasks.values() for t in lane]  # (before close())
        self._zombies = []
        self._graveyard = []
        self._paused.clear()
        self.close()
        self._discarding = True
        hook = sys.unraisablehook
        sys.unraisablehook = functools.partial(_dropped_world, hook)
        try:
            for task in tasks:
                # (the runtime's process-wide tables must not keep it, and this world, alive: a task done
                # too, whose done callbacks were dropped with the loop)
                abandon(task)
                if task.done():
                    continue
                coro = task.get_coro()
                if coro is None:  # (3.12+: an eager task that already finished has none)
                    continue
                try:
                    coro.close()
                except BaseException:  # noqa: BLE001 - a closed world: nothing can observe it
                    pass
        finally:
            sys.unraisablehook = hook


def _dropped_world(hook: Callable[[Any], object], unraisable: Any) -> None:
    """``sys.unraisablehook`` while a world is dropped: its coroutines' and async generators' cleanup errors are
    dropped with it (an ``async with`` left by closing, whose exit awaits); anything else goes to ``hook``."""
    if not inspect.iscoroutine(unraisable.object) and not inspect.isasyncgen(unraisable.object):
        hook(unraisable)
