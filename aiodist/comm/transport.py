"""The peer transport: one connection per pair of ranks, shared by all groups.

Each rank listens on one address (published in the store under the job's
prefix) and connects *lazily*, the first time it sends to a peer, so a job
only opens the connections its algorithms use. When two ranks dial each other
at the same moment, the connection dialed by the lower rank is kept and the
other is answered ``dup`` and closed: exactly one connection per pair.

The lower rank of a pair dials; the higher one waits for that connection
before dialing itself. In a symmetric exchange (recursive doubling, pairwise
exchange: both partners send to each other at about the same time) both used
to dial, and one of the two connections (an address lookup in the store, a
connect, a handshake) was thrown away. Now a rank that needs a connection to a
*lower* rank defers its dial by :data:`DIAL_DEFER` (``AIODIST_DIAL_DEFER``,
0: dial at once): if the lower rank's connection arrives meanwhile it is used
and no dial is made; otherwise it dials after all, so a lower rank that only
receives, or is gone, costs that delay once and nothing hangs (an unreachable
rank still fails the operation, after the deferral). A rank that posts a
receive from a *higher* rank it is not connected to dials it at once, so a
higher rank whose first send to us waits for our first send to it (ours
waiting for its reply) does not wait out its deferral. The rule depends only
on the two ranks, never on timing or on the network, so it is the same over
TCP and in the simulator.

Every connection starts with a ``hello`` frame naming the job id, the rank and
the world size. A connection of another job (a stale rank of an earlier run),
an out-of-range rank or a different world size is refused with a ``refused``
frame that says why, then closed.

A reader task per connection routes frames through the :class:`Router`;
payloads of receives posted in time are written straight into the caller's
buffer. Sending never waits for reading: sends go straight to the connection.

Failure: a connection that breaks makes the peer *failed*: every pending and
later operation that involves it raises :class:`PeerFailureError` (``how`` says
why), every group containing it is broken, and the news is passed on to the
other connected peers so that ranks without a connection to it stop waiting
too. A rank only told of a failure keeps its connection to the accused
rank and tells it, so a rank that is alive but cut off from the others learns
that it was declared failed (its groups break, blaming itself) instead of
blaming whoever hung up on it. A peer that leaves through
:meth:`Transport.close` says ``bye`` first; that only fails the receives that
still expected something from it. A failed address lookup (the store is gone)
fails the operation that needed the connection, blaming nobody (``rank=None``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..context import current_network, getenv
from ..eager import start_eager
from ..errors import (
    CollectiveMismatchError,
    ConnectionClosedError,
    ConnectionClosedLocally,
    GroupError,
    PeerFailureError,
    PeerRefusedError,
)
from ..net.base import Address, Connection, Frame, Header, Listener, Network
from ..net.shmhost import choose_network
from ..wire import DEFER, as_byte_view
from .router import Delivery, Match, Receive, Router, freeze, resolve

log = logging.getLogger("aiodist.comm")

HELLO_TIMEOUT = 30.0
"""Seconds a new connection may take to say hello (and to answer one)."""

BYE_TIMEOUT = 2.0

DIAL_DEFER = 0.002
"""Seconds the higher rank of a pair waits for the lower rank's connection before dialing itself."""
DIAL_DEFER_ENV = "AIODIST_DIAL_DEFER"

DEFER_MIN_BYTES = 256 * 1024
"""A keyed payload at least this large that arrives before its receive is posted waits in the
socket (reading from that peer pauses) until the receive is posted, so that it is written
straight into the receiver's buffer instead of into a new one and then copied."""
DEFER_TIMEOUT = 0.05
"""Seconds a payload waits so; then it is read into a new buffer, so that a receive posted much
later (or never) does not hold up the frames behind it."""

MAX_EARLY_FRAMES_ENV = "AIODIST_MAX_EARLY_FRAMES"
"""Per peer: how many frames may wait for their receive (default :data:`.router.MAX_EARLY_FRAMES`)."""
MAX_EARLY_BYTES_ENV = "AIODIST_MAX_EARLY_BYTES"
"""Per peer: how many payload bytes may wait for their receive (default :data:`.router.MAX_EARLY_BYTES`).

A peer that exceeds either, or sends an impossible frame (see :mod:`.router`: a group this
rank will never know, a duplicate or absurd sequence number), is treated as failed: its
connection is closed after a ``fail`` notice naming the problem (so an aiodist rank on the
other end raises an error saying why), its buffered frames are dropped, and every group
containing it fails with PeerFailureError naming it, ``how`` starting with "sent bad input".
"""

HEARTBEAT_ENV = "AIODIST_HEARTBEAT_TIMEOUT"
"""Seconds of silence after which a connected peer is declared failed (0 or ``off``: no heartbeats).

When set it overrides ``interval * misses`` (the interval becomes timeout / misses).
"""
HEARTBEAT_INTERVAL_ENV = "AIODIST_HEARTBEAT_INTERVAL"
"""Seconds between heartbeat frames on each connection (default :data:`HEARTBEAT_INTERVAL`)."""
HEARTBEAT_MISSES_ENV = "AIODIST_HEARTBEAT_MISSES"
"""Heartbeat intervals of silence after which a peer is declared failed (default :data:`HEARTBEAT_MISSES`)."""
HEARTBEAT_MIN_BANDWIDTH = 1e6
"""Bytes/s: while a frame of n bytes arrives from a peer, its heartbeats wait behind it, so the
peer is allowed n / HEARTBEAT_MIN_BANDWIDTH more seconds of silence (a slow link is not a hung peer)."""
HEARTBEAT_GRACE_MIN_BYTES = 256 * 1024
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_MISSES = 6
"""Defaults: a hung peer (stopped, partitioned, or its event loop blocked) is declared failed after
3 s of silence, so within about 3.5 s.

Heartbeats are on by default. Each live connection carries a tiny ``hb`` frame
every interval (a few bytes per second: nothing next to collective traffic),
and any frame, or the start of a payload, counts as a sign of life. A rank
whose event loop is blocked (a long computation that never awaits) sends
nothing and cannot be told from a hung one: raise the timeout for such
programs (``init_process_group(heartbeat_interval=..., heartbeat_misses=...)``
or the environment variables above), or turn heartbeats off with
``AIODIST_HEARTBEAT_TIMEOUT=0``. A rank whose own loop was blocked does not
blame its peers for the silence it did not hear: a watcher that wakes up late
restarts its count.
"""


