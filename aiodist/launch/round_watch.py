"""While a round's job runs, the elastic agent watches the other nodes of the round.

A node can be lost at any moment after its round froze: its launcher killed
(SIGKILL, SIGTERM, a crash) before its ranks even joined the workers'
rendezvous, or its job failing on its own. The ranks of the other nodes would
only learn it from their own timeouts (``init_process_group``'s, 300 s by
default, while they wait in the rendezvous for ranks that will never come), so
each agent watches, in the rendezvous store, for as long as its ranks run:

* every agent goes on bumping its heartbeat counter of the round
  (``<prefix>hb/<round>/<node>``, the counter it bumped while joining); a
  node whose counter has not moved for :data:`HEARTBEAT_TIMEOUT` seconds (on
  the watcher's clock) is lost;
* an agent that leaves says why (``<prefix>bye/<node>``, :func:`say_goodbye`):
  ``finished`` (its job succeeded: nothing is lost), else e.g. ``SIGTERM``; a
  node that left without finishing is lost at once;
* a node whose job failed opens the next round: the round moved on, so this
  one is over for every node.

When one of these happens, :meth:`RoundWatch.run` returns a :class:`Loss`
and the agent stops its ranks and, if it may restart, rejoins, without the
lost node. A watcher that loses the store itself stops watching (the store's
host is gone: nothing can be rejoined; the ranks' own detection decides).

Time comes from the running loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from ..errors import StoreConnectionLost, StoreError
from .outcome import _ranges

__all__ = ["FINISHED", "HEARTBEAT_TIMEOUT", "HOST_FINISHED", "HOST_KEY", "HOST_LEFT", "POLL", "Loss", "RoundWatch", "say_goodbye"]

POLL = 0.25
"""Seconds between two looks at the other nodes (each also bumps this node's heartbeat)."""
HEARTBEAT_TIMEOUT = 5.0
"""Seconds a node's heartbeat may stand still before it is lost (the elastic rendezvous's own limit)."""
FINISHED = "finished"
"""What an agent whose job succeeded says as it leaves."""
HOST_KEY = "host"
"""Under the prefix: the node id of the agent that hosts the rendezvous store."""
HOST_FINISHED = "the elastic agent hosting the rendezvous store finished"
"""What the store's host tells the connected agents as it closes the store after its job succeeded."""
HOST_LEFT = "the elastic agent hosting the rendezvous store left ("
"""... and otherwise (followed by why, then ``)``)."""
_GOODBYE_LIMIT = 1.0
"""Seconds an agent gives the store to take its goodbye (it may be gone)."""


@dataclass(frozen=True)
class Loss:
    """Why the round is over: the node lost (its rank in the round, None: the round moved on), its ranks, why.

    ``store``: the node hosted the rendezvous store, which went with it (no new round can be formed).
    """

    node: int | None
    ranks: tuple[int, ...]
    why: str
    store: bool = False

    def message(self, when: str = "") -> str:
        """``node 1 (ranks 2, 3) was lost before its ranks joined the rendezvous: its launcher left (SIGTERM)``."""
        if self.node is None:
            return self.why
        return f"node {self.node} ({describe_ranks(self.ranks)}) was lost{when}: {self.why}"


def node_ranks(node: int, nproc_per_node: int) -> tuple[int, ...]:
    return tuple(range(node * nproc_per_node, (node + 1) * nproc_per_node))


def describe_ranks(ranks: tuple[int, ...]) -> str:
    """``rank 2``, ``ranks 2, 3``, ``ranks 0\u20133, 6``."""
    if not ranks:
        return "no ranks"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranges(ranks)}"


async def say_goodbye(store: Any, prefix: str, node_id: str, why: str) -> None:
    """Tell the other agents that this one leaves, and why (``FINISHED`` or a reason); errors are ignored."""
    with contextlib.suppress(TimeoutError, StoreError, ConnectionError, OSError):
        async with asyncio.timeout(_GOODBYE_LIMIT):
            await store.set(f"{prefix}bye/{node_id}", why.encode())


class RoundWatch:
    """Watches the other participants of round ``round`` (this node is ``participants[rank]``)."""

    def __init__(self, store: Any, prefix: str, *, round: int, rank: int, participants: list[str],
                 nproc_per_node: int, poll: float = POLL, heartbeat_timeout: float = HEARTBEAT_TIMEOUT) -> None:
        self.store = store
        self.prefix = prefix
        self.round = round
        self.rank = rank
        self.participants = list(participants)
        self.nproc_per_node = nproc_per_node
        self.poll = poll
        self.heartbeat_timeout = heartbeat_timeout

    async def run(self) -> Loss | None:
        """Watch until a node is lost (its :class:`Loss`), or the store is lost (None); else until cancelled."""
        loop = asyncio.get_running_loop()
        me = self.participants[self.rank]
        others = [(i, n) for i, n in enumerate(self.participants) if i != self.rank]
        seen: dict[int, tuple[int, float]] = {}  # node's rank -> (heartbeat count, when it last moved)
        finished: list[int] = []
        last_look: float | None = None
        host: int | None = None  # the rank in the round of the node hosting the store (if it is in the round)
        try:
            if await self.store.check([f"{self.prefix}{HOST_KEY}"]):
                hosting = bytes(await self.store.get(f"{self.prefix}{HOST_KEY}")).decode(errors="replace")
                if hosting in self.participants and hosting != me:
                    host = self.participants.index(hosting)
            while True:
                await self.store.add(f"{self.prefix}hb/{self.round}/{me}", 1)
                state = json.loads(bytes(await self.store.get(f"{self.prefix}state")))
                if isinstance(state, dict) and state.get("round", self.round) != self.round:
                    return Loss(None, (), f"round {self.round} was given up by another node (its job failed; "
                                          f"round {state.get('round')} is open)")
                now = loop.time()
                if last_look is not None and now - last_look > self.heartbeat_timeout / 2:
                    seen.clear()  # (this watcher itself was held up: nobody's silence can be judged on it)
                last_look = now
                for i, node in others:
                    if i in finished:
                        continue
                    if await self.store.check([f"{self.prefix}bye/{node}"]):
                        why = bytes(await self.store.get(f"{self.prefix}bye/{node}")).decode(errors="replace")
                        if why == FINISHED:
                            finished.append(i)
                            continue
                        return Loss(i, node_ranks(i, self.nproc_per_node), f"its launcher left ({why})")
                    count = await self.store.add(f"{self.prefix}hb/{self.round}/{node}", 0)
                    last = seen.get(i)
                    if last is None or last[0] != count:
                        seen[i] = (count, now)
                    elif now - last[1] > self.heartbeat_timeout:
                        return Loss(i, node_ranks(i, self.nproc_per_node),
                                    f"its launcher stopped responding (no heartbeat for {now - last[1]:.1f}s)")
                await asyncio.sleep(self.poll)
        except StoreConnectionLost as e:
            if host is None or host in finished or HOST_FINISHED in str(e):
                return None  # (the host finished its job: nothing is lost; the ranks' own detection decides)
            said = str(e).partition(HOST_LEFT)[2].partition(")")[0]
            how = f"its launcher left ({said})" if said else "its launcher went away"
            return Loss(host, node_ranks(host, self.nproc_per_node),
                        f"{how}, and with it the rendezvous store it hosted", store=True)
        except (StoreError, ConnectionError, TimeoutError, ValueError):
            return None
