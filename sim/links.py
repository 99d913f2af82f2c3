"""Link timing: when a frame sent on a simulated connection arrives, and what holds it on the way.

This module knows hosts and the *streams* between them (one direction of a
connection), never the endpoints' buffers: an endpoint hands a frame to its
outgoing :class:`Stream` and :class:`Links` calls the stream's ``deliver``
callback (the receiving endpoint's) at the arrival time.

The model (all times virtual):

* A frame of n payload bytes sent at t leaves the sender's NIC once the NIC
  has sent what it queued before (a FIFO serving bytes at ``bandwidth``),
  its first byte arrives ``latency`` later, and the receiver's NIC serves its
  n bytes at ``bandwidth`` from then on, in the first stretch of time the
  NIC is not already booked for (frames booked earlier keep their slots:
  nothing waits for a frame that has not arrived yet). With a per-message
  CPU ``overhead`` o the receiver's CPU handles each frame for o the same
  way. Uncontended, that is ``latency + n / bandwidth`` (+ o on each side):
  the alpha-beta model.
* Order is kept per stream only (TCP): a frame never overtakes an earlier
  one of its own connection, and nothing orders two connections' frames.
* Latency is the configured model (per-link overrides win), times the
  sender's straggler factor, plus, when a :class:`~sim.latency.Tail` is set,
  a rare long extra delay (retransmissions, scheduling: the network's, so
  not scaled by the straggler factor).
* Blocks (partitions, clogs) hold a stream's frames in order until released;
  one that breaks TCP gives up after ``retransmit_timeout`` (the sending end
  sees ConnectionLost, the receiving end a reset once the link heals). A
  one-way partition also holds the streams flowing against it from
  :data:`ACK_STALL` after their first frame under it on: their
  acknowledgements are cut.
"""

from __future__ import annotations

import contextvars
import math
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .latency import Constant, LatencyModel, Tail, Uniform, as_model

if TYPE_CHECKING:
    from .loop import SimLoop
    from .trace import Tracer

EPHEMERAL_PORT_BASE = 40000
NEVER = 1 << 62
"""A message count no host reaches (the trigger counters' "no watch")."""


class Host:
    """One virtual machine and its current process incarnation: lane, context, NIC and CPU state.

    ``listeners`` and ``endpoints`` hold the seam objects of :mod:`sim.endpoints`
    (typed loosely: this module does not know them). ``sent``/``received`` count
    frames; ``watch_sent``/``watch_recv`` are the next counts at which the
    simulation wants to hear of it (a fault trigger), ``watch_fatal`` the next
    one that may kill it.
    """

    __slots__ = ("name", "num", "rank", "lane", "ctx", "alive", "vanished", "listeners", "endpoints", "tx_free",
                 "rx_busy", "cpu_busy", "cpu_free", "next_port", "sent", "received", "watch_sent", "watch_fatal", "watch_recv",
                 "factor", "stretch", "net", "gone")

    def __init__(self, name: str, rank: int | None, num: int) -> None:
        self.name = name
        self.num = num  # (its number in the digest: hosts are added in a deterministic order)
        self.rank = rank
        self.lane = -1
        self.ctx: contextvars.Context | None = None
        self.alive = False
        self.vanished = False
        self.listeners: dict[int, Any] = {}
        self.gone: dict[int, str] = {}  # port -> why its service is gone (a connect there is refused, saying so)
        self.endpoints: dict[int, Any] = {}
        self.tx_free = 0.0  # the outgoing NIC is busy until then (a FIFO)
        self.rx_busy: list[float] = []  # the incoming NIC's booked stretches: [start, end, start, end, ...]
        self.cpu_busy: list[float] = []  # the same for the CPU's per-message receive overhead
        self.cpu_free = 0.0  # the CPU's send overhead: busy until then (a FIFO)
        self.next_port = EPHEMERAL_PORT_BASE
        self.sent = 0
        self.received = 0
        self.watch_sent = NEVER
        self.watch_fatal = NEVER  # (the next watched send whose action may kill this host)
        self.watch_recv = NEVER
        self.factor = 1.0
        self.stretch: tuple[float, float | None] = (math.inf, None)  # the factor's (until, most): loop.stretch_sleeps
        self.net: Any = None

    def __repr__(self) -> str:
        state = "alive" if self.alive else "vanished" if self.vanished else "down"
        return f"<Host {self.name} {state} lane={self.lane}>"


