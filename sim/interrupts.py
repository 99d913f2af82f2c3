"""Telling Ctrl-C from a program's own ``raise KeyboardInterrupt``.

A real Ctrl-C raises :class:`KeyboardInterrupt` in whatever code runs at that
moment, often a virtual rank's: it must stop the simulator. A rank that raises
``KeyboardInterrupt`` itself is only that rank's process dying of it, as it
would for real. While a run lasts, :func:`sigint_marked` makes Ctrl-C raise
:class:`CtrlC` (a ``KeyboardInterrupt``) so that the two differ; an interrupt
the simulator raises on purpose (a sweep's wall-clock limit) is
:class:`Stop`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

__all__ = ["CtrlC", "Stop", "sigint_marked", "is_stop"]


class Stop(KeyboardInterrupt):
    """An interrupt that stops the simulator, whatever rank's code it was raised in."""


class CtrlC(Stop):
    """Ctrl-C (SIGINT) while a simulation ran."""


class _Interruptible(Protocol):
    def interrupt(self, exc: BaseException) -> bool: ...


@contextlib.contextmanager
def sigint_marked(loop: _Interruptible | None = None) -> Iterator[bool]:
    """For the run inside: Ctrl-C raises :class:`CtrlC`. Yields whether a plain ``KeyboardInterrupt`` can only
    be a program's own (True in the main thread with Python's default handler, which is then replaced; with
    SIGINT ignored; in any other thread, where no signal raises it). False when another SIGINT handler is in
    place: it may raise plain ones, so every ``KeyboardInterrupt`` stops the run.

    With ``loop``, Ctrl-C stops it after the callback that runs at that moment and the loop raises
    :class:`CtrlC` itself, as ``asyncio.run`` cancels its main task first: raised in a rank's code, an
    ``except BaseException`` or a finalizer there could swallow it and the run go on. A second Ctrl-C
    before the loop got there (a rank's code that never yields) raises it where it lands."""
    if threading.current_thread() is not threading.main_thread():
        yield True
        return
    current = signal.getsignal(signal.SIGINT)
    if current is signal.SIG_IGN:
        yield True
        return
    if current is not signal.default_int_handler:
        yield False
        return
    def _ctrl_c(signum: int, frame: FrameType | None) -> None:
        if loop is None or not loop.interrupt(CtrlC()):
            raise CtrlC()

    signal.signal(signal.SIGINT, _ctrl_c)
    try:
        yield True
    finally:
        signal.signal(signal.SIGINT, current)


def is_stop(exc: BaseException) -> bool:
    """Is ``exc`` an interrupt meant to stop the simulator (Ctrl-C, a wall-clock limit)?"""
    return isinstance(exc, Stop)
