"""The module-level API: init, groups, and every operation on the default group.

These mirror torch.distributed: each operation acts on the calling rank's
default group unless ``group=`` names another, and ``src``/``dst`` are
*global* ranks (translated to the group's numbering), as in torch. Each
returns a :class:`~aiodist.group.Work` (already started; await it).

The default group is per rank (kept in the rank scope of
:mod:`aiodist.context`), so the simulator's virtual ranks each have their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from .auth import FROM_ENVIRONMENT, resolve_secret
from .collectives.ops import ReduceOp
from .comm import Transport
from .comm.channel import rank_table
from .context import get_default_group, rank_scope, set_default_group
from .errors import GroupError, InvalidRankError
from .group import WORLD_GROUP_ID, ProcessGroup, Work
from .net.shmhost import transport_mode
from .rendezvous import Rendezvous, leave, rendezvous
from .unawaited import raise_if_unawaited

log = logging.getLogger(__name__)

_GROUPS = "aiodist_groups"
STORE_LEAVE_WAIT = 10.0
"""Seconds rank 0 keeps the store server it hosts open for the other ranks to leave."""


def _registry() -> list[ProcessGroup]:
    return rank_scope().setdefault(_GROUPS, [])


def _world() -> ProcessGroup:
    pg = get_default_group()
    if pg is None:
        raise GroupError("the default process group is not initialized: call `await aiodist.init_process_group()` first")
    return pg  # type: ignore[no-any-return]


def _group(group: ProcessGroup | None) -> ProcessGroup:
    if group is None:
        return _world()
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup, not {type(group).__name__}")
    return group


def _local(pg: ProcessGroup, global_rank: int, what: str) -> int:
    if isinstance(global_rank, bool) or not isinstance(global_rank, int):
        raise TypeError(f"{what} must be an int rank, not {type(global_rank).__name__}")
    r = pg.group_rank(global_rank)
    if r < 0:
        raise InvalidRankError(
            f"{what}={global_rank} is not a member of {pg.name} (global ranks {pg.ranks})",
            rank=global_rank,
            size=pg.size,
            argument=what,
        )
    return r


# ---------------------------------------------------------------------- lifecycle


async def init_process_group(
    init_method: str | None = "env://",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    store: Any = None,
    timeout: float = 300.0,
    backend: str | None = None,
    heartbeat_interval: float | None = None,
    heartbeat_misses: int | None = None,
    secret: Any = FROM_ENVIRONMENT,
    ssl: Any = None,
    transport: str | None = None,
) -> ProcessGroup:
    """Rendezvous (see :mod:`aiodist.rendezvous`) and make the world group this rank's default.

    ``timeout`` bounds the rendezvous and is the default timeout of every
    operation of the group. ``heartbeat_interval`` (seconds, 0: off) and
    ``heartbeat_misses`` set the detection of hung peers (default 0.5 s x 6:
    a peer silent for 3 s is declared failed; see
    :data:`aiodist.comm.transport.HEARTBEAT_INTERVAL`; the environment
    variables ``AIODIST_HEARTBEAT_INTERVAL``/``_MISSES``/``_TIMEOUT`` set them
    too). A rank that blocks its event loop longer than that (a long
    computation that never awaits) looks hung to its peers: raise them. ``backend`` is accepted for torch compatibility
    and ignored (so is a backend name such as ``"gloo"`` in place of
    ``init_method``). Raises GroupError if this rank already has a default group.

    ``secret``: the job's shared secret (bytes or str). Every connection
    between ranks (and to the store) proves it both ways before it carries
    anything, so a process that does not know it can neither join nor sit in
    between. By default it is looked up in this rank's environment
    (``AIODIST_SECRET``, set by ``aiodist run`` and ``aiodist.spawn``; then
    ``AIODIST_SECRET_FILE``; then the user's own secret file, see
    :func:`aiodist.auth.resolve_secret`); ``None`` switches authentication
    off (with a warning). ``ssl``: an :class:`ssl.SSLContext` for links that
    cross machines (not supported by this build yet: it raises
    NotImplementedError rather than run unencrypted).

    ``transport="tcp"`` connects to the ranks of this host over TCP too
    (default ``"auto"``, or ``AIODIST_TRANSPORT``: Unix sockets and shared
    memory with them; see :mod:`aiodist.net.shmhost`).
    """
    del backend
    mode = transport_mode(transport)
    if get_default_group() is not None:
        raise GroupError("the default process group is already initialized; call destroy_process_group() first")
    if ssl is not None:
        raise NotImplementedError("init_process_group(ssl=...): TLS for the store and rank links is not available yet")
    secret = resolve_secret(secret)
    transports: list[Transport] = []

    async def publish(info: Rendezvous) -> None:
        while transports:  # a rendezvous that started over (its store went away): drop the old one
            await transports.pop().close()
        transports.append(
            await Transport.start(
                rank=info.rank,
                world_size=info.world_size,
                job_id=info.job_id,
                store=info.store,
                key_prefix=info.key_prefix,
                timeout=timeout,
                secret=secret,
                mode=mode,
            )
        )
        transports[-1].configure_heartbeat(heartbeat_interval, heartbeat_misses)

    try:
        rdzv = await rendezvous(
            init_method, rank=rank, world_size=world_size, store=store, timeout=timeout, publish=publish,
            # secret=secret, ssl=ssl,  # LEAD: enable once rendezvous/store accept them (helper "sec")
        )
    except BaseException:
        for t in transports:
            await t.close()
        raise
    world_transport = transports[-1]
    # one tuple shared by every rank of the process (the simulator's virtual ranks: O(N), not O(N^2))
    ranks = rank_table(range(rdzv.world_size)).ranks
    world_transport.register_group(WORLD_GROUP_ID, ranks)
    pg = ProcessGroup(world_transport, WORLD_GROUP_ID, ranks, store=rdzv.store, timeout=timeout, name="world")
    pg.local_rank = rdzv.local_rank
    pg.local_world_size = rdzv.local_world_size
    pg.job_id = rdzv.job_id

    async def teardown() -> None:
        # before close(): then every peer looks gone; an aborted transport waits for nobody either
        broken = bool(world_transport.failed_peers()) or world_transport.closed
        await world_transport.close()
        if rdzv.server is not None:
            # Keep the store up for the others until they leave too, unless the job is broken
            # (a failed rank never leaves: waiting would only delay this rank's error).
            wait = 0.0 if broken else min(timeout, STORE_LEAVE_WAIT)
            await leave(rdzv.store, rdzv.key_prefix, rdzv.world_size, wait=wait)
        elif rdzv.owned:
            await leave(rdzv.store, rdzv.key_prefix, rdzv.world_size, wait=0)
        for close in reversed(rdzv.owned):
            try:
                await close()
            except Exception as e:  # the job is over for this rank: what is left to close is not its concern
                log.debug("rank %d: closing %r at the end of the job failed: %r", rdzv.rank, close, e)

    pg._on_destroy.append(teardown)
    _registry().clear()
    _registry().append(pg)
    set_default_group(pg)
    return pg


def is_initialized() -> bool:
    """True when this rank has a default process group."""
    return get_default_group() is not None


async def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Destroy ``group``; with None (or the default group) destroy every group of this rank.

    Running operations of a destroyed group are cancelled. Destroying the
    world closes this rank's connections (peers are told it left) and, on a
    rank that created them, the store client and server; then, if operations
    of this rank were never awaited and their Works are gone (so they never
    will be), raises :class:`~aiodist.work.UnawaitedOperationError` naming
    them (the groups are destroyed all the same).
    """
    world = get_default_group()
    if group is None or group is world:
        if world is None:
            raise GroupError("destroy_process_group: the default process group is not initialized")
        rank = world.transport.rank
        await _destroy_all(world)
        raise_if_unawaited("destroy_process_group()", rank=rank, collected_only=True)
        return
    await _group(group).destroy()
    reg = _registry()
    if group in reg:
        reg.remove(group)


