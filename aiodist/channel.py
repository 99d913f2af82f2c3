"""The boundary between collective algorithms and the transport.

A collective algorithm (``aiodist.collectives``) is an ``async`` function over
a :class:`Channel`: the ranks of one group, numbered ``0..size-1``, exchanging
byte payloads identified by a *key*. The group layer (``aiodist.comm``)
implements it over the network seam, routing each frame by
(group, key, source) so that concurrent collectives and early arrivals reach
the right receiver. Tests implement it in memory.

Keys are short tuples of ints/strs, e.g. ``(seq, step)`` for step ``step`` of
the collective with sequence number ``seq``. A (source, key) pair is used for
at most one message per direction.
"""

from __future__ import annotations

from typing import Any, Protocol


class Channel(Protocol):
    """Point-to-point byte transport among the ranks of one group."""

    @property
    def rank(self) -> int:
        """This rank's number in the group."""

    @property
    def size(self) -> int:
        """Number of ranks in the group."""

    async def send(self, peer: int, key: tuple[Any, ...], payload: Any) -> None:
        """Send ``payload`` (bytes-like / C-contiguous buffer) to ``peer`` under ``key``.

        Returns once the payload was handed to the transport; the caller may
        then reuse the buffer. Raises PeerFailureError if ``peer`` is dead.
        """

    async def recv_into(self, peer: int, key: tuple[Any, ...], out: memoryview) -> None:
        """Receive the message ``peer`` sent under ``key`` into ``out`` (byte-format, writable).

        The transport writes straight into ``out`` when the message has not
        arrived yet (zero copy) and copies it when it arrived early. A message
        whose size differs from ``out.nbytes`` raises CollectiveMismatchError
        (never a silent partial write). Raises PeerFailureError if ``peer`` dies.
        Cancellation: ``out`` may be partially written; the key is abandoned.
        """

    async def exchange(
        self, dst: int, send_key: tuple[Any, ...], payload: Any, src: int, recv_key: tuple[Any, ...], out: memoryview
    ) -> None:
        """``send(dst, send_key, payload)`` and ``recv_into(src, recv_key, out)`` as one awaitable, no task.

        The receive is posted before the send waits, so a send that waits for
        room (a large payload) never waits on a peer that waits for us to read:
        the peer's message lands in ``out`` whenever it comes. (A send that
        goes at once may go first: nothing arrives before the step yields.) An
        implementation may do it with fewer coroutine layers than the two calls.
        """

    async def recv_bytes(self, peer: int, key: tuple[Any, ...]) -> memoryview:
        """Receive the message ``peer`` sent under ``key``, whatever its size."""

    def peer_name(self, peer: int) -> str:
        """``peer`` as an error message names it: "rank G" (its global rank), and its rank in the group if that differs."""
