"""A group's view of the transport: group ranks, and one Channel per operation.

:class:`GroupComm` maps a group's ranks (``0..size-1``) to the job's global
ranks. :class:`OpChannel` is the :class:`~aiodist.channel.Channel` one
collective runs over: every frame it sends carries the group id, the
operation's sequence number (prefixed to the algorithm's key, so concurrent
operations never collide) and a short signature of the call (``"all_reduce
SUM float32"``); a receive that gets a frame with another signature fails with
:class:`CollectiveMismatchError` naming what each rank called. It also tracks
the peers it still waits for, which a timeout reports.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Sequence
from typing import Any

from ..errors import CollectiveMismatchError, PeerFailureError
from .router import Delivery, Header, Receive
from .transport import Transport


class RankTable:
    """A group's global ranks and their inverse (global rank -> group rank): immutable, shared.

    Every rank of a group holds the same table, and in the simulator all the
    virtual ranks live in one process: a table per rank would cost O(N^2)
    memory (4096 ranks: gigabytes). :func:`rank_table` hands out one instance
    per distinct ranks tuple while anybody still uses it.
    """

    __slots__ = ("ranks", "index", "__weakref__")

    def __init__(self, ranks: tuple[int, ...]) -> None:
        self.ranks = ranks
        self.index = {g: i for i, g in enumerate(ranks)}


_TABLES: weakref.WeakValueDictionary[tuple[int, ...], RankTable] = weakref.WeakValueDictionary()


def rank_table(ranks: Any) -> RankTable:
    """The shared :class:`RankTable` of ``ranks`` (any sequence of ints); keep a reference to keep it shared."""
    key = tuple(ranks)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = RankTable(key)
    return table


class GroupComm:
    """The communication side of one process group on one rank."""

    __slots__ = ("transport", "gid", "_table", "ranks", "name", "_index", "members", "rank", "size",
                 "__weakref__")  # (weakly keyed: the intra-node engines)

    def __init__(self, transport: Transport, gid: Any, ranks: tuple[int, ...], *, name: str) -> None:
        self.transport = transport
        self.gid = gid
        self._table = rank_table(ranks)
        self.ranks = self._table.ranks
        self.name = name
        self._index = self._table.index
        self.members = self._index  # global rank -> group rank; `g in members` is O(1)
        self.rank = self._index.get(transport.rank, -1)
        self.size = len(ranks)

    def __repr__(self) -> str:
        return f"<GroupComm {self.name} rank={self.rank}/{self.size}>"

    def group_rank(self, global_rank: int) -> int:
        """The group rank of a global rank (-1 if not a member)."""
        return self._index.get(global_rank, -1)

    def restate_mismatch(
        self, e: CollectiveMismatchError, *, op: str, seq: int, mine: str | None = None
    ) -> CollectiveMismatchError:
        """A mismatch whose calls are in global ranks (a peer's report, the router's size check), as
        operation ``seq``'s error in this group's numbering; ``mine``: this rank's call, added to the calls."""
        calls = {self.group_rank(k): v for k, v in e.calls.items()}
        if mine is not None:
            calls[self.rank] = mine
        return CollectiveMismatchError(f"{op} (seq {seq}) of {self.name}: {e.args[0]}", calls=calls, seq=seq,
                                       found_by=e.found_by, finding=e.finding, group=self.name, ranks=self.ranks)

    def localize(self, e: PeerFailureError, *, op: str | None, seq: int | None) -> PeerFailureError:
        """Restate a transport's PeerFailureError (global ranks) in this group's numbering."""
        g = e.global_rank if e.global_rank is not None else e.rank
        local = self.group_rank(g) if g is not None else None
        e.rank = local
        e.global_rank = g
        e.op = op if e.op is None else e.op
        e.seq = seq if e.seq is None else e.seq
        where = self.name if not op else f"{op} of {self.name}" if seq is None else f"{op} (seq {seq}) of {self.name}"
        if g is None:
            e.args = (f"{where}: {e.how or 'a peer failed'}",)
            return e
        if local is None or local < 0:
            who = f"global rank {g} (not a member of {self.name})"
        else:
            who = f"rank {local} (global rank {g})" if local != g else f"rank {g}"
        e.args = (f"{where}: {who} failed: {e.how or 'unknown'}",)
        return e


