"""The simulated network: its configuration, and the fabric of hosts and connections of one run.

:class:`Network` is the *configuration* a user passes to ``sim.run``.
:class:`Fabric` is one run's network: its hosts (each with a
:class:`~sim.host_network.HostNetwork`, the :class:`aiodist.net.base.Network`
the production store, rendezvous and collectives run on unchanged), how
connections are made, and what crashes and resets do to them. When a frame
arrives is :mod:`sim.links`' business; what the endpoints buffer is
:mod:`sim.endpoints`'.

* ``connect`` costs a round trip; an address nobody listens on is refused
  (ConnectionLost) after a round trip; an unknown host fails the same way;
  a connect across a partition waits for it to heal (or the retransmit
  timeout).
* A crashed host's connections deliver what was already sent, then an
  end-of-stream (peers see ConnectionLost); a host that vanished (a silent
  crash) tells nobody: what is sent to it is never acknowledged.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiodist.errors import ConnectionLost
from aiodist.net.base import Address, Connection
from aiodist.wire import DEFAULT_MAX_FRAME_SIZE

from .endpoints import SimConnection, _connected, _fail_future
from .host_network import LOCAL_NAMES, HostNetwork, SimListener
from .latency import Constant, Exponential, LatencyModel, Tail, Uniform, finite
from .links import Host, Links, Stream

if TYPE_CHECKING:
    from .loop import SimLoop
    from .trace import Tracer


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True, kw_only=True)
class Network:
    """How the simulated network behaves.

    ``latency``: seconds or a model (:class:`~sim.latency.Constant`,
    :class:`~sim.latency.Uniform`, :class:`~sim.latency.Exponential`); the
    default varies so that seed sweeps explore interleavings. ``tail``: a
    :class:`~sim.latency.Tail` (a rare long extra delay on any message; the
    exploration of ``sim.run`` draws one per seed when this is None).
    ``bandwidth``: bytes/second per host NIC (None: infinite).
    ``overhead``: CPU seconds per message on the sender and on the receiver.
    ``contention``: each host's NIC serves one frame's bytes at a time, in
    each direction (see :mod:`sim.links`).
    ``links``: per-link latency overrides, keyed by (src, dst) host names or
    rank numbers (directional; add both directions for a symmetric link).
    ``slow``: per-link latency multipliers, keyed the same way (a slow link;
    ``(0, 0)``: rank 0's connections to itself).
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
    tail: Tail | None = None
    bandwidth: float | None = 1.25e9
    overhead: float = 0.0
    contention: bool = True
    links: Mapping[tuple[str | int, str | int], float | LatencyModel] = field(default_factory=dict)
    slow: Mapping[tuple[str | int, str | int], float] = field(default_factory=dict)
    retransmit_timeout: float | None = 60.0
    max_unread_frames: int | None = 4096
    socket_buffer: int | None = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        """ValueError for a setting no network has (a NaN latency made the clock stop advancing: the run spun)."""
        _latency("latency", self.latency)
        for link, lat in self.links.items():
            _latency(f"links[{link!r}]", lat)
        if self.tail is not None and not isinstance(self.tail, Tail):
            raise ValueError(f"Network: tail must be a sim.latency.Tail or None, got {self.tail!r}")
        _positive("bandwidth", self.bandwidth, none_ok=True)
        _positive("retransmit_timeout", self.retransmit_timeout, none_ok=True)
        for link, factor in self.slow.items():
            _positive(f"slow[{link!r}]", factor)
        if not finite(self.overhead) or self.overhead < 0:
            raise ValueError(f"Network: overhead must be a finite number of seconds >= 0, got {self.overhead!r}")
        for name, least in (("max_unread_frames", 1), ("socket_buffer", 0)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise ValueError(f"Network: {name} must be an integer >= {least} or None, got {v!r}")

    @classmethod
    def ideal(cls, *, alpha: float, bandwidth: float | None) -> Network:
        """The textbook alpha-beta network: constant latency, no overhead, no contention."""
        return cls(latency=Constant(alpha), bandwidth=bandwidth, overhead=0.0, contention=False)

    @classmethod
    def fixed(cls, latency: float = 1e-4) -> Network:
        """Constant latency, infinite bandwidth: the same timing for every seed (with ``explore=False``)."""
        return cls(latency=Constant(latency), bandwidth=None)


def _latency(name: str, value: object) -> None:
    if isinstance(value, LatencyModel):
        return  # (the models check their own numbers)
    if not finite(value) or value < 0:  # type: ignore[operator]
        raise ValueError(f"Network: {name} must be a finite number of seconds >= 0 or a latency model "
                         f"(Constant, Uniform, Exponential), got {value!r}")


def _positive(name: str, value: object, *, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if not finite(value) or not value > 0:  # type: ignore[operator]
        raise ValueError(f"Network: {name} must be a finite number > 0{' or None' if none_ok else ''}, got {value!r}")


__all__ = ["Network", "Fabric", "Host", "HostNetwork", "SimConnection", "SimListener", "Constant", "Uniform",
           "Exponential", "Tail"]


def host_name(h: str | int) -> str:
    return f"rank{h}" if isinstance(h, int) else h


class _Pending:
    """A connect() in progress (kept so a partition heal can retry it)."""

    __slots__ = ("src", "dst", "port", "fut", "lane")

    def __init__(self, src: Host, dst: Host, port: int, fut: asyncio.Future[Connection], lane: int) -> None:
        self.src, self.dst, self.port, self.fut, self.lane = src, dst, port, fut, lane


def _connect_timed_out(fut: asyncio.Future[Connection], host: object, port: object, timeout: float) -> None:
    """A connect's timeout: its error is made only if it fires (nearly every connect is answered first)."""
    if not fut.done():
        fut.set_exception(TimeoutError(f"connecting to {host}:{port} timed out after {timeout:g}s"))


class Fabric:
    """All hosts and connections of one simulation run."""

    def __init__(self, config: Network, loop: SimLoop, rng: random.Random, tracer: Tracer) -> None:
        self.config = config
        self.loop = loop
        self.tracer = tracer
        self.hosts: dict[str, Host] = {}
        self.kernel_ctx = contextvars.Context()
        self.links = Links(config, loop, rng, tracer, self.kernel_ctx)
        self._next_conn = 0
        self._pending: list[_Pending] = []
        self.handler_errors: list[str] = []

    # -- hosts ---------------------------------------------------------------

    def add_host(self, name: str, rank: int | None = None) -> Host:
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists")
        host = self.hosts[name] = Host(name, rank, len(self.hosts))
        host.net = HostNetwork(host, self)
        return host

    def boot(self, host: Host, lane: int, ctx: contextvars.Context) -> None:
        """Start a new incarnation of ``host`` running in ``lane`` with context ``ctx``."""
        host.lane = lane
        host.ctx = ctx
        host.alive = True
        host.vanished = False
        host.listeners = {}
        host.endpoints = {}
        self.loop.stretch_sleeps(lane, host.factor, *host.stretch)

    def resolve(self, src: Host, name: str) -> Host | None:
        if name in LOCAL_NAMES or name == src.name:
            return src
        return self.hosts.get(name)

    @property
    def messages(self) -> int:
        """Frames sent so far (each has a message id in the trace)."""
        return self.links.messages

    # -- crash ---------------------------------------------------------------

    def crash(self, host: Host, reason: str, *, silent: bool = False) -> None:
        """The process on ``host`` dies: its callbacks never run again.

        Peers see end-of-streams (the OS closes a dead process's sockets), unless
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
                ep._vanish(f"{host.name} vanished")
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
        why = f"the service at {host.name}:{port} crashed ({reason})"
        host.gone[port] = why
        listener._crash(why)
        return True

    def reset(self, a: Host, b: Host) -> int:
        """Reset (RST) every connection between hosts ``a`` and ``b``; returns how many."""
        n = 0
        for ep in list(a.endpoints.values()):
            peer = ep._peer_ep
            if peer is not None and peer._host is b and ep._exc is None:
                msg = f"connection {a.name}<->{b.name} was reset by the network"
                ep._fail(ConnectionLost(msg))
                peer._fail(ConnectionLost(msg))
                n += 1
        self.tracer.emit(self.loop.time(), "reset", a.name, b.name, detail=f"{n} connection(s)")
        return n

    def release(self) -> None:
        """Re-check held streams and connects after a partition or clog ended."""
        self.links.release()
        pending, self._pending = self._pending, []
        for p in pending:
            if p.fut.done():
                continue
            if self.links.blocked(p.src, p.dst) or self.links.blocked(p.dst, p.src):
                self._pending.append(p)
            else:
                self._syn(p)

    # -- connecting --------------------------------------------------------------

    async def connect(self, src: Host, address: Address, timeout: float | None) -> SimConnection:
        host, port = address
        loop = self.loop
        links = self.links
        fut: asyncio.Future[Connection] = loop.create_future()
        dst = self.resolve(src, str(host))
        now = loop.time()
        self.tracer.emit(now, "connect", src.name, str(host), detail=str(port))
        if dst is None:
            loop.schedule(now + 2 * links.mean_latency, loop.lane, _fail_future,
                          (fut, ConnectionLost(f"could not connect to {host}:{port}: unknown host")),
                          self.kernel_ctx)
        else:
            p = _Pending(src, dst, int(port), fut, loop.lane)
            if links.blocks and (links.blocked(src, dst) or links.blocked(dst, src)):
                self._pending.append(p)
                if links.retransmit_timeout is not None:
                    loop.schedule(now + links.retransmit_timeout, loop.lane, _fail_future,
                                  (fut, ConnectionLost(f"could not connect to {host}:{port}: unreachable")),
                                  self.kernel_ctx)
            else:
                self._syn(p)
        # The timeout as one timer failing ``fut`` (what ``asyncio.timeout`` does, minus its context
        # manager and the cancellation it turns into TimeoutError: one connect per connection made).
        timer = None if timeout is None else loop.call_at(now + timeout, _connect_timed_out, fut, host, port, timeout)
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
        lat = self.links.latency(p.src, p.dst)
        self.loop.schedule(self.loop.time() + lat, -1, self._syn_arrived, (p,), self.kernel_ctx)

    def _syn_arrived(self, p: _Pending) -> None:
        now = self.loop.time()
        dst, src = p.dst, p.src
        links = self.links
        if dst.vanished:  # nobody answers: the caller's timeout, or TCP's, ends the wait
            if links.retransmit_timeout is not None:
                self.loop.schedule(now + links.retransmit_timeout, p.lane, _fail_future,
                                   (p.fut, ConnectionLost(f"could not connect to {dst.name}:{p.port}: no answer")),
                                   self.kernel_ctx)
            return
        back = now + links.latency(dst, src)
        listener = dst.listeners.get(p.port) if dst.alive else None
        if listener is None or listener._closing or not src.alive:
            self.tracer.emit(now, "refused", dst.name, src.name, detail=str(p.port))
            gone = dst.gone.get(p.port) if listener is None and dst.alive else None
            refused = ConnectionLost.refusal(f"could not connect to {dst.name}:{p.port}: connection refused"
                                             + (f" ({gone})" if gone else ""))
            self.loop.schedule(back, p.lane, _fail_future, (p.fut, refused), self.kernel_ctx)
            return
        self._next_conn += 1
        cid = self._next_conn
        client = SimConnection(links, src, dst, cid * 2, DEFAULT_MAX_FRAME_SIZE)
        server = SimConnection(links, dst, src, cid * 2 + 1, listener._max_frame_size)
        client._peer_ep, server._peer_ep = server, client
        client._out = Stream(client._id, src, dst, server._deliver, server._remote_closed, client._broke, now,
                             links.slowness(src, dst))
        server._out = Stream(server._id, dst, src, client._deliver, client._remote_closed, server._broke, now,
                             links.slowness(dst, src))
        src.endpoints[client._id] = client
        dst.endpoints[server._id] = server
        self.tracer.emit(now, "accept", dst.name, src.name, detail=str(p.port))
        assert dst.ctx is not None
        dst.ctx.run(listener._accept, server)
        self.loop.schedule(back, p.lane, _connected, (p.fut, client), self.kernel_ctx)
