"""Where in the program's own code a rank waits, or an exception came through.

Frames of asyncio and of the simulator are skipped; frames of aiodist are
used only when the program has none on the way (a rank waiting inside
aiodist is reported at the program's line that called it).
"""

from __future__ import annotations

import asyncio
import os
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
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS):
            inner = _frame_text(filename, frame.f_lineno, frame.f_code.co_name)
            if not filename.startswith(_RUNTIME_DIR):
                user = inner
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if nxt is None or not (hasattr(nxt, "cr_frame") or hasattr(nxt, "gi_frame")):
            break
        coro = nxt
    return user or inner


def _raise_location(exc: BaseException) -> str:
    """The innermost line of the program's own code an exception came through ("" if none)."""
    where = ""
    tb_ = exc.__traceback__
    for _ in range(1000):
        if tb_ is None:
            break
        code = tb_.tb_frame.f_code
        if not code.co_filename.startswith(_SKIP_DIRS + (_RUNTIME_DIR,)):
            where = _frame_text(code.co_filename, tb_.tb_lineno, code.co_name)
        tb_ = tb_.tb_next
    return where


def _frame_text(filename: str, line: int, name: str) -> str:
    return f"{filename}:{line} in {name}"


_SKIP_DIRS = (os.path.dirname(asyncio.__file__) + os.sep, os.path.dirname(os.path.abspath(__file__)) + os.sep)
_RUNTIME_DIR = os.path.dirname(os.path.abspath(inflight.__file__)) + os.sep