def new_receive(
    comm: GroupComm,
    *,
    src: int | None,
    out: memoryview | None,
    key: Any = None,
    tag: int | None = None,
    check: Any = None,
) -> tuple[Receive, asyncio.Future[Delivery | BaseException]]:
    """A receive (global ``src``) and the future it completes."""
    fut: asyncio.Future[Delivery | BaseException] = asyncio.get_running_loop().create_future()
    return Receive(group=comm.gid, src=src, out=out, key=key, tag=tag, check=check, fut=fut), fut


def peer_name(ranks: Sequence[int], group: str, peer: int) -> str:
    """Group rank ``peer`` of ``group`` (global ``ranks``) as a message names it: "rank G", plus its group rank if
    that differs ("rank 5 (rank 1 of group1)")."""
    g = ranks[peer] if 0 <= peer < len(ranks) else peer
    return f"rank {g}" if g == peer else f"rank {g} (rank {peer} of {group})"


class OpChannel:
    """The Channel of one collective call (see the module doc)."""

    __slots__ = ("comm", "loop", "op", "seq", "sig", "entry", "rank", "size", "_ranks", "_recv_waits", "_send_waits")

    def __init__(
        self,
        comm: GroupComm,
        *,
        op: str,
        seq: int,
        sig: str,
        entry: dict[str, Any] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.comm = comm
        self.loop = loop or asyncio.get_running_loop()
        self.op = op
        self.seq = seq
        self.sig = sig
        self.entry = entry
        self.rank = comm.rank  # (plain attributes: algorithms read them at every step)
        self.size = comm.size
        self._ranks = comm.ranks
        self._recv_waits: dict[int, int] = {}
        self._send_waits: dict[int, int] = {}
        if entry is not None:
            # The flight recorder shows the live table of peers this operation receives
            # from (inflight.snapshot lists its keys): nothing to update per message.
            entry["peers"] = self._recv_waits

    def __repr__(self) -> str:
        return f"<OpChannel {self.op} seq={self.seq} {self.comm.name}>"

    def waiting_for(self) -> list[int]:
        """Group ranks this operation is still receiving from (else: still sending to)."""
        return sorted(self._recv_waits or self._send_waits)

    @staticmethod
    def _untrack(table: dict[int, int], peer: int) -> None:
        n = table[peer] - 1
        if n:
            table[peer] = n
        else:
            del table[peer]

    def peer_name(self, peer: int) -> str:
        """See :meth:`aiodist.channel.Channel.peer_name`."""
        return peer_name(self._ranks, self.comm.name, peer)

    def _global(self, peer: int) -> int:
        if not 0 <= peer < self.size:
            raise ValueError(f"peer {peer} out of range for a group of {self.size} ranks")
        return self._ranks[peer]

    def _check(self, header: Header, src: int, nbytes: int) -> BaseException | None:
        theirs = header.get("o")
        if theirs == self.sig:
            return None
        peer = self.comm.group_rank(src)
        me = self.comm.rank
        return CollectiveMismatchError(
            f"collective mismatch in {self.comm.name} at seq {self.seq}: rank {me} called {self.sig!r} "
            f"but rank {peer} called {theirs!r}",
            calls={me: self.sig, peer: theirs},
            seq=self.seq,
            group=self.comm.name,
            ranks=self.comm.ranks,
        )

    async def exchange(
        self, dst: int, send_key: tuple[Any, ...], payload: Any, src: int, recv_key: tuple[Any, ...], out: memoryview
    ) -> None:
        # One coroutine for a step (see Channel.exchange). A send that goes at once goes first
        # (nothing can arrive before this step yields: the peer gets it sooner); otherwise the
        # receive is posted before the send waits, so the peer's message lands in ``out``
        # whenever it comes, even while our send waits for room.
        if out.format != "B" or out.ndim != 1:
            out = out.cast("B")
        pending = self._send_soon(dst, send_key, payload)
        try:
            r, fut = self._post(src, recv_key, out)
        except BaseException:
            if pending is not None:
                pending.close()  # type: ignore[attr-defined]  # (never started: nothing was sent)
            raise
        try:
            if pending is not None:
                await self._sending(dst, pending)
        except BaseException:
            self.comm.transport.router.cancel(r)  # (a timeout then names the send's peer, not this one)
            self._untrack(self._recv_waits, src)
            raise
        # _received, inlined: no coroutine of its own per step, one frame fewer on every resume
        try:
            result = await fut
        except asyncio.CancelledError:
            self.comm.transport.router.cancel(r)  # a receive cut short by a timeout was still waiting
            raise
        self._untrack(self._recv_waits, src)
        if isinstance(result, BaseException):
            raise self._failed(result, src, r) from None

    async def send(self, peer: int, key: tuple[Any, ...], payload: Any) -> None:
        pending = self._send_soon(peer, key, payload)
        if pending is not None:
            await self._sending(peer, pending)

    def _send_soon(self, peer: int, key: tuple[Any, ...], payload: Any) -> Awaitable[None] | None:
        """Send now if the transport can (None), else the awaitable that sends (see Transport.send_soon)."""
        dst = self._ranks[peer] if 0 <= peer < self.size else self._global(peer)
        header = {"t": "m", "g": self.comm.gid, "k": (self.seq, *key), "o": self.sig}
        try:
            return self.comm.transport.send_soon(dst, header, payload, self.comm.gid)
        except PeerFailureError as e:
            raise self.comm.localize(e, op=self.op, seq=self.seq) from None

    async def _sending(self, peer: int, pending: Awaitable[None]) -> None:
        """Wait for a send to ``peer`` that could not go at once (a timeout reports that peer)."""
        waits = self._send_waits
        waits[peer] = waits.get(peer, 0) + 1
        cancelled = False
        try:
            await pending
        except asyncio.CancelledError:
            cancelled = True  # cut short by a timeout: it was still waiting to get through
            raise
        except PeerFailureError as e:
            raise self.comm.localize(e, op=self.op, seq=self.seq) from None
        finally:
            if not cancelled:
                self._untrack(waits, peer)

    def _post(self, peer: int, key: tuple[Any, ...], out: memoryview | None) -> tuple[Receive, asyncio.Future[Any]]:
        """Post the receive of ``key`` from ``peer`` (counted as waited for); its future."""
        src = self._ranks[peer] if 0 <= peer < self.size else self._global(peer)
        fut = self.loop.create_future()
        r = Receive(group=self.comm.gid, src=src, out=out, key=(self.seq, *key), check=self._check, sig=self.sig, fut=fut)
        self.comm.transport.post(r)
        waits = self._recv_waits
        waits[peer] = waits.get(peer, 0) + 1
        return r, fut

    async def _received(self, peer: int, r: Receive, fut: asyncio.Future[Any]) -> Delivery:
        """Wait for the posted receive ``r`` from ``peer``; cancellation withdraws it (still counted).

        (:meth:`exchange` has this inlined: keep the two in step.)"""
        try:
            result = await fut
        except asyncio.CancelledError:
            self.comm.transport.router.cancel(r)  # a receive cut short by a timeout was still waiting
            raise
        self._untrack(self._recv_waits, peer)
        if isinstance(result, BaseException):
            raise self._failed(result, peer, r) from None
        return result  # type: ignore[no-any-return]

    def _failed(self, e: BaseException, peer: int, r: Receive) -> BaseException:
        """What a receive from ``peer`` that ended with ``e`` raises: in this group's numbering."""
        if isinstance(e, PeerFailureError):
            return self.comm.localize(e, op=self.op, seq=self.seq)
        if isinstance(e, CollectiveMismatchError):
            return self._mismatch(e, peer, r.src, r.out)  # type: ignore[arg-type]
        return e

    async def _recv(self, peer: int, key: tuple[Any, ...], out: memoryview | None) -> Delivery:
        r, fut = self._post(peer, key, out)
        return await self._received(peer, r, fut)

    def _mismatch(self, e: CollectiveMismatchError, peer: int, src: int, out: memoryview | None) -> CollectiveMismatchError:
        """Restate a mismatch in group ranks and, if we found it, tell the peer (it may wait on us)."""
        reported = e.found_by is not None
        if e.seq is None:  # size mismatch (router) or a peer's report: calls are in global ranks
            mine = self.sig if reported else f"{self.sig} with {out.nbytes if out is not None else '?'} bytes"
            e = self.comm.restate_mismatch(e, op=self.op, seq=self.seq, mine=mine)
        if not reported:
            glob = {self.comm.ranks[k]: v for k, v in e.calls.items() if 0 <= k < self.comm.size}
            self.comm.transport.report_mismatch(src, self.comm.gid, self.seq, str(e), glob)
        return e

    def recv_into(self, peer: int, key: tuple[Any, ...], out: memoryview) -> Awaitable[Any]:
        # A plain function returning _recv's coroutine: one frame fewer per message.
        if out.format != "B" or out.ndim != 1:
            out = out.cast("B")
        return self._recv(peer, key, out)

    async def recv_bytes(self, peer: int, key: tuple[Any, ...]) -> memoryview:
        d = await self._recv(peer, key, None)
        return d.payload if d.payload is not None else memoryview(b"")
