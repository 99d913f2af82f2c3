"""What the link state machine (:mod:`.links`) asks its driver to do: one small record per action.

Connections are opaque here (whatever the driver gave the machine); the
driver carries the actions out in the order given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .frames import Header


class Action:
    """Something the driver must do; see the subclasses."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Dial(Action):
    """Start a dial to ``rank`` (look its address up, connect, shake hands); report how it ended."""

    rank: int


@dataclass(frozen=True, slots=True)
class StartTimer(Action):
    """Call :meth:`.links.Links.deferral_expired` for ``rank`` in ``delay`` seconds."""

    rank: int
    delay: float


@dataclass(frozen=True, slots=True)
class CancelTimer(Action):
    rank: int


@dataclass(frozen=True, slots=True)
class Install(Action):
    """``conn`` is now the link to ``rank``: route its frames (full frame size), read it until it ends."""

    rank: int
    conn: Any


@dataclass(frozen=True, slots=True)
class Send(Action):
    """Queue a control frame on ``conn`` (without waiting; a connection that broke meanwhile is ignored)."""

    conn: Any
    header: Header


@dataclass(frozen=True, slots=True)
class Release(Action):
    """The sends waiting on ``conn`` return (its peer was declared failed; the connection is kept to tell it)."""

    conn: Any


@dataclass(frozen=True, slots=True)
class Close(Action):
    """Close ``conn`` (orderly: frames queued on it, e.g. by a Send just before, still go out)."""

    conn: Any


@dataclass(frozen=True, slots=True)
class Wake(Action):
    """Wake the sends waiting for the link to ``rank``: with the installed connection, or ``error``."""

    rank: int
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class FailReceives(Action):
    """Fail the receives expecting anything from ``rank`` (with :meth:`.links.Links.peer_error`)."""

    rank: int


@dataclass(frozen=True, slots=True)
class BreakGroups(Action):
    """Break every group containing ``rank`` (this rank's own: every group), blaming ``rank``."""

    rank: int
    how: str


@dataclass(frozen=True, slots=True)
class NameFailedOps(Action):
    """Name in ``notice`` (a failure notice about ``rank``, sent next) this rank's collectives that the
    failure fails here: those with a receive waiting in a group containing ``rank`` (the groups break
    next). The ranks it reaches void them too -- ``rank`` itself above all, should it resume after a pause
    and find their messages."""

    rank: int
    notice: Header


@dataclass(frozen=True, slots=True)
class Watch(Action):
    """Start watching ``rank``'s heartbeats."""

    rank: int


@dataclass(frozen=True, slots=True)
class Unwatch(Action):
    rank: int


@dataclass(frozen=True, slots=True)
class Log(Action):
    level: int
    message: str


Actions = list[Action]
