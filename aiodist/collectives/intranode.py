"""Collectives among ranks of one host, in each other's memory (the engine's state and rules).

When every member of a group runs on this host and reaches the others
through shared memory (see :mod:`aiodist.net.shmhost`), a large collective
does not move its data through messages. Rank r reduces block r of the array
straight from every member's array, in a fixed rank order (so every rank
ends with the same bits), in chunks that stay in cache, and writes the result
into its own array and into every member's array it can write. A member's
array is reached in place in one of two ways:

* it lives in shared memory (:func:`aiodist.empty`, :func:`aiodist.shared_array`):
  the others map it and use it like their own;
* it is an ordinary array and the kernel lets members copy from each other's
  memory (cross-memory attach, :mod:`aiodist.net.shmpeer`; the setup tests
  it): the others read it with one copy (and never write it: each rank writes
  its own array, and a rank whose array is not shared copies the others'
  reduced blocks out of their arrays).

Where neither works (a kernel or container that forbids cross-memory attach),
each rank *publishes* its data into its own staging segment (:data:`NBUF`
buffers of :data:`ROUND_BYTES`, which the other members have mapped), in
rounds, and the others reduce from there and copy the results out. The
algorithms are in :mod:`.intranode_ops`; this module holds the per-group state.

Setup: the first collective of a group that qualifies (:func:`engine_for`:
large enough, no algorithm forced, a real network) asks every member for its
host id, whether it may share memory and where its staging segment is
(gathered at group rank 0, which broadcasts the verdict); then every member
maps the others' segments, tries cross-memory attach on them, and says how it
went. Every rank takes the same decisions from the same messages, so all of
them run the engine, or all of them the usual algorithms.

Synchronisation is by messages: small frames on the group's ordinary
connections, keyed by the operation's sequence number, the round and the
phase (``("shm", round, phase)``), so a flag of another operation or round is
never mistaken for this one. An operation starts with a *hello* from every
member (its array is ready; where it is) and, in place, ends with a *done*
from every member (nobody touches anyone's array any more). In the staging
path a rank writes a buffer only before it sends the message that publishes
it, and reads a peer's buffer only after it received the peer's message; it
writes a buffer again only once every reader said (in a later message) that
it is done with it. Those messages go through a kernel socket, whose queue
lock orders the writer's stores (numpy's, non-temporal ones included, which
glibc fences) before the reader's loads on every architecture -- and a copy
by the kernel into or out of another process happens between two such
messages -- so nobody ever reads a half-written buffer as data. Failures,
timeouts, mismatches and cancellation are therefore those of the messages:
the same as for any collective (a SIGKILLed peer's socket ends at once; a
copy into a vanished process waits for the transport to name it).

Any error inside an engine operation leaves the engine *broken* on that
rank: its segments are unmapped and never used again (the peers' buffers may
be half-way through a round); the operations already queued behind it on
that engine raise GroupError. The group's next qualifying collective sets a
new engine up, with fresh segments, as if it were the first: a program that
catches a collective's timeout and goes on gets correct results, as over TCP.
The members of a failed operation all fail it (the one that gave up tells the
others), so they all start afresh with the same collective; a member that did
not (its operation had finished) runs the old engine's protocol against the
others' setup, and that collective fails too (by its timeout, since the two
wait for different messages), after which all of them start afresh.
A rank that gives up on an operation (a timeout, a cancellation, an error)
while its peers still reach its array in place gets its array back before
its call returns: it fences them off (:mod:`.intranode_fence`), so that none
of them writes into it any more, and one that read it after (its program may
have reused it) fails with PeerAbandonedError instead of returning that data.
Nothing ever writes into another process's own memory (only into shared
arrays), and staging buffers are never written again after a failure.
When the connection to a member ends (:data:`aiodist.net.shmseg.PEERS`), the
group's segments are unmapped at once, so a dead peer's memory is freed.

Engine operations of one group run one at a time, in call order.
"""

from __future__ import annotations

import asyncio
import enum
import os
import traceback
import weakref
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from ..channel import Channel
from ..comm.channel import GroupComm, OpChannel
from ..errors import GroupError
from ..net.shmhost import host_id, is_real_network, uses_shared_memory
from ..net import shmpeer
from ..net.shmseg import PEERS, Segment, SegmentRef, SharedMemoryError, still_held
from ..shared import locate
from .intranode_fence import CONTROL_BYTES, Fence, abandon, epoch_at

