"""A listener's bound on connections that have not authenticated yet.

:class:`HandshakeGate` counts the connections of one listener that are still
in their handshake (a TLS handshake, a rank link's hello and proof) against a
limit. A new connection over it takes the place of the oldest one still in
its handshake, which is closed at once: sockets that never authenticate then
cost a bounded amount of memory however many are opened (and each is held at
most the handshake timeout), while a genuine peer, whose handshake takes a
few round trips, still gets in during a flood unless the limit's worth of
new connections arrives within its handshake. (Refusing the new connection
instead would let anyone who holds the limit's worth of silent sockets shut
every genuine peer out: a rank's refused dial fails the job.) Evictions are
logged once per interval with a count (:class:`~aiodist.ratelog.RateLog`),
never silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..ratelog import RateLog

DEFAULT_MAX_HANDSHAKES = 1024
"""Connections of one listener in their handshake at once (as the store's ``max_handshakes``)."""

LOG_INTERVAL = 10.0


class HandshakeGate:
    """Connections in their handshake against ``limit`` (see the module doc).

    ``where`` names the listener in the log (``"rank 0's listener"``), ``what``
    what is counted (``"in their TLS handshake"``) and ``option`` the setting
    that raises the limit.
    """

    __slots__ = ("limit", "evicted", "_waiting", "_where", "_what", "_option", "_busy")

    def __init__(
        self,
        limit: int,
        where: str,
        logger: logging.Logger,
        *,
        what: str = "in their handshake",
        option: str = "max_handshakes",
        interval: float = LOG_INTERVAL,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"{option} must be a positive integer, got {limit!r}")
        self.limit = limit
        self.evicted = 0
        self._waiting: dict[Ticket, None] = {}  # (oldest first)
        self._where = where
        self._what = what
        self._option = option
        self._busy = RateLog(logger, logging.WARNING, interval)

    def __repr__(self) -> str:
        return f"<HandshakeGate {self._where} handshaking={self.handshaking}/{self.limit} evicted={self.evicted}>"

    @property
    def handshaking(self) -> int:
        """Connections counted in now."""
        return len(self._waiting)

    def admit(self, peer: str, evict: Callable[[], object]) -> Ticket:
        """Count a new connection in; at the limit, the oldest counted one is evicted first (``evict()``
        called: it closes that connection). The ticket's :meth:`Ticket.leave` counts it out."""
        if len(self._waiting) >= self.limit:
            oldest = next(iter(self._waiting))
            self.evicted += 1
            self._busy.event(
                f"{self._where}: {len(self._waiting)} connections are {self._what}, the limit ({self._option}) is "
                f"{self.limit}: closed the oldest (from {oldest.peer}) to let in the one from {peer}"
            )
            oldest.evict()
        ticket = Ticket(self, peer, evict)
        self._waiting[ticket] = None
        return ticket

    def close(self) -> None:
        """Log the evictions not yet reported (and stop the log's timer)."""
        self._busy.close()


class Ticket:
    """One connection counted in by a gate: :meth:`leave` (at its authentication, or its end) counts it out once."""

    __slots__ = ("peer", "_gate", "_evict")

    def __init__(self, gate: HandshakeGate, peer: str, evict: Callable[[], object]) -> None:
        self.peer = peer
        self._gate: HandshakeGate | None = gate
        self._evict: Callable[[], object] | None = evict

    def leave(self) -> None:
        gate, self._gate, self._evict = self._gate, None, None
        if gate is not None:
            del gate._waiting[self]

    def evict(self) -> None:
        """Count it out and close its connection."""
        evict = self._evict
        self.leave()
        if evict is not None:
            evict()
