"""The handshake of one rank-to-rank connection, for each side (pure: headers in, headers out).

A connection carries four frames before it is a link (see :mod:`.frames`)::

    dialer                                             acceptor
      hello {job, rank, world, to, nonce}      ->
                                               <-      challenge {nonce, proof}   (or refused {reason})
      (checks the acceptor's proof)
      answer {proof}                           ->
                                                       (checks the dialer's proof; then the
                                                        transport decides: welcome, dup or refused)
                                               <-      welcome | dup | refused {reason, condemned}

The proofs are :mod:`aiodist.auth`'s, bound to the listening address as the
dialer found it in the store (the acceptor binds the address it published),
the job id and both ranks: a process that rewrote a rank's address in the
store and relays frames to the real rank fails, and so does anything that is
not this job. With authentication off on both sides (``secret=None``) the
same frames flow without nonces and proofs; with it off on one side only, the
handshake fails.

What a refusal may say: before the dialer has proved the secret, only what
the dialer itself sent (its job id, rank, world size) and never anything of
the acceptor's; after it, the acceptor's view of the pair (e.g. that it
considers the dialer failed, ``condemned``).

States of either side (:class:`Phase`)::

    dialer:   start --hello()--> hello_sent --on_reply(challenge)--> authenticating --on_verdict()--> done
                                     \\--on_reply(refused)--> done          (any error) --> failed
    acceptor: start --on_hello()--> authenticating --on_answer()--> done
                         \\--(bad hello: refused)--> failed
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NoReturn

from ..auth import Acceptor, AuthenticationError, Dialer, binding
from ..errors import ProtocolError
from . import frames as F

PURPOSE = "peer"


class Phase(enum.Enum):
    START = "start"
    HELLO_SENT = "hello_sent"
    AUTHENTICATING = "authenticating"
    DONE = "done"
    FAILED = "failed"


class Verdict(enum.Enum):
    WELCOME = "welcome"
    DUP = "dup"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a dial ended, as the acceptor said it: welcome, dup, or refused (``reason``, ``condemned``; ``gone``:
    it left the job)."""

    verdict: Verdict
    reason: str | None = None
    condemned: str | None = None
    gone: bool = False


def link_binding(address: bytes, job: str, dialer: int, acceptor: int) -> bytes:
    """What both ends of a link know independently, bound into its proofs."""
    return binding(address, job, dialer, acceptor)


class DialHandshake:
    """The dialing side: ``hello()``, then ``on_reply(frame)``, then ``on_verdict(frame)``.

    Raises :class:`~aiodist.auth.AuthenticationError` when the acceptor does
    not prove the secret (or refuses our proof), and
    :class:`~aiodist.errors.ProtocolError` for a frame out of place.
    """

    def __init__(
        self,
        secret: bytes | None,
        *,
        job: str,
        rank: int,
        world: int,
        peer_rank: int,
        address: bytes,
        nonce: bytes,
        peer: str | None = None,
    ) -> None:
        self.job, self.rank, self.world, self.peer_rank = job, rank, world, peer_rank
        self.phase = Phase.START
        self._auth = Dialer(
            secret, purpose=PURPOSE, binding=link_binding(address, job, rank, peer_rank), nonce=nonce, peer=peer
        )

    def __repr__(self) -> str:
        return f"<DialHandshake {self.rank}->{self.peer_rank} {self.phase.value}>"

    def hello(self) -> F.Header:
        self._expect(Phase.START, "hello")
        self.phase = Phase.HELLO_SENT
        return F.hello(self.job, self.rank, self.world, self.peer_rank, self._auth.hello())

    def on_reply(self, h: F.Header) -> F.Header | Outcome:
        """The acceptor's reply to our hello: the answer to send, or its refusal."""
        self._expect(Phase.HELLO_SENT, "a reply to the hello")
        kind = h.get(F.KIND)
        if kind == F.REFUSED:
            self.phase = Phase.DONE
            reason = h.get(F.REASON)
            if reason is None:  # it did not like our hello's authentication, and says no more
                self.phase = Phase.FAILED
                raise self._auth.refused()
            # (any ``condemned`` is not believed yet; the reason is shown as what it is, unproven)
            return Outcome(Verdict.REFUSED, f"{F.shown(reason)} (said before it proved the job's secret)")
        if kind != F.CHALLENGE:
            return self._broken(f"expected a challenge, got {F.brief(kind)}")
        try:
            fields = self._auth.answer(h)
        except AuthenticationError:
            self.phase = Phase.FAILED
            raise
        self.phase = Phase.AUTHENTICATING
        return F.answer(fields)

    def on_verdict(self, h: F.Header) -> Outcome:
        """The acceptor's last frame: it authenticated us (welcome or dup), or refused."""
        self._expect(Phase.AUTHENTICATING, "a verdict")
        kind = h.get(F.KIND)
        if kind == F.WELCOME:
            self.phase = Phase.DONE
            return Outcome(Verdict.WELCOME)
        if kind == F.DUP:
            self.phase = Phase.DONE
            return Outcome(Verdict.DUP)
        if kind == F.REFUSED:
            reason = h.get(F.REASON)
            if reason is None:
                self.phase = Phase.FAILED
                raise self._auth.refused()
            self.phase = Phase.DONE
            condemned = h.get(F.CONDEMNED)
            return Outcome(Verdict.REFUSED, F.shown(reason), None if condemned is None else F.shown(condemned),
                           gone=bool(h.get(F.GONE)))
        return self._broken(f"expected welcome, dup or refused, got {F.brief(kind)}")

    def _expect(self, phase: Phase, what: str) -> None:
        if self.phase is not phase:
            raise RuntimeError(f"{what} in phase {self.phase.value}")

    def _broken(self, why: str) -> NoReturn:
        self.phase = Phase.FAILED
        raise ProtocolError(f"rank {self.peer_rank} broke the handshake: {why}")


