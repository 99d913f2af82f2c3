"""The sending half of a TCP connection: what goes out, in which order, and when a sender may go on.

A small frame (up to 64 KiB with its header) is copied. The first small frame
of a loop iteration is written at once; the others sent in the same
iteration are coalesced into one write at the start of the next (or, while a
batch of received frames is handed to a frame handler, when the batch is
done). A frame is never held longer than the rest of the iteration it was
sent in: it must not wait for a receive that may never come.

A large payload is not copied: it is handed to the kernel in slices no
larger than what the socket's send buffer takes at once (Linux says how much
room it has), so asyncio's transport never keeps the caller's memory; while
the kernel is full, a small copy is written instead, and its leftover in the
transport brings ``resume_writing`` once there is room again. Frames behind
a large one wait, in order, in :class:`Outbox`'s own queue. So a send that
is cancelled leaves nothing of the caller's behind: a frame that had not
started is dropped, one that had started is finished from a copy of its
rest.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import struct
import sys
from typing import Any

from ..errors import ConnectionClosedError, anew
from ..wire import as_byte_view, encode_frame
from .waiters import Waiters, wake

COALESCE_LIMIT = 1 << 16
"""Frames up to this size (header included) are copied and batched into one write."""
_COPY_SLICE = 1 << 15  # what is copied and written while the kernel's send buffer is (nearly) full
_COPY_WHOLE = 1 << 17  # a payload up to this size is copied with its header into one write (cheaper than two)
_COPY_BLIND = 1 << 20  # what is copied and written at once where the kernel's room is unknown (TLS, not Linux)
_MIN_VIEW = 1 << 16  # the least the kernel must take at once for a slice of the caller's memory

_SO_MEMINFO = 55 if sys.platform == "linux" else None  # (Linux >= 4.6: a socket's memory counters)
_MEMINFO = struct.Struct("9I")


class KernelRoom:
    """How many bytes a send on a socket takes at once, now (Linux; elsewhere unknown).

    The kernel accepts data while the memory its send queue holds is below
    the socket's send buffer (``SO_MEMINFO``); three quarters of the
    difference are taken as room, as queued memory counts per-packet overhead
    too. (The kernel wakes a writer once a third of the buffer is free: the
    room then is about a megabyte on loopback.)
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: Any) -> None:
        self._sock = sock

    def room(self) -> int:
        """Bytes a send takes at once (0 if that cannot be known any more: the socket is closing)."""
        try:
            info = _MEMINFO.unpack(self._sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, _MEMINFO.size))
        except (OSError, ValueError, struct.error):
            return 0
        sndbuf: int = info[3]
        queued: int = info[5]
        return (sndbuf - queued) * 3 // 4

    @classmethod
    def of(cls, sock: Any) -> KernelRoom | None:
        """The room of ``sock``'s send buffer, if this system tells it."""
        if sock is None or _SO_MEMINFO is None:
            return None
        try:
            _MEMINFO.unpack(sock.getsockopt(socket.SOL_SOCKET, _SO_MEMINFO, _MEMINFO.size))
        except (OSError, ValueError, struct.error):
            return None
        return cls(sock)


class _Outgoing:
    """A large frame waiting in the queue, handed to the kernel slice by slice."""

    __slots__ = ("head", "data", "pos", "owned", "sent", "waiter")

    def __init__(self, head: bytes, data: memoryview) -> None:
        self.head = head  # the encoded prefix and header; b"" once written
        self.data = data  # the payload: the caller's memory until own()
        self.pos = 0  # payload bytes handed over
        self.owned = False
        self.sent = False  # handed over whole (or owned by a closing connection): it goes out
        self.waiter: asyncio.Future[None] | None = None  # a send() waiting until it is handed over

    def __repr__(self) -> str:
        return f"<_Outgoing {self.pos}/{len(self.data)} {'owned' if self.owned else 'caller memory'}>"

    def wake(self) -> None:
        wake(self.waiter)

    @property
    def started(self) -> bool:
        return not self.head

    def own(self) -> None:
        """Copy the rest of the payload: the caller's buffer is then free."""
        if not self.owned:
            self.data = memoryview(bytes(self.data[self.pos :]))
            self.pos = 0
            self.owned = True


