"""Start a task by running its first step at once: asyncio's eager tasks (3.12+), and the same on 3.11.

A collective is started when it is called (its sequence number is taken then)
and runs in a task of its own, so that several can be in flight. A plain
``create_task`` runs the first step one loop iteration later: for a small
message that iteration is a good part of the latency (the send goes out
late, the receive is posted late). :func:`start_eager` creates the task and
runs the coroutine up to its first suspension right away, inside the task's
context and with the task as :func:`asyncio.current_task` (so code that
cancels "itself" on a timeout cancels the right task); the task then carries
on from that suspension. A coroutine that never suspends (a broadcast root
handing its message to the socket) finishes before the call returns.

On Python 3.12 and later this is asyncio's own eager start
(:func:`asyncio.eager_task_factory`), through the loop's ``create_task`` so
that a loop that keeps track of its tasks (the simulator's) sees this one
too. Python 3.11 has no eager tasks: :func:`_start_eager_311` does the same
with the hooks 3.12's eager tasks are built on; it is the only code here
that touches asyncio's internals.

No I/O and no clock: only the order of steps changes, so the simulator stays
deterministic.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from collections.abc import Callable, Coroutine, Generator
from typing import Any

__all__ = ["EagerStart", "FirstStep", "running_task", "start_eager"]




class FirstStep:
    """What the first step of an eagerly started task did.

    ``finished``: the coroutine ran to its end in the first step; then
    ``error`` is what it raised (or None) and ``value`` what it returned.
    """

    __slots__ = ("finished", "_task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self.finished = task.done()

    def __repr__(self) -> str:
        state = "running" if not self.finished else "failed" if self.error is not None else "done"
        return f"<FirstStep {state}>"

    @property
    def error(self) -> BaseException | None:
        """(Asked only when needed: asking marks the task's exception as retrieved.)"""
        if not self.finished:
            return None
        if self._task.cancelled():
            return asyncio.CancelledError()
        return self._task.exception()

    @property
    def value(self) -> Any:
        return self._task.result() if self.finished and self.error is None else None


if sys.version_info >= (3, 12):

    def _eager_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
        """:func:`asyncio.eager_task_factory`, taking whatever else a loop passes (uvloop passes ``eager_start``)."""
        kwargs["eager_start"] = True
        return asyncio.Task(coro, loop=loop, **kwargs)

    running_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None] = asyncio.current_task

    def start_eager(coro: Coroutine[Any, Any, Any],
                    loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Task[Any], FirstStep | EagerStart]:
        """Create a task for ``coro`` and run its first step now; return the task and what the step did.

        Must be called from code running in ``loop`` (in a task or a callback).
        The first step runs in the task's own context copy and as the current
        task. A task whose first step finished is done when this returns.
        Cancelling the task later finishes the coroutine's remaining steps with
        a CancelledError at its suspension point, as for any task. (The loop's
        own task factory, if it has one, is not used for this task.)
        """
        saved = loop.get_task_factory()
        loop.set_task_factory(_eager_task)
        try:
            task = loop.create_task(coro, context=contextvars.copy_context())
        finally:
            loop.set_task_factory(saved)
        return task, FirstStep(task)

else:  # pragma: no cover - Python 3.11

    def running_task(loop: asyncio.AbstractEventLoop) -> asyncio.Task[Any] | None:
        """``asyncio.current_task(loop)`` without its Python frame (3.11's is a Python function)."""
        return _CURRENT_TASKS.get(loop)

    def start_eager(coro: Coroutine[Any, Any, Any],
                    loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Task[Any], FirstStep | EagerStart]:
        """See the 3.12+ version: the same, with the task finishing one iteration later if its first step did."""
        return _start_eager_311(coro, loop)


class EagerStart(collections.abc.Coroutine):  # type: ignore[type-arg]
    """(Python 3.11) An eagerly started coroutine: what its first step did, and the coroutine its task runs from there.

    ``finished`` is True when the first step ran to the end: then ``error`` is
    what it raised (or None) and ``value`` what it returned. The task created
    for it finishes the same way at its first step.

    As the task's coroutine it carries on from the first suspension. A class
    rather than a generator so that a throw before the task's first step (the
    task was cancelled before it ran) still reaches the coroutine at its
    suspension point, where its cleanup (``except CancelledError``/``finally``)
    runs. (One object for both roles: it is made for every collective.)
    """

    __slots__ = ("finished", "value", "error", "_coro", "_yielded", "_started")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None
        self._coro = coro
        self._yielded: Any = None  # what the first step yielded (the future it waits on)
        self._started = False  # the task ran its first step (it took over from first_step)

    def __repr__(self) -> str:
        state = "running" if not self.finished else "failed" if self.error is not None else "done"
        return f"<EagerStart {state}>"

    def first_step(self) -> None:
        try:
            self._yielded = self._coro.send(None)
        except StopIteration as e:
            self.finished, self.value = True, e.value
        except BaseException as e:  # the task raises it again; the caller decides who sees it
            self.finished, self.error = True, e

    def _first(self) -> Any:
        self._started = True
        if self.finished:
            if self.error is not None:
                raise self.error
            raise StopIteration(self.value)
        fut = self._yielded
        self._yielded = None
        if getattr(fut, "_asyncio_future_blocking", False) and fut.done():
            # What the first step waits on is done already (a reply that came in before the
            # task's first turn): carry on now, as the task's wakeup would one iteration later.
            fut._asyncio_future_blocking = False
            return self._coro.send(None)
        return fut

    def send(self, value: Any) -> Any:
        if not self._started:
            return self._first()  # what the first step yielded: the task waits on it now
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if not self._started:
            self._started = True
            if self.finished:  # nothing left to interrupt
                raise typ if val is None else val
        exc = typ if val is None else val
        return self._coro.throw(exc)

    def close(self) -> None:
        if not self.finished:
            self._coro.close()

    @property
    def __name__(self) -> str:  # what asyncio shows for the task's coroutine
        coro = self._coro
        return str(getattr(coro, "__qualname__", None) or getattr(coro, "__name__", "eager"))

    def __await__(self) -> Generator[Any, Any, Any]:
        return self

    def __iter__(self) -> EagerStart:
        return self

    def __next__(self) -> Any:
        return self.send(None)


if sys.version_info < (3, 12):  # pragma: no cover - Python 3.11: asyncio's internals, here and nowhere else
    from asyncio.tasks import _current_tasks  # type: ignore[attr-defined]
    from asyncio.tasks import _enter_task, _leave_task

    _CURRENT_TASKS: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = _current_tasks

    def _start_eager_311(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Task[Any], EagerStart]:
        """Python 3.11's eager start: run the first step as the new task, through the hooks 3.12 uses.

        If the first step finished, the task only finishes the same way one
        iteration later (nothing waits for that).
        """
        state = EagerStart(coro)
        ctx = contextvars.copy_context()
        task: asyncio.Task[Any] = loop.create_task(state, context=ctx)
        caller = _CURRENT_TASKS.get(loop)
        if caller is not None:
            _leave_task(loop, caller)
        _enter_task(loop, task)
        try:
            ctx.run(state.first_step)
        finally:
            _leave_task(loop, task)
            if caller is not None:
                _enter_task(loop, caller)
        return task, state
