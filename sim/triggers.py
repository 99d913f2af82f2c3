"""Event triggers: run an action when a host sends or receives its n-th frame.

Faults use them (``Crash(2, on=MessageSent(2, 3))``) and so does timing
exploration (a pause after some send). Each host keeps its frame counts;
:class:`Watches` sets the host's next watched count, so the endpoints pay one
integer comparison per frame and call back only when a watch is due.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from .links import NEVER, Host, Links


@dataclass(frozen=True)
class MessageSent:
    """Fires when ``rank`` hands its ``n``-th message (1-based) to the network; it still goes out."""

    rank: int
    n: int

    def to_cli(self) -> str:
        return f"sent:{self.n}"


@dataclass(frozen=True)
class MessageReceived:
    """Fires when ``rank`` has received its ``n``-th message (1-based), before its program sees it."""

    rank: int
    n: int

    def to_cli(self) -> str:
        return f"recv:{self.n}"


Trigger = MessageSent | MessageReceived


def parse_trigger(rank: int, spec: str) -> Trigger | None:
    """``sent:N`` / ``recv:N`` for ``rank``; None if ``spec`` is not a trigger (a time, say)."""
    if spec.startswith("sent:"):
        return MessageSent(rank, int(spec[5:]))
    if spec.startswith("recv:"):
        return MessageReceived(rank, int(spec[5:]))
    return None


class Watches:
    """The pending triggers of one run, per host and direction, run when their count is reached.

    Actions run synchronously inside the step that sent (after the frame left)
    or received (before the program sees the frame) the counted frame.
    """

    def __init__(self, links: Links) -> None:
        self._sent: dict[str, list[tuple[int, int, Callable[[], None], bool]]] = {}
        self._recv: dict[str, list[tuple[int, int, Callable[[], None], bool]]] = {}
        self._seq = 0
        self.last_peer: Host | None = None
        """While a send trigger's action runs: the host the counted frame went to."""
        links.on_send = self._on_send
        links.on_recv = self._on_recv

    def add(self, host: Host, trigger: Trigger, action: Callable[[], None], *, fatal: bool = False) -> None:
        """Run ``action`` when ``host`` reaches the trigger's count (on its next frame if it already has).

        ``fatal``: the action may kill the sender, so the frame that fires it
        must be sent by a path that can stop the rest of its step
        (``try_send`` refuses it).
        """
        sent = isinstance(trigger, MessageSent)
        table = self._sent if sent else self._recv
        pending = table.setdefault(host.name, [])
        self._seq += 1
        bisect.insort(pending, (trigger.n, self._seq, action, fatal), key=lambda w: (w[0], w[1]))
        self._arm(host, sent)

    def _arm(self, host: Host, sent: bool) -> None:
        pending = (self._sent if sent else self._recv).get(host.name)
        nxt = pending[0][0] if pending else NEVER
        if sent:
            host.watch_sent = nxt
            host.watch_fatal = min((w[0] for w in pending if w[3]), default=NEVER) if pending else NEVER
        else:
            host.watch_recv = nxt

    def _on_send(self, host: Host, peer: Host) -> None:
        self.last_peer = peer
        self._fire(host, True, host.sent)

    def _on_recv(self, host: Host) -> None:
        self._fire(host, False, host.received)

    def _fire(self, host: Host, sent: bool, count: int) -> None:
        pending = (self._sent if sent else self._recv).get(host.name)
        while pending and pending[0][0] <= count:
            action = pending.pop(0)[2]
            action()  # (it may add watches: they are in ``pending`` already when due)
        self._arm(host, sent)