class _Peer:
    """What this rank knows about its connection to one other rank."""

    __slots__ = (
        "rank", "conn", "ready", "dialing", "accepting", "failure", "refused", "matches", "last_heard", "rejected",
        "deferred", "watch",
    )

    def __init__(self, rank: int, loop: asyncio.AbstractEventLoop) -> None:
        self.rank = rank
        self.conn: Connection | None = None
        self.ready: asyncio.Future[Connection] = loop.create_future()
        self.dialing = False
        self.accepting = False
        self.failure: str | None = None  # how it failed, once it did
        self.refused: str | None = None  # the peer refused our connection: why
        self.matches: collections.deque[Match] = collections.deque()
        self.last_heard = loop.time()
        self.rejected: str | None = None  # it sent bad input: why (its frames are dropped since)
        self.deferred: asyncio.TimerHandle | None = None  # our dial, deferred: we wait for the peer's (see _dial_late)
        self.watch: asyncio.TimerHandle | None = None  # starts the heartbeat watcher of ``conn`` (see _start_watch)

    def __repr__(self) -> str:
        state = self.failure or ("ready" if self.ready.done() else "dialing" if self.dialing else "idle")
        return f"<peer {self.rank} {state}>"


def format_address(address: Address) -> bytes:
    return f"{address[0]}|{address[1]}".encode()


def parse_address(raw: bytes) -> Address:
    host, _, port = raw.decode().rpartition("|")
    return host, int(port)


