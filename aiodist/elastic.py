"""Elastic rendezvous: nodes that come and go agree, round by round, on who is in the job.

The state of the rendezvous is one JSON value in the store (``<prefix>state``),
changed only with ``compare_set`` (read, compute the new state, swap it in if
nobody changed it meanwhile, else start over), so any number of concurrent
joiners never corrupt it::

    {"v": version, "round": k, "status": "joining" | "frozen",
     "participants": [node ids in join order], "waiting": [node ids]}

A round accepts joiners while it is ``joining``, up to ``max_nodes`` (then it
freezes at once). Once it has ``min_nodes``, a *last call* of ``last_call``
seconds lets more arrive; then any participant freezes it. A frozen round is
the job: a node's rank is its place in ``participants``, the world size their
number. A node that arrives after the freeze is put on the ``waiting`` list
and waits for the next round, which :meth:`ElasticRendezvous.open_next_round`
starts (the members do, e.g. when a node failed or when
:meth:`ElasticRendezvous.num_waiting` says nodes want in; the launcher does it
when it restarts the job).

While a round is joining, each participant bumps a heartbeat counter
(``<prefix>hb/<round>/<node>``) every ``poll`` seconds; a participant whose
counter has not moved for ``heartbeat_timeout`` seconds (as seen by any other
participant, on its own clock) is dropped from the round, and so is, at the end
of the last call, one that was not heard from during it: a node that died
while joining is not frozen into the round, nor holds it open forever.

Time comes from the running loop, so the same code runs under the simulator.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import RendezvousError, RendezvousTimeoutError

DEFAULT_PREFIX = "aiodist/elastic/"


@dataclass
class ElasticRound:
    """A frozen round: this node's ``rank`` in it, the ``world_size``, the ``participants`` in rank order."""

    round: int
    rank: int
    world_size: int
    participants: list[str] = field(default_factory=list)


def _initial() -> dict[str, Any]:
    return {"v": 0, "round": 0, "status": "joining", "participants": [], "waiting": []}