async def _destroy_all(world: ProcessGroup) -> None:
    groups = list(_registry())
    for g in reversed(groups):
        if g is not world:
            await g.destroy()
    await world.destroy()
    _registry().clear()
    set_default_group(None)


async def finish_rank(*, timeout: float = 30.0) -> None:
    """What happens when a rank's ``main`` returns (the launcher, :func:`aiodist.spawn` and the simulator call it).

    Destroys the rank's groups in order if the default group is still alive
    (pending sends are flushed and the peers are told this rank left, so
    peers still finishing their last collective get their data), bounded by
    ``timeout`` seconds (past that the connections are dropped); then raises
    :class:`~aiodist.work.UnawaitedOperationError` if operations of this rank
    were never awaited. A no-op for a rank that destroyed its group itself
    and awaited everything.
    """
    world = get_default_group()
    rank = None
    if world is not None:
        rank = world.transport.rank
        try:
            async with asyncio.timeout(timeout):
                await _destroy_all(world)
        except TimeoutError:
            await abort()
    raise_if_unawaited(f"the main function of rank {rank} returned" if rank is not None else "main returned")


async def abort(group: ProcessGroup | None = None) -> None:
    """Fail every pending operation at once and tear the group down, without waiting for anyone.

    With None (or the default group): every group of this rank is aborted;
    its connections are dropped at once (the peers see this rank fail, as if
    it had crashed, and their own operations raise PeerFailureError naming
    it), the store server it hosts (rank 0 with ``env://``) is closed without
    waiting for the others. Pending and later operations raise
    :class:`~aiodist.errors.AbortedError`. The process lives on: a new
    ``init_process_group`` (a new rendezvous round, e.g. of the survivors,
    possibly with replacements, on a store that outlives the old job) builds
    a new world. Aborting a subgroup only ends that group on this rank.
    Idempotent; a no-op when this rank has no default group.
    """
    world = get_default_group()
    if group is None or group is world:
        if world is None:
            return
        groups = list(_registry())
        for g in groups:
            g._aborted = True
        world.transport.abort()
        for g in reversed(groups):
            if g is not world:
                await g.abort()
        await world.abort()
        _registry().clear()
        set_default_group(None)
        return
    await _group(group).abort()
    reg = _registry()
    if group in reg:
        reg.remove(group)


