"""Ready queues: the order in which the loop runs callbacks that are due at the same virtual instant.

Every callback belongs to a *lane* (one virtual process incarnation).
Inside a lane callbacks always run in FIFO order, as asyncio promises a real
process; across lanes the order is what a distributed system leaves open, and
a strategy picks it:

* :class:`FifoReady` (``"fifo"``): global arrival order;
* :class:`RandomReady` (``"random"``): each step a seeded generator picks the
  lane to run next among those with something ready;
* :class:`PctReady` (``"pct"``): PCT (Burckhardt et al., ASPLOS 2010): each
  lane gets a random priority, the highest ready lane runs, and at
  ``depth - 1`` random steps the running lane drops below all others.

All three have the same interface: ``push(lane, handle)``; ``pop()`` returns
``(lane, handle)`` (raises :class:`IndexError` when empty); ``any`` is a
container that is non-empty exactly when something is ready (a C-level truth
test for the loop's hot path); ``requeue_front(lane, handles)`` puts callbacks
back ahead of the lane's other ready callbacks (a paused lane that resumes);
``clear()``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from typing import Any

SCHEDULES = ("fifo", "random", "pct")

Handle = Any  # an asyncio.Handle or the loop's lighter kernel event


class FifoReady:
    """One global FIFO of ``(lane, handle)``."""

    __slots__ = ("_q", "pop", "any")

    def __init__(self) -> None:
        self._q: deque[tuple[int, Handle]] = deque()
        self.any = self._q
        self.pop = self._q.popleft  # (a C method)

    def __repr__(self) -> str:
        return f"<FifoReady {len(self._q)} ready>"

    def __len__(self) -> int:
        return len(self._q)

    def push(self, lane: int, handle: Handle) -> None:
        self._q.append((lane, handle))

    def requeue_front(self, lane: int, handles: Iterable[Handle]) -> None:
        """``handles`` of ``lane`` run before the lane's callbacks already queued (others keep their places)."""
        q = self._q
        mine = [item for item in q if item[0] == lane]
        if mine:
            others = [item for item in q if item[0] != lane]
            q.clear()
            q.extend(others)
        q.extend((lane, h) for h in handles)
        q.extend(mine)

    def clear(self) -> None:
        self._q.clear()


class RandomReady:
    """A FIFO per lane; ``pop`` picks a random lane among those with something ready."""

    __slots__ = ("_lanes", "_active", "_rand", "any", "_change_points")

    def __init__(self, rng: random.Random, depth: int = 3, steps: int = 100_000) -> None:
        self._lanes: dict[int, deque[Handle]] = {}
        self._active: list[int] = []  # lanes with a non-empty queue, in no particular order
        self.any = self._active
        self._rand = rng.random
        # PCT's change points (only PctReady uses them): drawn by both, so that the "random" and
        # "pct" schedules of one seed pick lanes from the same generator state.
        self._change_points = sorted(rng.randrange(max(1, steps)) for _ in range(max(1, depth) - 1))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {len(self)} ready in {len(self._active)} lanes>"

    def __len__(self) -> int:
        return sum(len(self._lanes[lane]) for lane in self._active)

    def _new_lane(self, lane: int) -> deque[Handle]:
        dq: deque[Handle] = deque()
        self._lanes[lane] = dq
        return dq

    def push(self, lane: int, handle: Handle) -> None:
        dq = self._lanes.get(lane)
        if dq is None:
            dq = self._new_lane(lane)
        if not dq:
            self._active.append(lane)
        dq.append(handle)

    def _pick(self, active: list[int]) -> int:
        return int(self._rand() * len(active))

    def pop(self) -> tuple[int, Handle]:
        active = self._active
        n = len(active)
        if n == 1:
            i = 0  # one lane ready: no draw (the common case between deliveries)
        elif n:
            i = self._pick(active)
        else:
            raise IndexError("pop from an empty ready queue")
        lane = active[i]
        dq = self._lanes[lane]
        handle = dq.popleft()
        if not dq:
            active[i] = active[-1]
            active.pop()
        return lane, handle

    def requeue_front(self, lane: int, handles: Iterable[Handle]) -> None:
        dq = self._lanes.get(lane)
        if dq is None:
            dq = self._new_lane(lane)
        was_empty = not dq
        dq.extendleft(reversed(list(handles)))
        if was_empty and dq:
            self._active.append(lane)

    def clear(self) -> None:
        self._lanes.clear()
        self._active.clear()


class PctReady(RandomReady):
    """PCT: the highest-priority ready lane runs; ``depth - 1`` change points demote the running lane."""

    __slots__ = ("_prio", "_depth", "_pops", "_rng")

    def __init__(self, rng: random.Random, depth: int, steps: int) -> None:
        super().__init__(rng, depth, steps)
        self._rng = rng
        self._depth = max(1, depth)
        self._prio: dict[int, float] = {}
        self._pops = 0

    def _new_lane(self, lane: int) -> deque[Handle]:
        self._prio[lane] = self._depth + self._rng.random()  # above every demoted priority (< depth)
        return super()._new_lane(lane)

    def _pick(self, active: list[int]) -> int:
        prio = self._prio
        best, best_p = 0, prio[active[0]]
        for i in range(1, len(active)):
            p = prio[active[i]]
            if p > best_p:
                best, best_p = i, p
        return best

    def pop(self) -> tuple[int, Handle]:
        lane, handle = super().pop()
        self._pops += 1
        cps = self._change_points
        if cps and self._pops >= cps[0]:
            cps.pop(0)
            self._prio[lane] = float(len(cps) + 1)  # the k-th change point: priority depth - k
        return lane, handle

    def note_lane(self, lane: int) -> None:
        """A lane seen for the first time outside the queue (the loop's lone-callback fast path) gets its priority."""
        if lane not in self._lanes:
            self._new_lane(lane)


def new_ready(schedule: str, rng: random.Random, *, pct_depth: int = 3, pct_steps: int = 100_000
              ) -> FifoReady | RandomReady | PctReady:
    """The ready queue for a ``schedule`` name (one of :data:`SCHEDULES`)."""
    if schedule == "fifo":
        return FifoReady()
    if schedule == "random":
        return RandomReady(rng, pct_depth, pct_steps)
    if schedule == "pct":
        return PctReady(rng, pct_depth, pct_steps)
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
