"""Running a rank's entry function in the current process (sync or async).

Used by the bootstrap (``python -m aiodist.launch_bootstrap``) and by the
children of :func:`aiodist.spawn`: a coroutine gets a fresh event loop of its
own (uvloop's when installed, unless ``AIODIST_NO_UVLOOP=1``; see
:mod:`aiodist.eventloop`), closed when it finishes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from ..eventloop import loop_factory

__all__ = ["call_entry", "run_awaitable"]


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def run_awaitable(aw: Awaitable[Any]) -> Any:
    """Run ``aw`` to completion on a new event loop (uvloop when available) and return its result.

    Like :func:`asyncio.run`: tasks still pending at the end are cancelled and
    the loop is closed. Must not be called from a running event loop.
    """
    coro = aw if inspect.iscoroutine(aw) else _await(aw)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def call_entry(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; if it returns an awaitable (an ``async def``), run that to completion too."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return run_awaitable(result)
    return result