__all__ = [
    "ENGINE_MIN_BYTES", "ENGINE_MIN_BYTES_MANY", "PAIR_MIN_BYTES", "ROUND_BYTES", "NBUF", "CHUNK_BYTES",
    "GroupEngine", "engine_for", "engine_on",
]

ENGINE_MIN_BYTES = 2 << 20
"""Collectives of two ranks with fewer bytes (per rank's array) take the usual message path: one
exchange of messages costs less than the engine's two or three messages and the copies it saves
(each message a rank waits for is a wake-up, and on a busy machine a wait for the scheduler)."""
ENGINE_MIN_BYTES_MANY = 1 << 20
"""The same for three ranks or more (the usual algorithms then take several steps)."""
PAIR_MIN_BYTES = 1 << 20
"""all_to_all: a block of at least this many bytes is read by its receiver in place (see
:func:`aiodist.collectives.intranode_ops.exchange_in_place`); smaller ones travel as messages."""
ROUND_BYTES = 4 << 20
"""Bytes of each of a rank's staging buffers: a larger array is moved in rounds of this size."""
NBUF = 3
"""Staging buffers per rank, used in turn by successive rounds."""
CHUNK_BYTES = 256 * 1024
"""Reductions and copies go this many bytes at a time (the working set stays in cache)."""

_SHM = "shm"  # first element of every engine key (algorithms' keys are all-int tuples)
_SETUP = -1  # the setup's round number


class State(enum.Enum):
    UNKNOWN = "unknown"  # no qualifying collective yet
    ON = "on"
    OFF = "off"  # not every member is on this host (or allowed to share memory)
    BROKEN = "broken"  # an operation failed half-way: the buffers cannot be trusted


_ENGINES: weakref.WeakKeyDictionary[GroupComm, GroupEngine] = weakref.WeakKeyDictionary()


def engine_for(ch: Any, nbytes: int, algorithm: str | None) -> GroupEngine | None:
    """The engine to try for a collective of ``nbytes`` on ``ch`` (None: use the usual algorithms).

    Depends only on what every rank of a well-formed call agrees on (size,
    forced algorithm, the group) and on the network being real (not the
    simulator's), so every rank asks for the engine or none does.
    """
    if algorithm is not None or type(ch) is not OpChannel or ch.size < 2:
        return None
    if nbytes < (ENGINE_MIN_BYTES if ch.size == 2 else ENGINE_MIN_BYTES_MANY):
        return None
    comm = ch.comm
    eng = _ENGINES.get(comm)
    if eng is None or eng.state is State.BROKEN:  # (broken: its segments are gone; start afresh)
        if not is_real_network(comm.transport.network):
            return None
        eng = _ENGINES[comm] = GroupEngine(comm)
    return None if eng.state is State.OFF else eng


def release(comm: GroupComm) -> None:
    """``comm``'s group is destroyed (its operations are over): unmap its engine's segments now.

    The engine refers to its group, so the weak table alone kept both, and
    every destroyed group's mappings (36 MiB and 6 descriptors per rank at 3
    ranks), for the process's life.
    """
    eng = _ENGINES.pop(comm, None)
    if eng is not None:
        eng.state = State.OFF
        eng._close_segments()


def engine_on(ch: Any) -> GroupEngine | None:
    """The group's engine if it is on and its members read each other's memory directly; never sets it up.

    For operations whose sizes the ranks need not agree on (all_to_all): they
    may use an engine some earlier collective set up, and decide pair by pair.
    """
    if type(ch) is not OpChannel:
        return None
    eng = _ENGINES.get(ch.comm)
    return eng if eng is not None and eng.state is State.ON and eng.direct else None


def key(round_: int, phase: int) -> tuple[Any, ...]:
    """The key of an engine message of ``round_`` and ``phase`` (the channel prefixes the op's seq)."""
    return (_SHM, round_, phase)


