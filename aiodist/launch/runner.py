"""Running a rank's entry function in the current process (sync or async).

Used by the bootstrap (``python -m aiodist.launch_bootstrap``) and by the
children of :func:`aiodist.spawn`: a coroutine gets a fresh event loop of its
own (uvloop's when installed, unless ``AIODIST_NO_UVLOOP=1``; see
:mod:`aiodist.eventloop`), closed when it finishes. When it returns (not when
it raises), :func:`aiodist.api.finish_rank` runs on the same loop: the rank's
groups are destroyed in order (peers are told it left) and operations never
awaited are an error. When it raises CollectiveMismatchError,
:func:`aiodist.api.finish_failed_rank` leaves in order too (bounded), so the
mismatch reports this rank sent reach every member.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ..eventloop import loop_factory

__all__ = ["call_entry", "finishing_asyncio_run", "run_awaitable"]


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


async def _main_then_finish(aw: Awaitable[Any], *, always: bool = True) -> Any:
    """Await a rank's main, then finish the rank; how it ended is recorded while the loop still runs.

    ``always=False`` (a script's own ``asyncio.run``): its end is not recorded
    here (the script may go on). Either way the rank is finished: its groups
    destroyed if it still has them, and operations never awaited an error, as
    in the simulator (:func:`~aiodist.api.finish_rank`; before, a script that
    destroyed its group itself ended with only a RuntimeWarning for them).
    """
    from ..api import finish_failed_rank, finish_rank
    from . import outcome

    try:
        result = await aw
        await finish_rank()
    except BaseException as exc:
        outcome.rank_ended(exc)
        what = outcome.raised_text(outcome.describe_exception(exc)) if isinstance(exc, Exception) else None
        # (after a mismatch: its reports reach every member before this rank leaves)
        await finish_failed_rank(exc, what=what)
        raise
    if always:  # (a script's asyncio.run: the script may go on; the bootstrap records its end)
        outcome.rank_ended(None)
    return result


def run_awaitable(aw: Awaitable[Any]) -> Any:
    """Run ``aw`` to completion on a new event loop (uvloop when available) and return its result.

    Like :func:`asyncio.run`: tasks still pending at the end are cancelled and
    the loop is closed. Must not be called from a running event loop.
    """
    coro = aw if inspect.iscoroutine(aw) else _await(aw)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def call_entry(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a rank's ``fn``; if it returns an awaitable (an ``async def``), run that, then ``finish_rank()``."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return run_awaitable(_main_then_finish(result))
    return result


def finishing_asyncio_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """``asyncio.run`` for a launched script: when its coroutine returns, the rank is finished on the same loop.

    A script run by ``aiodist run`` that calls ``asyncio.run(main())`` and never
    destroys its process group gets what a module's ``main`` gets: the group
    destroyed in order (peers are told it left) and operations never awaited
    reported as an error. Anything but a coroutine goes to ``original`` as is.
    """

    def run(main: Any, *args: Any, **kwargs: Any) -> Any:
        if not inspect.iscoroutine(main):
            return original(main, *args, **kwargs)
        return original(_main_then_finish(main, always=False), *args, **kwargs)

    run.__doc__ = original.__doc__
    return run
