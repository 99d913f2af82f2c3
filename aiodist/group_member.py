"""torch's ``GroupMember``: ``GroupMember.WORLD`` (the calling rank's default group) and ``NON_GROUP_MEMBER``.

``aiodist.group.WORLD`` is the same group (see :mod:`aiodist.group`). A rank
that is not a member of a group gets a :class:`~aiodist.group.ProcessGroup`
whose ``rank`` is -1 from ``new_group``; it compares equal to
``GroupMember.NON_GROUP_MEMBER``, so torch's ``if group == GroupMember.NON_GROUP_MEMBER``
works.
"""

from __future__ import annotations

from typing import Any

from .context import get_default_group
from .group import ProcessGroup

__all__ = ["GroupMember"]


class _NonGroupMember:
    """Equal to itself and to any group this rank is not a member of."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, ProcessGroup) and other.rank < 0)

    def __hash__(self) -> int:
        return hash("NON_GROUP_MEMBER")

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


class _WorldMeta(type):
    @property
    def WORLD(cls) -> Any:
        """The calling rank's default group (None before ``init_process_group``)."""
        return get_default_group()


class GroupMember(metaclass=_WorldMeta):
    """torch's ``GroupMember``: ``GroupMember.WORLD``, ``GroupMember.NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER: Any = _NonGroupMember()
