"""The calling rank's groups: its default group, the groups it created, and the ``group=`` argument of the API.

Kept in the rank scope of :mod:`aiodist.context` (per rank, not per process:
the simulator's virtual ranks each have their own).
"""

from __future__ import annotations

import asyncio
from typing import Any

from .context import get_default_group, rank_scope
from .errors import GroupError, InvalidArgumentTypeError, NotInitializedError, OutsideLoopError
from .group import ProcessGroup

_GROUPS = "aiodist_groups"


def registry() -> list[ProcessGroup]:
    """The groups of the calling rank (the world first), in creation order."""
    return rank_scope().setdefault(_GROUPS, [])  # type: ignore[no-any-return]


def world() -> ProcessGroup:
    """The calling rank's default group (GroupError if there is none)."""
    pg = get_default_group()
    if pg is None:
        raise NotInitializedError(
            "the default process group is not initialized: call `await aiodist.init_process_group()` first")
    return pg  # type: ignore[no-any-return]


def group_of(group: Any) -> ProcessGroup:
    """The group a ``group=`` argument names: None is the default group (torch's ``group.WORLD`` is that group)."""
    if group is None:
        return world()
    if not isinstance(group, ProcessGroup):
        raise InvalidArgumentTypeError(f"group must be a ProcessGroup, not {type(group).__name__}")
    return group


def operating(group: Any, op: str) -> ProcessGroup:
    """:func:`group_of` for the operation ``op`` about to start: it starts on the running event loop.

    Called in a thread where no loop runs (a worker thread), it raises
    :class:`~aiodist.errors.OutsideLoopError` naming ``op`` (asyncio's own
    error would be a bare "no running event loop" from deep inside).
    """
    if asyncio._get_running_loop() is None:
        raise OutsideLoopError(op)
    return group_of(group)
