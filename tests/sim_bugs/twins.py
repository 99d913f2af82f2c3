"""One body, two programs: the bug, and its twin with the fix (what runs under ``if fixed``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Program = Callable[[], Awaitable[Any]]


def twins(name: str, body: Callable[[bool], Awaitable[Any]]) -> tuple[Program, Program]:
    """The program ``name`` (the bug) and ``name_fixed``: ``body(False)`` and ``body(True)``.

    Named as ``body``'s module binds them (``name = twins("name", ...)``), so they pickle (sweeps on
    worker processes)."""

    async def buggy() -> Any:
        return await body(False)

    async def fixed() -> Any:
        return await body(True)

    for f, n in ((buggy, name), (fixed, f"{name}_fixed")):
        f.__name__ = f.__qualname__ = n
        f.__module__ = body.__module__
    return buggy, fixed
