"""One rank's links to its peers, driven: the I/O that :class:`.links.Links` decides.

:class:`PeerLinks` listens, dials (:meth:`PeerLinks._dial` is the one place a
connection to a peer is opened), runs both sides of the handshake
(:mod:`.connect`: as frame handlers, while the task that owns the connection
waits for its end), hands each link's frames on until it ends, and carries out the state
machine's actions in order (:meth:`PeerLinks.do`). What arrives on a link is
handed to the transport's ``on_frame`` / ``on_payload``; the heartbeats are
:class:`.heartbeats.Heartbeats`'. Every task it starts it owns, and
:meth:`PeerLinks.close` cancels and awaits them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from .. import tls
from ..auth import NONCE_BYTES, AuthenticationError
from ..context import token_bytes
from ..eager import start_eager
from ..errors import (ConnectionClosedError, ConnectionClosedLocally, ConnectionLost, EvictedError, GroupError,
                      PeerFailureError, StoreConnectionLost, anew)
from ..net.base import Address, Connection, Frame, Header, Listener, Network
from ..net.gate import DEFAULT_MAX_HANDSHAKES, HandshakeGate, Ticket
from . import actions as A
from . import connect
from . import frames as F
from . import links as L
from .detector import Watch
from .handshake import AcceptHandshake, DialHandshake, Outcome
from .heartbeats import Heartbeats
from .mismatch_reports import CallFailure, apply_call_failed
from .registry import GroupRegistry
from .router import Match, Router
from .settings import (BYE_TIMEOUT, DEPARTURE_LOOKUP, DIAL_DEFER, DIAL_DEFER_ENV, EXPECT_LOWER, HELLO_TIMEOUT,
                       MAX_HANDSHAKES_ENV, REPORT_GRACE, env_number)

log = logging.getLogger("aiodist.comm")

DESTROYED = "the process group was destroyed"
_ENDED = (L.LinkState.FAILED, L.LinkState.REFUSED, L.LinkState.LEFT)


class Peer:
    """The driver's side of the link to one rank: the frames being received, the sends waiting for it."""

    __slots__ = ("rank", "link", "watch", "matches", "waiters", "timer", "expecting")

    def __init__(self, rank: int, link: L.Link) -> None:
        self.rank = rank
        self.link = link
        self.watch = Watch(rank)  # signs of life, for the failure detector (set on every frame)
        self.matches: list[Match] = []  # frames whose payload is arriving (rarely more than one: a list, not a deque)
        # Sends waiting for the link, a future each: its connection, an error, or _BROKEN (their group broke).
        self.waiters: list[asyncio.Future[Any]] | None = None
        self.timer: asyncio.TimerHandle | None = None  # the dial deferral
        self.expecting: asyncio.TimerHandle | None = None  # a receive from this lower rank waits (expect_later)

    def __repr__(self) -> str:
        return f"<peer {self.rank} {self.link.state.value}>"

    @property
    def conn(self) -> Connection | None:
        return self.link.conn  # type: ignore[no-any-return]

    @property
    def failure(self) -> str | None:
        return self.link.how