class Stream:
    """One direction of a connection on the wire, ``src`` -> ``dst``: FIFO, held while blocked.

    ``deliver(header, data, n, msg)`` and ``end(reason)`` are the receiving
    endpoint's; ``broke(reason)`` the sending endpoint's (the retransmit
    timeout of a blocked link gave up). ``fin_reason`` is what the receiver
    is told when the end-of-stream arrives.
    """

    __slots__ = ("id", "src", "dst", "last", "held", "vanished", "deliver", "end", "broke", "fin_reason", "slow")

    def __init__(self, cid: int, src: Host, dst: Host, deliver: Callable[[Any, Any, int, int], None],
                 end: Callable[[str], None], broke: Callable[[str], None], now: float, slow: float = 1.0) -> None:
        self.id = cid
        self.slow = slow  # the link's latency multiplier (Network.slow)
        self.src = src
        self.dst = dst
        self.last = now  # the latest arrival scheduled so far: later frames never arrive earlier
        self.held: deque[tuple[Any, Any, int]] | None = None
        self.vanished = False  # the receiving machine vanished: frames are never acknowledged
        self.deliver = deliver
        self.end = end
        self.broke = broke
        self.fin_reason = "closed"

    def __repr__(self) -> str:
        return f"<Stream #{self.id} {self.src.name}->{self.dst.name}{' held' if self.held is not None else ''}>"


ACK_STALL = 0.2
"""Seconds a stream flowing against a one-way partition still flows after its first frame under it: the
cut drops the acknowledgements of its data, and TCP's sender, once its retransmission timeout expires
(200 ms at least on Linux), sends nothing new before they come. (Where one rank's heartbeats or
messages still reached the others forever, a one-way cut evicted the rank that stopped hearing them.)"""


class Block(Protocol):
    """A partition or clog in force: which directions it cuts, whether TCP gives up behind it."""

    breaks: bool
    stalled: dict[int, float]  # stream id -> when it stops, for the streams that run against it

    def blocks(self, src: str, dst: str) -> bool: ...

    def stalls(self, src: str, dst: str) -> bool: ...


def book(busy: list[float], arrive: float, need: float, now: float) -> float:
    """Book ``need`` seconds of a resource that serves one thing at a time, from ``arrive`` on; the end.

    ``busy`` holds the booked stretches as a flat sorted list ``[s0, e0, s1,
    e1, ...]``; stretches over by ``now`` are dropped. The booking takes the
    first free stretch long enough, so what was booked before never moves.
    """
    drop = 0
    n = len(busy)
    while drop < n and busy[drop + 1] <= now:
        drop += 2
    if drop:
        del busy[:drop]
        n -= drop
    if not n or busy[n - 1] <= arrive:  # nothing booked after the arrival: the usual case
        if n and busy[n - 1] == arrive:
            busy[n - 1] = arrive + need
        else:
            busy += (arrive, arrive + need)
        return arrive + need
    start = arrive
    i = 0
    while i < n:
        s, e = busy[i], busy[i + 1]
        if start + need <= s:
            break
        if e > start:
            start = e
        i += 2
    end = start + need
    busy[i:i] = (start, end)
    if i + 2 < len(busy) and busy[i + 2] == end:  # touching the next stretch: merge
        busy[i + 1] = busy[i + 3]
        del busy[i + 2:i + 4]
    if i and busy[i - 1] == start:  # touching the previous one
        busy[i - 1] = busy[i + 1]
        del busy[i:i + 2]
    return end


