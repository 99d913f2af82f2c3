"""The module-level API: init, groups, and what a rank asks about them; every operation (from :mod:`aiodist.operations`).

These mirror torch.distributed: each operation acts on the calling rank's
default group unless ``group=`` names another, and ``src``/``dst`` are
*global* ranks (translated to the group's numbering), as in torch. Each
returns a :class:`~aiodist.group.Work` (already started; await it). torch's
signatures work as written (see :mod:`aiodist.operations` and
:func:`init_process_group`).

The default group is per rank (kept in the rank scope of
:mod:`aiodist.context`), so the simulator's virtual ranks each have their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from . import tls
from .arguments import Backend, backend_name, is_backend, optional_seconds, with_ranks
from .auth import FROM_ENVIRONMENT, resolve_secret
from .collectives.ops import ReduceOp
from .comm import Transport
from .comm.channel import rank_table
from .context import get_default_group, getenv, set_default_group
from .current import group_of as _group, registry as _registry, world as _world
from .errors import (
    CollectiveMismatchError,
    GroupError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidRankError,
    NotInitializedError,
    RendezvousError,
)
from .file_init import FileRendezvous, open_file_store
from .group import WORLD_GROUP_ID, ProcessGroup
from .net.shmhost import transport_mode
from .operations import *  # noqa: F403  (every operation: aiodist.api.all_reduce is aiodist.all_reduce)
from .operations import __all__ as _OPERATIONS
from .rendezvous import STORE_GOODBYE_GRACE, Rendezvous, leave, rendezvous
from .subgroups import new_group, new_subgroups, new_subgroups_by_enumeration, split_group
from .unawaited import raise_if_unawaited
from .work import Work

log = logging.getLogger(__name__)

STORE_LEAVE_WAIT = 10.0
"""Seconds rank 0 keeps the store server it hosts open for the other ranks to leave."""
MISMATCH_LEAVE_WAIT = 2.0
"""Seconds a rank whose main raised CollectiveMismatchError spends leaving in order (its reports to get out)."""
DEFAULT_TIMEOUT = 300.0
"""Seconds: the default timeout of the rendezvous and of every operation."""
default_pg_timeout = timedelta(seconds=DEFAULT_TIMEOUT)
"""torch's name for the default timeout, as a ``timedelta`` (aiodist's is 5 minutes; torch's gloo one is 30)."""


# ---------------------------------------------------------------------- lifecycle


