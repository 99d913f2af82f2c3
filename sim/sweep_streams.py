"""Where a run's output goes, per thread: runs of a sweep in threads of one process capture their own output.

``contextlib.redirect_stdout`` swaps the process-wide ``sys.stdout``: two
runs in two threads (a ``ThreadPoolExecutor``, a Dask worker with several
threads) then write into each other's capture, and the second to finish
restores the first one's capture as ``sys.stdout``, so the caller's later
prints vanish. Here ``sys.stdout`` / ``sys.stderr`` are replaced once, while
any run is capturing, by an object that writes to the calling *thread's*
target (the original stream for threads that capture nothing) and are put
back when the last capture ends; aiodist's log records go the same way
(:func:`capture_logs`). A rank's code runs in the thread of its run (the
simulator's loop runs inline), so the thread names the run.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = ["routed", "current", "capture_logs", "LastLines"]

_local = threading.local()
_lock = threading.Lock()
_depth = 0
_saved: dict[str, Any] = {}
_NAMES = ("stdout", "stderr")


class _Routed:
    """``sys.stdout`` / ``sys.stderr`` while captures are on: writes go to the calling thread's target."""

    def __init__(self, name: str, original: TextIO) -> None:
        self._name = name
        self._original = original

    def target(self) -> Any:
        return getattr(_local, self._name, None) or self._original

    def write(self, s: str) -> int:
        return int(self.target().write(s))

    def flush(self) -> None:
        self.target().flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return bool(self.target().isatty())

    def __getattr__(self, name: str) -> Any:  # (encoding, fileno, buffer, ...: the target's)
        return getattr(self.target(), name)


def current(name: str) -> Any:
    """The stream ``sys.<name>`` writes to for the calling thread now."""
    stream = getattr(sys, name)
    return stream.target() if isinstance(stream, _Routed) else stream


@contextlib.contextmanager
def routed(*, stdout: Any = None, stderr: Any = None, argv: list[str] | None = None) -> Iterator[None]:
    """In the calling thread: ``sys.stdout`` writes to ``stdout`` and ``sys.stderr`` to ``stderr`` (None: where
    they went before), ``sys.argv`` is ``argv`` (process-wide: the runs of one sweep share it); nests; other
    threads are not affected; everything is put back when the last capture of the process ends."""
    global _depth
    with _lock:
        if _depth == 0:
            for name in _NAMES:
                _saved[name] = getattr(sys, name)
                setattr(sys, name, _Routed(name, _saved[name]))
            _saved["argv"] = sys.argv
        _depth += 1
        if argv is not None:
            sys.argv = argv
    targets = {"stdout": stdout, "stderr": stderr}
    before = {name: getattr(_local, name, None) for name in _NAMES}
    for name, target in targets.items():
        if target is not None:
            setattr(_local, name, target)
    try:
        yield
    finally:
        for name, target in before.items():
            setattr(_local, name, target)
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name in _NAMES:
                    if isinstance(getattr(sys, name), _Routed):  # (else someone replaced it meanwhile: theirs stays)
                        setattr(sys, name, _saved[name])
                sys.argv = _saved["argv"]
                _saved.clear()


class _LogRouter(logging.Handler):
    """The one handler on aiodist's logger while captures are on: a record goes to its thread's collector, or
    (a thread capturing nothing) on up the logger tree as it would have without the router."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def handle(self, record: logging.LogRecord) -> bool:
        collector: logging.Handler | None = getattr(_local, "logs", None)
        if collector is not None:
            collector.handle(record)
            return True
        found = False
        parent = self.logger.parent
        while parent is not None:
            for h in parent.handlers:
                found = True
                if record.levelno >= h.level:
                    h.handle(record)
            if not parent.propagate:
                break
            parent = parent.parent
        if not found and logging.lastResort is not None and record.levelno >= logging.lastResort.level:
            logging.lastResort.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it all
        pass


_log_depth = 0
_router: _LogRouter | None = None
_propagate = True


@contextlib.contextmanager
def capture_logs(collector: logging.Handler, name: str = "aiodist") -> Iterator[logging.Handler]:
    """The records of logger ``name`` (and its children) logged in the calling thread go to ``collector``."""
    global _log_depth, _router, _propagate
    logger = logging.getLogger(name)
    with _lock:
        if _log_depth == 0:
            _router = _LogRouter(logger)
            _propagate = logger.propagate
            logger.addHandler(_router)
            logger.propagate = False
        _log_depth += 1
    before = getattr(_local, "logs", None)
    _local.logs = collector
    try:
        yield collector
    finally:
        _local.logs = before
        with _lock:
            _log_depth -= 1
            if _log_depth == 0 and _router is not None:
                logger.removeHandler(_router)
                logger.propagate = _propagate
                _router = None


class LastLines:
    """A text stream that keeps only its last ``n`` lines (what a failing seed of a sweep printed, bounded)."""

    WIDTH = 500  # (characters kept of a line)

    def __init__(self, n: int = 20) -> None:
        self.n = n
        self.lines: collections.deque[str] = collections.deque(maxlen=n)
        self.dropped = 0
        self._partial = ""

    def write(self, s: str) -> int:
        *done, partial = (self._partial + s).split("\n")
        self._partial = partial[: self.WIDTH * 2]
        for line in done:
            if len(self.lines) == self.n:
                self.dropped += 1
            self.lines.append(line if len(line) <= self.WIDTH else line[:self.WIDTH] + " ...")
        return len(s)

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        """The kept lines (after a line saying how many came before them), or "" if nothing was printed."""
        lines = list(self.lines) + ([self._partial] if self._partial else [])
        if not lines:
            return ""
        more = [f"... ({self.dropped} earlier line{'s' if self.dropped != 1 else ''})"] if self.dropped else []
        return "\n".join(more + lines)