class GroupEngine:
    """One rank's shared-memory state for one group (see the module doc)."""

    def __init__(self, comm: GroupComm) -> None:
        self.comm = comm
        self.name = comm.name
        self.state = State.UNKNOWN
        self.rank = comm.rank
        self.size = comm.size
        self.why_broken = ""
        self._staging: list[Segment | None] = []  # per group rank: its staging segment (ours included)
        self._attached: dict[SegmentRef, Segment] = {}  # peers' shared arrays mapped here
        self._tail: asyncio.Future[None] | None = None  # the last operation in line
        self._busy = False
        self._doomed = False  # a member's connection ended during an operation: close after it
        self._pids: list[int] = []  # per group rank: its process
        self._watched: set[int] = set()  # members whose connection's end we watch
        # Rounds, counted over all the group's engine operations (the same count on every member).
        self.rounds = 0  # rounds used so far
        self._read = -1  # this rank finished reading the peers' buffers of every round up to this one
        self._heard = [-1] * self.size  # per member: the same, as it last said in a message
        self._used = [-1] * NBUF  # per buffer of ours: the round last published into it
        self.direct = False  # members read each other's ordinary arrays (cross-memory attach)
        self._scratch: list[np.ndarray] = []

    def __repr__(self) -> str:
        return f"<GroupEngine {self.name} rank={self.rank}/{self.size} {self.state.value}>"

    # ------------------------------------------------------------------ running an operation

    async def run(self, ch: Channel, body: Any, *args: Any) -> bool:
        """Run ``body(self, ch, *args)`` as this group's next engine operation; False if the engine is off.

        Waits for the previous engine operation of the group (call order) and,
        on the group's first one, for the setup. Any error (a cancellation
        too) leaves the engine broken (see the module doc: the group's next
        collective sets up a new one) and propagates once the peers are fenced
        off this rank's arrays (:meth:`abandon`). A failed or cancelled setup
        unmaps what it mapped and leaves the engine to be set up again.
        """
        assert isinstance(ch, OpChannel)  # (engine_for gives engines to OpChannels only)
        prev, done = self._tail, asyncio.get_running_loop().create_future()
        self._tail = done
        try:
            if prev is not None and not prev.done():
                await _wait_quietly(prev)
            if self.state is State.UNKNOWN:
                try:
                    await self._setup(ch)
                except BaseException as e:
                    self._break(f"its setup failed: {type(e).__name__}")  # (the next collective starts afresh)
                    raise
            if self.state is State.OFF:
                return False
            if self.state is State.BROKEN:
                raise GroupError(
                    f"{ch.op} (seq {ch.seq}) of {self.name}: the group's shared memory is unusable after "
                    f"an earlier failure ({self.why_broken})"
                )
            self._busy = True
            try:
                await body(self, ch, *args)
            except BaseException as e:
                # The traceback must not keep the failed operation's views of the segments
                # (and so their memory) alive for as long as someone keeps the error.
                traceback.clear_frames(e.__traceback__)
                self._break(f"{ch.op} (seq {ch.seq}) failed: {type(e).__name__}")
                raise
            finally:
                self._busy = False
                if self._doomed:
                    self._break("the connection to a member ended")
            return True
        finally:
            done.set_result(None)
            if self._tail is done:
                self._tail = None

    # ------------------------------------------------------------------ buffers

    def staging(self, rank: int, round_: int, dtype: Any, offset: int, count: int) -> np.ndarray:
        """Elements ``offset .. offset+count`` of group rank ``rank``'s staging buffer of round ``round_``."""
        seg = self._staging[rank]
        assert seg is not None
        itemsize = np.dtype(dtype).itemsize
        return seg.array(dtype, (round_ % NBUF) * ROUND_BYTES + offset * itemsize, count)

    def describe(self, flat: np.ndarray) -> list[Any] | None:
        """How peers reach ``flat`` in place: ``["s", segment, offset, epoch]`` (shared memory), ``["p", pid,
        address, epoch]`` (directly, see :attr:`direct`), or None: only through the staging buffers.

        ``epoch``: this rank's, which its peers check (:mod:`.intranode_fence`)."""
        found = locate(flat)
        if found is not None:
            return ["s", found[0].pack(), found[1], self.epoch()]
        return ["p", os.getpid(), flat.ctypes.data, self.epoch()] if self.direct else None

    def epoch(self) -> int:
        """This rank's epoch: how many of its calls gave up while the engine ran (see :mod:`.intranode_fence`).

        -1 once its segments are unmapped (the engine broke): a peer that reaches its array then fails."""
        seg = self._staging[self.rank] if self._staging else None
        return -1 if seg is None or seg.closed else seg.load_word(epoch_at(seg))

    def fence(self, rank: int, epoch: int) -> Fence:
        """The fence of group rank ``rank``'s array, which it described with ``epoch``."""
        seg = self._staging[rank] if self._staging else None
        if seg is None or seg.closed:
            raise GroupError(f"{self.name}: the shared memory of rank {rank} is no longer mapped here")
        return Fence(rank, seg, epoch)

    def abandon(self) -> None:
        """This rank's call of an engine operation ends abnormally: fence its peers off its arrays.

        Blocks until no peer is in a copy from or into them (bounded: see
        :mod:`.intranode_fence`); afterwards a peer that still reaches them fails.
        """
        abandon(self._staging[self.rank] if self._staging else None)

    def peer_array(self, ref_raw: Any, offset: Any, dtype: Any, count: int) -> np.ndarray:
        """A peer's shared array (segment ``ref_raw``, byte ``offset``: see :meth:`describe`), mapped here."""
        ref = SegmentRef.unpack(ref_raw)
        if type(offset) is not int or offset < 0 or offset + count * np.dtype(dtype).itemsize > ref.size:
            raise SharedMemoryError(f"a shared array of {count} x {dtype} at {offset!r} does not fit {ref}")
        seg = self._attached.get(ref)
        if seg is None:
            self._drop_freed()
            seg = self._attached[ref] = Segment.attach(ref)
        return seg.array(dtype, offset, count)

    def _drop_freed(self) -> None:
        """Unmap the peers' arrays that their owners have freed since they were mapped here (the owner closed
        the descriptor: its memory lived on only through this mapping, a descriptor or two here, until the
        group's end). Done before each new mapping: a loop that allocates a new shared array per step keeps
        one generation mapped, not all of them."""
        for ref in [ref for ref in self._attached if not still_held(ref)]:
            self._attached.pop(ref).close()

    # ------------------------------------------------------------------ rounds and messages

    def begin(self) -> int:
        """An operation starts: the first round it may use (every earlier read of this rank is done)."""
        self._read = self.rounds - 1
        return self.rounds

    def end(self, first: int, count: int) -> None:
        """The operation that started at round ``first`` used ``count`` rounds and read all it had to."""
        self.rounds = first + count
        self._read = self.rounds - 1

    def clean(self, round_: int) -> bool:
        """Did every reader of the buffer that round ``round_`` uses say it finished with it?"""
        last = self._used[round_ % NBUF]
        return all(last <= self._heard[r] for r in range(self.size) if r != self.rank)

    def publishing(self, round_: int) -> int:
        """About to write my buffer of ``round_``: its index (GroupError if a reader may still be on it)."""
        if not self.clean(round_):
            raise GroupError(f"{self.name}: the shared memory engine broke its own rule (round {round_})")
        buf = round_ % NBUF
        self._used[buf] = round_
        return buf

    def read_through(self, round_: int) -> None:
        """This rank finished reading the peers' buffers of every round up to ``round_``."""
        self._read = max(self._read, round_)

    async def tell(self, ch: OpChannel, peers: Sequence[int], k: tuple[Any, ...], extra: Any = None) -> None:
        """Send the engine message ``k`` to ``peers``: ``extra`` and how far this rank has read."""
        payload = msgpack.packb([self._read, extra])
        for r in peers:
            await ch.send(r, k, payload)

    async def hear(self, ch: OpChannel, peers: Sequence[int], k: tuple[Any, ...]) -> dict[int, Any]:
        """Wait for the engine message ``k`` from each of ``peers``; their ``extra``."""
        out = {}
        for r in peers:
            raw = msgpack.unpackb(await ch.recv_bytes(r, k))
            if not isinstance(raw, list) or len(raw) != 2 or type(raw[0]) is not int:
                raise GroupError(f"{self.name}: a malformed shared memory message from rank {r}: {raw!r}")
            self._heard[r] = max(self._heard[r], raw[0])
            self.heard_from(r)
            out[r] = raw[1]
        return out

    # ------------------------------------------------------------------ setup and teardown

    async def _setup(self, ch: OpChannel) -> None:
        """Decide, with every member, whether this group runs on shared memory (see the module doc).

        Also whether each member may read and write the others' memory directly
        (:mod:`aiodist.net.shmpeer`): then ordinary arrays are reduced in place too.
        """
        p, me = self.size, self.rank
        allowed = uses_shared_memory(self.comm.transport.network)
        own: Segment | None = None
        if allowed:
            try:
                own = Segment.create(NBUF * ROUND_BYTES + CONTROL_BYTES, name="aiodist-staging")
            except SharedMemoryError:
                allowed = False
        where = 0 if own is None else own.array(np.uint8, 0, 1).ctypes.data  # our mapping's address, for the probe
        mine = [host_id(), allowed, None if own is None else own.ref.pack(), where]
        try:
            table = await _agree(ch, 0, mine, lambda rows: _verdict(rows))
        except BaseException:
            if own is not None:
                own.close()
            raise
        if table is None:
            if own is not None:
                own.close()
            self.state = State.OFF
            return
        self._staging = [own if r == me else None for r in range(p)]
        ok = True
        try:
            for r in range(p):
                if r != me:
                    self._staging[r] = Segment.attach(SegmentRef.unpack(table[r][0]))
        except SharedMemoryError:
            ok = False
        refs = [SegmentRef.unpack(row[0]) for row in table]
        direct = shmpeer.available() and all(
            shmpeer.probe(refs[r].pid, table[r][1], 8) for r in range(p) if r != me
        )
        agreed = await _agree(ch, 1, [ok, direct], lambda rows: [all(r[0] for r in rows), all(r[1] for r in rows)])
        if not agreed[0]:
            self._close_segments()
            self.state = State.OFF
            return
        self.state = State.ON
        self.direct = bool(agreed[1])
        self._pids = [ref.pid for ref in refs]

    def scratch(self, dtype: Any, which: int) -> np.ndarray:
        """Scratch buffer number ``which`` of :data:`CHUNK_BYTES`, as ``dtype`` (kept: fresh memory costs page faults)."""
        while len(self._scratch) <= which:
            self._scratch.append(np.empty(CHUNK_BYTES // 8 * 8, np.uint8))
        return self._scratch[which].view(dtype)

    def pid_of(self, rank: int) -> int:
        """The process of group rank ``rank`` (as it said at setup)."""
        return self._pids[rank]

    def heard_from(self, rank: int) -> None:
        """A message of group rank ``rank`` arrived (so a connection to it is open): watch that connection's end."""
        if rank not in self._watched and self._pids:
            self._watched.add(rank)
            PEERS.watch(self._pids[rank], self._member_gone)

    def _member_gone(self, pid: int) -> None:
        if self._busy:
            self._doomed = True  # the running operation fails soon (its messages do); then close
        else:
            self._break(f"the connection to a member (pid {pid}) ended")

    def _break(self, why: str) -> None:
        if self.state is State.ON or self.state is State.UNKNOWN:  # (OFF stays off; BROKEN keeps its first why)
            self.state = State.BROKEN
            self.why_broken = why
        self._close_segments()

    def _close_segments(self) -> None:
        self.abandon()  # (an operation that was running gave up; if none was, nobody is fenced off)
        segs = [s for s in self._staging if s is not None] + list(self._attached.values())
        self._staging = []
        self._attached = {}
        for seg in segs:
            seg.close()


async def _wait_quietly(fut: asyncio.Future[None]) -> None:
    """Wait for ``fut`` without cancelling it when this wait is cancelled."""
    await asyncio.shield(fut)


def _verdict(rows: list[Any]) -> list[Any] | None:
    """Group rank 0's decision from every member's [host id, allowed, staging ref, its address]:
    [ref, address] per member, or None (off)."""
    hosts = {row[0] for row in rows}
    if len(hosts) != 1 or not all(row[1] is True and row[2] is not None for row in rows):
        return None
    return [[row[2], row[3]] for row in rows]


async def _agree(ch: OpChannel, step: int, mine: Any, decide: Any) -> Any:
    """Gather every member's ``mine`` at group rank 0, which broadcasts ``decide(rows)``; return that."""
    p, me = ch.size, ch.rank
    if me == 0:
        rows = [mine] + [None] * (p - 1)
        for r in range(1, p):
            rows[r] = msgpack.unpackb(await ch.recv_bytes(r, key(_SETUP, 2 * step)))
        verdict = decide(rows)
        raw = msgpack.packb(verdict)
        for r in range(1, p):
            await ch.send(r, key(_SETUP, 2 * step + 1), raw)
        return verdict
    await ch.send(0, key(_SETUP, 2 * step), msgpack.packb(mine))
    return msgpack.unpackb(await ch.recv_bytes(0, key(_SETUP, 2 * step + 1)))
