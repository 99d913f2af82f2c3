"""A sweep's per-seed wall-clock limit (``--seed-timeout`` / ``sim.sweep(seed_timeout=)``): a seed stuck in
pure-Python code (``while True: pass``: virtual time never moves, so no virtual limit can end it) is stopped.

Outside the simulated run and **not deterministic**: whether a seed reaches
the limit depends on the machine and its load. Such a seed is reported as its
own outcome (failure kind ``wall_clock_limit``, where it was running), never
as a run's result, and its record is not saved in the results file (a resumed
sweep tries it again). It works where a seed runs in the main thread of its
process (local worker processes, or a sweep run here): the limit is a timer
signal (``SIGALRM``) that interrupts the program's code where it runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from .interrupts import Stop

__all__ = ["WallClockLimit", "wall_clock_limit", "limit_record", "supported"]

_OWN = (os.sep + "sim" + os.sep, os.sep + "aiodist" + os.sep, os.sep + "asyncio" + os.sep)


class WallClockLimit(Stop):
    """Raised in a seed's run when its wall-clock limit passed (a KeyboardInterrupt that stops the simulator, as
    Ctrl-C does). ``.where``: the program's line it interrupted."""

    def __init__(self, seconds: float, where: str) -> None:
        super().__init__(f"wall-clock limit of {seconds:g}s reached at {where}")
        self.seconds, self.where = seconds, where


def supported() -> bool:
    """Whether a limit can be set here (the main thread of a POSIX process)."""
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def _where(frame: FrameType | None) -> str:
    """The innermost frame of the program's own code (not the simulator's, aiodist's or asyncio's)."""
    first = None
    while frame is not None:
        name = frame.f_code.co_filename
        here = f"{os.path.basename(name)}:{frame.f_lineno} in {frame.f_code.co_name}"
        first = first or here
        if not any(part in name for part in _OWN) and not name.startswith("<"):
            return here
        frame = frame.f_back
    return first or "?"


@contextlib.contextmanager
def wall_clock_limit(seconds: float | None) -> Iterator[list[WallClockLimit]]:
    """Interrupt the code running here after ``seconds`` of wall-clock time (None: no limit).

    Yields a list that holds the :class:`WallClockLimit` once it fired (it is
    raised again every 0.1 s until it leaves the run, in case a rank caught it).
    """
    fired: list[WallClockLimit] = []
    leaving: list[bool] = []
    if seconds is None or not supported():
        yield fired
        return

    def alarm(signum: int, frame: FrameType | None) -> None:
        if leaving:
            return
        if not fired:
            fired.append(WallClockLimit(seconds, _where(frame)))
        raise fired[0]

    previous: Any = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.1)
    try:
        yield fired
    except WallClockLimit:
        leaving.append(True)
    finally:
        leaving.append(True)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def limit_record(seed: int, world_size: int, limit: WallClockLimit, **extra: Any) -> dict[str, Any]:
    """The record of a seed stopped by its wall-clock limit (kind ``wall_clock_limit``; not saved to ``out``)."""
    signature = f"wall_clock_limit at {limit.where}"
    message = (f"still running after {limit.seconds:g}s of wall-clock time, at {limit.where} (not deterministic: "
               "it depends on the machine; run the seed alone to see where it spins)")
    failure = {"kind": "wall_clock_limit", "rank": None, "time": None, "message": message,
               "location": limit.where, "signature": signature}
    return {"seed": seed, "ok": False, "digest": None, "world_size": world_size, "virtual_time": None,
            "messages": None, "steps": None, "signature": signature, "failures": [failure], "faults": [],
            "wall_clock_limit": True, **extra}
