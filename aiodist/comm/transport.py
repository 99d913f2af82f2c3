"""The peer transport: one authenticated connection per pair of ranks, shared by all groups.

Each rank listens on one address (published in the store under the job's
prefix) and connects *lazily*, the first time it sends to a peer, so a job
only opens the connections its algorithms use. When two ranks dial each other
at the same moment, the connection dialed by the lower rank is kept and the
other is answered ``dup``: exactly one connection per pair. The lower rank of
a pair dials; the higher one defers its own dial by :data:`.settings.DIAL_DEFER`
(``AIODIST_DIAL_DEFER``, 0: dial at once) in case the lower rank's connection
is on its way, and a rank that posts a receive from a higher rank it is not
connected to dials it at once. The rule depends only on the two ranks, never
on timing or the network, so it is the same over TCP and in the simulator.

Every connection starts with a handshake (:mod:`.handshake`): the job id,
ranks and world size, and a mutual proof of the job's secret
(:mod:`aiodist.auth`) bound to the address the dialer found in the store, so
a process that rewrote that address cannot sit in the middle. Before it
completes, frames are limited to a few KiB.

The transport sends and routes frames and keeps the groups' books
(:class:`.registry.GroupRegistry`); the links are :class:`.peers.PeerLinks`'
(dialing, accepting, reading: the I/O), whose meaning is decided by
:class:`.links.Links` (a pure state machine: its module doc has the state
diagram) and silence by :class:`.detector.FailureDetector`; every wire header
is built by :mod:`.frames`. Frames are routed through the
:class:`.router.Router`: payloads of receives posted in time land straight in
the caller's buffer; others are received into memory as their bytes arrive
and copied when their receive is posted (the connection never waits for it).

Failure: a connection that breaks makes the peer *failed*: every pending and
later operation that involves it raises :class:`PeerFailureError` (``how``
says why), every group containing it breaks, and the other connected peers are
told, so that ranks without a connection to it stop waiting too. A rank
declared failed by the others learns it (:class:`EvictedError`) instead of
blaming whoever hung up on it. A peer that leaves through :meth:`Transport.close`
says ``bye`` first; that only fails the receives that still expected something
from it. A failed address lookup (the store is gone) fails the operation that
needed the connection, blaming nobody (``rank=None``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable
from typing import Any

from ..auth import FROM_ENVIRONMENT, resolve_secret
from ..context import current_network, getenv
from ..errors import AiodistError, ConnectionClosedError, GroupError, PeerFailureError
from ..net.base import Address, Connection, Frame, Header, Network
from ..net.shmhost import choose_network
from ..wire import as_byte_view
from . import frames as F
from .heartbeats import Heartbeats
from .links import LinkState
from .mismatch_reports import CallFailure, apply_call_failed, apply_report, apply_voids
from .peers import DESTROYED, Peer, PeerLinks
from .registry import GroupRegistry
from .router import Match, Receive, Router, resolve
from .settings import (
    HEARTBEAT_GRACE_MIN_BYTES,
    HEARTBEAT_INTERVAL,  # noqa: F401  (documented as aiodist.comm.transport.HEARTBEAT_INTERVAL)
    HEARTBEAT_MIN_BANDWIDTH,
    HEARTBEAT_MISSES,  # noqa: F401
    MAX_EARLY_BYTES_ENV,
    MAX_EARLY_FRAMES_ENV,
    RELAYED_CALL_FAILURES,
    REPORT_GRACE,
    env_number,
)

log = logging.getLogger("aiodist.comm")

_READY = LinkState.READY
_FAILED = LinkState.FAILED
ABORTED = "it aborted (aiodist.abort())"
"""How a rank that aborted its transport left, as the store's farewell tells the others (unless it failed first)."""

_KIND, _MESSAGE, _P2P = F.KIND, F.MESSAGE, F.P2P  # (module globals: read for every frame)