class PeerLinks:
    """The links of one rank (see the module doc)."""

    __slots__ = ("rank", "world_size", "job_id", "store", "key_prefix", "timeout", "links", "peers", "_net", "_secret",
                 "_ssl", "_router", "_groups", "_on_frame", "_on_payload", "_loop", "heartbeats", "_listener",
                 "_published", "_tasks", "_reports", "_unauthentic", "_gate", "_dialing")

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
        secret: bytes | None,
        router: Router,
        groups: GroupRegistry,
        on_frame: Callable[[Peer, Frame], None],
        on_payload: Callable[[Peer, Header, int, int], memoryview | None],
        ssl: Any = None,
        max_handshakes: int | None = None,
    ) -> None:
        """``max_handshakes``: connections to this rank's listener in their handshake at once (not yet
        authenticated; None: ``AIODIST_MAX_HANDSHAKES``, else 1024); a new one over it resets the oldest."""
        self.rank, self.world_size, self.job_id = rank, world_size, job_id
        self.store, self.key_prefix, self.timeout = store, key_prefix, timeout
        self.links = L.Links(rank, world_size, dial_defer=env_number(DIAL_DEFER_ENV, DIAL_DEFER, float, zero_ok=True))
        self.peers: dict[int, Peer] = {}
        self._net = network
        self._secret = secret
        self._ssl = ssl  # an aiodist.tls.TLS (or one SSLContext): every link over TLS
        self._router = router
        self._groups = groups
        self._on_frame = on_frame
        self._on_payload = on_payload
        self._loop = asyncio.get_running_loop()
        self.heartbeats = Heartbeats(self._loop, lambda r: self.peers[r].link.conn, self._silent)
        self._listener: Listener | None = None
        self._published = b""  # our address as published in the store (what dialers bind their proofs to)
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._reports: dict[asyncio.Task[Any], None] = {}  # (spawned with now=True: close() lets them finish first)
        self._unauthentic = 0  # connections refused for not proving the secret (the first one is logged)
        self._dialing: dict[connect.Dialing, None] = {}  # (dials in their handshake: see _say_bye)
        if max_handshakes is None:
            max_handshakes = env_number(MAX_HANDSHAKES_ENV, DEFAULT_MAX_HANDSHAKES, int, zero_ok=False)
        self._gate = HandshakeGate(max_handshakes, f"rank {rank}'s listener", log,  # (see _accept)
                                   what="in their handshake (not yet authenticated)",
                                   option=f"max_handshakes, {MAX_HANDSHAKES_ENV}")

    def __repr__(self) -> str:
        return f"<PeerLinks {self.links!r}>"

    # ------------------------------------------------------------------ life cycle

    async def listen(self, host: str) -> Address:
        """Listen on ``host`` and publish the address in the store."""
        self._listener = await self._net.listen(
            (host, 0), self._accept, max_frame_size=F.MAX_HANDSHAKE_FRAME, ssl=tls.server_side(self._ssl)
        )
        address = self._listener.address
        self._published = connect.format_address(address)
        await self.store.set(self._address_key(self.rank), self._published)
        return address

    async def use_store(self, store: Any) -> None:
        """Look addresses up in ``store`` from now on (a new connection to the job's store), and publish ours there."""
        self.store = store
        if self._published:  # (listening: our address is known)
            await store.set(self._address_key(self.rank), self._published)

    async def close(self) -> None:
        """``bye`` to every live link, close them all, cancel and await every task (bounded).

        Reports still on their way (:meth:`spawn` with ``now``) get up to
        :data:`.settings.REPORT_GRACE` seconds first: a peer must learn of a
        mismatch before it sees this rank leave.
        """
        reports = [t for t in self._reports if not t.done()]
        if reports:
            await asyncio.wait(reports, timeout=REPORT_GRACE)
        actions = self._say_bye()
        self._gate.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout(BYE_TIMEOUT):  # a transport that never reports its end must not hang us
                if self._listener is not None:
                    await self._listener.wait_closed()
                for a in actions:
                    if type(a) is A.Close:
                        await a.conn.wait_closed()
        except TimeoutError:
            log.warning("rank %d: connections did not finish closing within %gs", self.rank, BYE_TIMEOUT)

    async def farewell(self) -> None:
        """``bye`` to every live link and close them all, waiting until they are closed; nothing else is
        ended (the tasks, the receives still waiting): for a rank whose process ends next (see
        :meth:`~aiodist.comm.transport.Transport.leave_stopped`). The caller bounds the wait."""
        actions = self._say_bye()
        for a in actions:
            if type(a) is A.Close:
                await a.conn.wait_closed()

    def _say_bye(self) -> A.Actions:
        """``bye`` to every live link, closing them; stop expecting anyone, stop the heartbeats, stop listening.
        Returns the actions done (the caller waits for their ``Close``s)."""
        actions = self.links.close(answered=[shake.conn for shake in self._dialing if shake.answered])
        self.do(actions)
        self._stop_expecting()
        self.heartbeats.stop()
        if self._listener is not None:
            self._listener.close()
        return actions

    def abort(self) -> None:
        self.do(self.links.abort())
        self._stop_expecting()
        self.heartbeats.stop()
        if self._listener is not None:
            self._listener.close()
        self._gate.close()

    def peer(self, rank: int) -> Peer:
        p = self.peers.get(rank)
        if p is None:
            if not 0 <= rank < self.world_size:
                raise GroupError(f"rank {rank} is not in the job (world size {self.world_size})")
            p = self.peers[rank] = Peer(rank, self.links.link(rank))
        return p

    def spawn(self, coro: Any, *, now: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` in a task owned here; ``now``: its first step at once (see :mod:`aiodist.eager`).

        ``now`` is for reports: they must be on the wire before the code that learns of the
        problem from us can react (e.g. exit, which drops the connections).
        """
        task = start_eager(coro, self._loop)[0] if now else self._loop.create_task(coro)
        self._tasks[task] = None
        task.add_done_callback(self._task_done)
        if now and not task.done():
            self._reports[task] = None
            task.add_done_callback(self._reports.pop)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("comm task failed", exc_info=task.exception())

    # ------------------------------------------------------------------ waiting for a link

    async def connection(self, p: Peer, broken: asyncio.Future[None] | None, culprit: Callable[[], int]) -> Connection:
        """The connection to ``p``, once there is one; ``broken`` (the group broke: blame ``culprit()``) ends it early."""
        if p.link.state in _ENDED:
            raise self.links.peer_error(p.rank)
        self.do(self.links.need(p.rank))
        if p.link.state is L.LinkState.READY:
            return p.link.conn  # type: ignore[no-any-return]
        if broken is not None and broken.done():
            raise self.links.peer_error(culprit())
        # A future of its own (set by the Wake, or by ``broken``): cancelling this wait touches no other one.
        waiter = self._loop.create_future()
        if p.waiters is None:
            p.waiters = [waiter]
        else:
            p.waiters.append(waiter)
        on_break = None
        if broken is not None:
            on_break = functools.partial(_broke, waiter)
            broken.add_done_callback(on_break)
        try:
            result = await waiter
        except asyncio.CancelledError:
            if p.waiters is not None and waiter in p.waiters:
                p.waiters.remove(waiter)
            raise
        finally:
            if on_break is not None:
                broken.remove_done_callback(on_break)  # type: ignore[union-attr]
        if result is _BROKEN:  # the group broke first
            raise self.links.peer_error(culprit())
        if not isinstance(result, BaseException):
            return result  # type: ignore[no-any-return]
        if p.link.state in _ENDED:
            raise self.links.peer_error(p.rank) from None
        if isinstance(result, EvictedError):
            raise self.links.peer_error(self.rank) from None
        raise anew(result) from None  # (every waiter gets its own: the group layer restates errors)

    def expect(self, src: int) -> None:
        """A receive from the higher rank ``src`` was posted: dial it if nothing is under way."""
        p = self.peers.get(src)
        if p is None or p.link.state is L.LinkState.IDLE:
            self.peer(src)
            self.do(self.links.expect(src))

    def expect_later(self, src: int) -> None:
        """A receive from the lower rank ``src`` was posted and there is no link: ``src`` dials us when it sends,
        but if nothing is under way in :data:`.settings.EXPECT_LOWER` seconds, dial it (speculatively). A rank
        that left the job before it ever connected is then found out (its receives fail, saying so) instead
        of being waited for until the receive's timeout."""
        p = self.peer(src)
        if p.expecting is None and p.link.state is L.LinkState.IDLE and not self.links.closing:
            p.expecting = self._loop.call_later(EXPECT_LOWER, self._expect_lower, src)

    def _expect_lower(self, src: int) -> None:
        p = self.peers[src]
        p.expecting = None
        if p.link.state is L.LinkState.IDLE:
            self.do(self.links.expect(src))

    def _stop_expecting(self) -> None:
        for p in self.peers.values():
            if p.expecting is not None:
                p.expecting.cancel()
                p.expecting = None

    # ------------------------------------------------------------------ actions

    def do(self, actions: list[A.Action]) -> None:
        """Carry out what the link state machine decided, in order (one method per kind of action)."""
        for a in actions:
            self._carry_out[type(a)](self, a)

    def _send(self, a: A.Send) -> None:
        try:
            a.conn.send_nowait(a.header)
        except ConnectionClosedError:
            pass

    def _close(self, a: A.Close) -> None:
        a.conn.close()

    def _break_groups(self, a: A.BreakGroups) -> None:
        self._groups.break_containing(a.rank, every=a.rank == self.rank)

    def _name_failed_ops(self, a: A.NameFailedOps) -> None:
        members = self._groups.members
        ops = self._router.waiting_ops(lambda gid: a.rank in (members(gid) or ()))
        if ops:
            a.notice[F.VOIDS] = [[gid, seq] for gid, seq in ops]

    def _wake(self, a: A.Wake) -> None:
        p = self.peers[a.rank]
        waiters, p.waiters = p.waiters, None
        if waiters is not None:
            result = p.link.conn if a.error is None else a.error
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(result)

    def _install(self, a: A.Install) -> None:
        a.conn.set_max_frame_size(connect.LINK_MAX_FRAME)
        a.conn.set_payload_sink(functools.partial(self._on_payload, self.peers[a.rank]))

    def _start_timer(self, a: A.StartTimer) -> None:
        self.peers[a.rank].timer = self._loop.call_later(a.delay, self._deferral_expired, a.rank)

    def _cancel_timer(self, a: A.CancelTimer) -> None:
        p = self.peers[a.rank]
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None

    _carry_out: dict[type, Callable[[PeerLinks, Any], object]] = {
        A.Send: _send,
        A.Close: _close,
        A.Release: lambda self, a: a.conn.release_senders(),
        A.FailReceives: lambda self, a: self._fail_receives(a.rank),
        A.BreakGroups: _break_groups,
        A.NameFailedOps: _name_failed_ops,
        A.Wake: _wake,
        A.Install: _install,
        A.Watch: lambda self, a: self.heartbeats.watch(self.peers[a.rank].watch),
        A.Unwatch: lambda self, a: self.heartbeats.unwatch(a.rank),
        A.Dial: lambda self, a: self.spawn(self._dial(a.rank)),
        A.StartTimer: _start_timer,
        A.CancelTimer: _cancel_timer,
        A.Log: lambda self, a: log.log(a.level, "%s", a.message),
    }

    def _deferral_expired(self, rank: int) -> None:
        self.peers[rank].timer = None
        self.do(self.links.deferral_expired(rank))

    def _silent(self, rank: int, how: str) -> None:
        self.do(self.links.silent(rank, how))

    def _fail_receives(self, rank: int) -> None:
        p = self.peers.get(rank)
        error: Callable[[Any], PeerFailureError] = lambda r: self.links.peer_error(rank)
        if p is not None:
            while p.matches:
                self._router.abort(p.matches.pop(0), error(None))
        self._router.fail_source(rank, error)

    # ------------------------------------------------------------------ connections

    def _address_key(self, rank: int) -> str:
        return f"{self.key_prefix}addr/{rank}"

    def _departure_key(self, rank: int) -> str:
        return f"{self.key_prefix}gone/{rank}"

    async def note_departure(self, *, grace: float, calls: Sequence[CallFailure] = ()) -> None:
        """This rank leaves: say so in the store (after a failure: which, the first it learned of), within ``grace`` s.

        For the peers that dial it once it is gone (they can no longer hear its ``bye``):
        their receives from it fail at once, and after a failure their errors name the root
        cause. ``calls``: the failed calls of members it learned of (see
        :meth:`.Transport._relay_call_failures`), noted first: a dialer that finds it gone applies them
        before its receives fail on the departure. Errors are swallowed (the store may be gone).
        """
        first = self.links.first_failure
        note = f"{L.LEFT_CLEANLY}|" if first is None else f"{'' if first[0] is None else first[0]}|{first[1]}"
        try:
            async with asyncio.timeout(grace):
                if calls:
                    told = [[f.gid, f.seq, f.found, f.text] for f in calls]
                    await self.store.set(self._departed_calls_key(self.rank), json.dumps(told))
                await self.store.set(self._departure_key(self.rank), note)
        except Exception as e:  # noqa: BLE001 - a courtesy: leaving goes on without it
            log.debug("rank %d: could not note its departure in the store: %r", self.rank, e)

    def _departed_calls_key(self, rank: int) -> str:
        return f"{self.key_prefix}gone_calls/{rank}"

    async def _apply_departed_calls(self, rank: int) -> None:
        """``rank`` left: the failed calls it noted as it left (see :meth:`note_departure`) void their operations
        here, as its relays ahead of a ``bye`` would have (bad entries are skipped: the rank is gone)."""
        try:
            raw = await self._noted(self._departed_calls_key(rank))
            told = None if raw is None else json.loads(raw)
        except Exception as e:  # noqa: BLE001 - no more to learn than the departure itself
            log.debug("rank %d: could not read the calls rank %d noted as it left: %r", self.rank, rank, e)
            return
        for item in told if type(told) is list else ():
            if type(item) is list and len(item) == 4 and type(item[2]) is int and type(item[3]) is str:
                gid, seq, found, text = item
                apply_call_failed(self._router, rank, F.call_failed(gid, seq, text, found=found))

    async def _noted(self, key: str) -> bytes | None:
        """What a departed rank noted under ``key`` in the store (None: nothing), within
        :data:`.settings.DEPARTURE_LOOKUP` s; the store's error if it fails."""
        async with asyncio.timeout(min(self.timeout, DEPARTURE_LOOKUP)):
            if not await self.store.check([key]):
                return None
            return bytes(await self.store.get(key))

    async def _departure_of(self, rank: int) -> tuple[tuple[int | str | None, str] | None, tuple[Any, Any, Any] | None]:
        """What ``rank`` noted in the store when it left (None: nothing, or no store to ask): the rank it
        blamed and how, or ``(LEFT_CLEANLY, "")``. If ``rank`` hosted the store and left after a failure,
        the store said so to its clients as it closed: that is the note. Second: when there is no note to
        read because the store closed as its (other) host left after a failure, what it said: host, culprit,
        how (else None)."""
        try:
            note = await self._noted(self._departure_key(rank))
        except Exception as e:  # noqa: BLE001 - the store failed us too: no more to say than the dial's error
            departed = _left_as_host(e, rank)
            if departed is None and isinstance(e, StoreConnectionLost) and e.culprit is not None:
                return None, (e.host_rank, e.culprit, e.cause)
            return departed, None
        if note is None:
            return None, None
        culprit, _, how = note.decode(errors="replace").partition("|")
        if culprit == L.LEFT_CLEANLY:
            return (L.LEFT_CLEANLY, ""), None
        return ((int(culprit) if culprit.isdigit() else None), how), None

    def _nonce(self) -> bytes:
        return token_bytes(NONCE_BYTES) if self._secret is not None else b""

    async def _dial(self, rank: int) -> None:
        """Open a connection to ``rank`` (the one place that does) and, if it becomes the link, serve it until it ends."""
        try:
            raw = bytes(await self.store.get(self._address_key(rank), timeout=self.timeout))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the store failed us, not the peer: no verdict on it, a later dial may retry
            detail = f"{type(e).__name__}: {e}"
            departed = _left_as_host(e, rank)
            if departed is not None:  # the store's host is the rank we dial: it left, saying why
                self.do(self.links.dial_failed(rank, detail, departed))
            else:  # (a store whose host left after a rank failed names that rank: the likely cause)
                self.do(self.links.lookup_failed(rank, detail, culprit=getattr(e, "culprit", None)))
            return
        hs = DialHandshake(self._secret, job=self.job_id, rank=self.rank, world=self.world_size, peer_rank=rank,
                           address=raw, nonce=self._nonce(), peer=f"rank {rank}")
        timeout = min(self.timeout, HELLO_TIMEOUT)
        try:
            conn = await connect.open_connection(self._net, raw, timeout, ssl=tls.client_side(self._ssl))
        except Exception as e:  # connect failed: the peer is unreachable (or left: it says why)
            await self._dial_failed(rank, e)
            return
        shake = connect.Dialing(conn, hs, timeout, self._loop, self._dialed)  # (the handshake: frame by frame)
        del hs  # (the shake keeps it until the verdict only)
        self._dialing[shake] = None
        try:
            end = await self._serve(conn, shake)
        finally:
            del self._dialing[shake]
        if shake.over and shake.error is None:
            return  # (the acceptor's verdict was taken: the connection was the link, or it was closed)
        error = shake.error if shake.error is not None else end
        assert error is not None  # (the connection ended during the handshake)
        if isinstance(error, AuthenticationError):
            self.do(self.links.dial_unauthentic(rank, str(error)))
        else:  # the handshake failed (broke, timed out, out of place): unreachable (or left: it says why)
            await self._dial_failed(rank, error)

    async def _dial_failed(self, rank: int, e: BaseException) -> None:
        departed, store_gone = await self._departure_of(rank)
        if departed is not None:
            await self._apply_departed_calls(rank)
        self.do(self.links.dial_failed(rank, f"{type(e).__name__}: {e}", departed, store_gone=store_gone,
                                       refused=getattr(e, "refused", False) is True))

    def _dialed(self, rank: int, conn: Connection, outcome: Outcome) -> bool:
        """The acceptor's verdict on our dial (in the frame's delivery): True if ``conn`` became the link."""
        self.do(self.links.dialed(rank, conn, outcome))
        return self._linked(rank, conn)

    async def _accept(self, conn: Connection) -> None:
        """Listener handler: the handshake, then serve the connection until it ends (if it became the link).

        Connections in their handshake are counted against ``max_handshakes`` (a new one over it resets the
        oldest one still in its handshake: see :mod:`aiodist.net.gate`); a connection leaves the count when its
        dialer proved itself, or when it ends.
        """
        ticket = self._gate.admit(conn.peer, conn.abort)
        hs = AcceptHandshake(self._secret, job=self.job_id, rank=self.rank, world=self.world_size,
                             address=self._published, nonce=self._nonce())
        shake = connect.Accepting(conn, hs, min(self.timeout, HELLO_TIMEOUT), self._loop,
                                  functools.partial(self._accepted, ticket))
        del hs  # (the shake keeps it until the dialer proved itself only)
        try:
            await self._serve(conn, shake)
        finally:
            ticket.leave()
        error = shake.error
        if isinstance(error, AuthenticationError):
            self._unauthentic += 1
            level = logging.WARNING if self._unauthentic == 1 else logging.DEBUG
            log.log(level, "rank %d: refused a connection from %s: %s (%d so far)", self.rank, conn.peer, error,
                    self._unauthentic)
        elif error is not None and not isinstance(error, TimeoutError):
            raise error  # (a local bug: the listener reports it)
        elif shake.hs is not None and shake.hs.problem is not None:
            log.info("rank %d: refusing connection from %s: %s", self.rank, conn.peer, shake.hs.problem)

    def _accepted(self, ticket: Ticket, rank: int, conn: Connection) -> bool:
        """``rank`` proved itself on ``conn`` (in the frame's delivery): answer it; True if ``conn`` became the link."""
        ticket.leave()  # (authenticated: no longer counted against max_handshakes)
        self.peer(rank)
        self.do(self.links.accepted(rank, conn))
        return self._linked(rank, conn)

    def _linked(self, rank: int, conn: Connection) -> bool:
        """If ``conn`` is now the link to ``rank``: its frames go to ``on_frame`` from now on (True)."""
        p = self.peers[rank]
        if p.link.conn is not conn or p.link.state is not L.LinkState.READY:
            return False
        conn.set_frame_handler(functools.partial(self._on_frame, p))  # frames dispatched as they complete
        return True

    async def _serve(self, conn: Connection, shake: connect.Shake) -> ConnectionClosedError | None:
        """Wait for the end of ``conn`` (the handshake runs in its frame handler meanwhile); what ended it.

        If the connection became the link: its end is the link's (lost), and the
        frames whose payload was still arriving fail. A handshake still under way
        when the connection ends, or this wait is cancelled, is abandoned (its
        deadline cancelled, the connection closed).
        """
        end: ConnectionClosedError | None = None
        try:
            while True:  # (with a frame handler installed, recv only reports the end)
                frame = await conn.recv()
                if shake.linked and shake.rank is not None:  # (only if a link's handler stepped aside)
                    self._on_frame(self.peers[shake.rank], frame)
        except ConnectionClosedError as e:
            end = e
        finally:
            shake.abandon()  # (a handshake still under way ends with the connection, or with this wait)
            r = shake.rank
            if shake.linked and r is not None:
                if end is not None:
                    detail = end.detail if isinstance(end, ConnectionLost) else None
                    self.do(self.links.lost(r, conn, locally=isinstance(end, ConnectionClosedLocally), detail=detail))
                p = self.peers[r]
                if p.matches:
                    err = self.links.peer_error(r) if p.link.how is not None else GroupError(DESTROYED)
                    while p.matches:
                        self._router.abort(p.matches.pop(0), err)
        return end


def _left_as_host(e: BaseException, rank: int) -> tuple[int | None, str] | None:
    """What the store said of its host as it closed, if ``e`` is that store's error and its host was ``rank``
    (a :class:`~aiodist.errors.StoreConnectionLost` with a farewell): the rank it blamed and how."""
    if not isinstance(e, StoreConnectionLost) or e.host_rank != rank:
        return None
    return e.culprit, e.cause or "unknown"


_BROKEN = object()
"""What a waiting send's future holds when its group broke first."""


def _broke(waiter: asyncio.Future[Any], _: Any) -> None:
    if not waiter.done():
        waiter.set_result(_BROKEN)
