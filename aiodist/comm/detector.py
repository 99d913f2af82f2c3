"""The failure detector: heartbeat bookkeeping, and the verdict "declare this peer failed" (pure).

One periodic check per rank (not per connection) does three things for every
watched peer: counts an interval in which nothing arrived from it as missed,
declares it failed after ``misses`` missed intervals in a row, and names it in
the list of peers to send a heartbeat to. No clock and no I/O here: the driver
calls :meth:`FailureDetector.check` from a timer with the time and the time
the check was due, and sends the heartbeats.

Signs of life are recorded by the driver on the hot path, for every frame
and every payload start, by setting :attr:`Watch.alive` (an attribute, not a
call); the check turns them into "heard in this interval". A large payload
keeps its sender's heartbeats waiting behind it: where the connection counts
what arrives (``progress``, bytes over TCP), the check reads that count, and
bytes that keep coming are the sign of life (bytes that stopped are silence,
whatever length the frame's header announced: a peer stopped in the middle of
a large frame, or one that announced more than it sends, is declared failed
after the heartbeat timeout). Where nothing is counted (frames arrive whole),
:meth:`Watch.slow_frame` gives the peer the time such a frame needs at a
minimum bandwidth instead.

A check that runs more than an interval late means this rank's own loop was
blocked (or the process was stopped): what it did not hear meanwhile is not
its peers' fault (it may still be in the socket), so every count starts again.
"""

from __future__ import annotations

from collections.abc import Callable


class Watch:
    """What the detector knows of one peer.

    ``alive``: something arrived since the last check (set by the driver).
    ``missed``: checks in a row that found nothing. ``quiet_until``: a large
    frame is arriving; silence is no evidence until then (loop time), unless
    the connection counts what arrives. ``progress``: that count at the last
    check (None: not counted).
    """

    __slots__ = ("rank", "alive", "missed", "quiet_until", "progress")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.alive = True
        self.missed = 0
        self.quiet_until = 0.0
        self.progress: int | None = None

    def __repr__(self) -> str:
        return f"<Watch {self.rank} {'alive' if self.alive else f'missed={self.missed}'}>"

    def slow_frame(self, now: float, seconds: float) -> None:
        """A frame that needs ``seconds`` to arrive started at ``now``: its sender is not silent until then."""
        self.alive = True
        if now + seconds > self.quiet_until:
            self.quiet_until = now + seconds


class FailureDetector:
    """Heartbeat bookkeeping for the peers of one rank: ``interval`` seconds, ``misses`` allowed."""

    __slots__ = ("interval", "misses", "_watching")

    def __init__(self, interval: float, misses: int) -> None:
        if interval <= 0 or misses < 1:
            raise ValueError(f"heartbeat interval must be > 0 and misses >= 1, got {interval!r}, {misses!r}")
        self.interval = interval
        self.misses = misses
        self._watching: dict[int, Watch] = {}

    def __repr__(self) -> str:
        return f"<FailureDetector every {self.interval:g}s x{self.misses} watching={len(self._watching)}>"

    @property
    def timeout(self) -> float:
        return self.interval * self.misses

    def watching(self) -> list[int]:
        return list(self._watching)

    def watch(self, w: Watch) -> None:
        """Start watching ``w``'s peer (its link just came up: that counts as hearing from it)."""
        w.alive = True
        w.missed = 0
        w.progress = None
        self._watching[w.rank] = w

    def unwatch(self, rank: int) -> None:
        self._watching.pop(rank, None)

    def check(
        self, now: float, due: float, progress: Callable[[int], int | None] | None = None
    ) -> tuple[list[int], list[tuple[int, str]]]:
        """The periodic check, due at ``due``, running at ``now``.

        ``progress(rank)``: the count of what arrived on that peer's connection
        (``Connection.progress``), or None where nothing is counted.
        Returns the peers to send a heartbeat to, and the peers to declare
        failed with why (those are no longer watched).
        """
        late = now - due > self.interval
        failed: list[tuple[int, str]] = []
        for w in self._watching.values():
            moved = False
            if progress is not None:
                count = progress(w.rank)
                moved = count != w.progress
                w.progress = count
            if w.alive or late or moved:
                w.alive = False
                w.missed = 0
            elif w.progress is not None or now >= w.quiet_until:
                w.missed += 1
                if w.missed >= self.misses:
                    failed.append((w.rank, self._verdict(w)))
        for rank, _ in failed:
            del self._watching[rank]
        return list(self._watching), failed

    def _verdict(self, w: Watch) -> str:
        return (
            f"hung or unreachable: heard nothing for {w.missed * self.interval:.1f}s "
            f"(heartbeat every {self.interval:g}s, {self.misses} missed)"
        )
