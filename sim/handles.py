"""The loop's callback objects: asyncio handles built without their debug-mode checks, and kernel events.

Program code gets ordinary :class:`asyncio.Handle` / :class:`asyncio.TimerHandle`
subclasses (so cancellation, ``when()`` and reprs work as asyncio's); the
simulator's own callbacks (:meth:`sim.loop.SimLoop.schedule`) are lighter
:class:`KernelEvent` objects that are never cancelled nor handed to user code.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import SimLoop


class LoopHandle(asyncio.Handle):
    """An asyncio.Handle built without the debug-mode check (the hot path)."""

    __slots__ = ()

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None


class LoopTimerHandle(asyncio.TimerHandle):
    """An asyncio.TimerHandle built without the debug-mode check (the hot path)."""

    __slots__ = ()

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: SimLoop,
                 context: contextvars.Context | None) -> None:
        self._context = context if context is not None else contextvars.copy_context()
        self._loop = loop
        self._callback = callback
        self._args = args
        self._cancelled = False
        self._repr = None
        self._source_traceback = None
        self._when = when
        self._scheduled = False

    def cancel(self) -> None:
        """asyncio's ``TimerHandle.cancel`` and ``Handle.cancel`` in one call (timeouts cancel a timer each)."""
        if not self._cancelled:
            loop = self._loop
            loop._timer_handle_cancelled(self)
            self._cancelled = True
            if loop._debug:  # (as Handle.cancel: keep the callback's repr for the log)
                self._repr = repr(self)  # type: ignore[assignment]
            self._callback = None  # type: ignore[assignment]
            self._args = None  # type: ignore[assignment]


class KernelEvent:
    """A simulator-internal callback (message delivery, wake-up): a handle without asyncio's extras.

    The loop only reads ``_cancelled``, ``_context``, ``_callback`` and
    ``_args`` and writes ``_scheduled``; these are never cancelled and never
    handed to user code, so they skip TimerHandle's bookkeeping.
    """

    __slots__ = ("_context", "_callback", "_args", "_scheduled")
    _cancelled = False

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...],
                 context: contextvars.Context) -> None:
        self._context = context
        self._callback = callback
        self._args = args
        self._scheduled = False

    def __repr__(self) -> str:
        return f"<sim event {getattr(self._callback, '__qualname__', self._callback)!r}>"
