"""The simulated network: configuration, hosts, timing and faults of virtual links.

:class:`Network` is the *configuration* a user passes to ``sim.run``.
:class:`Fabric` is the simulation-wide state (hosts, listeners, links); each
virtual host gets a :class:`~sim.endpoints.HostNetwork`, which implements
:class:`aiodist.net.base.Network` (see :mod:`sim.endpoints`), so the
production store, rendezvous and collective code runs on it unchanged.

Model (all times virtual):

* A connection is a pair of :class:`SimConnection` endpoints; each direction
  is a FIFO stream of :class:`~aiodist.net.base.Frame` objects (headers are
  copied the way msgpack would round-trip them: tuples become lists; payload
  bytes are copied at ``send`` so the sender may reuse its buffer). No silent
  loss on a live connection: a frame is delivered, or the connection breaks.
* A message of n bytes sent at t arrives at ``t + o + latency + n / bandwidth
  + o`` (o = per-message CPU ``overhead`` on each side; ``send`` itself
  returns after the sender's o). With ``contention`` each host's outgoing and
  incoming NIC serialize transmissions. Later messages on a link never
  overtake earlier ones.
* ``connect`` costs a round trip; an address nobody listens on is refused
  (ConnectionLost) after a round trip; an unknown host fails the same way.
* Flow control (``max_unread_frames``, ``socket_buffer``): a receiver that
  does not read stops absorbing frames and its peer's ``send`` blocks.
* Faults hook in here: crashed hosts' connections deliver what was already
  sent, then a FIN (peers see ConnectionLost); blocked links (partitions,
  clogs) hold messages in order until released.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections import deque
from heapq import heappush
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiodist.errors import ConnectionLost
from aiodist.net.base import Address, Connection, Header
from aiodist.wire import DEFAULT_MAX_FRAME_SIZE

from .endpoints import LOCAL_NAMES, HostNetwork, SimConnection, SimListener, _connected, _fail_future
from .latency import Constant, Exponential, LatencyModel, Uniform, as_model
from .loop import _Event

_new_event = object.__new__

if TYPE_CHECKING:
    from .loop import SimLoop
    from .trace import Tracer

EPHEMERAL_PORT_BASE = 40000


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, kw_only=True)
class Network:
    """How the simulated network behaves.

    ``latency``: seconds or a model (:class:`~sim.latency.Constant`,
    :class:`~sim.latency.Uniform`, :class:`~sim.latency.Exponential`); the
    default varies so that seed sweeps explore interleavings.
    ``bandwidth``: bytes/second per host NIC (None: infinite).
    ``overhead``: CPU seconds per message on the sender and on the receiver.
    ``contention``: serialize transmissions at each host's NIC.
    ``links``: per-link latency overrides, keyed by (src, dst) host names or
    rank numbers (directional; add both directions for a symmetric link).
    ``retransmit_timeout``: a message held by a partition longer than this
    breaks its connection (as TCP gives up); None: wait forever.
    ``max_unread_frames`` / ``socket_buffer``: flow control as in
    :mod:`aiodist.net.tcp`: a receiver whose program leaves this many frames
    unread stops reading; what arrives then waits in its kernel buffer, and
    once that holds more than ``socket_buffer`` bytes the peer's ``send``
    blocks until the program reads again (so two ranks that both only send
    deadlock, as they would over TCP). None: unbounded buffering.
    """

    latency: float | LatencyModel = field(default_factory=lambda: Uniform(50e-6, 150e-6))
    bandwidth: float | None = 1.25e9
    overhead: float = 0.0
    contention: bool = True
    links: Mapping[tuple[str | int, str | int], float | LatencyModel] = field(default_factory=dict)
    retransmit_timeout: float | None = 60.0
    max_unread_frames: int | None = 4096
    socket_buffer: int | None = 4 * 1024 * 1024

    @classmethod
    def ideal(cls, *, alpha: float, bandwidth: float | None) -> Network:
        """The textbook alpha-beta network: constant latency, no overhead, no contention."""
        return cls(latency=Constant(alpha), bandwidth=bandwidth, overhead=0.0, contention=False)

    @classmethod
    def fixed(cls, latency: float = 1e-4) -> Network:
        """Constant latency, infinite bandwidth: the same timing for every seed."""
        return cls(latency=Constant(latency), bandwidth=None)


__all__ = ["Network", "Fabric", "HostNetwork", "SimConnection", "SimListener", "Constant", "Uniform", "Exponential"]


def host_name(h: str | int) -> str:
    return f"rank{h}" if isinstance(h, int) else h


# --------------------------------------------------------------------------- hosts


class Host:
    """One virtual machine/process incarnation: its lane, context, listeners, NIC state."""

    __slots__ = ("name", "num", "rank", "lane", "ctx", "alive", "vanished", "listeners", "endpoints", "tx_free",
                 "rx_free", "cpu_free", "next_port", "sent", "received", "factor", "net")

    def __init__(self, name: str, rank: int | None, num: int) -> None:
        self.name = name
        self.num = num  # (its number in the digest: hosts are added in a deterministic order)
        self.rank = rank
        self.lane = -1
        self.ctx: contextvars.Context | None = None
        self.alive = False
        self.vanished = False
        self.listeners: dict[int, SimListener] = {}
        self.endpoints: dict[int, SimConnection] = {}
        self.tx_free = 0.0
        self.rx_free = 0.0
        self.cpu_free = 0.0
        self.next_port = EPHEMERAL_PORT_BASE
        self.sent = 0
        self.received = 0
        self.factor = 1.0
        self.net = HostNetwork(self)


class _Pending:
    """A connect() in progress (kept so a partition heal can retry it)."""

    __slots__ = ("src", "dst", "port", "fut", "lane")

    def __init__(self, src: Host, dst: Host, port: int, fut: asyncio.Future[Connection], lane: int) -> None:
        self.src, self.dst, self.port, self.fut, self.lane = src, dst, port, fut, lane


class Fabric:
    """All hosts and links of one simulation run."""

    def __init__(self, config: Network, loop: SimLoop, rng: random.Random, tracer: Tracer) -> None:
        self.config = config
        self.loop = loop
        self.rng = rng
        self.tracer = tracer
        self.hosts: dict[str, Host] = {}
        self._latency = as_model(config.latency)
        lm = self._latency
        self._uniform = (lm.low, lm.high - lm.low) if isinstance(lm, Uniform) else None
        self._random = rng.random
        self._links = {(host_name(a), host_name(b)): as_model(m) for (a, b), m in config.links.items()}
        # Per-message constants of _schedule (the model never changes during a run): the default
        # model's draw inlined; a constant latency needs no draw at all (Constant.sample draws none).
        self._lat_low, self._lat_span = self._uniform if self._uniform is not None and not self._links else (0.0, 0.0)
        self._lat_drawn = self._uniform is not None and not self._links
        self._lat_const = lm.value if isinstance(lm, Constant) and not self._links else None
        self._bw = config.bandwidth
        self._overhead = config.overhead
        self._contention = config.contention
        self.max_unread_frames = config.max_unread_frames or (1 << 62)
        self.socket_buffer = config.socket_buffer if config.socket_buffer is not None else (1 << 62)
        self._next_conn = 0
        self._next_msg = 0
        self.blocks: list[Any] = []  # active partition/clog objects with .blocks(src, dst) and .breaks
        self._holding: dict[int, SimConnection] = {}
        self._pending: list[_Pending] = []
        self.on_send: Callable[[Host], None] | None = None
        self.on_recv: Callable[[Host], None] | None = None
        self.handler_errors: list[str] = []
        self.kernel_ctx = contextvars.Context()

    # -- hosts ---------------------------------------------------------------

    def add_host(self, name: str, rank: int | None = None) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        host = self.hosts[name] = Host(name, rank, len(self.hosts))
        host.net.fabric = self
        return host

    def boot(self, host: Host, lane: int, ctx: contextvars.Context) -> None:
        """Start a new incarnation of ``host`` running in ``lane`` with context ``ctx``."""
        host.lane = lane
        host.ctx = ctx
        host.alive = True
        host.vanished = False
        host.listeners = {}
        host.endpoints = {}
        self.loop.stretch_sleeps(lane, host.factor)

    def resolve(self, src: Host, name: str) -> Host | None:
        if name in LOCAL_NAMES or name == src.name:
            return src
        return self.hosts.get(name)

    def latency(self, src: Host, dst: Host) -> float:
        model = self._links.get((src.name, dst.name)) if self._links else None
        return (model or self._latency).sample(self.rng)

    def blocked(self, src: Host, dst: Host) -> Any:
        for b in self.blocks:
            if b.blocks(src.name, dst.name):
                return b
        return None

    # -- crash ---------------------------------------------------------------

    def crash(self, host: Host, reason: str, *, silent: bool = False) -> None:
        """The process on ``host`` dies: its callbacks never run again.

        Peers see FINs (the OS closes a dead process's sockets), unless
        ``silent``: the machine vanished, nothing tells the peers; what they
        send is never acknowledged and breaks their connection after the
        retransmit timeout, and connects to it go unanswered.
        """
        if not host.alive:
            return
        self.loop.kill_lane(host.lane)
        self.tracer.emit(self.loop.time(), "crash", host.name, detail=reason + (" (silent)" if silent else ""))
        self._down(host, f"{host.name} crashed ({reason})", silent=silent)

    def exit(self, host: Host) -> None:
        """The process on ``host`` exited (its lane is over): the OS closes its sockets and listeners.

        A connection still holding data the process never read is reset (as
        TCP does on close with unread data); the others deliver what was sent,
        then a FIN.
        """
        if host.alive:
            self._down(host, f"{host.name} exited", silent=False, reset_unread=True)

    def _down(self, host: Host, reason: str, *, silent: bool, reset_unread: bool = False) -> None:
        host.alive = False
        host.vanished = silent
        host.listeners = {}
        for ep in list(host.endpoints.values()):
            if silent:
                ep._vanished = True
                if ep._exc is None:
                    ep._exc = ConnectionLost(f"{host.name} vanished")
            elif reset_unread and (ep._frames or ep._kernel):
                ep._abort(f"{reason} leaving data unread")
            else:
                ep._die(reason)
        host.endpoints = {}
        self._pending = [p for p in self._pending if p.src is not host]

    def crash_listener(self, host: Host, port: int, reason: str) -> bool:
        """Only the service listening on ``host:port`` dies (e.g. the store). False if none."""
        listener = host.listeners.get(port)
        if listener is None:
            return False
        self.tracer.emit(self.loop.time(), "crash", host.name, detail=f"{reason} (port {port})")
        listener._crash(f"the service at {host.name}:{port} crashed ({reason})")
        return True

    def reset(self, a: Host, b: Host) -> int:
        """Reset (RST) every connection between hosts ``a`` and ``b``; returns how many."""
        n = 0
        for ep in list(a.endpoints.values()):
            if ep._peer_ep is not None and ep._peer_ep._host is b and ep._exc is None:
                msg = f"connection {a.name}<->{b.name} was reset by the network"
                ep._fail(ConnectionLost(msg))
                ep._peer_ep._fail(ConnectionLost(msg))
                n += 1
        self.tracer.emit(self.loop.time(), "reset", a.name, b.name, detail=f"{n} connection(s)")
        return n

    # -- message path ----------------------------------------------------------

    def transmit(self, ep: SimConnection, header: Header | None, data: bytearray | None, n: int, now: float) -> None:
        """Put one frame (or a FIN when ``header`` is None) on ``ep``'s outgoing link."""
        peer = ep._peer_ep
        if peer is not None:
            peer._incoming += n  # in flight towards peer (held frames too) until delivered
        if ep._held is not None or (peer is not None and peer._vanished) or (
                self.blocks and self.blocked(ep._host, ep._peer_host)):
            if ep._held is None:
                ep._held = deque()
                self._holding[ep._id] = ep
                blocker = self.blocked(ep._host, ep._peer_host)
                breaks = (blocker is not None and blocker.breaks) or (peer is not None and peer._vanished)
                if breaks and self.config.retransmit_timeout is not None:
                    self.loop.call_in_lane(now + self.config.retransmit_timeout, -1, self._give_up, ep,
                                           ep._held, context=self.kernel_ctx)
            ep._held.append((header, data, n))
            return
        self._schedule(ep, header, data, n, now)

    def _schedule(self, ep: SimConnection, header: Header | None, data: bytearray | None, n: int,
                  now: float) -> None:
        """Time one frame (or FIN) on ``ep``'s link and post its arrival: the per-message hot path.

        The arithmetic is kept operation for operation (same draws, same
        float results): digests and virtual times do not depend on the fast paths.
        """
        src = ep._host
        dst = ep._peer_host
        if self._lat_drawn:  # the default Uniform model, inlined (the same draw as Uniform.sample)
            lat = self._lat_low + self._lat_span * self._random()
        elif self._lat_const is not None:
            lat = self._lat_const
        else:
            lat = self.latency(src, dst)
        bw = self._bw
        tx = n / bw if (bw and n) else 0.0
        factor = src.factor
        if factor != 1.0:
            lat *= factor
            tx *= factor
        if tx and self._contention:
            start = now if now > src.tx_free else src.tx_free
            src.tx_free = start + tx
            t = start + tx + lat
            rx_done = dst.rx_free + tx
            if rx_done > t:
                t = rx_done
            dst.rx_free = t
        else:
            t = now + lat + tx
        if self._overhead:  # the receiver's CPU handles one message at a time
            o = self._overhead * dst.factor
            t = (t if t > dst.cpu_free else dst.cpu_free) + o
            dst.cpu_free = t
        if t < ep._last:
            t = ep._last
        ep._last = t
        peer = ep._peer_ep
        assert peer is not None
        loop = self.loop
        if header is None:
            loop.call_in_lane(t, dst.lane, peer._remote_closed, ep._fin_reason, context=dst.ctx)
            return
        msg = self._next_msg = self._next_msg + 1
        tracer = self.tracer
        if tracer.keep:
            tracer.message(now, src.name, dst.name, n, msg, header, (src.num, dst.num))
        else:  # Tracer.message inlined (the hot path of big runs)
            buf = tracer._buf
            buf.append((now, src.num, dst.num, n, msg, header))
            if len(buf) >= 2048:
                tracer._flush()
        event = _new_event(_Event)  # _Event.__init__ inlined
        event._context = dst.ctx if dst.ctx is not None else contextvars.copy_context()
        event._callback = peer._deliver
        event._args = (header, data, n, msg)
        if t <= loop._now:
            event._scheduled = False
            loop._push(dst.lane, event)  # type: ignore[arg-type]
        else:  # SimLoop.post inlined
            event._scheduled = True
            heappush(loop._heap if t < loop._bound else loop._far,  # type: ignore[arg-type]
                     (t, next(loop._seq), dst.lane, event))

    def release(self) -> None:
        """Re-check held links and connects after a partition/clog ended."""
        now = self.loop.time()
        for cid, ep in list(self._holding.items()):
            if ep._held is None:
                del self._holding[cid]
                continue
            if self.blocked(ep._host, ep._peer_host) or (ep._peer_ep is not None and ep._peer_ep._vanished):
                continue
            held, ep._held = ep._held, None
            del self._holding[cid]
            for header, data, n in held:
                self._schedule(ep, header, data, n, now)
        pending, self._pending = self._pending, []
        for p in pending:
            if p.fut.done():
                continue
            if self.blocked(p.src, p.dst) or self.blocked(p.dst, p.src):
                self._pending.append(p)
            else:
                self._syn(p)

    def _give_up(self, ep: SimConnection, held: deque[Any]) -> None:
        if ep._held is held and ep._exc is None:
            ep._fail(ConnectionLost(f"connection {ep._host.name}->{ep._peer_host.name} timed out "
                                    f"(unreachable for {self.config.retransmit_timeout:g}s)"))
            ep._fin_reason = "reset after retransmission timeout"
            held.append((None, None, 0))

    # -- connecting --------------------------------------------------------------

    async def connect(self, src: Host, address: Address, timeout: float | None) -> SimConnection:
        host, port = address
        loop = self.loop
        fut: asyncio.Future[Connection] = loop.create_future()
        dst = self.resolve(src, str(host))
        now = loop.time()
        self.tracer.emit(now, "connect", src.name, str(host), detail=str(port))
        if dst is None:
            loop.call_in_lane(now + 2 * self._latency.mean, loop.current_lane, _fail_future, fut,
                              ConnectionLost(f"could not connect to {host}:{port}: unknown host"))
        else:
            p = _Pending(src, dst, int(port), fut, loop.current_lane)
            if self.blocks and (self.blocked(src, dst) or self.blocked(dst, src)):
                self._pending.append(p)
                if self.config.retransmit_timeout is not None:
                    loop.call_in_lane(now + self.config.retransmit_timeout, loop.current_lane, _fail_future, fut,
                                      ConnectionLost(f"could not connect to {host}:{port}: unreachable"))
            else:
                self._syn(p)
        # The timeout as one timer failing ``fut`` (what ``asyncio.timeout`` does, minus its context
        # manager and the cancellation it turns into TimeoutError: one connect per connection made).
        timer = None if timeout is None else loop.call_at(
            now + timeout, _fail_future, fut,
            TimeoutError(f"connecting to {host}:{port} timed out after {timeout:g}s"))
        try:
            conn = await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().close()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        assert isinstance(conn, SimConnection)
        return conn

    def _syn(self, p: _Pending) -> None:
        lat = self.latency(p.src, p.dst)
        self.loop.call_in_lane(self.loop.time() + lat, -1, self._syn_arrived, p, context=self.kernel_ctx)

    def _syn_arrived(self, p: _Pending) -> None:
        now = self.loop.time()
        dst, src = p.dst, p.src
        if dst.vanished:  # nobody answers: the caller's timeout, or TCP's, ends the wait
            if self.config.retransmit_timeout is not None:
                self.loop.call_in_lane(now + self.config.retransmit_timeout, p.lane, _fail_future, p.fut,
                                       ConnectionLost(f"could not connect to {dst.name}:{p.port}: no answer"))
            return
        back = now + self.latency(dst, src)
        listener = dst.listeners.get(p.port) if dst.alive else None
        if listener is None or listener._closing or not src.alive:
            self.tracer.emit(now, "refused", dst.name, src.name, detail=str(p.port))
            self.loop.call_in_lane(back, p.lane, _fail_future, p.fut,
                                   ConnectionLost(f"could not connect to {dst.name}:{p.port}: connection refused"))
            return
        self._next_conn += 1
        cid = self._next_conn
        client = SimConnection(self, src, dst, cid * 2, DEFAULT_MAX_FRAME_SIZE)
        server = SimConnection(self, dst, src, cid * 2 + 1, listener._max_frame_size)
        client._peer_ep, server._peer_ep = server, client
        client._last = server._last = now
        src.endpoints[client._id] = client
        dst.endpoints[server._id] = server
        self.tracer.emit(now, "accept", dst.name, src.name, detail=str(p.port))
        assert dst.ctx is not None
        dst.ctx.run(listener._accept, server)
        self.loop.call_in_lane(back, p.lane, _connected, p.fut, client)
