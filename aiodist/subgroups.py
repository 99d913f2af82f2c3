"""Creating groups: ``new_group``, ``new_subgroups``, ``new_subgroups_by_enumeration``, ``split_group``.

Two ways to agree on a group, as in torch:

* *every rank of the world* calls (``new_group``, ``new_subgroups``,
  ``new_subgroups_by_enumeration``): each rank allocates the next group id of
  its own counter, so all ranks agree on the id without talking; the members
  check through the store that they passed the same ranks.
* *only the members* call (``split_group``, by the members of the parent
  group; ``new_group(..., use_local_synchronization=True)``, by the members of
  the new group): the world's counter would then differ between the ranks
  that called and those that did not, so these groups get an id of their own
  (a string naming the parent or the members and a count kept per rank), and
  the members meet in the store before the call returns, so that none sends
  to the new group before every member knows it.

Every rank that calls gets a :class:`~aiodist.group.ProcessGroup`; a rank
that is not a member gets one whose ``rank`` is -1 (operations on it do
nothing, as torch's do on a non-member), except ``split_group``, which returns
None there, as torch does.

Cancellation: a group creation cut short may have registered the group on
some ranks and not others: destroy the world group then.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .arguments import backend_name, optional_seconds
from .comm.channel import rank_table
from .context import rank_scope
from .current import group_of, registry, world
from .errors import GroupError, InvalidArgumentError, InvalidArgumentTypeError
from .group import ProcessGroup
from .mismatch import note_disagreement

__all__ = ["new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group"]

_LOCAL_COUNTS = "aiodist_local_group_counts"


def _count(w: ProcessGroup, what: tuple[Any, ...]) -> int:
    """How many groups of kind ``what`` this rank created in the job of world group ``w`` before (0, 1, ...)."""
    per_job: dict[Any, dict[tuple[Any, ...], int]] = rank_scope().setdefault(_LOCAL_COUNTS, {})
    counts = per_job.setdefault(w.job_id, {})
    if len(per_job) > 1:  # (only the current job's counts matter)
        for job in [j for j in per_job if j != w.job_id]:
            del per_job[job]
    k = counts.get(what, 0)
    counts[what] = k + 1
    return k


def _check_ranks(ranks: Sequence[int], n: int, *, sort: bool) -> list[int]:
    members = []
    for given in ranks:
        try:
            if isinstance(given, (bool, np.bool_)):
                raise TypeError
            r = operator.index(given)  # ints, numpy integers (np.arange(...)), as torch takes them
        except TypeError:
            raise InvalidArgumentTypeError(f"ranks must be ints, got {given!r}") from None
        if not 0 <= r < n:
            raise InvalidArgumentError(f"rank {r} is out of range for a world of {n} ranks")
        members.append(r)
    if len(set(members)) != len(members):
        raise InvalidArgumentError(f"ranks {list(ranks)} contain duplicates")
    if not members:
        raise InvalidArgumentError("a group needs at least one rank")
    return sorted(members) if sort else members


async def new_group(
    ranks: Sequence[int] | None = None,
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
    sort_ranks: bool = True,
) -> ProcessGroup:
    """Create a group of the given global ranks (None: all). Every rank of the world calls it, in the same order.

    torch's signature. Members get a group with ``rank >= 0``; other ranks get
    a group whose ``rank`` is -1 (operations on it do nothing). The members
    check through the store that they passed the same ranks (GroupError if
    not). ``use_local_synchronization=True``: only the members call it (see
    the module doc). ``sort_ranks=False`` keeps the order given as the group's
    rank order. ``timeout`` (seconds or a timedelta): the group's default operation
    timeout. ``backend``: a name for :func:`aiodist.get_backend`; ``pg_options``,
    ``group_desc`` and ``device_id`` are accepted and ignored.
    """
    w = world()
    members = list(range(w.size)) if ranks is None else _check_ranks(ranks, w.size, sort=sort_ranks)
    if use_local_synchronization:
        if w.transport.rank not in members:
            raise GroupError(
                f"new_group(ranks={members}, use_local_synchronization=True) called on global rank "
                f"{w.transport.rank}, which is not one of them: only the members call it"
            )
        k = _count(w, ("local", *members))
        local_id = f"local:{','.join(map(str, members))}:{k}"
        return await _local_group(w, local_id, members, timeout, backend, label=f"group {local_id}")
    transport = w.transport
    gid = transport.allocate_group_id()
    t = w.timeout if timeout is None else optional_seconds(timeout)
    label = f"group {gid} (ranks {members})"
    if transport.rank in members:
        key = f"{transport.key_prefix}group/{gid}"
        mine = ",".join(map(str, members)).encode()
        agreed = bytes(await w.store.compare_set(key, b"", mine))
        if agreed != mine:
            # The members that passed the agreed ranks have the group: their first collective on it would
            # wait for this rank until its timeout. Their fingerprint check reads this note and fails it.
            await note_disagreement(w.store, transport, gid, mine.decode())
            raise GroupError(
                f"new_group #{gid}: rank {transport.rank} passed ranks {members} but another member passed "
                f"[{agreed.decode()}]; every rank must call new_group with the same ranks in the same order"
            )
        transport.register_group(gid, rank_table(members).ranks)
    else:
        transport.foreign_group(gid)  # frames for it from any peer are bad input, not buffered
    return _made(w, gid, members, t, backend, label)


def _made(w: ProcessGroup, gid: Any, members: list[int], timeout: float | None, backend: str | None, label: str) -> ProcessGroup:
    pg = ProcessGroup(w.transport, gid, rank_table(members).ranks, store=w.store,
                      timeout=w.timeout if timeout is None else timeout, name=label)
    pg.job_id = w.job_id
    pg.backend = backend_name(backend) if backend is not None else w.backend
    registry().append(pg)
    return pg


async def _local_group(
    w: ProcessGroup, gid: str, members: list[int], timeout: Any, backend: str | None, *, label: str
) -> ProcessGroup:
    """A group only its members create (id ``gid``, the same on all of them): registered, then met in the store."""
    transport = w.transport
    t = w.timeout if timeout is None else optional_seconds(timeout)
    assert t is not None
    transport.register_group(gid, rank_table(members).ranks)
    prefix = f"{transport.key_prefix}local/{gid}/"
    await w.store.set(f"{prefix}{transport.rank}", b"1")
    try:
        await w.store.wait([f"{prefix}{r}" for r in members], timeout=t)
    except TimeoutError:
        missing = [r for r in members if not await w.store.check([f"{prefix}{r}"])]
        transport.unregister_group(gid)
        raise GroupError(
            f"creating {label} timed out after {t:g}s on global rank {transport.rank}: "
            f"ranks {missing} did not create it (every member must make the same call, in the same order)"
        ) from None
    return _made(w, gid, members, t, backend, label)


async def new_subgroups(
    group_size: int | None = None,
    group: ProcessGroup | None = None,
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    """Split ``group``'s ranks (default: the world) into consecutive groups of ``group_size``; every rank calls it.

    Returns (this rank's subgroup, all the subgroups), as torch does. The
    default ``group_size`` is the number of ranks per machine (``LOCAL_WORLD_SIZE``).
    """
    pg = group_of(group)
    if group_size is None:
        group_size = pg.local_world_size or world().local_world_size
        if group_size is None:
            raise InvalidArgumentError("new_subgroups: pass group_size (LOCAL_WORLD_SIZE is not set, so there is no default)")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise InvalidArgumentError(f"new_subgroups: group_size must be a positive int, got {group_size!r}")
    ranks = pg.ranks
    if group_size > len(ranks):
        raise InvalidArgumentError(f"new_subgroups: group_size {group_size} exceeds the group's {len(ranks)} ranks")
    if len(ranks) % group_size:
        raise InvalidArgumentError(f"new_subgroups: the group's {len(ranks)} ranks cannot be split into groups of {group_size}")
    return await new_subgroups_by_enumeration(
        [ranks[i : i + group_size] for i in range(0, len(ranks), group_size)], timeout=timeout, backend=backend
    )


async def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: Sequence[Sequence[int]],
    timeout: Any = None,
    backend: str | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[ProcessGroup | None, list[ProcessGroup]]:
    """One group per list of global ranks (they must not overlap); every rank of the world calls it.

    Returns (this rank's subgroup or None, all the subgroups), as torch does.
    """
    if not ranks_per_subgroup_list:
        raise InvalidArgumentError("new_subgroups_by_enumeration: ranks_per_subgroup_list is empty")
    seen: dict[int, list[int]] = {}
    for ranks in ranks_per_subgroup_list:
        for r in ranks:
            if r in seen:
                raise InvalidArgumentError(f"rank {r} appears in both subgroup {seen[r]} and {list(ranks)}")
            seen[r] = list(ranks)
    me = world().transport.rank
    mine: ProcessGroup | None = None
    subgroups = []
    for ranks in ranks_per_subgroup_list:
        g = await new_group(ranks, timeout=timeout, backend=backend)
        subgroups.append(g)
        if me in ranks:
            mine = g
    return mine, subgroups


async def split_group(
    parent_pg: ProcessGroup | None = None,
    split_ranks: Sequence[Sequence[int]] | None = None,
    timeout: Any = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: str | None = None,
) -> ProcessGroup | None:
    """Split ``parent_pg`` (default: the world) into groups of its *group* ranks; every member of the parent calls it.

    ``split_ranks``: lists of ranks of the parent group, not overlapping. Returns
    this rank's group, or None if it is in none of them, as torch does.
    """
    parent = group_of(parent_pg)
    if not split_ranks:
        raise InvalidArgumentError("split_group: split_ranks cannot be None or empty")
    if parent.rank < 0:
        raise InvalidArgumentError(f"split_group: global rank {world().transport.rank} is not part of the parent group {parent.name}")
    seen: set[int] = set()
    mine: list[int] | None = None
    for split in split_ranks:
        for r in split:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < parent.size:
                raise InvalidArgumentError(f"split_group: {r!r} is not a rank of {parent.name} (0..{parent.size - 1})")
            if r in seen:
                raise InvalidArgumentError(f"split_group: rank {r} is in more than one split of {list(map(list, split_ranks))}")
            seen.add(r)
        if parent.rank in split:
            mine = list(split)
    w = world()
    k = _count(w, ("split", parent.group_id))
    spec = ";".join(",".join(map(str, sorted(s))) for s in split_ranks)
    key = f"{w.transport.key_prefix}split/{parent.group_id}/{k}"
    agreed = bytes(await w.store.compare_set(key, b"", spec.encode())).decode()
    if agreed != spec:
        raise GroupError(
            f"split_group #{k} of {parent.name}: rank {parent.rank} passed split_ranks [{spec}] but another member "
            f"passed [{agreed}]; every member of the parent must pass the same splits"
        )
    if mine is None:
        return None
    members = sorted(parent.ranks[r] for r in mine)
    gid = f"split:{parent.group_id}:{k}:{','.join(map(str, members))}"
    return await _local_group(w, gid, members, timeout, backend, label=f"group {gid}")