class Outbox:
    """The frames one connection sends, from the caller's hands to its asyncio transport.

    The connection tells it when the transport's buffer fills and empties
    (:meth:`pause`, :meth:`resume`), when a batch of received frames is being
    handled (:meth:`begin_batch`, :meth:`end_batch`), and when sending must
    stop (:meth:`refuse`, :meth:`close`, :meth:`stop`).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, room: KernelRoom | None) -> None:
        self._loop = loop
        self._transport = transport
        self._room = room
        self.paused = False  # the transport holds bytes the kernel did not take yet
        self._exposed = False  # ... and some of them are a caller's memory (see _write_slices)
        self._delivering = False
        # A frame went straight to the transport since the last receive or flush: the next ones are batched.
        self.wrote = False
        self._flush_scheduled = False
        self._wbuf = bytearray()
        # Frames that could not be handed to the transport yet, in order: large ones
        # (_Outgoing) and, behind them, small ones copied into bytearrays.
        self._queue: collections.deque[_Outgoing | bytearray] = collections.deque()
        self._drainers = Waiters(loop)
        self._exc: ConnectionClosedError | None = None  # why nothing more may be sent
        self.reset_needed = False  # a cancelled send left a caller's memory in the transport

    def __repr__(self) -> str:
        state = "refusing" if self._exc is not None else "paused" if self.paused else "ready"
        return f"<Outbox {state} queued={len(self._queue)} batched={len(self._wbuf)}>"

    @property
    def empty(self) -> bool:
        """Nothing waits in the queue (the transport may still hold bytes)."""
        return not self._queue

    # -- sending ----------------------------------------------------------------

    def try_send(self, header: dict[str, Any], payload: Any = None) -> bool:
        """Queue one small frame (a copy) if nothing waits: True; else queue nothing: False.

        A large payload (more than the coalescing limit, written without a
        copy) is never taken here.
        """
        if self._exc is not None or self.paused or self._queue:
            return False
        if payload is not None:
            payload = as_byte_view(payload)
            if payload.nbytes > COALESCE_LIMIT:  # large whatever the header: no encoding for nothing
                return False
        head, body = encode_frame(header, payload)
        if body is None:
            self._queue_small(head)
        elif len(head) + body.nbytes <= COALESCE_LIMIT:
            self._queue_small(head + body)
        else:
            return False
        return True

    def send_nowait(self, header: dict[str, Any], payload: Any = None) -> bool:
        """Queue one frame; False: the buffer is full (wait before sending more). See the module docstring."""
        if self._exc is not None:
            raise anew(self._exc)
        head, body = encode_frame(header, payload)
        if body is None:
            return self._queue_small(head)
        if len(head) + body.nbytes <= COALESCE_LIMIT:
            return self._queue_small(head + body)
        # Large: queued behind whatever is batched, handed to the kernel slice by slice.
        if self._wbuf:
            self._write_buffered()
        self._queue.append(_Outgoing(head, body))
        if not self.paused and len(self._queue) == 1:
            self._pump()
        self._wrote_now()
        return not self.paused and not self._queue

    async def wait_sent(self) -> None:
        """After send_nowait said False: wait until the caller may reuse that frame's payload.

        A large frame of the caller's memory: until it is all in the kernel's
        hands (cancellation: a frame that has not started leaves the queue, not
        sent at all; one that has is finished from a copy of its rest, so the
        caller's buffer is free either way; :attr:`reset_needed` says if only a
        reset can free it). Anything else was copied: until the buffer drained.
        """
        last = self._queue[-1] if self._queue else None
        if not isinstance(last, _Outgoing) or last.waiter is not None or last.owned:
            await self.drained()
            return
        fut = last.waiter = self._loop.create_future()
        try:
            await fut
        except asyncio.CancelledError:
            self._give_back(last)
            raise
        finally:
            last.waiter = None
        if not last.sent:
            assert self._exc is not None
            raise anew(self._exc)

    def _give_back(self, item: _Outgoing) -> None:
        """A send gave up waiting for ``item``: make sure nothing keeps referring to its payload."""
        if item.sent or item not in self._queue:
            # Handed over (or dropped) already, but the cancellation came before the sender
            # resumed: the cancelled task's traceback keeps the item alive, so it lets go.
            if not item.owned:
                item.data = memoryview(b"")
            return
        if not item.started:
            self._queue.remove(item)
            item.data = memoryview(b"")  # (the cancelled task's traceback may keep the item alive)
        elif self._exposed and self._queue[0] is item:
            # The kernel refused part of a slice it said it had room for: the transport
            # still reads the caller's memory, and only a reset lets go of it.
            self.reset_needed = True
        else:
            item.own()

    async def drained(self) -> None:
        """Wait until everything queued was handed to the kernel (raises if sending stopped)."""
        if self._exc is not None:
            raise anew(self._exc)
        if not self.paused and not self._queue:
            return
        await self._drainers.wait()
        if self._exc is not None:
            raise anew(self._exc)

    # -- small frames: coalescing -------------------------------------------------

    def _queue_small(self, data: bytes) -> bool:
        """Write ``data`` now, or batch it for the end of this loop iteration."""
        if self._queue:  # behind a large frame still on its way
            last = self._queue[-1]
            if isinstance(last, bytearray):
                last += data
            else:
                self._queue.append(bytearray(data))
            return False
        if not (self.wrote or self._delivering or self.paused or self._wbuf):
            self._transport.write(data)
            self._wrote_now()
            return not self.paused
        self._wbuf += data
        if len(self._wbuf) >= COALESCE_LIMIT:
            self._write_buffered()
        self._wrote_now()
        return not self.paused

    def _wrote_now(self) -> None:
        """Something was written or batched in this iteration: batch what follows until the next one."""
        self.wrote = True
        if not self._flush_scheduled and not self._delivering:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """At the start of the next iteration: write the frames batched during the last one."""
        self._flush_scheduled = False
        self.wrote = False
        if self._wbuf and self._exc is None:
            self._write_buffered()

    def _write_buffered(self) -> None:
        data, self._wbuf = self._wbuf, bytearray()
        if self._queue:  # (a large frame went first meanwhile: stay behind it)
            self._queue.append(data)
        else:
            self._transport.write(data)

    def begin_batch(self) -> None:
        """A batch of received frames is being handed over: what the handler sends goes out together."""
        self._delivering = True

    def end_batch(self) -> None:
        self._delivering = False
        if self._wbuf and self._exc is None:
            self._write_buffered()
        # Many frames at once (pipelined replies) usually wake many senders: batch theirs until next iteration.
        self._wrote_now()

    # -- large frames: slices -----------------------------------------------------

    def pause(self) -> None:
        """The transport keeps bytes the kernel did not take."""
        self.paused = True

    def resume(self) -> None:
        """The transport handed everything to the kernel: send on."""
        self.paused = False
        self._exposed = False
        if self._queue:
            self._pump()
        if not self.paused and not self._queue:
            self._drainers.wake_all()

    def _pump(self) -> None:
        """Hand queued frames to the transport, in order, while it takes them without holding on."""
        q = self._queue
        t = self._transport
        while q and not self.paused:
            item = q[0]
            if type(item) is bytearray:
                q.popleft()
                t.write(item)
                continue
            assert isinstance(item, _Outgoing)
            if not self._write_slices(t, item):
                break
            q.popleft()
            item.sent = True
            item.wake()
        if not q and not self.paused:
            self._drainers.wake_all()

    def _write_slices(self, t: asyncio.Transport, item: _Outgoing) -> bool:
        """Write ``item`` while the kernel takes it; True once all of it is in the kernel's hands or copied.

        A slice of the caller's memory is only written when the kernel has
        room for all of it (else asyncio's transport would keep referring to
        it); otherwise a small copy, whose leftover the transport keeps
        (``pause``) until the kernel has room again (``resume``).
        """
        data = item.data
        n = len(data)
        while item.pos < n:
            if self.paused:
                return False
            pos = item.pos
            if item.owned:  # (the connection's own copy: the transport may keep it)
                if item.head:
                    t.write(item.head)
                t.write(data[pos:])
                item.head, item.pos = b"", n
                break
            room = self._room.room() if self._room is not None and not item.head else None
            if room is not None and room >= _MIN_VIEW:
                k = min(n - pos, room)
                t.write(data[pos : pos + k])
                if self.paused:  # the kernel did not take all of it after all
                    self._exposed = True
            else:  # the header with the payload's first bytes, the kernel (nearly) full, or its room unknown: a copy
                if item.head and n <= _COPY_WHOLE:
                    k = n - pos
                else:
                    k = min(n - pos, _COPY_SLICE if self._room is not None else _COPY_BLIND)
                t.write(item.head + data[pos : pos + k])
                item.head = b""
            item.pos = pos + k
        # Done, unless the transport still holds part of a slice of the caller's memory (then
        # the frame stays first in the queue until the transport let go of it: resume).
        return not self._exposed

    # -- stopping -----------------------------------------------------------------

    def refuse(self, exc: ConnectionClosedError) -> None:
        """No new frames (they raise ``exc``); what is queued still goes out."""
        if self._exc is None:
            self._exc = exc
        self._drainers.wake_all()

    def close(self, exc: ConnectionClosedError) -> None:
        """An orderly close: refuse new frames; what is queued goes out, no longer from its senders' memory.

        Its senders are released at once (their frames will be delivered),
        except the one whose memory the transport still reads: once it let go.
        """
        self.refuse(exc)
        if self._wbuf:
            self._write_buffered()  # frames batched in this iteration still go out
        self.release()

    def release(self) -> None:
        """Free the senders of what is queued: their frames still go out, from copies (except the one whose
        memory the transport still reads: once it let go)."""
        for i, item in enumerate(self._queue):
            if isinstance(item, _Outgoing):
                item.own()
                if i or not self._exposed:
                    item.sent = True
                    item.wake()

    def stop(self, exc: ConnectionClosedError) -> None:
        """Nothing more goes out (a reset, or the connection is gone): drop the queue, wake every sender."""
        self.refuse(exc)
        self._wbuf = bytearray()
        queue, self._queue = self._queue, collections.deque()
        for item in queue:
            if isinstance(item, _Outgoing):
                item.data = memoryview(b"")  # (its sender raises our exception, which we keep: with its frames)
                item.wake()
        self._drainers.wake_all()