async def new_group(ranks: Sequence[int] | None = None, *, timeout: float | None = None) -> ProcessGroup:
    """Create a group of the given global ranks (None: all). Every rank of the world must call it, in the same order.

    Members get a group with ``rank >= 0``; other ranks get a group whose
    ``is_member`` is False and whose operations raise GroupError. The members
    check through the store that they passed the same ranks (GroupError if not).
    """
    world = _world()
    n = world.size
    if ranks is None:
        members = list(range(n))
    else:
        members = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int):
                raise TypeError(f"ranks must be ints, got {r!r}")
            if not 0 <= r < n:
                raise ValueError(f"rank {r} is out of range for a world of {n} ranks")
            members.append(int(r))
        if len(set(members)) != len(members):
            raise ValueError(f"ranks {list(ranks)} contain duplicates")
        if not members:
            raise ValueError("new_group needs at least one rank")
        members.sort()
    transport = world.transport
    gid = transport.allocate_group_id()
    t = world.timeout if timeout is None else float(timeout)
    label = f"group {gid} (ranks {members})"
    if transport.rank in members:
        key = f"{transport.key_prefix}group/{gid}"
        mine = ",".join(map(str, members)).encode()
        agreed = bytes(await world.store.compare_set(key, b"", mine))
        if agreed != mine:
            raise GroupError(
                f"new_group #{gid}: rank {transport.rank} passed ranks {members} but another member passed "
                f"[{agreed.decode()}]; every rank must call new_group with the same ranks in the same order"
            )
        transport.register_group(gid, rank_table(members).ranks)
    else:
        transport.foreign_group(gid)  # frames for it from any peer are bad input, not buffered
    pg = ProcessGroup(transport, gid, rank_table(members).ranks, store=world.store, timeout=t, name=label)
    pg.job_id = world.job_id
    _registry().append(pg)
    return pg


def get_rank(group: ProcessGroup | None = None) -> int:
    """This rank's number in ``group`` (default: the world); -1 if not a member."""
    return _group(group).rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (default: the world)."""
    return _group(group).size


def get_process_group_ranks(group: ProcessGroup | None = None) -> list[int]:
    """The global ranks of ``group``'s members."""
    return _group(group).ranks


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    return _group(group).global_rank(group_rank)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    return _group(group).group_rank(global_rank)


# ---------------------------------------------------------------------- collectives


