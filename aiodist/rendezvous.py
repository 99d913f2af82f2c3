"""Rendezvous: how the ranks of a job find a store, agree on the job and on each other.

Three ways in, as in torch:

* ``env://`` reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``
  (and ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) from the rank's environment;
  rank 0 starts the store server on ``MASTER_ADDR:MASTER_PORT`` (unless
  ``TORCHELASTIC_USE_AGENT_STORE=True``: then, as under torchrun, an agent
  hosts it), the others connect to it, retrying until the timeout;
* ``tcp://host:port`` does the same with the address from the URL and rank
  and world size from the arguments (or the environment);
* ``store=`` uses a store the caller made (rank and world size from the
  arguments or the environment).

Then the ranks join a *round* in the store. A round is numbered by the
store's generation counter; each rank registers its rank there once (a second
registration of the same rank in an unfinished round is a duplicate rank and
fails at once), all ranks must state the same world size, and the first to
arrive proposes the *job id* (compare-and-set, so all agree on one). Every
connection between ranks carries the job id, so a stale process of an earlier
round is refused. A rank that rendezvouses again on the same store after its
round completed (re-initialization) moves the generation on, and the others
follow. A round's keys live under its prefix (``aiodist/<round>/``).

The store connections are authenticated with the job's secret (``secret=``,
default: from the rank's environment, see :func:`aiodist.auth.resolve_secret`)
and optionally run over TLS (``ssl=``); the server rank 0 starts takes its
limits from ``store_limits=`` or the ``AIODIST_STORE_LIMITS`` variable of the
rank's environment (see :class:`aiodist.store.limits.StoreLimits`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from . import auth, tls
from .context import getenv, token_bytes
from .errors import RendezvousError, RendezvousTimeoutError, StoreConnectTimeoutError, StoreError, StoreTimeoutError
from .launch_marks import JOINED, WAITING, mark_rendezvous

GENERATION_KEY = "aiodist/rdzv/generation"
RECONNECT_PAUSE = 0.1
"""Seconds a rank waits before reconnecting to a store server that went away during its rendezvous."""
STORE_GOODBYE_GRACE = 1.0
"""Seconds a leaving rank gives the store to take its goodbye, beyond the wait for the others."""
_FAILED = "failed: "
"""How a round's ``done`` key starts when the round failed (the rest says why); a completed round's is ``1``."""
_TIMED_OUT = "timed out: "
"""How it starts when a rank's rendezvous timed out (the rest: the ranks that did not join, comma-separated)."""
BACKENDS = ("gloo", "nccl", "mpi", "cpu", "aiodist", "cpu:gloo")
"""Names torch programs pass as ``backend``: taken to mean ``env://``."""


@dataclass
class Rendezvous:
    """The outcome of a rendezvous.

    ``owned`` lists what this rank created and must close when the job ends
    (the store client it connected, the store server rank 0 started).
    """

    store: Any
    rank: int
    world_size: int
    job_id: str
    key_prefix: str
    round: int
    local_rank: int | None = None
    local_world_size: int | None = None
    server: Any = None
    owned: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


