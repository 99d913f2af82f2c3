"""The life cycle of one rank's links to the other ranks: a pure state machine.

:class:`Links` takes the events of the rank's links as method calls (a send
needs a link, our dial ended so, a peer's dial authenticated, a connection
broke, a peer said bye, another rank reports a failure, a peer was silent too
long...) and returns :class:`Action` lists for the driver
(:class:`~aiodist.comm.peers.PeerLinks`) to carry out in order: dial,
start or cancel the dial deferral, install a connection, send a control frame,
close a connection, wake the sends waiting for a link, fail the receives from
a rank, break the groups containing a rank, start or stop watching a peer's
heartbeats, log. No I/O, no clock, no asyncio: connections are opaque tokens.

One link per peer rank (:class:`Link`, state :class:`LinkState`)::

               need (we are the higher rank)
        IDLE ---------------------------------> DEFERRED
        |  ^                                       |  deferral expired
        |  | dup / lookup failed                   v        (dup, when wanted: DEFERRED again)
        |  +-------------------------------------- DIALING ---refused------------> REFUSED
        |   need (we are the lower rank),          |   |
        +-- expect (a receive from a higher rank) -+   +--unreachable, not authentic--+
                                                   |                                  v
                               welcome, accepted   |                                FAILED
        IDLE, DEFERRED --------- accepted -------> READY --lost, silent, bad input-----^
                                                   |
                                                   +--bye--> LEFT

    besides:  reported by another rank:  IDLE, DEFERRED, DIALING, READY --> FAILED (the connection is kept)
              refused, "you are condemned":  DIALING --> IDLE (and this rank is condemned)
              a speculative dial that fails or is refused:  DIALING --> IDLE (no verdict), but --> FAILED
                  when nothing listens at the peer's address any more, or the store went as its host
                  left after that peer's failure (a receive from it would wait for its timeout)
              accepted while DIALING, we being the lower rank:  answered dup (our dial is the one kept)
              close() / abort():  every state that is not over --> CLOSED

Terminal states: LEFT (the peer left cleanly: only receives still expecting it
fail), FAILED (``how`` says why; its groups break and the other ranks are
told), REFUSED (the peer refused our connection: ``reason``), CLOSED (this
rank closed). The two ranks of a pair may dial each other at the same time:
the acceptor keeps the connection dialed by the lower rank and answers the
other ``dup``, so exactly one connection per pair survives.

This rank itself can be *condemned* (:attr:`Links.condemned`): another rank
reports that it was declared failed, or a peer refuses our connection because
it considers us failed. Its groups then break blaming this rank, and every
error it raises says so (:class:`~aiodist.errors.EvictedError`). A failure
that is only reported to us keeps the connection to the accused rank and tells
it, and a rank silent for too long is told before it is hung up on, so that a
rank that was stopped or cut off and comes back learns that *it* was declared
failed, instead of blaming whoever hung up on it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import EvictedError, GroupError, PeerFailureError, PeerRefusedError
from . import frames as F
from .actions import (
    Action,
    Actions,
    BreakGroups,
    CancelTimer,
    Close,
    Dial,
    FailReceives,
    Install,
    Log,
    NameFailedOps,
    Release,
    Send,
    StartTimer,
    Unwatch,
    Wake,
    Watch,
)
from .handshake import Outcome, Verdict

AUTH_FAILED = "authentication failed"
"""How a link fails whose other end did not prove the job's secret: this rank's finding (an impostor at the
peer's address, or a wrong secret), not a failure of that peer."""


class LinkState(enum.Enum):
    IDLE = "idle"  # no connection, and nobody of ours dialing
    DEFERRED = "deferred"  # a send waits; we are the higher rank: the lower one may dial us first
    DIALING = "dialing"  # our dial is under way (address lookup, connect, handshake)
    READY = "ready"  # a connection is installed
    LEFT = "left"  # the peer said bye
    FAILED = "failed"  # declared failed (by us, or reported by another rank)
    REFUSED = "refused"  # the peer refused our connection
    CLOSED = "closed"  # this rank closed its links


_IDLE, _DEFERRED, _DIALING, _READY = LinkState.IDLE, LinkState.DEFERRED, LinkState.DIALING, LinkState.READY
_LEFT, _FAILED, _REFUSED, _CLOSED = LinkState.LEFT, LinkState.FAILED, LinkState.REFUSED, LinkState.CLOSED
TERMINAL = (_LEFT, _FAILED, _REFUSED, _CLOSED)  # (a tuple: membership by identity, no Enum.__hash__ in Python)

LEFT_CLEANLY = "bye"
"""What a rank that left without a failure notes in the store as its culprit (see ``dial_failed``)."""
LEFT_HOW = "left the job (its process group was destroyed)"

DUP_WAIT = 1.0
"""Seconds a rank answered ``dup`` (the lower rank's own connection is on its way) waits for that connection
before it dials again, when a send or receive needs the link."""

MAX_HOW = F.MAX_TEXT
"""Characters of a failure's description kept from a peer's ``bye`` (what it left after) or ``fail`` notice."""


class Link:
    """What this rank knows of its link to one other rank.

    ``conn``: the installed connection (READY; also kept by a FAILED link whose
    failure was only reported, to tell the accused). ``wanted``: sends wait for
    the link. ``speculative``: our dial was started by a receive alone (a
    failure of it blames nobody unless a send came to need it meanwhile).
    ``how``: why it ended; ``reason``: the peer's refusal; ``rejected``: the
    bad input it sent (nothing it says counts since); ``after_eviction``: it
    failed after this rank was declared failed (a consequence: errors about
    it blame this rank). ``culprit``/``cause``: the peer left after the failure
    of that rank (itself, for its own error), which failed so, as it said (in
    its ``bye``, or its note in the store); None when it named no other rank.
    """

    __slots__ = ("rank", "state", "conn", "wanted", "speculative", "how", "reason", "rejected", "after_eviction",
                 "culprit", "cause")

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state = _IDLE
        self.conn: Any = None
        self.wanted = False
        self.speculative = False
        self.how: str | None = None
        self.reason: str | None = None
        self.rejected: str | None = None
        self.after_eviction = False
        self.culprit: int | None = None
        self.cause: str | None = None

    def __repr__(self) -> str:
        extra = f" ({self.how})" if self.how else ""
        return f"<Link {self.rank} {self.state.value}{extra}>"


# --------------------------------------------------------------------------- the machine


def _text(how: Any) -> str:
    """A failure's description as a peer (or the store) gave it (unchecked): at most :data:`MAX_HOW` characters
    of a string; any other value shown as text, bounded whatever its nesting ("unknown" for None)."""
    if type(how) is str:
        return how[:MAX_HOW]
    return "unknown" if how is None else F.shown(how, MAX_HOW)


class Links:
    """The links of rank ``rank`` of a ``world_size``-rank job (see the module doc)."""

    __slots__ = ("rank", "world_size", "dial_defer", "condemned", "closing", "first_failure", "stopped", "_links",
                 "_nfailed")

    def __init__(self, rank: int, world_size: int, *, dial_defer: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.dial_defer = dial_defer
        self.condemned: str | None = None  # why the other ranks consider this rank failed, if they do
        self.closing = False  # close() or abort() ran: no new links, failures are quiet
        # (rank, how) of the first failure this rank learned of: a peer's, or one a peer left after
        # (rank None: no rank to blame, e.g. the store went away). Said with ``bye``, so that ranks
        # that only see this one leave can name the root cause.
        self.first_failure: tuple[int | None, str] | None = None
        self.stopped = False  # this rank's launcher stops it because of ``first_failure`` (see stopped_for)
        self._links: dict[int, Link] = {}
        self._nfailed = 0  # links in state FAILED (which a new link must hear of: none, usually)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for link in self._links.values():
            counts[link.state.value] = counts.get(link.state.value, 0) + 1
        states = " ".join(f"{k}={v}" for k, v in counts.items())
        me = " condemned" if self.condemned is not None else " closing" if self.closing else ""
        return f"<Links rank={self.rank}/{self.world_size}{me} {states}>".replace("  ", " ")

    def __iter__(self) -> Iterator[Link]:
        return iter(list(self._links.values()))

    def get(self, rank: int) -> Link | None:
        return self._links.get(rank)

    def link(self, rank: int) -> Link:
        """The link to ``rank`` (made IDLE on first use); ValueError for a rank outside the job or this rank."""
        link = self._links.get(rank)
        if link is None:
            if not 0 <= rank < self.world_size or rank == self.rank:
                raise ValueError(f"no link from rank {self.rank} to rank {rank} (world size {self.world_size})")
            link = self._links[rank] = Link(rank)
        return link

    # ------------------------------------------------------------------ queries

    def failed(self) -> list[int]:
        """Ranks considered failed (not those that left cleanly); this rank too if it was condemned."""
        out = [r for r, link in self._links.items() if link.state is _FAILED or link.state is _REFUSED]
        if self.condemned is not None:
            out.append(self.rank)
        return sorted(out)

    def failures(self) -> list[tuple[int, str]]:
        """(rank, how) of the failed ranks, in rank order."""
        return sorted(
            (r, link.how or "unknown")
            for r, link in self._links.items()
            if link.state is _FAILED or link.state is _REFUSED
        )

    def peer_error(self, rank: int) -> PeerFailureError:
        """A fresh error for an operation that involves ``rank`` (which failed, or this rank was condemned)."""
        link = self._links.get(rank)
        if rank == self.rank or (link is not None and link.after_eviction):
            how = f"declared failed by its peers ({self.condemned or 'why is unknown'})"
            return EvictedError(f"this rank ({self.rank}) was {how}", rank=self.rank, how=how)
        how = link.how if link is not None and link.how else "unknown"
        if link is not None and link.state is _REFUSED:
            reason = link.reason or ""
            return PeerRefusedError(
                f"rank {rank} refused the connection of rank {self.rank}: {reason}", rank=rank, how=how, reason=reason
            )
        culprit, cause = (link.culprit, link.cause) if link is not None else (None, None)
        return PeerFailureError(f"rank {rank} failed: {how}", rank=rank, how=how, culprit=culprit, cause=cause)

    # ------------------------------------------------------------------ wanting a link

    def need(self, rank: int) -> Actions:
        """A send waits for the link to ``rank``: dial, or (as the higher rank) give the lower one a moment."""
        link = self.link(rank)
        if link.state is _READY or link.state in TERMINAL or self.closing:
            return []
        link.wanted = True
        if link.state is _IDLE:
            if self.rank > rank and self.dial_defer > 0:
                link.state = _DEFERRED
                return [StartTimer(rank, self.dial_defer)]
            return self._dial(link, speculative=False)
        if link.state is _DIALING:
            link.speculative = False  # its failure now blames the peer
        return []

    def expect(self, rank: int) -> Actions:
        """A receive from ``rank`` waits: if nothing is under way, dial it now (speculatively).

        A higher ``rank`` defers its own dial to us and may be waiting for our connection right
        now; a lower one is dialed so only after a while without its connection (see
        :meth:`~aiodist.comm.peers.PeerLinks.expect_later`).
        """
        link = self.link(rank)
        if link.state is not _IDLE or self.closing:
            return []
        return self._dial(link, speculative=True)

    def deferral_expired(self, rank: int) -> Actions:
        """The lower rank did not connect to us in time: dial it ourselves."""
        link = self._links.get(rank)
        if link is None or link.state is not _DEFERRED:
            return []
        return self._dial(link, speculative=False)

    def _dial(self, link: Link, *, speculative: bool) -> Actions:
        link.state = _DIALING
        link.speculative = speculative
        return [Dial(link.rank)]

    # ------------------------------------------------------------------ our dial's outcome

    def lookup_failed(self, rank: int, detail: str, *, culprit: int | None = None) -> Actions:
        """The store could not give ``rank``'s address: blame nobody (``rank=None``) unless the store said
        whose failure it went away after (``culprit``, a global rank); a later send may retry. When that
        failure was ``rank``'s own, ``rank`` fails (a receive from it, whose dial was only speculative,
        would otherwise wait for its timeout)."""
        link = self._links[rank]
        if link.state is not _DIALING:
            return []
        how = f"looking up the address of rank {rank} in the store failed ({detail})"
        if culprit is not None and not 0 <= culprit < self.world_size:
            culprit = None  # (what a server says is not trusted to be in range)
        if culprit == rank and rank != self.rank:  # the store went as its host left after ``rank`` failed
            return self._fail(link, how)
        link.state = _IDLE
        if not link.wanted:
            return []
        link.wanted = False
        if self.first_failure is None and not self.closing:
            self.first_failure = (culprit, how[:MAX_HOW])
        return [Wake(rank, PeerFailureError(how, rank=culprit, how=how))]

    def dial_failed(
        self, rank: int, detail: str, departed: tuple[Any, Any] | None = None, *,
        store_gone: tuple[Any, Any, Any] | None = None, refused: bool = False,
    ) -> Actions:
        """Connecting to ``rank``, or its handshake, failed (refused, timed out, broke): it is unreachable.

        ``departed``: what ``rank`` left in the store when it left the job: after a failure
        (the rank and how, unchecked), that is how it failed; ``(LEFT_CLEANLY, "")``: it left
        cleanly (as a ``bye`` says), also when the dial was only speculative: a receive from it
        can then never complete. ``store_gone``: no note could be read, the store having closed
        as its host left the job after a failure: ``(host, culprit, how)`` as the store said (unchecked).
        ``refused``: nothing listens at the address ``rank`` published any more (it crashed or
        aborted). Either, or a departure note, is a verdict even on a speculative dial (nobody sent to
        ``rank`` yet): a receive from it could otherwise only time out.
        """
        link = self._links[rank]
        if link.state is not _DIALING:
            return []
        if departed is not None and departed[0] == LEFT_CLEANLY:  # as its bye would have said
            return self._gone(link)
        if link.speculative and not link.wanted and not refused and departed is None:  # (no verdict on the peer)
            link.state = _IDLE
            return []
        if departed is not None:
            return self._fail(link, self._left_after(link, *departed))
        return self._fail(link, f"unreachable ({detail}){self._likely_cause(link, store_gone)}")

    def dial_unauthentic(self, rank: int, detail: str) -> Actions:
        """The other end did not prove the job's secret, or refused our proof: no link, and no gossip
        (the others may reach ``rank`` fine: an impostor, or this rank's own secret is wrong)."""
        link = self._links[rank]
        if link.state is not _DIALING:
            return []
        if link.speculative and not link.wanted:
            link.state = _IDLE
            return [Log(logging.WARNING, f"rank {self.rank}: connection to rank {rank}: {detail}")]
        first = self.first_failure
        acts = self._fail(link, f"{AUTH_FAILED}: {detail}", report=False)
        if first is None and self.first_failure is not None:
            self.first_failure = (self.rank, self.first_failure[1])  # this rank's finding, not ``rank``'s failure
        return acts

    def dialed(self, rank: int, conn: Any, outcome: Outcome) -> Actions:
        """Our dial's connection ``conn`` got ``outcome`` from the acceptor."""
        link = self._links[rank]
        verdict = outcome.verdict
        if verdict is Verdict.WELCOME:
            if link.state is _DIALING and not self.closing:
                return self._install(link, conn)
            if link.state is _FAILED and not self.closing:
                # Declared failed while we shook hands: say so before hanging up, or it would blame us.
                return [Send(conn, F.fail(rank, f"rank {self.rank} considers it failed ({link.how})")), Close(conn)]
            return [Close(conn)]
        if verdict is Verdict.DUP:  # the peer's own connection to us is the one kept (it is on its way)
            if link.state is not _DIALING:
                return [Close(conn)]
            if not link.wanted:
                link.state = _IDLE
                return [Close(conn)]
            # Wanted: if its connection does not come (its dial failed, and it may have declared us
            # failed), dial again: then it welcomes us, answers dup again, or refuses saying why.
            link.state = _DEFERRED
            return [Close(conn), StartTimer(rank, DUP_WAIT)]
        acts: Actions = [Close(conn)]
        if outcome.condemned is not None:  # the peer is fine; it considers *us* failed
            acts += self._condemn(f"rank {rank} refused our connection: {outcome.condemned}")
            if link.state is _DIALING:
                link.state = _IDLE
                if link.wanted:
                    link.wanted = False
                    acts.append(Wake(rank, self.peer_error(self.rank)))
            return acts
        if link.state is not _DIALING:
            return acts
        if outcome.gone:  # it left the job (after it proved itself): as its bye would have said
            return acts + self._gone(link)
        if link.speculative and not link.wanted:  # our sends, if any, will hear the refusal
            link.state = _IDLE
            return acts
        link.reason = outcome.reason or "no reason given"
        return acts + self._fail(link, f"refused our connection: {link.reason}", report=False, state=_REFUSED)

    # ------------------------------------------------------------------ the peer's dial

    def accepted(self, rank: int, conn: Any) -> Actions:
        """``rank`` proved itself on ``conn``, which it dialed: welcome it, answer ``dup``, or refuse.

        The first action sends the answer. The connection is the link if the
        state is READY with ``conn`` afterwards; otherwise it was closed.
        """
        link = self.link(rank)
        if self.closing or link.state is _CLOSED:
            return self._refuse(conn, rank, "this rank has left the job", gone=True)
        if link.state in TERMINAL:
            if (link.how or "").startswith(AUTH_FAILED):
                # It has just proved the secret: what failed our dial was not this rank (something on the
                # path, or at its address) and this rank's verdict on it is no verdict on the dialer.
                reason = f"rank {self.rank} could not authenticate rank {rank}'s address ({link.how})"
                return self._refuse(conn, rank, reason)
            reason = f"rank {rank} is already marked as failed here ({link.how})"
            condemned = None if link.state is _LEFT else f"rank {self.rank} considers it failed ({link.how})"
            return self._refuse(conn, rank, reason, condemned)
        if link.state is _READY or (link.state is _DIALING and self.rank < rank):
            return [Send(conn, F.dup()), Close(conn)]
        return [Send(conn, F.welcome()), *self._install(link, conn)]

    def _refuse(self, conn: Any, rank: int, reason: str, condemned: str | None = None, *, gone: bool = False) -> Actions:
        return [
            Log(logging.INFO, f"rank {self.rank}: refusing the connection of rank {rank}: {reason}"),
            Send(conn, F.refused(reason, condemned, gone=gone)),
            Close(conn),
        ]

    def _install(self, link: Link, conn: Any) -> Actions:
        acts: Actions = []
        if link.state is _DEFERRED:  # the peer's connection came first: no dial of ours
            acts.append(CancelTimer(link.rank))
        link.state = _READY
        link.conn = conn
        link.speculative = False
        acts += [Install(link.rank, conn), Watch(link.rank)]
        if link.wanted:
            link.wanted = False
            acts.append(Wake(link.rank))
        # A peer that connects after a failure must hear of it too (it may wait on us in vain), with the root
        # cause the failed rank left after, as a notice at the time said it (else the peer would blame it).
        if self._nfailed:
            for q in self._links.values():
                if q is not link and q.state is _FAILED:
                    root = None if q.culprit is None else (q.culprit, q.cause or "unknown")
                    acts.append(Send(conn, F.fail(q.rank, q.how or "unknown", root)))
        return acts

    # ------------------------------------------------------------------ a link ends

    def lost(self, rank: int, conn: Any, *, locally: bool = False, detail: str | None = None) -> Actions:
        """The connection ``conn`` of ``rank`` ended (``locally``: closed by this side; ``detail``: what broke
        it, an OS or TLS error, said in the failure: a reset, or data altered on the path under TLS)."""
        link = self._links.get(rank)
        if link is None or link.conn is not conn:
            return []
        if link.state is not _READY:
            link.conn = None
            return []
        lost = "connection lost" if detail is None else f"connection lost ({F.shown(detail, 200)})"
        if self.closing:
            if locally:
                return []
            return self._fail(link, lost)
        return self._fail(link, "connection closed" if locally else lost)

    def send_failed(self, rank: int) -> Actions:
        """A send to ``rank`` found its connection broken."""
        link = self._links.get(rank)
        if link is None or link.state is not _READY or self.closing:
            return []
        return self._fail(link, "connection lost")

    def bye(self, rank: int, after: Any = None, how: Any = None, stopped: Any = False) -> Actions:
        """``rank`` left the job cleanly: only what still expected something from it fails.

        ``after``/``how``: the failure it left after, as it said (unchecked input: a rank
        outside the job, or not an int, names nobody; ``how`` is cut to :data:`MAX_HOW`
        characters); ``stopped`` (True): its launcher stopped it because of that failure.
        """
        link = self._links.get(rank)
        if link is None or link.state is not _READY:
            return []
        link.state = _LEFT
        if after is None and how is None:
            link.how = LEFT_HOW
        else:
            link.how = self._left_after(link, after, how, stopped=stopped is True)
        return [Log(logging.DEBUG, f"rank {self.rank}: peer rank {rank} {link.how}"), Unwatch(rank), FailReceives(rank)]

    def _gone(self, link: Link) -> Actions:
        """``link``'s rank left the job cleanly before we had a link (we learned it dialing it): as its ``bye``."""
        link.state = _LEFT
        link.how = LEFT_HOW
        acts: Actions = [Log(logging.DEBUG, f"rank {self.rank}: peer rank {link.rank} {link.how}"), FailReceives(link.rank)]
        if link.wanted:
            link.wanted = False
            acts.append(Wake(link.rank, self.peer_error(link.rank)))
        return acts

    def _left_after(self, link: Link, after: Any, how: Any, *, stopped: bool = False) -> str:
        """How ``link``'s rank left, as it said: after the failure of rank ``after`` (``how``; ``after`` is
        the rank itself for its own error); notes the root cause, on the link and as this rank's first failure.

        Unchecked input: an ``after`` that is not a rank of the job names nobody; ``how`` is
        cut to :data:`MAX_HOW` characters. ``stopped``: its launcher stopped it for that failure.
        """
        rank = link.rank
        named = type(after) is int and 0 <= after < self.world_size
        root = after if named and after != rank else None
        cause = _text(how)
        if named and after != self.rank:  # (this rank's own failure is not a root cause it learned of)
            link.culprit, link.cause = after, cause
        if self.first_failure is None and not self.closing and not (named and after == self.rank):
            self.first_failure = (link.culprit, cause)
        lead = "stopped by its launcher after" if stopped else "left the job after"
        if root is None:
            return f"{lead}: {cause}"
        return f"{lead} {'this rank' if root == self.rank else f'rank {root}'} failed: {cause}"

    def _likely_cause(self, link: Link, store_gone: tuple[Any, Any, Any] | None) -> str:
        """What to add to ``link``'s "unreachable" when its rank's departure note could not be read because
        the store closed as its host left the job after rank ``culprit``'s failure: that failure, the likely
        reason ``link``'s rank is gone too, noted as the root cause (on the link and as this rank's first
        failure) as a departure note's would be. Empty when the store named no rank of the job."""
        if store_gone is None:
            return ""
        host, after, how = store_gone
        if not (type(after) is int and 0 <= after < self.world_size):
            return ""
        cause = _text(how)
        if after != self.rank:
            link.culprit, link.cause = after, cause
            if self.first_failure is None and not self.closing:
                self.first_failure = (after, cause)
        who = "this rank" if after == self.rank else f"rank {after}"
        by = f"its host, rank {host}," if type(host) is int else "its host"
        return f"; the store closed as {by} left the job after {who} failed: {cause}"

    def silent(self, rank: int, how: str) -> Actions:
        """The failure detector heard nothing from ``rank`` for too long: fail it, telling it first
        (a stopped rank that resumes then learns that it was declared failed)."""
        link = self._links.get(rank)
        if link is None or link.state is not _READY:
            return []
        return self._fail(link, how, tell_it=True)

    def reported(self, reporter: int, rank: Any, cause: Any, root: Any = None) -> Actions:
        """``reporter`` says ``rank`` failed (``cause``, cut to :data:`MAX_HOW` characters); about this rank:
        it was declared failed. ``root``: ``[rank, how]`` of the failure ``rank`` left after, as the reporter
        knew it (unchecked): noted as the root cause, as ``rank``'s own ``bye`` would have said it."""
        if type(rank) is not int or not 0 <= rank < self.world_size:
            return []
        cause = F.shown(cause, MAX_HOW)  # (unchecked input: it goes into errors, logs and on to every peer)
        if rank == self.rank:
            return self._condemn(f"rank {reporter} reports: {cause}")
        link = self.link(rank)
        if link.state not in TERMINAL:
            self._root_of(link, root)
        return self._fail(link, f"reported by rank {reporter}: {cause}", cause=cause, close=False)

    def _root_of(self, link: Link, root: Any) -> None:
        """A report's ``root`` (``[rank, how]``, unchecked): the failure ``link``'s rank left after, noted as the
        root cause (on the link, and as this rank's first failure). A malformed one, or one naming ``link``'s
        rank or this rank, is ignored (the report still counts)."""
        if type(root) is not list or len(root) != 2:
            return
        after, how = root
        if type(after) is not int or not 0 <= after < self.world_size or after in (self.rank, link.rank):
            return
        link.culprit, link.cause = after, F.shown(how, MAX_HOW) if type(how) is str else "unknown"
        if self.first_failure is None and not self.closing and self.condemned is None:
            self.first_failure = (after, link.cause)

    def bad_input(self, rank: int, why: str) -> Actions:
        """``rank`` sent something impossible: fail it, tell it why and close its connection (once)."""
        link = self._links[rank]
        if link.rejected is not None or link.conn is None:  # (only a connection brings input)
            return []
        link.rejected = why
        how = f"sent bad input: {why}"
        acts: Actions = [
            Log(logging.WARNING, f"rank {self.rank}: closing the connection of rank {rank}, which sent bad input: {why}")
        ]
        conn = link.conn
        if link.state not in TERMINAL:
            acts += self._fail(link, how, close=False, notify=False)
        link.conn = None
        return acts + [Send(conn, F.fail(rank, f"rank {self.rank} closed its connection: {how}")), Close(conn)]

    def _fail(
        self,
        link: Link,
        how: str,
        *,
        cause: str | None = None,
        close: bool = True,
        notify: bool = True,
        tell_it: bool = False,
        report: bool = True,
        state: LinkState = _FAILED,
    ) -> Actions:
        """Mark ``link`` failed (``how``); ``cause`` is what to pass on (default ``how``).

        ``close=False`` (a failure we only heard of) keeps the connection and,
        if ``notify``, tells the peer that it was declared failed, so that it
        blames itself rather than us if it is in fact alive; ``tell_it`` tells
        it before closing.
        """
        if link.state in TERMINAL:
            return []
        acts: Actions = []
        was = link.state
        if was is _DEFERRED:
            acts.append(CancelTimer(link.rank))
        link.state = state
        if state is _FAILED:
            self._nfailed += 1
        link.how = how
        link.after_eviction = self.condemned is not None
        if self.first_failure is None and not self.closing and self.condemned is None:
            self.first_failure = (link.rank, (cause or how)[:MAX_HOW])
        if not self.closing:
            acts.append(Log(logging.INFO, f"rank {self.rank}: peer rank {link.rank} failed: {how}"))
        if link.wanted:
            link.wanted = False
            acts.append(Wake(link.rank, self.peer_error(link.rank)))
        if was is _READY:
            acts.append(Unwatch(link.rank))
        conn = link.conn
        notice = F.fail(link.rank, cause or how, None if link.culprit is None else (link.culprit, link.cause or "unknown"))
        if not self.closing:  # (the operations this failure fails here: named in the notice)
            acts.append(NameFailedOps(link.rank, notice))
        if conn is not None:
            if close:
                link.conn = None
                if tell_it:
                    acts.append(Send(conn, notice))
                acts.append(Close(conn))
            else:
                acts.append(Release(conn))  # (a send waiting for a stopped peer would wait for its timeout)
                if notify:
                    acts.append(Send(conn, notice))
        acts.append(FailReceives(link.rank))
        if self.closing:
            return acts
        acts.append(BreakGroups(link.rank, how))
        if report and self.condemned is None:  # a rank the others declared failed is no witness
            for q in self._links.values():
                if q is not link and q.state is _READY:
                    acts.append(Send(q.conn, notice))
        return acts

    def failed_here(self, how: str) -> None:
        """This rank's program failed on its own (``how``): that is the first failure, unless one came before."""
        if self.first_failure is None and not self.closing:
            self.first_failure = (self.rank, how[:MAX_HOW])

    def stopped_for(self, culprit: int, how: str) -> bool:
        """This rank's launcher stops it because rank ``culprit`` failed (``how``): the ``bye`` of :meth:`close`
        says so (the launcher's root cause, in place of what this rank learned first), so that the peers
        name that failure, not this rank's departure. False (nothing changes): it already left, or
        ``culprit`` is not another rank of the job."""
        if self.closing or not 0 <= culprit < self.world_size or culprit == self.rank:
            return False
        self.first_failure = (culprit, how[:MAX_HOW])
        self.stopped = True
        return True

    def _condemn(self, how: str) -> Actions:
        """The other ranks consider this rank failed: break every group, blaming this rank."""
        if self.condemned is not None or self.closing:
            return []
        self.condemned = how
        return [Log(logging.INFO, f"rank {self.rank}: declared failed by its peers: {how}"), BreakGroups(self.rank, how)]

    # ------------------------------------------------------------------ this rank ends

    def close(self, *, bye: bool = True, answered: Sequence[Any] = ()) -> Actions:
        """This rank leaves: ``bye`` on every live link (not after :meth:`abort`), then close them all.

        ``answered``: the connections of this rank's dials that sent their proof and await the verdict (their
        owners close them): the acceptor may already hold one as its link, and would see it drop without a
        word, so they get the ``bye`` too (an acceptor that did not take the connection never reads it).
        """
        orderly = bye and not self.closing
        self.closing = True
        acts: Actions = []
        if orderly:
            farewell = F.bye(self.first_failure, stopped=self.stopped)
            acts += [Send(link.conn, farewell) for link in self._links.values() if link.state is _READY]
            acts += [Send(conn, farewell) for conn in answered]
        destroyed = GroupError("the process group was destroyed")
        for link in self._links.values():
            if link.state is _DEFERRED:
                acts.append(CancelTimer(link.rank))
            elif link.state is _READY:
                acts.append(Unwatch(link.rank))
            if link.state not in TERMINAL:
                link.state = _CLOSED
                link.how = "this rank closed its connections"
            if link.conn is not None:
                acts.append(Close(link.conn))
                link.conn = None
            if link.wanted:
                link.wanted = False
                acts.append(Wake(link.rank, destroyed))
        return acts

    def abort(self) -> Actions:
        """This rank drops every connection at once, without ``bye`` (what a crash looks like to the peers)."""
        return self.close(bye=False)
