"""What a launched rank says when it is stopped by a signal: the aiodist operations it was waiting in.

A hung job that is killed (``timeout``, a scheduler's limit, Ctrl-C of the
launcher, or the launcher stopping the others after a failure) would end
without a word about where each rank was stuck. The bootstrap of a launched
rank (:mod:`aiodist.launch_bootstrap`) installs :func:`install`: on SIGTERM
the rank writes one line, e.g. ``rank 1: stopped by SIGTERM while waiting
in recv group=world src=0 tag=0 (for 118.2s)``, and then dies of the signal
as it would have (its exit status is unchanged). A program that installs its
own SIGTERM handler keeps it; a rank waiting in no aiodist operation says
nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .. import inflight
from ..flight import describe_entry

__all__ = ["describe", "install"]

MAX_SHOWN = 4
"""Operations named at most (the oldest first: what the rank waits in longest)."""


def describe(rank: str, signame: str, entries: Sequence[dict[str, Any]], now: float | None) -> str | None:
    """The line for ``rank`` stopped by ``signame`` while waiting in ``entries`` (None: in nothing). Pure."""
    if not entries:
        return None
    shown = []
    for e in entries[:MAX_SHOWN]:
        start = e.get("start")
        since = f" (for {now - start:.1f}s)" if now is not None and isinstance(start, float) and now >= start else ""
        shown.append(describe_entry(e) + since)
    more = f"; and {len(entries) - MAX_SHOWN} more" if len(entries) > MAX_SHOWN else ""
    return f"rank {rank}: stopped by {signame} while waiting in {'; '.join(shown)}{more}"


def install() -> None:
    """On SIGTERM, say what this rank waits in, then die of the signal (main thread, default handler only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    signal.signal(signal.SIGTERM, _stopped)


def _stopped(signum: int, frame: FrameType | None) -> None:
    try:
        loop_time = inflight._now()
        line = describe(os.environ.get("RANK", "?"), signal.Signals(signum).name, inflight.snapshot(),
                        loop_time if loop_time > 0 else None)
        if line is not None:
            os.write(2, (line + "\n").encode(errors="replace"))  # (unbuffered: safe amid a write to stderr)
    except Exception:  # noqa: BLE001, S110 - saying where it was is a courtesy: the signal's effect must follow
        pass
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
