"""What a rank started by ``aiodist run`` tells its launcher while it runs: how far its rendezvous got.

A leaf (it imports only :mod:`aiodist.rankenv`), so that the rendezvous can
write it without loading the launcher. When the launcher's status directory is
set (``$AIODIST_STATUS_DIR``, where each rank also leaves its end record: see
:mod:`aiodist.launch.outcome`), a rank whose rendezvous is in the launcher's
world (the ``RANK`` and ``WORLD_SIZE`` it was started with) writes
``rdzv<R>``: ``waiting`` as it starts it, ``joined`` once it completed.

With that, a launcher that sees a rank exit cleanly without ever joining,
while others of the same world wait in their rendezvous, knows the round can
never complete (they wait for it) and stops it at once, instead of letting
them wait out their whole timeout (300 s by default). A rendezvous in a world
of the program's own (other ranks or size) is not marked: the launcher cannot
tell whom it waits for. Errors writing are ignored (it is only a hint).
"""

from __future__ import annotations

import os
from pathlib import Path

from .rankenv import getenv

__all__ = ["JOINED", "STATUS_DIR_ENV", "WAITING", "load_marks", "mark_rendezvous"]

STATUS_DIR_ENV = "AIODIST_STATUS_DIR"
"""The launcher's status directory (set by the launcher for each rank)."""
WAITING = "waiting"
JOINED = "joined"
_PREFIX = "rdzv"


def mark_rendezvous(state: str, *, rank: int, world_size: int) -> None:
    """Tell the launcher (if any) that this rank's rendezvous is ``state`` (:data:`WAITING` or :data:`JOINED`)."""
    directory = getenv(STATUS_DIR_ENV)
    if not directory or getenv("RANK") != str(rank) or getenv("WORLD_SIZE") != str(world_size):
        return
    path = Path(directory) / f"{_PREFIX}{rank}"
    try:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(state)
        os.replace(tmp, path)
    except OSError:
        return


def load_marks(directory: str | os.PathLike[str]) -> dict[int, str]:
    """The marks in ``directory``: rank -> state (unreadable ones are skipped)."""
    out: dict[int, str] = {}
    for p in sorted(Path(directory).glob(f"{_PREFIX}*")):
        suffix = p.name[len(_PREFIX):]
        if not suffix.isdigit():
            continue
        try:
            state = p.read_text()
        except OSError:
            continue
        if state in (WAITING, JOINED):
            out[int(suffix)] = state
    return out