async def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: Any = None,
    world_size: int | None = None,
    rank: int | None = None,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    *,
    heartbeat_interval: float | None = None,
    heartbeat_misses: int | None = None,
    secret: Any = FROM_ENVIRONMENT,
    ssl: Any = None,
    store_limits: Any = None,
    transport: str | None = None,
) -> ProcessGroup:
    """Rendezvous (see :mod:`aiodist.rendezvous`) and make the world group this rank's default.

    torch's signature: ``init_process_group("gloo", "env://", timedelta(minutes=5),
    world_size, rank, store)``, any of them by keyword; aiodist's
    ``init_process_group("tcp://host:port", rank=..., world_size=...)`` (an init
    method first) works too. ``init_method``: ``env://`` (the default),
    ``tcp://host:port``, ``file:///path`` (a file the ranks of one machine share: see
    :mod:`aiodist.file_init`), or ``store=``. ``backend``: a name torch knows
    (``"gloo"``, ``"nccl"``, ``"mpi"``, ``"cpu:gloo,cuda:nccl"``...), recorded for
    :func:`get_backend`: every backend runs over aiodist's own transport; a
    name torch does not know is refused. ``world_size``/``rank`` of -1 (torch's
    default) mean "from the environment". ``group_name``, ``pg_options`` and
    ``device_id`` are accepted and ignored.

    ``timeout`` (seconds or a timedelta; default :data:`DEFAULT_TIMEOUT`) bounds the rendezvous and is the
    default timeout of every operation of the group. ``heartbeat_interval`` (seconds, 0: off) and
    ``heartbeat_misses`` set the detection of hung peers (default 0.5 s x 6:
    a peer silent for 3 s is declared failed; see
    :data:`aiodist.comm.transport.HEARTBEAT_INTERVAL`; the environment
    variables ``AIODIST_HEARTBEAT_INTERVAL``/``_MISSES``/``_TIMEOUT`` set them
    too). A rank that blocks its event loop longer than that (a long
    computation that never awaits) looks hung to its peers: raise them.
    Raises GroupError if this rank already has a default group.

    ``secret``: the job's shared secret (bytes or str). Every connection
    between ranks (and to the store) proves it both ways before it carries
    anything, so a process that does not know it can neither join nor sit in
    between. By default it is looked up in this rank's environment
    (``AIODIST_SECRET``, set by ``aiodist run`` and ``aiodist.spawn``; then
    ``AIODIST_SECRET_FILE``; then the user's own secret file, see
    :func:`aiodist.auth.resolve_secret`); ``None`` switches authentication
    off (with a warning). ``ssl``: TLS for links that cross machines, an
    :class:`aiodist.tls.TLS` (this rank's server-side and client-side
    contexts, e.g. ``TLS.mutual(cert=..., key=..., ca=...)``: both ends then
    require a certificate of that CA), used by the store and the rank links;
    by default taken from ``AIODIST_TLS_CERT``/``_KEY``/``_CA`` when they are
    set (``aiodist run --tls-cert ... --tls-key ... --tls-ca ...``).
    ``store_limits`` (an :class:`aiodist.store.limits.StoreLimits`) sets the
    limits of the store rank 0 starts (default: ``AIODIST_STORE_LIMITS``, as
    ``aiodist run --store-limits`` sets it).

    ``transport="tcp"`` connects to the ranks of this host over TCP too
    (default ``"auto"``, or ``AIODIST_TRANSPORT``: Unix sockets and shared
    memory with them; see :mod:`aiodist.net.shmhost`).
    """
    mode = transport_mode(transport)
    backend, init_method = _backend_and_method(backend, init_method)
    del group_name, pg_options, device_id
    world_size = None if world_size == -1 else world_size
    rank = None if rank == -1 else rank
    seconds = optional_seconds(timeout)
    timeout = DEFAULT_TIMEOUT if seconds is None else seconds
    if get_default_group() is not None:
        raise GroupError("the default process group is already initialized; call destroy_process_group() first")
    if ssl is None:
        ssl = tls.from_environment()  # AIODIST_TLS_CERT/_KEY/_CA, as aiodist run --tls-* sets them
    tls.server_side(ssl)  # (a TypeError for anything but TLS contexts, before any connection)
    secret = resolve_secret(secret)
    transports: list[Transport] = []

    async def publish(info: Rendezvous) -> None:
        if transports:
            t = transports[-1]
            same = (t.job_id, t.key_prefix, t.rank, t.world_size) == (info.job_id, info.key_prefix, info.rank,
                                                                      info.world_size)
            if same:
                # The same round joined again over a new store connection (the old one broke): keep the
                # transport (peers that finished the round may be connected to it already).
                await t.use_store(info.store)
                return
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
                ssl=ssl,
                mode=mode,
            )
        )
        transports[-1].configure_heartbeat(heartbeat_interval, heartbeat_misses)

    found: FileRendezvous | None = None
    if store is None and init_method is not None and init_method.startswith("file://"):
        found = await open_file_store(
            init_method, rank=_file_rank(rank), timeout=timeout, secret=secret, ssl=ssl, limits=store_limits
        )
        store, init_method = found.store, None
    try:
        rdzv = await rendezvous(
            init_method, rank=rank, world_size=world_size, store=store, timeout=timeout, publish=publish,
            secret=secret, ssl=ssl, store_limits=store_limits,
        )
    except BaseException:
        for t in transports:
            await t.close()
        if found is not None:
            await found.close("", 1, wait=0)
        raise
    world_transport = transports[-1]
    # one tuple shared by every rank of the process (the simulator's virtual ranks: O(N), not O(N^2))
    ranks = rank_table(range(rdzv.world_size)).ranks
    world_transport.register_group(WORLD_GROUP_ID, ranks)
    pg = ProcessGroup(world_transport, WORLD_GROUP_ID, ranks, store=rdzv.store, timeout=timeout, name="world")
    pg.backend = Backend(backend or "gloo")
    pg.local_rank = rdzv.local_rank
    pg.local_world_size = rdzv.local_world_size
    pg.job_id = rdzv.job_id

    started = found_closed = False  # (a teardown whose run was cancelled: the next run resumes it)

    async def teardown() -> None:
        # A second run (the first was cancelled: see ProcessGroup.destroy) waits for nobody and does not
        # leave the store round again; every close is idempotent.
        nonlocal started, found_closed
        resumed, started = started, True
        # before close(): then every peer looks gone; an aborted transport waits for nobody either
        aborted = world_transport.closed
        broken = bool(world_transport.failed_peers()) or aborted
        if not aborted and not resumed:  # (after a failure: peers that dial this rank once it is gone learn which)
            await world_transport.note_departure(grace=STORE_GOODBYE_GRACE)
        await world_transport.close()
        # Keep the store up for the others until they leave too, unless the job is broken
        # (a failed rank never leaves: waiting would only delay this rank's error).
        wait = 0.0 if broken or resumed else min(timeout, STORE_LEAVE_WAIT)
        # (each goodbye to the store is bounded: see rendezvous.leave)
        if found is not None and not found_closed:  # (file://: the store this rank found or hosts, and the file)
            await found.close(rdzv.key_prefix, rdzv.world_size, wait=wait)
            found_closed = True
        if rdzv.server is not None:
            server = rdzv.server
            if not resumed:
                await leave(rdzv.store, rdzv.key_prefix, rdzv.world_size, wait=wait,
                            alone=lambda: server.clients <= 1)
            if broken:  # the others' store calls fail now: say why, so that they name the cause
                first = world_transport.links.first_failure
                await rdzv.server.close(reason=_store_farewell(rdzv.rank, first), host=rdzv.rank,
                                        culprit=first[0] if first is not None else None,
                                        cause=first[1] if first is not None else None)
        elif rdzv.owned and not resumed:
            await leave(rdzv.store, rdzv.key_prefix, rdzv.world_size, wait=0)
        while rdzv.owned:
            close = rdzv.owned[-1]
            try:
                await close()
            except Exception as e:  # the job is over for this rank: what is left to close is not its concern
                log.debug("rank %d: closing %r at the end of the job failed: %r", rdzv.rank, close, e)
            rdzv.owned.pop()

    pg._on_destroy.append(teardown)
    _registry().clear()
    _registry().append(pg)
    set_default_group(pg)
    return pg