class AcceptHandshake:
    """The accepting side: ``on_hello(frame)`` (the reply to send), then ``on_answer(frame)``.

    ``on_hello`` returns a refusal (and sets :attr:`problem`, for this side's
    log) for a hello this rank cannot take; ``on_answer`` returns the
    authenticated dialer's rank or raises
    :class:`~aiodist.auth.AuthenticationError`.
    """

    def __init__(self, secret: bytes | None, *, job: str, rank: int, world: int, address: bytes, nonce: bytes) -> None:
        self.secret, self.job, self.rank, self.world, self.address, self.nonce = secret, job, rank, world, address, nonce
        self.phase = Phase.START
        self.peer_rank: int | None = None
        self.problem: str | None = None
        self._auth: Acceptor | None = None

    def __repr__(self) -> str:
        return f"<AcceptHandshake {self.peer_rank}->{self.rank} {self.phase.value}>"

    def on_hello(self, h: F.Header) -> F.Header:
        if self.phase is not Phase.START:
            raise RuntimeError(f"a hello in phase {self.phase.value}")
        problem = self._check(h)
        if problem is None:
            rank = h[F.RANK]
            self._auth = Acceptor(
                self.secret,
                purpose=PURPOSE,
                binding=link_binding(self.address, self.job, rank, self.rank),
                nonce=self.nonce,
                peer=f"rank {rank}",
            )
            try:
                fields = self._auth.challenge(h)
            except AuthenticationError as e:
                problem = str(e)
                self.problem = problem
                self.phase = Phase.FAILED
                return F.refused()  # says nothing
            self.peer_rank = rank
            self.phase = Phase.AUTHENTICATING
            return F.challenge(fields)
        self.problem = problem
        self.phase = Phase.FAILED
        return F.refused(problem)

    def on_answer(self, h: F.Header) -> int:
        if self.phase is not Phase.AUTHENTICATING:
            raise RuntimeError(f"an answer in phase {self.phase.value}")
        assert self._auth is not None and self.peer_rank is not None
        if h.get(F.KIND) != F.ANSWER:
            self.phase = Phase.FAILED
            raise AuthenticationError(f"rank {self.peer_rank} sent {F.brief(h.get(F.KIND))} instead of its proof",
                                      reason="bad_proof", peer=f"rank {self.peer_rank}")
        try:
            self._auth.verify(h)
        except AuthenticationError:
            self.phase = Phase.FAILED
            raise
        self.phase = Phase.DONE
        return self.peer_rank

    def _check(self, h: F.Header) -> str | None:
        """Why this rank cannot take a hello (in terms of what the dialer sent), or None."""
        if h.get(F.KIND) != F.HELLO:
            return f"expected a hello frame, got {F.brief(h.get(F.KIND))}"
        job, rank, world = h.get(F.JOB), h.get(F.RANK), h.get(F.WORLD)
        if job != self.job:
            return f"wrong job: the connection is for job {F.brief(job)}, not this rank's (a rank of an earlier or another job?)"
        if world != self.world:
            return f"world size {F.brief(world)} differs from this job's"
        if type(rank) is not int or not 0 <= rank < self.world:
            return f"rank {F.brief(rank)} is out of range for world size {world}"
        if rank == self.rank:
            return f"rank {rank} connected to itself (two processes with rank {rank}?)"
        to = h.get(F.TO)
        if to != self.rank:  # (a stale address: another rank listens there now)
            return f"this is not rank {F.brief(to)} (its address in the store is stale?)"
        return None