def _int_setting(name: str, given: int | None, *, required: bool = True) -> int | None:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int):
            raise RendezvousError(f"{name.lower()} must be an int, got {given!r}")
        return given
    raw = getenv(name)
    if raw is None or raw == "":
        if required:
            raise RendezvousError(
                f"environment variable {name} is not set: pass it (or rank=/world_size=) or start the job "
                "with `aiodist run` / torchrun"
            )
        return None
    try:
        return int(raw)
    except ValueError:
        raise RendezvousError(f"environment variable {name}={raw!r} is not an integer") from None


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1:
        raise RendezvousError(f"world size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise RendezvousError(f"rank {rank} is out of range for world size {world_size}")


@dataclass(frozen=True)
class _StoreAccess:
    """How this rank reaches (and, as rank 0, serves) the job's store."""

    secret: bytes | None = field(repr=False)  # (never in a repr: a log line or traceback could show it)
    ssl: Any = None  # an aiodist.tls.TLS, an SSLContext usable on both sides, or None
    limits: Any = None  # StoreLimits for the server rank 0 starts


async def _open_store(
    host: str, port: int, rank: int, timeout: float, access: _StoreAccess | None = None
) -> tuple[Any, Any, list[Callable[[], Awaitable[None]]]]:
    """Rank 0: start the server, then connect; others: connect (the client retries until ``timeout``).

    ``access`` defaults to the secret of the rank's environment, no TLS, the environment's limits.
    """
    if access is None:
        access = _StoreAccess(auth.resolve_secret())
    from .store.client import TCPStore
    from .store.limits import StoreLimits
    from .store.server import StoreServer

    owned: list[Callable[[], Awaitable[None]]] = []
    server = None
    rank0_serves = (getenv("TORCHELASTIC_USE_AGENT_STORE") or "").lower() not in ("true", "1")
    if rank == 0 and rank0_serves:
        try:
            limits = access.limits if access.limits is not None else StoreLimits.from_environment(getenv)
            server = await StoreServer.start(
                host=host, port=port, secret=access.secret, ssl=tls.server_side(access.ssl), limits=limits
            )
        except (OSError, ConnectionError, ValueError) as e:
            raise RendezvousError(f"rank 0 could not start the store server on {host}:{port}: {e}") from None
        owned.append(server.close)
    try:
        store = await TCPStore.connect(host, port, timeout=timeout, secret=access.secret, ssl=tls.client_side(access.ssl))
    except BaseException as e:  # (a cancellation too: the server this call started goes with it)
        for close in reversed(owned):
            await close()
        if isinstance(e, StoreConnectTimeoutError) and rank != 0 and rank0_serves:
            # Nothing answered there until the deadline: rank 0, which starts that store, never did (hung,
            # stopped or gone before its rendezvous), or the address is wrong. Rank 0 is the one missing.
            raise RendezvousTimeoutError(
                f"rank {rank} could not reach the store at {host}:{port}, which rank 0 starts in its "
                f"rendezvous: {e}", missing=[0], timeout=timeout) from None
        if isinstance(e, (TimeoutError, StoreError, ConnectionError)) and not isinstance(e, auth.AuthenticationError):
            raise RendezvousError(f"rank {rank} could not reach the store at {host}:{port}: {e}") from None
        raise  # as it is: a cancellation, or the job's secret differs between the ranks (or the store is not the job's)
    owned.insert(0, store.close)
    return store, server, owned


async def rendezvous(
    init_method: str | None = "env://",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    store: Any = None,
    timeout: float = 300.0,
    publish: Callable[[Rendezvous], Awaitable[None]] | None = None,
    secret: Any = auth.FROM_ENVIRONMENT,
    ssl: Any = None,
    store_limits: Any = None,
) -> Rendezvous:
    """Find the store and join a round (see the module doc).

    ``secret`` authenticates the store connections (default: from the
    environment; ``None``: off, with a warning); ``ssl`` (an
    :class:`aiodist.tls.TLS`) adds TLS; ``store_limits`` (a
    :class:`~aiodist.store.limits.StoreLimits`) sets the limits of the
    server rank 0 starts (default: ``AIODIST_STORE_LIMITS`` or the defaults).
    None of them applies to a ``store=`` the caller made.

    ``publish(rendezvous)`` runs after this rank joined and before it
    waits for the others (the transport publishes its address there), so once
    the rendezvous completes every rank's address is in the store.

    Raises RendezvousError (bad or missing settings, duplicate rank, world
    size disagreement) or RendezvousTimeoutError naming the ranks that did not
    join. Cancellation closes what this call opened.
    """
    if not timeout > 0:
        raise RendezvousError(f"timeout must be > 0, got {timeout!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    method = init_method or "env://"
    if method in BACKENDS:
        method = "env://"
    owned: list[Callable[[], Awaitable[None]]] = []
    server = None
    if store is not None:
        r = _int_setting("RANK", rank)
        n = _int_setting("WORLD_SIZE", world_size)
    elif method.startswith("env://"):
        r = _int_setting("RANK", rank)
        n = _int_setting("WORLD_SIZE", world_size)
        host = getenv("MASTER_ADDR")
        if not host:
            raise RendezvousError("environment variable MASTER_ADDR is not set (env:// rendezvous)")
        port = _int_setting("MASTER_PORT", None)
    elif method.startswith("tcp://"):
        url = urlparse(method)
        if not url.hostname or url.port is None:
            raise RendezvousError(f"init_method {method!r} must look like tcp://host:port")
        host, port = url.hostname, url.port
        r = _int_setting("RANK", rank)
        n = _int_setting("WORLD_SIZE", world_size)
    else:
        raise RendezvousError(f"unsupported init_method {init_method!r}: use 'env://', 'tcp://host:port' or store=")
    assert r is not None and n is not None
    _check_rank(r, n)
    local_rank = _int_setting("LOCAL_RANK", None, required=False)
    local_world = _int_setting("LOCAL_WORLD_SIZE", None, required=False)
    reconnect = store is None and r != 0
    mark_rendezvous(WAITING, rank=r, world_size=n)  # (for `aiodist run`: see aiodist.launch_marks)
    access = _StoreAccess(auth.resolve_secret(secret) if store is None else None, ssl, store_limits)
    if store is None:
        assert host is not None and port is not None
        store, server, owned = await _open_store(host, port, r, max(deadline - loop.time(), 0.001), access)
    token = token_bytes(8).hex()  # this call's claim on RANK: a retry below recognizes its own
    reconnected = False
    try:
        while True:
            try:
                result = await _join(store, r, n, deadline, publish, token)
                break
            except RendezvousError as e:
                if reconnected:  # (the round it joined may be another job's: say so)
                    e.args = (f"{e} (rank {r} lost the store at {host}:{port} during its rendezvous and joined "
                              "the round of the store there now: the job it was joining may have been rebuilt "
                              "without it)",)
                raise
            except (StoreError, ConnectionError) as e:
                if reconnect and loop.time() < deadline and not isinstance(e, TimeoutError):
                    # The server went away under us: likely the store of a previous round whose host
                    # (rank 0) is re-creating it for this one (survivors rebuilding after a failure).
                    # Connect again and start over, within the same deadline.
                    for close in reversed(owned):
                        try:
                            await close()
                        except Exception:
                            pass
                    owned = []
                    reconnected = True
                    await asyncio.sleep(min(RECONNECT_PAUSE, max(deadline - loop.time(), 0)))
                    assert host is not None and port is not None
                    try:
                        store, server, owned = await _open_store(
                            host, port, r, max(deadline - loop.time(), 0.001), access
                        )
                    except RendezvousError:
                        raise RendezvousError(
                            f"rank {r} lost the store during rendezvous and could not reach it again: "
                            f"{type(e).__name__}: {e}"
                        ) from e
                    continue
                what = ("the store did not answer in time during rendezvous (stopped, hung or overloaded?)"
                        if isinstance(e, TimeoutError) else "lost the store during rendezvous")
                raise RendezvousError(f"rank {r}: {what}: {type(e).__name__}: {e}") from e
    except BaseException:
        for close in reversed(owned):
            try:
                await close()
            except Exception:
                pass
        raise
    mark_rendezvous(JOINED, rank=r, world_size=n)
    result.local_rank = local_rank
    result.local_world_size = local_world
    result.server = server
    result.owned = owned
    return result


async def _join(
    store: Any, rank: int, world_size: int, deadline: float, publish: Callable[[Rendezvous], Awaitable[None]] | None,
    token: str,
) -> Rendezvous:
    """Join the store's current round as ``rank``, claiming it with ``token``.

    Every step may be repeated by the same rendezvous call (after a lost store connection, with
    the same token): the claim then finds its own token rather than a second process, and the
    other steps set the same keys again. Only the joined counter can count a repeating rank
    twice (if its add was applied but the reply lost), which can set "done" early: ranks that go
    on before the last one published its address wait for it in the store.
    """
    loop = asyncio.get_running_loop()
    for _ in range(16):  # each pass moves the generation on at most once
        gen = await store.add(GENERATION_KEY, 0)
        prefix = f"aiodist/{gen}/"
        holder = bytes(await store.compare_set(f"{prefix}rank/{rank}", b"", token.encode())).decode()
        if holder == token:
            break
        if await store.check([f"{prefix}done"]):
            # Round ``gen`` finished long ago: this is a new initialization.
            await store.compare_set(GENERATION_KEY, str(gen), str(gen + 1))
            continue
        restarts = getenv("AIODIST_RESTART_COUNT") or getenv("TORCHELASTIC_RESTART_COUNT") or "0"
        if restarts not in ("", "0"):
            raise RendezvousError(
                f"rank {rank} joined rendezvous round {gen} twice: this process is a restart "
                f"(AIODIST_RESTART_COUNT={restarts}) of a rank that was in the round, and the others still are: "
                "they must leave it and rebuild the group with the restarted rank (an elastic program: see "
                "examples/elastic_train.py), or the whole job must restart"
            )
        problem = (f"rank {rank} joined rendezvous round {gen} twice: two processes were given RANK={rank} "
                   "(or a process of an earlier run is still alive)")
        # The round cannot complete (a rank is missing, if the world is full): end it for the others now,
        # saying why, instead of letting them wait for their timeout and blame the missing rank.
        await store.compare_set(f"{prefix}done", b"", (_FAILED + problem).encode())
        raise RendezvousError(problem)
    else:
        raise RendezvousError(f"rank {rank} could not join a rendezvous round (the store's generation keeps moving)")

    # The first rank here sets the round's world size and job id (one request: "SIZE JOB-ID").
    run_id = getenv("AIODIST_RUN_ID") or getenv("TORCHELASTIC_RUN_ID") or "job"
    candidate = f"{world_size} {run_id}/{gen}/{loop.time():.6f}/{rank}"
    agreed = bytes(await store.compare_set(f"{prefix}job", b"", candidate)).decode()
    theirs, _, job_id = agreed.partition(" ")
    if int(theirs) != world_size:
        problem = (f"world size disagreement in rendezvous round {gen}: rank {rank} has WORLD_SIZE={world_size}, "
                   f"another rank registered {int(theirs)}")
        # The round cannot complete as either side counts it: end it for the others now, saying why.
        await store.compare_set(f"{prefix}done", b"", (_FAILED + problem).encode())
        raise RendezvousError(problem)
    result = Rendezvous(store=store, rank=rank, world_size=world_size, job_id=job_id, key_prefix=prefix, round=gen)
    if publish is not None:
        await publish(result)
    # Counted first, registered after: a rank that stops between the steps is then one the others name as
    # missing (registered first, a rank that stopped before counting itself left a round that no rank
    # completed and that named nobody: "ranks [] did not join (4 of 4 did)"). The rank that completes the
    # round says so instead (its registration would only delay it: nobody looks once the round is done).
    joined = await store.add(f"{prefix}joined", 1)
    if joined >= world_size:  # (more: a repeated join counted twice; see above)
        await store.set(f"{prefix}done", b"1")
    else:
        await store.set(f"{prefix}joined/{rank}", b"1")
    waiting_since = loop.time()
    remaining = deadline - waiting_since
    try:
        if remaining <= 0:
            raise TimeoutError
        done = bytes(await store.get(f"{prefix}done", timeout=remaining))
    except TimeoutError:
        missing = await _missing(store, prefix, world_size)
        # The round ends for every rank now, with this verdict: the store may go with this rank (its host),
        # and the others must not read that as a lost store, nor wait out their own timeouts.
        mark = (_TIMED_OUT + ",".join(map(str, missing))).encode()
        try:
            done = bytes(await store.compare_set(f"{prefix}done", b"", mark))
        except (StoreError, ConnectionError, TimeoutError):
            done = mark
        if done == mark:
            raise RendezvousTimeoutError(
                f"rendezvous round {gen} timed out on rank {rank}: {_not_joined(missing, world_size)}",
                missing=missing,
                timeout=remaining,
            ) from None
    if done.startswith(_TIMED_OUT.encode()):  # another rank's timeout ended the round
        missing = [int(r) for r in done[len(_TIMED_OUT):].decode().split(",") if r.isdigit()]
        raise RendezvousTimeoutError(
            f"rendezvous round {gen} timed out (rank {rank} learned it from the store): "
            f"{_not_joined(missing, world_size)}",
            missing=missing,
            timeout=loop.time() - waiting_since,
        )
    if done.startswith(_FAILED.encode()):
        raise RendezvousError(f"rendezvous round {gen} failed (rank {rank} learned it from the store): "
                              f"{done[len(_FAILED):].decode(errors='replace')}")
    return result


def _not_joined(missing: list[int], world_size: int) -> str:
    return f"ranks {missing} did not join ({world_size - len(missing)} of {world_size} did)"


async def _missing(store: Any, prefix: str, world_size: int) -> list[int]:
    """Ranks that did not complete their join of the round under ``prefix``."""
    present = await asyncio.gather(*(store.check([f"{prefix}joined/{r}"]) for r in range(world_size)))
    return [r for r, ok in enumerate(present) if not ok]


async def leave(
    store: Any, prefix: str, world_size: int, *, wait: float, alone: Callable[[], bool] | None = None
) -> None:
    """Record that this rank left the round; wait up to ``wait`` s for all to leave (store owner only).

    Used before rank 0 closes the store server it hosts, so that the others
    can still use the store until they are done. ``alone`` (the host's
    server: nobody else is connected to it) ends the wait early: the ranks
    that did not leave are gone (they failed, or exited without leaving), and
    nobody is left to use the store. Errors are swallowed, and it takes at
    most ``wait`` + :data:`STORE_GOODBYE_GRACE` s in all: the store may have
    gone with a failure (or be cut off), and leaving must not sit out the
    store client's timeout on it.
    """
    try:
        async with asyncio.timeout(wait + STORE_GOODBYE_GRACE):
            left = await store.add(f"{prefix}left", 1)
            if left >= world_size:
                await store.set(f"{prefix}all_left", b"1")
            if wait > 0:
                await _all_left(store, f"{prefix}all_left", wait, alone)
    except (TimeoutError, StoreError, ConnectionError):
        pass


LEAVE_POLL = 0.2
"""Seconds between two looks, while the store's host waits for the others to leave, at whether any is still connected."""


async def _all_left(store: Any, key: str, wait: float, alone: Callable[[], bool] | None) -> None:
    """Wait up to ``wait`` s for ``key`` (all ranks left), or until ``alone()`` says nobody else is connected."""
    if alone is None:
        await store.wait([key], timeout=wait)
        return
    loop = asyncio.get_running_loop()
    end = loop.time() + wait
    for _ in range(int(wait / LEAVE_POLL) + 2):  # (bounded: each round takes LEAVE_POLL s, or ends it)
        if alone():
            return
        remaining = end - loop.time()
        if remaining <= 0:
            return
        try:
            await store.wait([key], timeout=min(LEAVE_POLL, remaining))
            return
        except StoreTimeoutError:
            continue
