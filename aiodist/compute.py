"""Running blocking computation off the event loop, so that communication in flight goes on meanwhile.

The rule: a rank's communication progresses only while its event loop runs.
A computation that blocks the loop (a long numpy call inside a coroutine)
holds up every operation in flight: an ``all_reduce`` started before 300 ms
of inline numpy work is finished only after it (and a loop blocked longer
than the heartbeat timeout makes the rank look hung to its peers). Started
with :func:`compute`, the same work runs in a worker thread; numpy releases
the GIL in its heavy loops, so the loop keeps sending and receiving, and the
``all_reduce`` is done when the computation is::

    h = aiodist.all_reduce(grads)                       # starts now
    loss = await aiodist.compute(forward, batch, w)      # runs in a thread meanwhile
    await h

Pure-Python work holds the GIL and gains little (the loop only runs in its
gaps); numpy's large array operations and BLAS release it.

It goes through :func:`asyncio.to_thread` (the rank's context variables
included), so the simulator, which runs ``to_thread`` inline on its virtual
clock, runs it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["compute"]

P = ParamSpec("P")
R = TypeVar("R")


async def compute(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run ``fn(*args, **kwargs)`` in a worker thread and return its result; the event loop runs meanwhile.

    Cancellation: the awaiting task is cancelled at once, but a thread cannot
    be interrupted: ``fn`` runs to its end in the background and its result
    is dropped. ``fn`` must not use the event loop or call aiodist itself.
    """
    return await asyncio.to_thread(fn, *args, **kwargs)