class ElasticRendezvous:
    """One node's handle on the elastic rendezvous kept in ``store`` (see the module doc)."""

    def __init__(
        self,
        store: Any,
        node_id: str,
        *,
        min_nodes: int,
        max_nodes: int,
        last_call: float = 1.0,
        timeout: float = 300.0,
        heartbeat_timeout: float = 5.0,
        poll: float = 0.05,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if not 1 <= min_nodes <= max_nodes:
            raise RendezvousError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}:{max_nodes}")
        self.store = store
        self.node_id = str(node_id)
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.last_call = last_call
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.poll = poll
        self.prefix = prefix
        self._key = f"{prefix}state"
        self._seen: dict[str, tuple[int, float]] = {}  # node -> (heartbeat count, when it last moved)

    # ------------------------------------------------------------------ state

    async def _read(self) -> tuple[bytes, dict[str, Any]]:
        raw = bytes(await self.store.compare_set(self._key, b"", json.dumps(_initial()).encode()))
        return raw, json.loads(raw)

    async def _update(self, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any]:
        """Apply ``change(state) -> new state | None`` atomically (compare_set, retried); the state after."""
        while True:
            raw, state = await self._read()
            new = change(json.loads(raw))
            if new is None:
                return state
            new["v"] = state["v"] + 1
            desired = json.dumps(new).encode()
            if bytes(await self.store.compare_set(self._key, raw, desired)) == desired:
                return new

    async def state(self) -> dict[str, Any]:
        """The current state (diagnostics, tests)."""
        return (await self._read())[1]

    async def num_waiting(self) -> int:
        """Nodes waiting for the next round (a running job may restart to take them in)."""
        return len((await self._read())[1]["waiting"])

    async def open_next_round(self, after: int | None = None) -> int:
        """Close the current round and open the next one for joiners (idempotent per round).

        ``after``: only if the current round is still that one (so that every
        member of a failed round calling it opens one round, not several).
        Returns the number of the round now open.
        """

        def change(s: dict[str, Any]) -> dict[str, Any] | None:
            if after is not None and s["round"] != after:
                return None
            if s["status"] == "joining" and after is None:
                return None
            return {"round": s["round"] + 1, "status": "joining", "participants": [], "waiting": []}

        return int((await self._update(change))["round"])

    # ------------------------------------------------------------------ joining

    async def next_round(self) -> ElasticRound:
        """Join the open round (or wait for the next one) until it freezes with this node in it.

        Raises RendezvousTimeoutError after ``timeout`` seconds.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        min_since: float | None = None  # when this node first saw the round reach min_nodes
        me = self.node_id
        while True:
            state = await self._update(self._join_change)
            k = state["round"]
            if state["status"] == "frozen" and me in state["participants"]:
                return ElasticRound(k, state["participants"].index(me), len(state["participants"]),
                                    list(state["participants"]))
            if state["status"] == "joining" and me in state["participants"]:
                await self.store.add(f"{self.prefix}hb/{k}/{me}", 1)
                await self._drop_silent(state)
                if len(state["participants"]) >= self.min_nodes:
                    if min_since is None:
                        min_since = loop.time()
                    if loop.time() - min_since >= self.last_call:
                        # Only nodes heard from during the last call count: one silent all along is gone.
                        silent = [
                            n for n in state["participants"]
                            if n != me and self._seen.get(f"{k}/{n}", (0, -1.0))[1] < min_since
                        ]
                        if silent:
                            await self._drop(k, silent)
                            min_since = None
                        else:
                            await self._update(lambda s: self._freeze_change(s, k))
                        continue
                else:
                    min_since = None
            if loop.time() >= deadline:
                raise RendezvousTimeoutError(
                    f"elastic rendezvous: node {me!r} was not in a complete round after {self.timeout:g}s "
                    f"(round {k}: {state['status']}, {len(state['participants'])} participant(s), "
                    f"min {self.min_nodes}, max {self.max_nodes})",
                    missing=[],
                    timeout=self.timeout,
                )
            await asyncio.sleep(self.poll)

    def _join_change(self, s: dict[str, Any]) -> dict[str, Any] | None:
        me = self.node_id
        if me in s["participants"]:
            return None
        if s["status"] == "joining" and len(s["participants"]) < self.max_nodes:
            s["participants"].append(me)
            s["waiting"] = [n for n in s["waiting"] if n != me]
            if len(s["participants"]) >= self.max_nodes:
                s["status"] = "frozen"
            return s
        if s["status"] == "frozen" and me not in s["waiting"]:
            s["waiting"].append(me)  # a late joiner: waits for the next round
            return s
        return None

    def _freeze_change(self, s: dict[str, Any], k: int) -> dict[str, Any] | None:
        if s["round"] != k or s["status"] != "joining" or len(s["participants"]) < self.min_nodes:
            return None
        s["status"] = "frozen"
        return s

    async def _drop_silent(self, state: dict[str, Any]) -> None:
        """Drop the participants of the joining round whose heartbeat has not moved for heartbeat_timeout."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        k = state["round"]
        dead: list[str] = []
        for node in state["participants"]:
            if node == self.node_id:
                continue
            count = await self.store.add(f"{self.prefix}hb/{k}/{node}", 0)
            last = self._seen.get(f"{k}/{node}")
            if last is None or last[0] != count:
                self._seen[f"{k}/{node}"] = (count, now)
            elif now - last[1] > self.heartbeat_timeout:
                dead.append(node)
        if dead:
            await self._drop(k, dead)

    async def _drop(self, k: int, dead: list[str]) -> None:
        def change(s: dict[str, Any]) -> dict[str, Any] | None:
            if s["round"] != k or s["status"] != "joining":
                return None
            s["participants"] = [n for n in s["participants"] if n not in dead]
            return s

        await self._update(change)
