"""Where in the program's own code a rank waits, or an exception came through.

Frames of asyncio and of the simulator are skipped; frames of aiodist and of
the rest of the standard library (``contextlib``, ...) are used only when the
program has none on the way (a rank waiting inside aiodist is reported at the
program's line that called it). A wait inside an ``async with`` whose context
manager is an async generator is followed into the generator, to the line it
waits on.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import sysconfig
from typing import Any

from aiodist import inflight


def _await_location(task: Any) -> str:
    """Where ``task`` is suspended: the innermost frame of the program's own code (outside aiodist,
    asyncio and sim), or the innermost one outside asyncio and sim if the program has none on the way."""
    if task is None or task.done():
        return ""
    coro = task.get_coro()
    user = inner = ""
    for _ in range(200):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
        if frame is None:
            break
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            inner = _frame_text(filename, frame.f_lineno, frame.f_code.co_name)
            if not _library(filename):
                user = inner
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
        if nxt is not None and type(nxt).__name__ in _ASYNC_GEN_STEPS:
            nxt = _driven_generator(frame)  # (the step hides its generator: the frame that awaits it holds it)
        else:
            task = _awaited_task(nxt)
            if task is not None:  # (awaiting a task: where that task waits)
                nxt = task.get_coro()
        if nxt is None or not (hasattr(nxt, "cr_frame") or hasattr(nxt, "gi_frame") or hasattr(nxt, "ag_frame")):
            break
        coro = nxt
    return user or inner


_ASYNC_GEN_STEPS = ("async_generator_asend", "async_generator_athrow")


def _awaited_task(step: Any) -> asyncio.Task[Any] | None:
    """The task a coroutine waits for when it awaits one (``await task``, or a ``gather`` of which one
    task is still running), else None. (``await`` on a future leaves only the future's iterator in
    ``cr_await``; the garbage collector's view of it gives the future.)"""
    if step is None or type(step).__name__ != "FutureIter":
        return None
    fut = next((r for r in gc.get_referents(step) if isinstance(r, asyncio.Future)), None)
    if fut is not None and not isinstance(fut, asyncio.Task):
        running = [c for c in getattr(fut, "_children", ()) if isinstance(c, asyncio.Task) and not c.done()]
        fut = running[0] if len(running) == 1 else None
    return fut if isinstance(fut, asyncio.Task) and not fut.done() else None


def _driven_generator(frame: Any) -> Any:
    """The async generator ``frame`` is running a step of (e.g. contextlib's ``self.gen``), or None."""
    for value in list(frame.f_locals.values()):
        if inspect.isasyncgen(value) and value.ag_running:
            return value
        gen = getattr(value, "gen", None)  # (a context manager object holding its generator)
        if inspect.isasyncgen(gen) and gen.ag_running:
            return gen
    return None


def _library(filename: str) -> bool:
    """aiodist, or the standard library outside asyncio (its own frames are skipped altogether)."""
    return filename.startswith(_RUNTIME_DIR) or (filename.startswith(_STDLIB_DIR) and _SITE not in filename)


def _raise_location(exc: BaseException) -> str:
    """The innermost line of the program's own code an exception came through ("" if none)."""
    where = ""
    tb_ = exc.__traceback__
    for _ in range(1000):
        if tb_ is None:
            break
        code = tb_.tb_frame.f_code
        if not code.co_filename.startswith(_SKIP_DIRS) and not _library(code.co_filename):
            where = _frame_text(code.co_filename, tb_.tb_lineno, code.co_name)
        tb_ = tb_.tb_next
    return where


def _frame_text(filename: str, line: int, name: str) -> str:
    return f"{filename}:{line} in {name}"


_SKIP_DIRS = (os.path.dirname(asyncio.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep)
_RUNTIME_DIR = os.path.dirname(os.path.abspath(inflight.__file__)) + os.sep
_STDLIB_DIR = os.path.join(sysconfig.get_paths()["stdlib"], "")
_SITE = os.sep + "site-packages" + os.sep