class Transport:
    """One rank's connections to the other ranks of one job (see the module doc).

    Create with :meth:`start`; end with :meth:`close`, which cancels and awaits
    every task it owns (readers, dials, reports).
    """

    __slots__ = ("rank", "world_size", "job_id", "store", "key_prefix", "timeout", "router", "_loop", "_net",
                 "_groups", "_links", "links", "_peers", "_closed", "_finished", "_call_failures", "address")

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
        secret: bytes | None = None,
        ssl: Any = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.job_id = job_id
        self.store = store
        self.key_prefix = key_prefix
        self.timeout = timeout
        self.router = Router()
        self.router.configure(
            check_groups=True,
            max_early_frames=env_number(MAX_EARLY_FRAMES_ENV, self.router.max_early_frames, int, zero_ok=False),
            max_early_bytes=env_number(MAX_EARLY_BYTES_ENV, self.router.max_early_bytes, int, zero_ok=False),
        )
        self._loop = asyncio.get_running_loop()
        self._net = network
        self._groups = GroupRegistry(self.router, self._loop, self.peer_error)
        self._links = PeerLinks(
            rank=rank, world_size=world_size, job_id=job_id, store=store, key_prefix=key_prefix, timeout=timeout,
            network=network, secret=secret, router=self.router, groups=self._groups,
            on_frame=self._dispatch, on_payload=self._sink, ssl=ssl,
        )
        self.links = self._links.links  # the link state machine (read-only use outside)
        self._peers = self._links.peers
        self._closed = False  # no new operations (closing, closed or aborted)
        # failed calls of members (this rank's too) it learned of, with the groups' members: relayed at close
        self._call_failures: deque[tuple[CallFailure, tuple[int, ...]]] = deque(maxlen=RELAYED_CALL_FAILURES)
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
        secret: Any = FROM_ENVIRONMENT,
        ssl: Any = None,
        mode: str | None = None,
    ) -> Transport:
        """Listen (on ``host``, else ``AIODIST_HOST``, else the network's default) and publish the address.

        ``secret``: the job's secret (bytes), ``None`` for no authentication, or by
        default looked up as :func:`aiodist.auth.resolve_secret` does. ``ssl``: an
        :class:`aiodist.tls.TLS` to run every link over TLS (TCP then, also between ranks
        of one host). ``mode``: the transport mode (see :mod:`aiodist.net.shmhost`; "tcp"
        forces TCP between ranks of one host).
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
            secret=resolve_secret(secret) if secret is FROM_ENVIRONMENT else secret,
            ssl=ssl,
        )
        try:
            t.address = await t._links.listen(host or getenv("AIODIST_HOST") or await net.default_host())
        except BaseException:
            await t.close()
            raise
        return t

    async def use_store(self, store: Any) -> None:
        """Use ``store`` (a new connection to the job's store, the same round) from now on.

        The links, and peers already connected, are kept: only address lookups move to it.
        """
        self.store = store
        await self._links.use_store(store)

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
        self._closed = True
        self._relay_call_failures()
        await self._links.close()
        self._groups.forget_all()
        for r in self.router.pending():
            self.router.cancel(r)
            resolve(r, GroupError(DESTROYED))

    async def note_departure(self, *, grace: float) -> None:
        """Before :meth:`close` after a failure: note in the store which failure this rank leaves after (see
        :meth:`PeerLinks.note_departure`), within ``grace`` seconds."""
        await self._links.note_departure(grace=grace, calls=[f for f, _ in self._call_failures])

    async def leave_stopped(self, culprit: int, how: str, *, grace: float) -> bool:
        """This rank's launcher stops it (it dies of the signal next) because rank ``culprit`` failed (``how``).

        Within ``grace`` seconds: note in the store, then say in a ``bye`` to every connected peer, that it
        leaves after that failure, stopped by its launcher; every connection is closed in order. The
        peers then name ``culprit`` as the root cause, not this rank, even those of other nodes (whose
        launchers only know this rank's departure). Nothing of this rank's own is resolved here (its
        operations wait on: the process ends). False: it already left, or ``culprit`` is this rank.
        """
        if self._closed or not self.links.stopped_for(culprit, how):
            return False
        self._closed = True
        try:
            async with asyncio.timeout(grace):
                await self._links.note_departure(grace=grace / 2)
                await self._links.farewell()
        except TimeoutError:
            pass
        return True

    def abort(self) -> None:
        """Drop every connection at once, without ``bye``: what a crash of this rank looks like to its peers.

        The transport is unusable afterwards; :meth:`close` still releases it.
        """
        self._closed = True
        self.links.failed_here(ABORTED)  # (what it left after, unless a failure came first: the store says so)
        self._links.abort()

    def failed_peers(self) -> list[int]:
        """Ranks this rank considers failed (not those that left cleanly); this rank too if it was declared failed."""
        return self.links.failed()

    def link_state(self, rank: int) -> LinkState:
        """The state of this rank's link to ``rank`` (IDLE when there never was one; diagnostics)."""
        link = self.links.get(rank)
        return LinkState.IDLE if link is None else link.state

    def connected_peers(self) -> list[int]:
        """Ranks with a live connection to this one (diagnostics, tests)."""
        return sorted(r for r, p in self._peers.items() if p.link.conn is not None and not p.link.conn.closed)

    def peer_error(self, rank: int) -> PeerFailureError:
        """A fresh PeerFailureError for ``rank`` (global numbering); EvictedError for this rank itself."""
        return self.links.peer_error(rank)

    # ------------------------------------------------------------------ groups

    def allocate_group_id(self) -> int:
        """The next group id (every rank allocates them in the same order)."""
        return self._groups.allocate()

    def register_group(self, gid: Any, ranks: tuple[int, ...]) -> None:
        failed = [self.rank] if self.links.condemned is not None else []
        self._groups.register(gid, tuple(ranks), failed + [r for r, _ in self.links.failures()])

    def foreign_group(self, gid: Any) -> None:
        """This rank is not a member of group ``gid`` (allocated here all the same): frames for it are bad input."""
        self.router.foreign_group(gid)

    def retire(self, gid: Any, floor: int) -> None:
        """Every operation of group ``gid`` below sequence number ``floor`` completed on this rank."""
        self.router.retire(gid, floor)

    def unregister_group(self, gid: Any) -> None:
        self._groups.unregister(gid)

    @property
    def heartbeats(self) -> Heartbeats:
        """This rank's heartbeats: ``stalled()`` says whether its loop runs late past an interval."""
        return self._links.heartbeats

    def group_failure(self, gid: Any) -> PeerFailureError | None:
        """The failure that broke group ``gid``, if one did."""
        return self._groups.failure(gid)

    def next_p2p_number(self, gid: Any, dst: int, tag: int) -> int:
        return self._groups.next_p2p_number(gid, dst, tag)

    def configure_heartbeat(self, interval: float | None = None, misses: int | None = None) -> None:
        """Set the heartbeat ``interval`` (s; 0: off) and ``misses``; None keeps the current/env value.

        Call it before the first operation.
        """
        self._links.heartbeats.configure(interval, misses)

    @property
    def heartbeat(self) -> tuple[float, int] | None:
        """(interval, misses) of the heartbeats, or None when they are off."""
        return self._links.heartbeats.config

    # ------------------------------------------------------------------ sending

    async def send(self, dst: int, header: Header, payload: Any = None, *, group: Any = None) -> None:
        """Send one frame to rank ``dst`` (connecting first if needed).

        Raises PeerFailureError if ``dst`` failed, or if ``group`` breaks while
        the connection is being made. Cancellation: the frame was queued whole
        or not at all, and the connection no longer reads ``payload``.
        """
        if self._closed:
            raise GroupError(DESTROYED)
        if dst == self.rank:
            self._loopback(header, payload)
            return
        p = self._links.peer(dst)
        link = p.link
        conn = link.conn if link.state is _READY else await self._connection(p, group)
        if not self._sent_now(p, conn, header, payload):
            await self._send_on(p, conn, header, payload)

    def send_soon(self, dst: int, header: Header, payload: Any = None, group: Any = None) -> Awaitable[None] | None:
        """Send one frame now if nothing is in the way (None); else the awaitable that sends it.

        :meth:`send` without a coroutine on the common path: connected, and the
        connection takes the frame at once (its ``try_send``). Raises what
        ``send`` raises, from here or from the awaitable.
        """
        p = self._peers.get(dst)
        if p is not None and p.link.state is _READY and not self._closed:
            conn = p.link.conn
            try:  # (_sent_now, inlined: once per message)
                if conn.try_send(header, payload):
                    return None
            except ConnectionClosedError:
                raise self._lost(p) from None
            return self._send_on(p, conn, header, payload)  # (not send(): it would try again)
        return self.send(dst, header, payload, group=group)

    def _connection(self, p: Peer, group: Any) -> Awaitable[Connection]:
        """The wait for the connection to ``p`` (await it; ``group`` broken already: raises here).

        The links' own coroutine is returned, not one of its own around it: one coroutine
        fewer on each send that waits for a link (the first to each peer)."""
        broken = None
        if group is not None and group in self._groups:
            if self._groups.failure(group) is not None:
                raise self.peer_error(self._groups.culprit(group, p.rank))
            broken = self._groups.broken(group)
        return self._links.connection(p, broken, lambda: self._groups.culprit(group, p.rank))

    def _sent_now(self, p: Peer, conn: Connection, header: Header, payload: Any) -> bool:
        """Did ``conn`` take the frame at once? A broken connection: ``p`` failed."""
        try:
            return conn.try_send(header, payload)
        except ConnectionClosedError:
            raise self._lost(p) from None

    async def _send_on(self, p: Peer, conn: Connection, header: Header, payload: Any) -> None:
        try:
            await conn.send(header, payload)
        except ConnectionClosedError:
            raise self._lost(p) from None
        if p.link.state is _FAILED:  # released: the peer was declared failed while the frame waited for it
            raise self.peer_error(p.rank)

    def _lost(self, p: Peer) -> PeerFailureError:
        """The connection to ``p`` broke under a send: the peer failed."""
        self._links.do(self.links.send_failed(p.rank))
        return self.peer_error(p.rank)

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

    def report_mismatch(
        self, dst: int, gid: Any, seq: int, message: str, calls: dict[int, Any], *, found: int | None = None
    ) -> None:
        """Tell rank ``dst`` that its call at ``seq`` of group ``gid`` does not match ours.

        ``found``: the rank that found it, when we relay its report (``message``: its words).
        Fire and forget: it connects if needed, within :data:`.settings.REPORT_GRACE`.
        """
        self._report_to(dst, F.mismatch(gid, seq, message, calls, found))

    def report_call_failed(self, dst: int, gid: Any, seq: int, message: str, *, void: bool = False) -> None:
        """Tell rank ``dst`` that our call at ``seq`` of group ``gid`` failed here (``message``: what it raised).

        ``void``: the whole operation is void there, even where every message it needs has come (a call
        that timed out here: the ranks must not disagree on whether it happened). Fire and forget, as
        :meth:`report_mismatch`.
        """
        self._report_to(dst, F.call_failed(gid, seq, message, void=void))

    def remember_call_failed(self, gid: Any, seq: int, message: str) -> None:
        """This rank's own call at ``seq`` of group ``gid`` failed (``message``; reported to the members):
        passed on again before this rank's ``bye`` (see :meth:`_relay_call_failures`)."""
        self._remember_call_failure(CallFailure(gid, seq, self.rank, message, False))

    def _remember_call_failure(self, f: CallFailure) -> None:
        members = self._groups.members(f.gid)
        if members is not None:
            self._call_failures.append((f, members))

    def _relay_call_failures(self) -> None:
        """Before this rank's ``bye``: the failed calls it learned of (the last few) go to the members it is
        linked with, on the link, ahead of the ``bye``.

        A member whose own call failed on that news and who leaves at once would otherwise be blamed
        by the members its news had not reached yet: its ``bye`` comes to them first ("left the job")
        and their part of the operation fails on it, naming the wrong rank. A member the news reached
        already, or whose group is gone, ignores it.
        """
        for f, members in self._call_failures:
            header = F.call_failed(f.gid, f.seq, f.text, found=None if f.found == self.rank else f.found)
            for r in members:
                if r == self.rank or r == f.found:
                    continue
                p = self._peers.get(r)
                if p is not None and p.link.state is _READY:
                    self._queue_whatever(p.link.conn, header)

    def _report_to(self, dst: int, header: Header) -> None:
        if self._closed or dst == self.rank or not 0 <= dst < self.world_size:
            return
        _ = self._links.spawn(self._report(dst, header), now=True)  # owned by the links

    def give_up_p2p(self, dst: int, gid: Any, tag: int, number: int, *, grace: float) -> None:
        """A point-to-point send to rank ``dst`` gave up (timed out, cancelled), perhaps before its frame was queued.

        So that its number does not hold up the messages sent after it, a skip
        frame follows it on the same link (:func:`.frames.p2p_skip`): queued at
        once if the link is up (with ``send_nowait``: behind whatever waits,
        never withdrawn), else as soon as it comes up (within ``grace`` seconds,
        as a send after this one would wait). Fire and forget: nothing if the
        peer failed or this transport is closed.
        """
        if self._closed or dst == self.rank or not 0 <= dst < self.world_size:
            return
        header = F.p2p_skip(gid, tag, number)
        p = self._peers.get(dst)
        if p is not None and p.link.state is _READY:
            self._queue_whatever(p.link.conn, header)
        else:
            _ = self._links.spawn(self._skip_when_connected(dst, gid, header, grace))  # owned by the links

    async def _skip_when_connected(self, dst: int, gid: Any, header: Header, grace: float) -> None:
        p = self._links.peer(dst)
        try:
            async with asyncio.timeout(grace):
                conn = await self._connection(p, gid)
        except (AiodistError, TimeoutError) as e:  # it failed, or cannot be reached: nothing after it comes either
            log.debug("rank %d: no link to rank %d for a skip frame (group %r): %r", self.rank, dst, gid, e)
            return
        self._queue_whatever(conn, header)

    @staticmethod
    def _queue_whatever(conn: Connection, header: Header) -> None:
        """Queue a header-only frame behind everything ``conn`` holds, however full (it is small; nothing waits)."""
        try:
            conn.send_nowait(header)
        except ConnectionClosedError:  # the peer failed: it learns otherwise
            pass

    async def _report(self, dst: int, header: Header) -> None:
        try:
            async with asyncio.timeout(REPORT_GRACE):
                await self.send(dst, header)
        except (AiodistError, TimeoutError) as e:  # it failed, or cannot be reached: it learns otherwise
            log.debug("rank %d: could not report the mismatch or failure at seq %s of group %r to rank %d: %r",
                      self.rank, header.get(F.SEQ), header.get(F.GROUP), dst, e)

    # ------------------------------------------------------------------ receiving (hot path)

    def post(self, receive: Receive) -> None:
        """Post a receive (keyed if ``receive.tag`` is None, else point-to-point)."""
        if self._closed:
            self.router.cancel(receive)
            resolve(receive, GroupError(DESTROYED))
            return
        if receive.tag is None:
            self.router.post_keyed(receive)
        else:
            self.router.post_p2p(receive)
        src = receive.src
        if src is not None and not receive.done and 0 <= src < self.world_size and src != self.rank:
            p = self._peers.get(src)
            if p is None or p.link.state is not _READY:
                if src > self.rank:  # a receive from a higher rank we are not connected to: dial it now
                    self._links.expect(src)
                else:  # from a lower one: it dials us when it sends; if it never does, we dial it
                    self._links.expect_later(src)

    def _sink(self, p: Peer, header: Header, nbytes: int, received: int) -> memoryview | None:
        """A payload is coming: the posted receive's buffer if one waits for it, else None (a new buffer).

        Asked again while a payload it had no buffer for arrives (``received`` > 0):
        the buffer of a receive posted since, if one was (the rest lands there).
        """
        p.watch.alive = True  # a payload on its way is a sign of life (heartbeats)
        if received:
            m = p.matches[-1] if p.matches else None  # (the frame arriving is the last one routed)
            if m is None or m.header is not header or not self.router.claim(m):
                return None
            if m.receive is not None and m.receive.tag is not None:
                m.receive.arriving = (p.link.conn, header)  # (see Router.cancel)
            return m.sink
        if nbytes >= HEARTBEAT_GRACE_MIN_BYTES:  # and the peer's heartbeats queue behind it
            p.watch.slow_frame(self._loop.time(), nbytes / HEARTBEAT_MIN_BANDWIDTH)
        if p.link.rejected is not None:
            p.matches.append(Match(p.rank, header, nbytes, drop=True))
            return None
        try:
            m = self.router.route(p.rank, header, nbytes)
        except (TypeError, RecursionError):
            self._malformed(p, header)
            p.matches.append(Match(p.rank, header, nbytes, drop=True))
            return None
        p.matches.append(m)
        if m.violation is not None:
            self._reject(p, m.violation)
            return None
        if m.late:
            self._note_late(p, header)
        r = m.receive  # (Match.sink, inlined)
        if r is None or r.out is None or r.out.nbytes != nbytes or nbytes == 0:
            return None
        if r.tag is not None:
            r.arriving = (p.link.conn, header)  # (a point-to-point receive withdrawn meanwhile: see Router.cancel)
        return r.out

    def _dispatch(self, p: Peer, frame: Frame) -> None:
        h = frame.header
        p.watch.alive = True
        m: Match | None = None
        if p.matches and p.matches[0].header is h:
            m = p.matches.pop(0)
        kind = h.get(_KIND)
        if kind != _MESSAGE and kind != _P2P:  # control frames (one with a payload too: it was routed, dropped)
            if p.link.rejected is None:  # (nothing a peer that sent bad input says counts any more)
                try:
                    self._on_control(p, kind, h)
                except (TypeError, RecursionError):
                    self._malformed(p, h)
            return
        if p.link.rejected is not None:  # nothing of a peer that sent bad input is kept
            return
        if m is None:
            try:
                m = self.router.route(p.rank, h, 0 if frame.payload is None else frame.payload.nbytes)
            except (TypeError, RecursionError):
                self._malformed(p, h)
                return
            if m.violation is not None:
                self._reject(p, m.violation)
                return
            if m.late:
                self._note_late(p, h)
        self.router.complete(m, frame.payload)

    # ------------------------------------------------------------------ control frames, bad input

    def _on_control(self, p: Peer, kind: Any, h: Header) -> None:
        if kind == F.BYE:
            self._links.do(self.links.bye(p.rank, h.get(F.RANK), h.get(F.HOW), h.get(F.STOPPED)))
        elif kind == F.FAIL:
            self._links.do(self.links.reported(p.rank, h.get(F.RANK), h.get(F.HOW, "?"), h.get(F.ROOT)))
            voids = h.get(F.VOIDS)  # (after the news: what they fail with names the failure)
            if voids is not None:
                bad = apply_voids(self.router, p.rank, h.get(F.RANK), voids, self.peer_error)
                if bad is not None:
                    self._reject(p, bad)
        elif kind == F.MISMATCH:
            bad = apply_report(self.router, p.rank, h)
            if bad is not None:
                self._reject(p, bad)
        elif kind == F.CALL_FAILED:
            got = apply_call_failed(self.router, p.rank, h)
            if isinstance(got, str):
                self._reject(p, got)
            elif got is not None and not got.void:
                self._remember_call_failure(got)

    def _malformed(self, p: Peer, h: Header) -> None:
        """Looking ``p``'s frame ``h`` up raised TypeError or RecursionError: its fields are of types no frame
        has (bad input: rejected), or the error is this rank's own bug (raised again, from the except clause)."""
        bad = F.malformed(h)
        if bad is None:
            raise
        self._reject(p, bad)

    def _reject(self, p: Peer, why: str) -> None:
        """``p`` sent bad input (``why``): drop what it sent, tell it, close its connection, fail it (once)."""
        if p.link.rejected is not None:
            return
        self.router.discard_source(p.rank)
        self._links.do(self.links.bad_input(p.rank, why))

    def _note_late(self, p: Peer, h: Header) -> None:
        if self.router.late_count(p.rank) == 1:  # logged once per peer
            log.warning(
                "rank %d: dropping frames of rank %d for operations that ended here (first: group %r key %r): "
                "duplicates, or the leftovers of a mismatched collective or of a call that failed here",
                self.rank, p.rank, h.get(F.GROUP), h.get(F.KEY),
            )