class Transport:
    """One rank's connections to the other ranks of one job (see the module doc).

    Create with :meth:`start`; end with :meth:`close`, which cancels and awaits
    every task it owns (readers, dials, failure reports).
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        job_id: str,
        store: Any,
        key_prefix: str,
        timeout: float,
        network: Network,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.job_id = job_id
        self.store = store
        self.key_prefix = key_prefix
        self.timeout = timeout
        self.router = Router()
        self.router.check_groups = True
        self.router.max_early_frames = _env_number(MAX_EARLY_FRAMES_ENV, self.router.max_early_frames, int, zero_ok=False)
        self.router.max_early_bytes = _env_number(MAX_EARLY_BYTES_ENV, self.router.max_early_bytes, int, zero_ok=False)
        self._net = network
        self._loop = asyncio.get_running_loop()
        self._listener: Listener | None = None
        self._peers: dict[int, _Peer] = {}
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._groups: dict[Any, tuple[int, ...]] = {}
        self._group_failures: dict[Any, PeerFailureError] = {}
        self._broken: dict[Any, asyncio.Future[None]] = {}  # per group: resolved when it breaks
        self._p2p_numbers: dict[tuple[Any, int, int], int] = {}
        # large payloads waiting in their socket for a receive: slot -> (peer, conn, match, fallback timer)
        self._deferred: dict[tuple[Any, Any, int], tuple[_Peer, Connection, Match, asyncio.TimerHandle]] = {}
        self._next_group = 1
        self._condemned: str | None = None  # why the other ranks consider this rank failed, if they do
        self._heartbeat = _heartbeat_timeout()  # (interval, misses) or None: off
        self._dial_defer = _env_number(DIAL_DEFER_ENV, DIAL_DEFER, float, zero_ok=True)
        self._hb_grace: dict[int, float] = {}  # peer -> extra seconds of silence allowed: a large frame is arriving
        self._closed = False  # no new operations (closing, closed or aborted)
        self._finished = False  # close() ran
        self.address: Address | None = None

    def __repr__(self) -> str:
        return f"<Transport rank={self.rank}/{self.world_size} job={self.job_id!r} peers={len(self._peers)}>"

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    async def start(
        cls,
        *,
        rank: int,
        world_size: int,
        job_id: str,
        store: Any,
        key_prefix: str,
        timeout: float,
        host: str | None = None,
        mode: str | None = None,
    ) -> Transport:
        """Listen (on ``host``, else ``AIODIST_HOST``, else the network's default) and publish the address.

        ``mode``: the transport mode (see :mod:`aiodist.net.shmhost`; "tcp" forces TCP between ranks of one host).
        """
        net = choose_network(current_network(), mode=mode)
        t = cls(
            rank=rank,
            world_size=world_size,
            job_id=job_id,
            store=store,
            key_prefix=key_prefix,
            timeout=timeout,
            network=net,
        )
        host = host or getenv("AIODIST_HOST") or net.default_host()
        t._listener = await net.listen((host, 0), t._accept)
        t.address = t._listener.address
        try:
            await store.set(t._address_key(rank), format_address(t.address))
        except BaseException:
            await t.close()
            raise
        return t

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def network(self) -> Network:
        """The network this rank's connections are made on."""
        return self._net

    async def close(self) -> None:
        """Say ``bye`` to connected peers, close every connection and await every task.

        Pending receives fail with GroupError. Idempotent.
        """
        if self._finished:
            return
        self._finished = True
        aborted, self._closed = self._closed, True
        byes = [p.conn for p in self._peers.values() if p.conn is not None and p.failure is None and p.ready.done()]
        if byes and not aborted:
            bye: Header = {"t": "bye"}
            waits = [c for c in byes if not _sent_now(c, bye)]  # (most go at once: no task, no timer each)
            if waits:
                await asyncio.gather(*(self._send_quietly(c, bye, BYE_TIMEOUT) for c in waits))
        for p in self._peers.values():
            for timer in (p.deferred, p.watch):
                if timer is not None:
                    timer.cancel()
            p.deferred = p.watch = None
            if p.failure is None:
                p.failure = "this rank closed its connections"
            if p.conn is not None:
                p.conn.close()
            if not p.ready.done():
                p.ready.set_exception(GroupError("the process group was destroyed"))
                p.ready.exception()
        if self._listener is not None:
            self._listener.close()
        self._drop_deferred()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(BYE_TIMEOUT):  # a transport that never reports its end must not hang us
                if self._listener is not None:
                    await self._listener.wait_closed()
                for p in self._peers.values():
                    if p.conn is not None:
                        await p.conn.wait_closed()
        except TimeoutError:
            log.warning("rank %d: connections did not finish closing within %gs", self.rank, BYE_TIMEOUT)
        destroyed: Callable[[Receive], BaseException] = lambda r: GroupError("the process group was destroyed")
        for gid in list(self._groups):
            self.router.forget_group(gid, destroyed)
        for r in self.router.pending():
            self.router.cancel(r)
            resolve(r, destroyed(r))

    def abort(self) -> None:
        """Drop every connection at once, without ``bye``: what a crash of this rank looks like to its peers.

        The transport is unusable afterwards; :meth:`close` still releases it.
        """
        self._closed = True
        for p in self._peers.values():
            if p.conn is not None:
                p.conn.close()
        if self._listener is not None:
            self._listener.close()

    def failed_peers(self) -> list[int]:
        """Ranks this rank considers failed (not those that left cleanly); this rank too if it was declared failed."""
        failed = [r for r, p in self._peers.items() if p.failure is not None and not self._left(p)]
        if self._condemned is not None:
            failed.append(self.rank)
        return sorted(failed)

    def connected_peers(self) -> list[int]:
        """Ranks with a live connection to this one (diagnostics, tests)."""
        return sorted(r for r, p in self._peers.items() if p.conn is not None and not p.conn.closed)

    # ------------------------------------------------------------------ groups

    def allocate_group_id(self) -> int:
        """The next group id (every rank allocates them in the same order)."""
        gid = self._next_group
        self._next_group += 1
        if gid > self.router.newest_group:
            self.router.newest_group = gid
        return gid

    def register_group(self, gid: Any, ranks: tuple[int, ...]) -> None:
        self._groups[gid] = tuple(ranks)
        self.router.know_group(gid, tuple(ranks))
        if self._condemned is not None:
            self._break_group(gid, self.rank, self._condemned)
        # Members that failed already: look at the failed peers (few), not at every member
        # (a group of N ranks on each of N ranks would cost O(N^2) in the simulator).
        failed = sorted(r for r, p in self._peers.items() if p.failure is not None and not self._left(p))
        if failed:
            members = frozenset(ranks)
            for r in failed:  # in rank order, as the members are
                if r in members:
                    self._break_group(gid, r, self._peers[r].failure)  # type: ignore[arg-type]

    def foreign_group(self, gid: Any) -> None:
        """This rank is not a member of group ``gid`` (allocated here all the same): frames for it are bad input."""
        self.router.foreign_group(gid)

    def retire(self, gid: Any, floor: int) -> None:
        """Every operation of group ``gid`` below sequence number ``floor`` completed on this rank."""
        self.router.retire(gid, floor)

    def unregister_group(self, gid: Any) -> None:
        self._groups.pop(gid, None)
        self._group_failures.pop(gid, None)
        broken = self._broken.pop(gid, None)
        if broken is not None and not broken.done():
            broken.set_result(None)
        self.router.forget_group(gid, lambda r: GroupError(f"group {gid!r} was destroyed"))

    def group_failure(self, gid: Any) -> PeerFailureError | None:
        """The failure that broke group ``gid``, if one did."""
        return self._group_failures.get(gid)

    def next_p2p_number(self, gid: Any, dst: int, tag: int) -> int:
        key = (gid, dst, tag)
        n = self._p2p_numbers.get(key, 0)
        self._p2p_numbers[key] = n + 1
        return n

    def peer_error(self, rank: int) -> PeerFailureError:
        """A fresh PeerFailureError for ``rank`` (global numbering)."""
        if rank == self.rank:
            how = self._condemned or "unknown"
            return PeerFailureError(f"this rank ({rank}) was declared failed by its peers: {how}", rank=rank, how=how)
        p = self._peers.get(rank)
        how = p.failure if p is not None and p.failure else "unknown"
        if p is not None and p.refused is not None:
            return PeerRefusedError(
                f"rank {rank} refused the connection of rank {self.rank}: {p.refused}",
                rank=rank,
                how=how,
                reason=p.refused,
            )
        return PeerFailureError(f"rank {rank} failed: {how}", rank=rank, how=how)

    # ------------------------------------------------------------------ sending / receiving

    async def send(self, dst: int, header: Header, payload: Any = None, *, group: Any = None) -> None:
        """Send one frame to rank ``dst`` (connecting first if needed).

        Raises PeerFailureError if ``dst`` failed, or if ``group`` breaks while
        the connection is being made. Cancellation: the frame was queued whole
        or not at all.
        """
        if self._closed:
            raise GroupError("the process group was destroyed")
        if dst == self.rank:
            self._loopback(header, payload)
            return
        p = self._peer(dst)
        if p.ready.done() and p.failure is None:
            conn = p.ready.result()
        else:
            conn = await self._connection(p, group)
        if not self._sent_now(p, conn, header, payload):
            await self._send_on(p, conn, header, payload)

    def send_soon(self, dst: int, header: Header, payload: Any = None, group: Any = None) -> Awaitable[None] | None:
        """Send one frame now if nothing is in the way (None); else the awaitable that sends it.

        :meth:`send` without a coroutine on the common path: connected, and the
        connection takes the frame at once (its ``try_send``). Raises what
        ``send`` raises, from here or from the awaitable.
        """
        p = self._peers.get(dst)
        if p is not None and p.failure is None and not self._closed and p.ready.done():
            conn = p.ready.result()
            if self._sent_now(p, conn, header, payload):
                return None
            return self._send_on(p, conn, header, payload)  # (not send(): it would try again)
        return self.send(dst, header, payload, group=group)

    def _sent_now(self, p: _Peer, conn: Connection, header: Header, payload: Any) -> bool:
        """Did ``conn`` take the frame at once (its ``try_send``)? A broken connection: ``p`` failed."""
        try_send = getattr(conn, "try_send", None)
        try:
            return try_send is not None and try_send(header, payload)
        except ConnectionClosedError:
            raise self._lost(p) from None

    async def _send_on(self, p: _Peer, conn: Connection, header: Header, payload: Any) -> None:
        try:
            await conn.send(header, payload)
        except ConnectionClosedError:
            raise self._lost(p) from None

    def _lost(self, p: _Peer) -> PeerFailureError:
        """The connection to ``p`` broke under a send: the peer failed."""
        if not self._closed:
            self._peer_failed(p, "connection lost")
        return self.peer_error(p.rank)

    def post(self, receive: Receive) -> None:
        """Post a receive (keyed if ``receive.tag`` is None, else point-to-point)."""
        if self._closed:
            self.router.cancel(receive)
            resolve(receive, GroupError("the process group was destroyed"))
            return
        if receive.tag is None:
            self.router.post_keyed(receive)
            if self._deferred and not receive.done:
                self._resume_deferred(receive)
        else:
            self.router.post_p2p(receive)
        src = receive.src
        if src is not None and src > self.rank and not receive.done:
            self._expect(src)

    def _expect(self, src: int) -> None:
        """A receive from the higher rank ``src`` waits: if we are not connected, dial it now.

        ``src`` defers its own dial to us (see the module doc), and may be waiting for our
        connection right now; or it sends only once it heard from us on another route.
        """
        p = self._peers.get(src)
        if p is not None and (p.ready.done() or p.dialing or p.accepting or p.failure is not None):
            return
        if not 0 <= src < self.world_size:
            return
        p = self._peer(src)
        p.dialing = True
        self._spawn(self._dial(p, speculative=True))

    def _loopback(self, header: Header, payload: Any) -> None:
        data = None if payload is None else memoryview(bytearray(as_byte_view(payload)))
        nbytes = 0 if data is None else data.nbytes
        m = self.router.route(self.rank, header, nbytes)
        if m.violation is not None:  # e.g. more messages to itself than the budget, none received
            raise GroupError(f"rank {self.rank} cannot send this message to itself: {m.violation}")
        if data is not None and m.sink is not None:
            m.sink[:] = data
            data = m.sink
        self.router.complete(m, data)

    # ------------------------------------------------------------------ connections

    def _peer(self, rank: int) -> _Peer:
        p = self._peers.get(rank)
        if p is None:
            if not 0 <= rank < self.world_size:
                raise GroupError(f"rank {rank} is not in the job (world size {self.world_size})")
            p = self._peers[rank] = _Peer(rank, self._loop)
        return p

    def _address_key(self, rank: int) -> str:
        return f"{self.key_prefix}addr/{rank}"

    async def _connection(self, p: _Peer, group: Any = None) -> Connection:
        """The connection to ``p``, dialing it if nobody is; fails early if ``group`` breaks meanwhile."""
        if p.failure is not None:
            raise self.peer_error(p.rank)
        if p.ready.done():
            return p.ready.result()
        if not p.dialing and not p.accepting:
            p.dialing = True
            if self.rank > p.rank and self._dial_defer > 0:  # let the lower rank dial (see the module doc)
                p.deferred = self._loop.call_later(self._dial_defer, self._dial_late, p)
            else:
                self._spawn(self._dial(p))
        ready = p.ready  # waited for through callbacks: cancelling this wait leaves it alone
        try:
            broken = None
            if group is not None and group in self._groups:
                failure = self._group_failures.get(group)
                if failure is not None:
                    raise self.peer_error(failure.global_rank if failure.global_rank is not None else p.rank)
                broken = self._broken.get(group)
                if broken is None:
                    broken = self._broken[group] = self._loop.create_future()
            await _first_of(self._loop, ready, broken)
            if not ready.done():  # the group broke first
                failure = self._group_failures.get(group)
                culprit = failure.global_rank if failure is not None and failure.global_rank is not None else p.rank
                raise self.peer_error(culprit)
            return ready.result()
        except PeerFailureError as e:
            if p.failure is None:  # this attempt failed (address lookup, or we are the condemned one)
                raise PeerFailureError(str(e), rank=e.rank, how=e.how) from None
            raise self.peer_error(p.rank) from None

    def _spawn(self, coro: Any, *, now: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` in a task owned here; ``now``: its first step at once (see :mod:`aiodist.eager`).

        ``now`` is for failure notices: they must be on the wire before the code that
        learns of the failure from us can react (e.g. abort, which drops the connections).
        """
        task = start_eager(coro, self._loop)[0] if now else self._loop.create_task(coro)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("comm task failed", exc_info=task.exception())

    def _hello(self) -> Header:
        return {"t": "hello", "job": self.job_id, "rank": self.rank, "world": self.world_size}

    def _dial_late(self, p: _Peer) -> None:
        """The lower rank ``p`` did not connect to us within the dial deferral: dial it ourselves."""
        p.deferred = None
        if p.ready.done() or p.accepting or p.conn is not None or p.failure is not None or self._closed:
            p.dialing = False  # (an accept still under way dials after all if it fails: _redial_if_needed)
            return
        self._spawn(self._dial(p))

    async def _dial(self, p: _Peer, speculative: bool = False) -> None:
        """Connect to ``p``; ``speculative`` (nothing to send yet, see _expect): a failure blames nobody.

        A speculative dial that fails leaves the peer's fate to the operations that involve it (a
        rank that left the job before we needed to send to it is not a failed rank).
        """
        try:
            raw = await self.store.get(self._address_key(p.rank), timeout=self.timeout)
            address = parse_address(bytes(raw))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the store failed us, not the peer: no verdict on it, a later dial may retry
            p.dialing = False
            if speculative:
                return
            if p.conn is None and not p.accepting and not self._closed and not p.ready.done():
                # No culprit among the ranks (rank=None): the store failed.
                how = f"looking up the address of rank {p.rank} in the store failed ({type(e).__name__}: {e})"
                failed, p.ready = p.ready, self._loop.create_future()
                failed.set_exception(PeerFailureError(how, rank=None, how=how))
                failed.exception()
            return
        conn: Connection | None = None
        try:
            conn = await self._net.connect(address, timeout=min(self.timeout, HELLO_TIMEOUT))
            hello = self._hello()
            if not _sent_now(conn, hello):
                await conn.send(hello)
            reply = await _recv_within(self._loop, conn, min(self.timeout, HELLO_TIMEOUT))
        except asyncio.CancelledError:
            if conn is not None:
                conn.close()
            raise
        except Exception as e:  # connect or handshake failed: the peer is unreachable
            p.dialing = False
            if conn is not None:
                conn.close()
            if p.conn is None and not p.accepting and not self._closed and not speculative:
                self._peer_failed(p, f"unreachable ({type(e).__name__}: {e})")
            return
        p.dialing = False
        kind = reply.header.get("t")
        if kind == "welcome" and p.conn is None and p.failure is None and not self._closed:
            self._install(p, conn)
            await self._read_loop(p, conn)  # in this task: one task per connection fewer
        elif kind == "welcome" and p.failure is not None and not self._left(p) and not self._closed:
            # Declared failed while we shook hands: say so before hanging up, or it would blame us.
            notice = {"t": "fail", "rank": p.rank, "how": f"rank {self.rank} considers it failed ({p.failure})"}
            await self._send_quietly(conn, notice, HELLO_TIMEOUT)
            conn.close()
        elif kind == "refused" and reply.header.get("condemned"):
            conn.close()  # the peer is fine; it considers *us* failed
            self._condemn(f"rank {p.rank} refused our connection: {reply.header['condemned']}")
            if not p.ready.done():
                failed, p.ready = p.ready, self._loop.create_future()
                failed.set_exception(self.peer_error(self.rank))
                failed.exception()
        elif kind == "refused" and speculative:
            conn.close()  # our own sends, if any, will hear the refusal
        elif kind == "refused":
            conn.close()
            p.refused = str(reply.header.get("reason", "no reason given"))
            self._peer_failed(p, f"refused our connection: {p.refused}", report=False)
        else:  # "dup": the peer's own connection to us is the one kept
            conn.close()

    def _check_hello(self, h: Header) -> str | None:
        if h.get("t") != "hello":
            return f"expected a hello frame, got {h.get('t')!r}"
        if h.get("job") != self.job_id:
            return (
                f"wrong job: the connection is for job {h.get('job')!r} but this is job {self.job_id!r} "
                "(a rank of an earlier or another job?)"
            )
        rank, world = h.get("rank"), h.get("world")
        if world != self.world_size:
            return f"world size {world!r} differs from this job's {self.world_size}"
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            return f"rank {rank!r} is out of range for world size {self.world_size}"
        if rank == self.rank:
            return f"rank {rank} connected to itself (two processes with rank {rank}?)"
        return None

    async def _accept(self, conn: Connection) -> None:
        """Listener handler: handshake, then read the connection until it ends."""
        try:
            hello = await _recv_within(self._loop, conn, min(self.timeout, HELLO_TIMEOUT))
        except (TimeoutError, ConnectionClosedError):
            return
        reason = self._check_hello(hello.header)
        if reason is None and self._closed:
            reason = "this rank has left the job"
        refusal: Header = {"t": "refused"}
        if reason is None:
            p = self._peer(int(hello.header["rank"]))
            if p.failure is not None:
                reason = f"rank {p.rank} is already marked as failed here ({p.failure})"
                if not self._left(p):
                    refusal["condemned"] = f"rank {self.rank} considers it failed ({p.failure})"
        if reason is not None:
            log.info("refusing connection from %s: %s", conn.peer, reason)
            refusal["reason"] = reason
            await self._send_quietly(conn, refusal, HELLO_TIMEOUT)
            return
        if p.conn is not None or p.accepting or (p.dialing and self.rank < p.rank):
            await self._send_quietly(conn, {"t": "dup"}, HELLO_TIMEOUT)
            return
        p.accepting = True
        try:
            welcome = {"t": "welcome"}
            if not _sent_now(conn, welcome):
                await conn.send(welcome)
        except ConnectionClosedError:
            self._redial_if_needed(p)
            return
        finally:
            p.accepting = False
        if p.failure is not None and not self._left(p) and not self._closed:
            # It was declared failed while we shook hands: tell it before hanging up, or it would blame us.
            notice = {"t": "fail", "rank": p.rank, "how": f"rank {self.rank} considers it failed ({p.failure})"}
            await self._send_quietly(conn, notice, HELLO_TIMEOUT)
            return
        if p.failure is not None or p.conn is not None or self._closed:
            return
        self._install(p, conn)
        await self._read_loop(p, conn)

    def configure_heartbeat(self, interval: float | None = None, misses: int | None = None) -> None:
        """Set the heartbeat ``interval`` (s; 0: off) and ``misses``; None keeps the current/env value.

        Affects connections made afterwards (call it before the first operation).
        """
        if interval is None and misses is None:
            return
        cur_i, cur_m = self._heartbeat or (HEARTBEAT_INTERVAL, HEARTBEAT_MISSES)
        i = cur_i if interval is None else float(interval)
        m = cur_m if misses is None else int(misses)
        if i < 0 or m < 1:
            raise ValueError(f"heartbeat interval must be >= 0 and misses >= 1, got {interval!r}, {misses!r}")
        self._heartbeat = (i, m) if i > 0 else None

    @property
    def heartbeat(self) -> tuple[float, int] | None:
        """(interval, misses) of the heartbeats, or None when they are off."""
        return self._heartbeat

    def _start_watch(self, p: _Peer, conn: Connection, config: tuple[float, int], due: float) -> None:
        """The first heartbeat of ``conn`` is due: from now on a task watches it.

        Started by a timer rather than at once: a connection that ends within its first
        interval (a short job, a short-lived group) costs no task at all.
        """
        p.watch = None
        if p.conn is conn and p.failure is None and not self._closed:
            self._spawn(self._watch(p, conn, config, due))

    async def _watch(self, p: _Peer, conn: Connection, config: tuple[float, int], due: float) -> None:
        """Heartbeat: keep ``conn`` talking, and declare ``p`` failed after ``misses`` silent intervals."""
        interval, misses = config
        timeout = interval * misses
        while True:  # the first check is due now (see _start_watch); then one every interval
            if p.conn is not conn or p.failure is not None or self._closed:
                return
            now = self._loop.time()
            if now - due > interval:
                # Our own loop was blocked (or the process stopped): what we did not hear is not
                # the peer's fault; whatever it sent is still in the socket. Start counting again.
                p.last_heard = max(p.last_heard, now)
            silent = now - p.last_heard
            if silent > timeout + self._hb_grace.get(p.rank, 0.0):
                self._peer_failed(
                    p,
                    f"hung or unreachable: heard nothing for {silent:.1f}s "
                    f"(heartbeat every {interval:g}s, {misses} missed)",
                )
                return
            await self._send_quietly(conn, {"t": "hb"}, interval)
            if p.conn is not conn or p.failure is not None or self._closed:
                return
            due = self._loop.time() + interval
            await asyncio.sleep(interval)

    def _redial_if_needed(self, p: _Peer) -> None:
        """A connection attempt with ``p`` came to nothing: dial it ourselves if nobody else is."""
        p.accepting = False
        if p.failure is None and p.conn is None and not p.dialing and not p.ready.done() and not self._closed:
            p.dialing = True
            self._spawn(self._dial(p))

    def _install(self, p: _Peer, conn: Connection) -> None:
        p.conn = conn
        if p.deferred is not None:  # the peer's connection came first: no dial of ours
            p.deferred.cancel()
            p.deferred = None
            p.dialing = False
        conn.set_payload_sink(functools.partial(self._sink, p, conn))  # (a partial: no frame of its own per frame)
        if not p.ready.done():
            p.ready.set_result(conn)
        p.last_heard = self._loop.time()
        if self._heartbeat:
            due = self._loop.time() + self._heartbeat[0]
            p.watch = self._loop.call_at(due, self._start_watch, p, conn, self._heartbeat, due)
        # A peer that connects after a failure must hear of it too (it may wait on us in vain).
        for q in self._peers.values():
            if q is not p and q.failure is not None and not self._left(q) and q.refused is None:
                header = {"t": "fail", "rank": q.rank, "how": q.failure}
                self._spawn(self._send_quietly(conn, header, BYE_TIMEOUT))

    def _sink(self, p: _Peer, conn: Connection, header: Header, nbytes: int) -> Any:
        p.last_heard = self._loop.time()  # a payload on its way is a sign of life (heartbeats)
        if nbytes >= HEARTBEAT_GRACE_MIN_BYTES:  # and the peer's heartbeats queue behind it
            self._hb_grace[p.rank] = nbytes / HEARTBEAT_MIN_BANDWIDTH
        if p.rejected is not None:
            m = Match(p.rank, header, nbytes, drop=True)
            p.matches.append(m)
            return None
        m = self.router.route(p.rank, header, nbytes)
        p.matches.append(m)
        if m.violation is not None:
            self._reject(p, m.violation)
            return None
        if m.late:
            self._note_late(p, header)
        if m.receive is None and nbytes >= DEFER_MIN_BYTES and not m.drop and header.get("t") == "m":
            resume = getattr(conn, "resume_payload", None)
            if resume is not None:
                # Nobody waits for this large payload yet: rather than into a new buffer (and a copy
                # later), let it wait in the socket until its receive is posted (see post()).
                slot = (header.get("g"), freeze(header.get("k")), p.rank)
                if slot not in self._deferred:
                    timer = self._loop.call_later(DEFER_TIMEOUT, self._defer_expired, slot)
                    self._deferred[slot] = (p, conn, m, timer)
                    return DEFER
        r = m.receive  # (Match.sink, inlined)
        if r is None or r.out is None or r.out.nbytes != nbytes or nbytes == 0:
            return None
        return r.out

    def _resume_deferred(self, receive: Receive) -> None:
        """``receive`` was just posted: if its payload is waiting in the socket, read it into place."""
        entry = self._deferred.pop((receive.group, receive.key, receive.src), None)
        if entry is None:
            return
        p, conn, m, timer = entry
        timer.cancel()
        if conn.closed or p.conn is not conn or m not in p.matches:
            return
        self.router.release(m)
        again = self.router.route(p.rank, m.header, m.nbytes)
        m.charged = again.charged
        m.receive, m.drop = again.receive, again.drop
        if again.violation is not None:
            self._reject(p, again.violation)
        conn.resume_payload(m.sink)  # type: ignore[attr-defined]

    def _defer_expired(self, slot: tuple[Any, Any, int]) -> None:
        """Its receive was not posted in time: take the payload into a new buffer, unblocking the frames behind it."""
        entry = self._deferred.pop(slot, None)
        if entry is not None:
            entry[1].resume_payload(None)

    def _drop_deferred(self, p: _Peer | None = None) -> None:
        for slot in [s for s, e in self._deferred.items() if p is None or e[0] is p]:
            self._deferred.pop(slot)[3].cancel()

    async def _read_loop(self, p: _Peer, conn: Connection) -> None:
        try:
            fast = getattr(conn, "set_frame_handler", None)
            if fast is not None:  # optional fast path: frames dispatched as they complete
                fast(functools.partial(self._dispatch, p))
            while True:
                frame = await conn.recv()
                self._dispatch(p, frame)
        except ConnectionClosedLocally:
            if not self._closed:
                self._peer_failed(p, "connection closed")
        except ConnectionClosedError:
            self._peer_failed(p, "connection lost")
        finally:
            self._drop_deferred(p)
            if p.matches:
                err = self.peer_error(p.rank) if p.failure else GroupError("the process group was destroyed")
                while p.matches:
                    self.router.abort(p.matches.popleft(), err)

    def _dispatch(self, p: _Peer, frame: Frame) -> None:
        h = frame.header
        p.last_heard = self._loop.time()
        if self._hb_grace:
            self._hb_grace.pop(p.rank, None)
        m: Match | None = None
        if p.matches and p.matches[0].header is h:
            m = p.matches.popleft()
        kind = h.get("t")
        if kind != "m" and kind != "p":  # control frames (one with a payload too: it was routed, dropped)
            if p.rejected is not None:  # nothing it says counts any more
                return
            if kind == "bye":
                self._peer_failed(p, "left the job (its process group was destroyed)", left=True)
            elif kind == "fail":
                self._on_failure_report(p, h)
            elif kind == "x":
                self._on_mismatch_report(p, h)
            return
        if m is None:
            if p.rejected is not None:
                return
            m = self.router.route(p.rank, h, 0 if frame.payload is None else frame.payload.nbytes)
            if m.violation is not None:
                self._reject(p, m.violation)
                return
            if m.late:
                self._note_late(p, h)
        if p.rejected is not None:  # nothing of a peer that sent bad input is kept
            return
        self.router.complete(m, frame.payload)

    # ------------------------------------------------------------------ failures

    @staticmethod
    def _left(p: _Peer) -> bool:
        return p.failure is not None and p.failure.startswith("left")

    def _peer_failed(
        self,
        p: _Peer,
        how: str,
        *,
        left: bool = False,
        report: bool = True,
        cause: str | None = None,
        close: bool = True,
        notify: bool = True,
    ) -> None:
        """Mark ``p`` failed (``how``); ``cause`` is what to pass on to the others (default: ``how``).

        ``close=False`` (a failure we only heard of) keeps the connection and
        tells ``p`` it was declared failed, so that it blames itself rather
        than us if it is in fact alive.
        """
        if p.failure is not None:
            return
        p.failure = how
        if left:
            log.debug("rank %d: peer rank %d %s", self.rank, p.rank, how)
        elif not self._closed:
            log.info("rank %d: peer rank %d failed: %s", self.rank, p.rank, how)
        if not p.ready.done():
            p.ready.set_exception(self.peer_error(p.rank))
            p.ready.exception()  # retrieved: waiters get their own copy
        if p.conn is not None and not left:
            if close:
                p.conn.close()
            elif p.ready.done() and notify:
                notice = {"t": "fail", "rank": p.rank, "how": cause or how}
                self._spawn(self._send_quietly(p.conn, notice, BYE_TIMEOUT), now=True)
        err = self.peer_error(p.rank)
        while p.matches:
            self.router.abort(p.matches.popleft(), err)
        rank = p.rank
        self.router.fail_source(rank, lambda r: self.peer_error(rank))
        if left or self._closed:
            return
        for gid, ranks in self._groups.items():
            if rank in ranks:
                self._break_group(gid, rank, how)
        if report and self._condemned is None:  # a rank the others declared failed is no witness
            for q in self._peers.values():
                if q is not p and q.failure is None and q.conn is not None and q.ready.done():
                    header = {"t": "fail", "rank": rank, "how": cause or how}
                    self._spawn(self._send_quietly(q.conn, header, BYE_TIMEOUT), now=True)

    def _break_group(self, gid: Any, rank: int, how: str) -> None:
        if gid in self._group_failures:
            return
        self._group_failures[gid] = self.peer_error(rank)
        self.router.fail_group(gid, lambda r: self.peer_error(rank))
        broken = self._broken.pop(gid, None)  # wakes sends of the group still waiting for a connection
        if broken is not None and not broken.done():
            broken.set_result(None)

    def _on_failure_report(self, reporter: _Peer, h: Header) -> None:
        rank = h.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            return
        cause = str(h.get("how", "?"))
        if rank == self.rank:
            self._condemn(f"rank {reporter.rank} reports: {cause}")
            return
        p = self._peer(rank)
        self._peer_failed(p, f"reported by rank {reporter.rank}: {cause}", cause=cause, close=False)

    def _reject(self, p: _Peer, why: str) -> None:
        """``p`` sent bad input (``why``): tell it, close its connection, and fail it (once)."""
        if p.rejected is not None:
            return
        p.rejected = why
        log.warning("rank %d: closing the connection of rank %d, which sent bad input: %s", self.rank, p.rank, why)
        self.router.discard_source(p.rank)
        self._drop_deferred(p)
        conn = p.conn
        how = f"sent bad input: {why}"
        if p.failure is None:
            self._peer_failed(p, how, close=False, notify=False)
        if conn is not None:
            notice = {"t": "fail", "rank": p.rank, "how": f"rank {self.rank} closed its connection: {how}"}
            self._spawn(self._notify_and_close(conn, notice))

    def _note_late(self, p: _Peer, h: Header) -> None:
        if self.router.late_from.get(p.rank) == 1:  # logged once per peer
            log.warning(
                "rank %d: dropping frames of rank %d for operations that completed here (first: group %r key %r): "
                "duplicates, or the leftovers of a mismatched collective",
                self.rank, p.rank, h.get("g"), h.get("k"),
            )

    async def _notify_and_close(self, conn: Connection, notice: Header) -> None:
        try:
            await self._send_quietly(conn, notice, BYE_TIMEOUT)
        finally:
            conn.close()

    def _condemn(self, how: str) -> None:
        """The other ranks consider this rank failed: break every group (blaming this rank)."""
        if self._condemned is not None or self._closed:
            return
        self._condemned = how
        log.info("rank %d: declared failed by its peers: %s", self.rank, how)
        for gid in self._groups:
            self._break_group(gid, self.rank, how)

    def report_mismatch(self, dst: int, gid: Any, seq: int, message: str, calls: dict[int, Any]) -> None:
        """Tell rank ``dst`` that its call at ``seq`` of group ``gid`` does not match ours (fire and forget)."""
        p = self._peers.get(dst)
        if p is None or p.failure is not None or p.conn is None or not p.ready.done() or self._closed:
            return
        header = {"t": "x", "g": gid, "s": seq, "m": message, "c": [[int(k), str(v)] for k, v in calls.items()]}
        self._spawn(self._send_quietly(p.conn, header, BYE_TIMEOUT), now=True)

    def _on_mismatch_report(self, reporter: _Peer, h: Header) -> None:
        if reporter.rejected is not None:
            return
        gid, seq = h.get("g"), h.get("s")
        bad = self.router.vet(reporter.rank, gid, seq)
        if bad is not None:
            self._reject(reporter, f"a mismatch report with {bad}")
            return
        if self.router.destroyed(gid):
            return  # late news of a group destroyed here
        try:
            calls = {int(k): v for k, v in h.get("c", [])}
        except (TypeError, ValueError):
            self._reject(reporter, f"a malformed mismatch report (calls {h.get('c')!r})")
            return
        message = str(h.get("m", "collective mismatch"))

        def factory(r: Receive) -> BaseException:
            # Global ranks in ``calls``; the group layer restates them.
            e = CollectiveMismatchError(f"reported by rank {reporter.rank}: {message}", calls=dict(calls), seq=None)
            e.reported = True  # type: ignore[attr-defined]
            return e

        # The operation is void on every rank: its receives from every source fail now.
        self.router.fail_seq(gid, seq, None, factory)
        # ... and so are the group's later ones (the group is unusable after a mismatch): a rank
        # whose part of ``seq`` completed unawares (a broadcast root) stops waiting in the next one.
        self.router.fail_from(gid, seq, factory)

    @staticmethod
    async def _send_quietly(conn: Connection, header: Header, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await conn.send(header)
        except (ConnectionClosedError, TimeoutError):
            pass


def _sent_now(conn: Connection, header: Header) -> bool:
    """Send ``header`` through the connection's ``try_send`` if it has one and takes it now."""
    try_send = getattr(conn, "try_send", None)
    return try_send is not None and try_send(header)


async def _recv_within(loop: asyncio.AbstractEventLoop, conn: Connection, timeout: float) -> Frame:
    """The next frame of ``conn``; TimeoutError if none comes within ``timeout`` s (``conn`` is closed then).

    One timer that closes the connection, instead of ``asyncio.timeout`` (a context
    manager, a cancellation and its undoing): both sides of every new connection wait
    here for the handshake. Cancellation leaves the connection open.
    """
    expired: list[bool] = []
    timer = loop.call_later(timeout, _expire, conn, expired)
    try:
        return await conn.recv()
    except ConnectionClosedError:
        if expired:
            raise TimeoutError(f"no frame from {conn.peer} within {timeout:g}s") from None
        raise
    finally:
        timer.cancel()


def _expire(conn: Connection, expired: list[bool]) -> None:
    expired.append(True)
    conn.close()


async def _first_of(loop: asyncio.AbstractEventLoop, a: asyncio.Future[Any], b: asyncio.Future[Any] | None) -> None:
    """Wait until ``a`` or ``b`` is done (without cancelling either when this wait is cancelled).

    What ``asyncio.wait(shield(a), b, FIRST_COMPLETED)`` does, for a fraction of
    its cost: every first send to a peer waits here while the connection is made.
    """
    if a.done() or (b is not None and b.done()):
        return
    waiter = loop.create_future()

    def wake(_: Any) -> None:
        if not waiter.done():
            waiter.set_result(None)

    a.add_done_callback(wake)
    if b is not None:
        b.add_done_callback(wake)
    try:
        await waiter
    finally:
        a.remove_done_callback(wake)
        if b is not None:
            b.remove_done_callback(wake)


def _env_number(name: str, default: Any, parse: Callable[[str], Any], *, zero_ok: bool) -> Any:
    """The number in environment variable ``name`` (parsed by ``parse``), or ``default`` if unset or unusable.

    Negative values are refused, and so is zero unless ``zero_ok``.
    """
    raw = getenv(name)
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not %s", name, raw, "a number" if parse is float else "an integer")
        return default
    return value if value > 0 or (zero_ok and value == 0) else default


def _heartbeat_timeout() -> tuple[float, int] | None:
    """The heartbeat (interval, misses) from the environment (defaults: on); None when turned off."""
    interval, misses = HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
    raw = getenv(HEARTBEAT_MISSES_ENV)
    if raw:
        try:
            misses = max(1, int(raw))
        except ValueError:
            log.warning("ignoring %s=%r: not an integer", HEARTBEAT_MISSES_ENV, raw)
    raw = getenv(HEARTBEAT_INTERVAL_ENV)
    if raw:
        try:
            interval = float(raw)
        except ValueError:
            log.warning("ignoring %s=%r: not a number of seconds", HEARTBEAT_INTERVAL_ENV, raw)
    raw = getenv(HEARTBEAT_ENV)
    if raw:
        if raw.strip().lower() in ("off", "no", "false", "none"):
            return None
        try:
            timeout = float(raw)
        except ValueError:
            log.warning("ignoring %s=%r: not a number of seconds", HEARTBEAT_ENV, raw)
        else:
            if timeout <= 0:
                return None
            interval = timeout / misses
    return (interval, misses) if interval > 0 else None
