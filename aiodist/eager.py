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
import contextvars
import sys
import types
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

        def eager_task(loop_: asyncio.AbstractEventLoop, coro_: Coroutine[Any, Any, Any], **kwargs: Any) -> asyncio.Task[Any]:
            # :func:`asyncio.eager_task_factory`, taking whatever else a loop passes (uvloop passes
            # ``eager_start``). The loop's own factory is back before the first step runs: a task
            # that step creates is an ordinary one, as on 3.11 (not eager too).
            loop.set_task_factory(saved)
            kwargs["eager_start"] = True
            return asyncio.Task(coro_, loop=loop_, **kwargs)

        loop.set_task_factory(eager_task)
        try:
            task = loop.create_task(coro, context=contextvars.copy_context())
        except BaseException:  # (a closed loop): the coroutine never runs; no "never awaited" for it
            coro.close()
            raise
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


class EagerStart:
    """(Python 3.11) What the first step of an eagerly started coroutine did.

    ``finished`` is True when the first step ran to the end: then ``error`` is
    what it raised (or None) and ``value`` what it returned. The task created
    for it finishes the same way at its first step.
    """

    __slots__ = ("finished", "value", "error")

    def __init__(self) -> None:
        self.finished = False
        self.value: Any = None
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        state = "running" if not self.finished else "failed" if self.error is not None else "done"
        return f"<EagerStart {state}>"


@types.coroutine
def _carry_on(coro: Coroutine[Any, Any, Any], state: EagerStart) -> Generator[Any, Any, Any]:
    """(Python 3.11) The coroutine an eager task runs: ``coro``'s first step now, the rest as the task's.

    Primed by :func:`_start_eager_311` (one ``send``: the first step runs, up to
    the bare ``yield`` after it); the task's first step carries on from there.
    A generator rather than an object with ``send``/``throw`` methods: once the
    task has waited for what the first step yielded, every later step is
    ``yield from`` -- the interpreter resumes ``coro`` directly, with no Python
    call in between. A throw before the task's first step (the task was
    cancelled before it ran) still reaches ``coro`` at its suspension point,
    where its cleanup runs; closing this generator closes ``coro``.
    """
    try:
        yielded = coro.send(None)
    except StopIteration as e:
        state.finished, state.value = True, e.value
        yield  # (the primer stops here; the task's first step ends with the same outcome)
        return e.value
    except BaseException as e:  # the task raises it again; the caller decides who sees it
        state.finished, state.error = True, e
        yield
        raise e
    exc: BaseException | None = None
    try:
        yield  # primed: the task's first step carries on from here
    except GeneratorExit:
        coro.close()
        raise
    except BaseException as e:  # noqa: BLE001 - handed to coro at its suspension point
        exc = e
    else:
        if getattr(yielded, "_asyncio_future_blocking", False) and yielded.done():
            # What the first step waits on is done already (a reply that came in before the
            # task's first turn): carry on now, as the task's wakeup would one iteration later.
            yielded._asyncio_future_blocking = False
            return (yield from coro)
    while True:  # hand what the task is waiting on to it (throws go to coro), until it resumes us
        if exc is not None:
            try:
                yielded = coro.throw(exc)
            except StopIteration as e:
                return e.value
            exc = None
        try:
            yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # noqa: BLE001 - handed to coro at its suspension point
            exc = e
            continue
        return (yield from coro)


if sys.version_info < (3, 12):  # pragma: no cover - Python 3.11: asyncio's internals, here and nowhere else
    from asyncio.tasks import _current_tasks  # type: ignore[attr-defined]
    from asyncio.tasks import _enter_task, _leave_task

    _CURRENT_TASKS: dict[asyncio.AbstractEventLoop, asyncio.Task[Any]] = _current_tasks

    def _start_eager_311(coro: Coroutine[Any, Any, Any], loop: asyncio.AbstractEventLoop) -> tuple[asyncio.Task[Any], EagerStart]:
        """Python 3.11's eager start: run the first step as the new task, through the hooks 3.12 uses.

        If the first step finished, the task only finishes the same way one
        iteration later (nothing waits for that).
        """
        state = EagerStart()
        gen = _carry_on(coro, state)
        ctx = contextvars.copy_context()
        try:
            task: asyncio.Task[Any] = loop.create_task(gen, context=ctx)
        except BaseException:  # (a closed loop): the coroutine never runs; no "never awaited" for it
            coro.close()
            raise
        caller = _CURRENT_TASKS.get(loop)
        if caller is not None:
            _leave_task(loop, caller)
        _enter_task(loop, task)
        try:
            ctx.run(gen.send, None)
        finally:
            _leave_task(loop, task)
            if caller is not None:
                _enter_task(loop, caller)
        return task, state