class Links:
    """Timing and blocking of every stream of one run (see the module docstring).

    ``config`` is the run's :class:`~sim.network.Network`; ``rng`` its "net"
    stream (every latency draw comes from it, in send order).
    """

    def __init__(self, config: Any, loop: SimLoop, rng: random.Random, tracer: Tracer,
                 kernel_ctx: contextvars.Context) -> None:
        self.loop = loop
        self.tracer = tracer
        self._schedule_event = loop.schedule  # (bound once: both run for every frame)
        self._trace_message = tracer.message
        self.kernel_ctx = kernel_ctx
        self.rng = rng
        self._random = rng.random
        self.latency_model: LatencyModel = as_model(config.latency)
        self._links = {(_host_name(a), _host_name(b)): as_model(m) for (a, b), m in config.links.items()}
        self._slow = {(_host_name(a), _host_name(b)): float(f) for (a, b), f in config.slow.items()}
        lm = self.latency_model
        # Per-message constants of _schedule: the default model's draw inlined; a constant
        # latency needs no draw at all.
        plain = not self._links
        self._lat_uniform = (lm.low, lm.high - lm.low) if isinstance(lm, Uniform) and plain else None
        self._lat_const = lm.value if isinstance(lm, Constant) and plain else None
        tail: Tail | None = config.tail
        self.tail = tail
        self._tail_p = tail.p if tail is not None else 0.0
        self._tail_low = tail.low if tail is not None else 0.0
        self._tail_ratio = tail.high / tail.low if tail is not None else 1.0
        self._tail_left = tail.budget if tail is not None and tail.budget is not None else float("inf")
        self.bandwidth: float | None = config.bandwidth
        self.overhead: float = config.overhead
        self.contention: bool = config.contention
        self.retransmit_timeout: float | None = config.retransmit_timeout
        # Kernel buffering the endpoints apply (flow control, see sim.endpoints).
        self.max_unread_frames: int = config.max_unread_frames or NEVER
        self.socket_buffer: int = config.socket_buffer if config.socket_buffer is not None else NEVER
        # Called when a host's frame count reaches its watch_sent / watch_recv (fault triggers).
        self.on_send: Callable[[Host, Host], None] = _ignore2
        self.on_recv: Callable[[Host], None] = _ignore
        self.blocks: list[Block] = []
        self._holding: dict[int, Stream] = {}
        self.messages = 0

    # -- latency ------------------------------------------------------------------

    def latency(self, src: Host, dst: Host) -> float:
        """One latency draw for a frame (or a connection handshake) from ``src`` to ``dst``."""
        lat = self._base_latency(src, dst)
        p = self._tail_p
        if p:
            u = self._random()
            if u < p:
                lat += self._tail(u / p)
        return lat

    def _tail(self, v: float) -> float:
        """The tail's extra delay for a uniform draw ``v``, within what is left of its budget."""
        extra = float(self._tail_low * self._tail_ratio ** v)
        if extra > self._tail_left:
            extra = max(self._tail_left, 0.0)
        self._tail_left -= extra
        if self._tail_left <= 0.0:
            self._tail_p = 0.0  # spent: no more tails (nor draws for them)
        return extra

    def _base_latency(self, src: Host, dst: Host) -> float:
        model = self._links.get((src.name, dst.name)) if self._links else None
        return (model or self.latency_model).sample(self.rng) * self.slowness(src, dst)

    def slowness(self, src: Host, dst: Host) -> float:
        """The latency multiplier of the link ``src`` -> ``dst`` (1.0 unless ``Network.slow`` names it)."""
        return self._slow.get((src.name, dst.name), 1.0) if self._slow else 1.0

    @property
    def mean_latency(self) -> float:
        return self.latency_model.mean

    # -- blocks ---------------------------------------------------------------------

    def blocked(self, src: Host, dst: Host) -> Block | None:
        for b in self.blocks:
            if b.blocks(src.name, dst.name):
                return b
        return None

    def stream_blocked(self, stream: Stream, depart: float) -> Block | None:
        """The block holding a frame that leaves on ``stream`` at ``depart``: one that cuts its direction,
        or a one-way partition it runs against, from :data:`ACK_STALL` after its first frame under it."""
        src, dst = stream.src.name, stream.dst.name
        for b in self.blocks:
            if b.blocks(src, dst):
                return b
            if b.stalls(src, dst) and depart >= b.stalled.setdefault(stream.id, depart + ACK_STALL):
                return b
        return None

    def add_block(self, block: Block) -> None:
        self.blocks.append(block)

    def remove_block(self, block: Block) -> bool:
        """End ``block``; streams it held flow again (False if it was not in force)."""
        if block not in self.blocks:
            return False
        self.blocks.remove(block)
        self.release()
        return True

    def release(self) -> None:
        """Re-check held streams after a block ended: those now free send what they held, in order."""
        now = self.loop.now
        for sid, stream in list(self._holding.items()):
            if stream.held is None:
                del self._holding[sid]
                continue
            if stream.vanished or self.stream_blocked(stream, now):
                continue
            held, stream.held = stream.held, None
            del self._holding[sid]
            for header, data, n in held:
                self.launch(stream, header, data, n, now)

    def _give_up(self, stream: Stream, held: deque[Any]) -> None:
        if stream.held is held:
            stream.broke(f"connection {stream.src.name}->{stream.dst.name} timed out "
                         f"(unreachable for {self.retransmit_timeout:g}s)")
            stream.fin_reason = "reset after retransmission timeout"
            held.append((None, None, 0))

    # -- the message path ------------------------------------------------------------

    def transmit(self, stream: Stream, header: Any, data: Any, n: int, depart: float) -> None:
        """Put one frame (or an end-of-stream when ``header`` is None) on ``stream``, departing at ``depart``."""
        if stream.held is None and not self.blocks and not stream.vanished:
            self.launch(stream, header, data, n, depart)
            return
        if stream.held is None:
            blocker = self.stream_blocked(stream, depart)
            if blocker is None and not stream.vanished:
                self.launch(stream, header, data, n, depart)
                return
            held: deque[tuple[Any, Any, int]] = deque()
            stream.held = held
            self._holding[stream.id] = stream
            breaks = (blocker is not None and blocker.breaks) or stream.vanished
            if breaks and self.retransmit_timeout is not None:
                self.loop.schedule(depart + self.retransmit_timeout, -1, self._give_up, (stream, held),
                                   self.kernel_ctx)
        stream.held.append((header, data, n))

    def launch(self, stream: Stream, header: Any, data: Any, n: int, now: float) -> None:
        """Time one frame (or end-of-stream) on a free ``stream`` and schedule its arrival: the per-message hot path.

        Only for a stream nothing holds (``transmit`` checks; a sender may check itself, as
        ``transmit`` would, and save the call).
        """
        src = stream.src
        dst = stream.dst
        uniform = self._lat_uniform
        if uniform is not None:  # the default model, inlined (the same draw as Uniform.sample)
            lat = uniform[0] + uniform[1] * self._random()
            if stream.slow != 1.0:
                lat *= stream.slow
        elif self._lat_const is not None:
            lat = self._lat_const * stream.slow
        else:
            lat = self._base_latency(src, dst)  # (the link's slowness included)
        bw = self.bandwidth
        tx = n / bw if (bw and n) else 0.0
        factor = src.factor
        if factor != 1.0:
            lat *= factor
            tx *= factor
        p = self._tail_p  # (latency()'s tail, inlined: the network's, not slowed by a straggler)
        if p:
            u = self._random()
            if u < p:
                lat += self._tail(u / p)
        if tx and self.contention:
            start = now if now > src.tx_free else src.tx_free
            src.tx_free = start + tx
            busy = dst.rx_busy
            arrive = start + lat
            if not busy or (busy[-1] <= arrive and busy[-1] <= self.loop.now):  # book()'s usual case, inlined:
                busy[:] = (arrive, arrive + tx)  # the receiving NIC is idle from the arrival on
                t = arrive + tx
            else:
                t = book(busy, arrive, tx, self.loop.now)
        else:
            t = now + lat + tx
        if self.overhead:  # the receiver's CPU handles one message at a time
            t = book(dst.cpu_busy, t, self.overhead * dst.factor, self.loop.now)
        if t < stream.last:
            t = stream.last
        stream.last = t
        if header is None:
            self.loop.schedule(t, dst.lane, stream.end, (stream.fin_reason,), dst.ctx)  # type: ignore[arg-type]
            return
        msg = self.messages = self.messages + 1
        self._trace_message(now, t, src, dst, n, msg, header)
        self._schedule_event(t, dst.lane, stream.deliver, (header, data, n, msg), dst.ctx)  # type: ignore[arg-type]


def _ignore(host: Host) -> None:
    return None


def _ignore2(host: Host, peer: Host) -> None:
    return None


def _host_name(h: str | int) -> str:
    return f"rank{h}" if isinstance(h, int) else h
