"""An in-process Channel: N ranks of one event loop exchanging keyed messages.

Used by the tests of the collective algorithms, and usable wherever several
ranks live in one process. With a seeded ``rng`` each message is delivered
after a random number of event-loop turns, so messages overtake each other
and receives are posted before or after arrival at random: ordering bugs
show up, reproducibly for a given seed.

Like the TCP path it does not copy a payload at ``send`` time: the payload is
read when the message is delivered, and ``send`` returns only then. An
algorithm that modifies a buffer before its send returned gets garbage, as
it would over TCP.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ..errors import AiodistError, CollectiveMismatchError
from .transfer import run_all

__all__ = ["MemoryFabric", "MemoryChannel", "DuplicateKeyError"]


class DuplicateKeyError(AiodistError):
    """Two messages used the same (source, destination, key): an algorithm bug."""


_Slot = tuple[int, int, tuple[Any, ...]]


class MemoryFabric:
    """The shared mailboxes of ``size`` in-process ranks.

    ``rng`` (a seeded ``random.Random``) enables random delivery delays of up to
    ``max_hops`` event-loop turns. With ``eager_limit``, a message larger than
    that many bytes is only delivered -- and its ``send`` only returns -- once
    the receiver has posted the matching receive (MPI's rendezvous protocol,
    or a full socket buffer): an algorithm that sends a large message before
    posting its own receive then deadlocks here as it would over TCP.
    ``messages``, ``bytes_sent`` count traffic per source rank.
    """

    def __init__(
        self, size: int, *, rng: random.Random | None = None, max_hops: int = 4, eager_limit: int | None = None
    ) -> None:
        self.size = size
        self._rng = rng
        self._max_hops = max_hops
        self._eager_limit = eager_limit
        self._arrived: dict[_Slot, bytes] = {}
        self._waiting: dict[_Slot, tuple[asyncio.Future[memoryview | None], memoryview | None]] = {}
        self._senders: dict[_Slot, asyncio.Future[None]] = {}
        self._used: set[_Slot] = set()
        self.messages = [0] * size
        self.bytes_sent = [0] * size

    def channel(self, rank: int) -> MemoryChannel:
        """The Channel of ``rank``."""
        return MemoryChannel(self, rank)

    def channels(self) -> list[MemoryChannel]:
        """One Channel per rank, in rank order."""
        return [MemoryChannel(self, r) for r in range(self.size)]

    def undelivered(self) -> list[_Slot]:
        """Messages that arrived but were never received (should be empty after a collective)."""
        return sorted(self._arrived, key=repr)

    # ------------------------------------------------------------- internals

    async def _send(self, src: int, dst: int, key: tuple[Any, ...], payload: Any) -> None:
        if not 0 <= dst < self.size:
            raise ValueError(f"rank {src} sent to rank {dst}, outside 0..{self.size - 1}")
        slot = (src, dst, key)
        if slot in self._used:
            raise DuplicateKeyError(f"rank {src} sent a second message to rank {dst} under key {key!r}")
        self._used.add(slot)
        view = memoryview(payload).cast("B") if not isinstance(payload, bytes) else memoryview(payload)
        self.messages[src] += 1
        self.bytes_sent[src] += view.nbytes
        if self._rng is not None:
            for _ in range(self._rng.randrange(self._max_hops + 1)):
                await asyncio.sleep(0)
        if self._eager_limit is not None and view.nbytes > self._eager_limit and slot not in self._waiting:
            posted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._senders[slot] = posted
            try:
                await posted
            finally:
                del self._senders[slot]
        self._deliver(slot, view)

    def _deliver(self, slot: _Slot, view: memoryview) -> None:
        waiter = self._waiting.pop(slot, None)
        if waiter is None:
            self._arrived[slot] = bytes(view)
            return
        fut, out = waiter
        if fut.done():  # receiver was cancelled: keep the message, it is abandoned
            self._arrived[slot] = bytes(view)
            return
        if out is None:
            fut.set_result(memoryview(bytes(view)))
        elif out.nbytes != view.nbytes:
            fut.set_exception(_mismatch(slot, view.nbytes, out.nbytes))
        else:
            out[:] = view
            fut.set_result(None)

    async def _recv(self, src: int, dst: int, key: tuple[Any, ...], out: memoryview | None) -> memoryview | None:
        slot = (src, dst, key)
        data = self._arrived.pop(slot, None)
        if data is not None:
            if out is None:
                return memoryview(data)
            if out.nbytes != len(data):
                raise _mismatch(slot, len(data), out.nbytes)
            out[:] = data
            return None
        if slot in self._waiting:
            raise DuplicateKeyError(f"rank {dst} posted a second receive from rank {src} under key {key!r}")
        fut: asyncio.Future[memoryview | None] = asyncio.get_running_loop().create_future()
        self._waiting[slot] = (fut, out)
        sender = self._senders.get(slot)
        if sender is not None and not sender.done():
            sender.set_result(None)
        try:
            return await fut
        finally:
            if self._waiting.get(slot, (None,))[0] is fut:
                del self._waiting[slot]


def _mismatch(slot: _Slot, got: int, expected: int) -> CollectiveMismatchError:
    src, dst, key = slot
    return CollectiveMismatchError(
        f"rank {dst} expected {expected} bytes from rank {src} under key {key!r} but {got} arrived",
        calls={src: f"sent {got} bytes", dst: f"expected {expected} bytes"},
        seq=key[0] if key and isinstance(key[0], int) else None,
    )


class MemoryChannel:
    """One rank's view of a :class:`MemoryFabric` (implements aiodist.channel.Channel)."""

    def __init__(self, fabric: MemoryFabric, rank: int) -> None:
        self._fabric = fabric
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._fabric.size

    def peer_name(self, peer: int) -> str:
        return f"rank {peer}"

    async def send(self, peer: int, key: tuple[Any, ...], payload: Any) -> None:
        await self._fabric._send(self._rank, peer, key, payload)

    async def recv_into(self, peer: int, key: tuple[Any, ...], out: memoryview) -> None:
        await self._fabric._recv(peer, self._rank, key, out)

    async def exchange(
        self, dst: int, send_key: tuple[Any, ...], payload: Any, src: int, recv_key: tuple[Any, ...], out: memoryview
    ) -> None:
        # The receive is posted first (see Channel.exchange): under the rendezvous protocol
        # (eager_limit) a large send waits until its receive is posted, and so may the peer's.
        await run_all([self.recv_into(src, recv_key, out), self.send(dst, send_key, payload)])

    async def recv_bytes(self, peer: int, key: tuple[Any, ...]) -> memoryview:
        got = await self._fabric._recv(peer, self._rank, key, None)
        assert got is not None
        return got