def _store_farewell(rank: int, first_failure: tuple[int | None, str] | None) -> str:
    """What the store server hosted by ``rank`` tells its clients when that rank leaves a broken job."""
    if first_failure is None:
        return f"its host, rank {rank}, left the job after a failure"
    culprit, how = first_failure
    if culprit == rank:
        return f"its host, rank {rank}, failed: {how}"
    whose = "a failure" if culprit is None else f"rank {culprit} failed"
    return f"its host, rank {rank}, left the job after {whose}: {how}"


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

    Cancellation: the groups are destroyed (no operation starts any more),
    but connections and the store server may still be open; the next
    ``destroy_process_group()`` or :func:`abort` closes what is left, waiting
    for nobody, after which ``init_process_group`` can start a new job.
    """
    world = get_default_group()
    if group is None or group is world:
        if world is None:
            raise NotInitializedError("destroy_process_group: the default process group is not initialized")
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


async def finish_failed_rank(error: BaseException, *, timeout: float = MISMATCH_LEAVE_WAIT,
                             what: str | None = None) -> None:
    """What happens when a rank's ``main`` raises ``error`` (the launcher and :func:`aiodist.spawn` call it).

    After a :class:`~aiodist.errors.CollectiveMismatchError`, the rank's groups
    are destroyed in order, bounded by ``timeout`` seconds, before the process
    exits: the reports of the mismatch this rank sent to the other members
    (connecting to those it never talked to) get there, so every member raises
    CollectiveMismatchError rather than a PeerFailureError for this rank. After
    any other exception the rank leaves at once, telling what failed (its own
    error, unless it was a consequence of an earlier failure it learned of) to
    the peers connected to it (``bye``), to those that reach for it later (a
    note in the store) and to the clients of the store it hosts, instead of a
    bare lost connection; its pending operations are aborted (as by
    :func:`abort`). ``what``: how to say an exception (default ``raised
    Type: message``; the launcher adds the program's line). Never raises.
    """
    world = get_default_group()
    if world is None:
        return
    if isinstance(error, CollectiveMismatchError):
        try:
            await finish_rank(timeout=timeout)
        except Exception as e:  # (operations never awaited, or a failing teardown: the mismatch is the rank's error)
            log.debug("leaving after a collective mismatch: %r", e)
        return
    if isinstance(error, SystemExit) and error.code not in (None, 0):  # sys.exit(3), sys.exit("why")
        what = f"exited with code {error.code}" if isinstance(error.code, int) else f"exited: {error.code}"
    elif not isinstance(error, Exception):  # (a clean exit, an interrupt: the process goes as it is)
        return
    elif what is None:
        what = f"raised {type(error).__name__}: {error}"
    transport = world.transport
    transport.links.failed_here(what.splitlines()[0])
    try:
        await transport.note_departure(grace=STORE_GOODBYE_GRACE)  # (for the peers that reach for it later)
        await transport.close()  # bye, saying what failed, to the peers connected to it
        await abort()  # every group at once, and the store it hosts (telling its clients why)
    except Exception as e:  # noqa: BLE001 - leaving is best effort: the error is the rank's own
        log.debug("leaving after %r: %r", error, e)


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
        for g in groups:  # (before the connections drop: pending operations fail with AbortedError)
            g.mark_aborted()
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


def get_rank(group: ProcessGroup | None = None) -> int:
    """This rank's number in ``group`` (default: the world); -1 if not a member. A plain int, as torch's."""
    return int(_group(group).rank)


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 on a rank that is not a member (as in torch)."""
    pg = _group(group)
    return int(pg.size) if pg.rank >= 0 else -1


def get_process_group_ranks(group: ProcessGroup | None = None) -> list[int]:
    """The global ranks of ``group``'s members."""
    return _group(group).ranks


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The global rank of ``group_rank`` of ``group``."""
    return _group(group).global_rank(group_rank)


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """The rank in ``group`` of ``global_rank``; InvalidRankError (a ValueError, as torch's) if it is not a member.

    (``group.group_rank(global_rank)`` answers -1 instead.)
    """
    pg = _group(group)
    rank = pg.group_rank(global_rank)
    if rank < 0:
        raise InvalidRankError(
            f"get_group_rank: global rank {global_rank} is not a member of {with_ranks(pg.name, pg.ranks)}",
            rank=global_rank, size=pg.size, argument="global_rank",
        )
    return rank


def get_backend(group: ProcessGroup | None = None) -> Backend:
    """The backend name ``group`` was created with (``init_process_group(backend=...)``; default ``"gloo"``).

    Only a name: every backend runs over aiodist's own transport.
    """
    return Backend(_group(group).backend)


def is_available() -> bool:
    """True: aiodist is always available (torch's ``torch.distributed.is_available``)."""
    return True


def is_gloo_available() -> bool:
    """True: ``backend="gloo"`` is accepted (it runs over aiodist's transport)."""
    return True


def is_nccl_available() -> bool:
    """False: there is no GPU transport (``backend="nccl"`` is accepted as a name and runs over aiodist's own)."""
    return False


def is_mpi_available() -> bool:
    return False


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` is available as its ``is_<name>_available()`` says: ``"gloo"`` (and ``"aiodist"``) only."""
    return isinstance(backend, str) and backend.strip().lower() in ("gloo", "aiodist")


_DEVICE_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "mps": "gloo"}
"""torch's ``Backend.default_device_backend_map``: the backend name torch picks per device type."""


def get_default_backend_for_device(device: Any) -> str:
    """The backend name torch uses for ``device`` (``"cpu"``, ``"cuda:0"``, a ``torch.device``): ``"gloo"`` for CPU.

    Only a name, for ``init_process_group(backend=...)``: every backend runs over aiodist's own
    transport. ValueError for a device type torch has no default backend for, as torch.
    """
    kind = getattr(device, "type", device)  # (a torch.device has .type)
    if not isinstance(kind, str):
        raise InvalidArgumentTypeError(f"get_default_backend_for_device: device must be a str or a torch.device, not "
                        f"{type(device).__name__}")
    backend = _DEVICE_BACKENDS.get(kind.split(":", 1)[0].strip().lower())
    if backend is None:
        raise InvalidArgumentError(f"Default backend not registered for device : {device}")
    return backend


def supports_complex(op: Any) -> bool:
    """Whether reduction ``op`` is defined on complex numbers (torch's ``supports_complex``): not MAX, MIN,
    PRODUCT or the bitwise ones."""
    return op not in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def get_pg_count() -> int:
    """How many process groups this rank has: the default group and the groups made since (0 before init)."""
    return len(_registry())


def is_torchelastic_launched() -> bool:
    """Whether this rank was started by a launcher that sets ``TORCHELASTIC_RUN_ID`` (``aiodist run``, the simulator, torchrun)."""
    return getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This rank's number on its machine (``LOCAL_RANK``), else ``fallback_rank``; RuntimeError if neither."""
    raw = getenv("LOCAL_RANK")
    if raw is not None and raw != "":
        return int(raw)
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment: start the job with `aiodist run` (or torchrun), or pass fallback_rank"
    )


def _file_rank(rank: int | None) -> int:
    """This rank's number for a ``file://`` init: ``rank=`` or ``RANK`` (required, as in torch)."""
    if rank is not None:
        return rank
    raw = getenv("RANK")
    if raw is None or not raw.strip().lstrip("-").isdigit():
        raise RendezvousError("init_method='file://...' needs rank= and world_size= (or RANK and WORLD_SIZE)")
    return int(raw)


def _backend_and_method(backend: str | None, init_method: str | None) -> tuple[str | None, str | None]:
    """(backend, init method) of ``init_process_group``'s first two arguments, in torch's order or aiodist's."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"init_process_group: backend must be a string, not {type(backend).__name__}")
    if backend is not None and not is_backend(backend):
        if "://" in backend:  # aiodist's form: the init method first
            if init_method is not None:
                raise TypeError(
                    f"init_process_group({backend!r}, {init_method!r}): the first argument is an init method, "
                    "and so is the second; torch's order is (backend, init_method)"
                )
            return None, backend
        backend_name(backend)  # raises, saying which names are accepted
    if init_method is not None and (not isinstance(init_method, str) or "://" not in init_method):
        raise ValueError(
            f"init_process_group: init_method {init_method!r} is not an init method "
            "(use 'env://', 'tcp://host:port', 'file:///path', or store=)"
        )
    return (backend_name(backend) if backend is not None else None), init_method


__all__ = [
    "ProcessGroup", "ReduceOp", "Work",  # (re-exported: code written against aiodist.api uses them)
    "DEFAULT_TIMEOUT", "abort", "destroy_process_group", "finish_failed_rank", "finish_rank", "get_backend", "get_global_rank",
    "get_group_rank", "get_node_local_rank", "get_process_group_ranks", "get_rank", "get_world_size",
    "init_process_group", "is_available", "is_backend_available", "is_gloo_available", "is_initialized",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
    "default_pg_timeout", "get_default_backend_for_device", "get_pg_count", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group", "supports_complex", *_OPERATIONS,
]