def all_reduce(x: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[Any]:
    return _group(group).all_reduce(x, op, timeout=timeout)


def broadcast(x: Any, src: int = 0, group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[Any]:
    pg = _group(group)
    return pg.broadcast(x, _local(pg, src, "src"), timeout=timeout)


def reduce(
    x: Any, dst: int = 0, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[Any]:
    pg = _group(group)
    return pg.reduce(x, _local(pg, dst, "dst"), op, timeout=timeout)


def all_gather(
    out_list: Sequence[Any], x: Any, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[Any]:
    return _group(group).all_gather(out_list, x, timeout=timeout)


def all_gather_into_tensor(out: Any, x: Any, group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[Any]:
    return _group(group).all_gather_into_tensor(out, x, timeout=timeout)


def gather(
    x: Any,
    gather_list: Sequence[Any] | None = None,
    dst: int = 0,
    group: ProcessGroup | None = None,
    *,
    timeout: float | None = None,
) -> Work[Any]:
    pg = _group(group)
    return pg.gather(x, gather_list, _local(pg, dst, "dst"), timeout=timeout)


def scatter(
    x: Any,
    scatter_list: Sequence[Any] | None = None,
    src: int = 0,
    group: ProcessGroup | None = None,
    *,
    timeout: float | None = None,
) -> Work[Any]:
    pg = _group(group)
    return pg.scatter(x, scatter_list, _local(pg, src, "src"), timeout=timeout)


def reduce_scatter(
    out: Any, in_list: Sequence[Any], op: Any = ReduceOp.SUM, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[Any]:
    return _group(group).reduce_scatter(out, in_list, op, timeout=timeout)


def reduce_scatter_tensor(
    out: Any, x: Any, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[Any]:
    return _group(group).reduce_scatter_tensor(out, x, op, timeout=timeout)


def all_to_all(
    out_list: Sequence[Any], in_list: Sequence[Any], group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[Any]:
    return _group(group).all_to_all(out_list, in_list, timeout=timeout)


def all_to_all_single(
    out: Any,
    x: Any,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    *,
    timeout: float | None = None,
) -> Work[Any]:
    return _group(group).all_to_all_single(out, x, output_split_sizes, input_split_sizes, timeout=timeout)


def barrier(group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[None]:
    return _group(group).barrier(timeout=timeout)


def monitored_barrier(
    group: ProcessGroup | None = None, timeout: float | None = None, wait_all_ranks: bool = False
) -> Work[None]:
    return _group(group).monitored_barrier(timeout, wait_all_ranks)


# ---------------------------------------------------------------------- point to point


def send(x: Any, dst: int, group: ProcessGroup | None = None, tag: int = 0, *, timeout: float | None = None) -> Work[None]:
    """Send ``x`` to global rank ``dst``."""
    pg = _group(group)
    return pg.send(x, _local(pg, dst, "dst"), tag, timeout=timeout)


def recv(
    x: Any, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0, *, timeout: float | None = None
) -> Work[int]:
    """Receive into ``x`` from global rank ``src`` (None: any); the Work returns the sender's global rank."""
    pg = _group(group)
    local = None if src is None else _local(pg, src, "src")
    return pg.recv(x, local, tag, timeout=timeout).then(pg.global_rank)


isend = send
irecv = recv


# ---------------------------------------------------------------------- objects


def all_gather_object(obj: Any, group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[list[Any]]:
    return _group(group).all_gather_object(obj, timeout=timeout)


def broadcast_object_list(
    object_list: list[Any], src: int = 0, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[list[Any]]:
    pg = _group(group)
    return pg.broadcast_object_list(object_list, _local(pg, src, "src"), timeout=timeout)


def gather_object(obj: Any, dst: int = 0, group: ProcessGroup | None = None, *, timeout: float | None = None) -> Work[Any]:
    pg = _group(group)
    return pg.gather_object(obj, _local(pg, dst, "dst"), timeout=timeout)


def scatter_object_list(
    out: list[Any], in_list: Sequence[Any] | None = None, src: int = 0, group: ProcessGroup | None = None, *, timeout: float | None = None
) -> Work[list[Any]]:
    pg = _group(group)
    return pg.scatter_object_list(out, in_list, _local(pg, src, "src"), timeout=timeout)
