"""The frames of a rank-to-rank link: every kind, every header key, one builder each.

This is the one place that names the wire keys of rank links (the store and
the simulator have their own protocols). A frame is a msgpack map (see
:mod:`aiodist.wire`); its kind is under :data:`KIND`. Schema, by kind::

    handshake (in this order; before it completes frames are limited to a few KiB)
      hello      dialer -> acceptor  {t, job, rank, world, to: the rank it means to reach, nonce?}
      challenge  acceptor -> dialer  {t, nonce?, proof?}
      answer     dialer -> acceptor  {t, proof?}
      welcome    acceptor -> dialer  {t}                      the link is up
      dup        acceptor -> dialer  {t}                      the other connection of the pair is kept
      refused    acceptor -> dialer  {t, reason?, condemned?, gone?} then closed (gone: it left the job)

    on a link that is up
      m     {t, g: group id, k: key (seq first), o: the call's signature}  + payload  (collectives)
      p     {t, g: group id, tag, n: per (group, destination, tag) number} + payload  (point to point)
      p     {t, g, tag, n, skip: 1}              number ``n`` will not come (its send gave up first); no payload
      hb    {t}                                  heartbeat
      bye   {t, how?, rank?, stopped?}           this rank leaves the job (its group was destroyed); after a
                                                 failure: the first one it learned of (``how``; whose: ``rank``);
                                                 ``stopped``: its launcher stopped it for that failure
      fail  {t, rank, how, root?}                rank ``rank`` failed (``how``); may name the receiver;
                                                 ``root``: [rank, how] of the failure it left after, if known
      x     {t, g, s: seq, m: message, c: [[global rank, call], ...]}   collective mismatch report
      xf    {t, g, s: seq, m: message}          the sender's call at ``seq`` failed there (it raised: ``m``)

``nonce``/``proof`` are :mod:`aiodist.auth`'s fields (absent when
authentication is off). A refusal before the dialer has authenticated says
only what the dialer itself sent (its job, rank or world size), never this
rank's; ``condemned`` (the receiver was declared failed) comes only after.
"""

from __future__ import annotations

from typing import Any, Final

from ..auth import NONCE, PROOF
from ..shown import MAX_TEXT as MAX_TEXT, brief as brief, shown as shown  # (re-exported: F.shown)

Header = dict[str, Any]

KIND: Final = "t"

# kinds
HELLO: Final = "hello"
CHALLENGE: Final = "challenge"
ANSWER: Final = "answer"
WELCOME: Final = "welcome"
DUP: Final = "dup"
REFUSED: Final = "refused"
MESSAGE: Final = "m"
P2P: Final = "p"
HEARTBEAT: Final = "hb"
BYE: Final = "bye"
FAIL: Final = "fail"
MISMATCH: Final = "x"
CALL_FAILED: Final = "xf"

# handshake keys
JOB: Final = "job"
RANK: Final = "rank"
TO: Final = "to"
WORLD: Final = "world"
REASON: Final = "reason"
CONDEMNED: Final = "condemned"
GONE: Final = "gone"
AUTH_NONCE: Final = NONCE
AUTH_PROOF: Final = PROOF

# message keys
GROUP: Final = "g"
KEY: Final = "k"
SIG: Final = "o"
TAG: Final = "tag"
NUMBER: Final = "n"
SKIP: Final = "skip"

# failure and mismatch reports
HOW: Final = "how"
STOPPED: Final = "stopped"
ROOT: Final = "root"
SEQ: Final = "s"
TEXT: Final = "m"
CALLS: Final = "c"
FOUND: Final = "fb"  # the rank that found a mismatch (whose call failed), when another rank relays its report
VOID: Final = "v"  # a call-failed report voids the operation: messages already here from anyone do not count
VOIDS: Final = "vo"  # a failure notice: [[group, seq], ...] its failure failed at the sender (void where it comes)

MAX_HANDSHAKE_FRAME: Final = 8 * 1024
"""Bytes a frame may have before the link has authenticated (a hello is ~200)."""


def message(group: Any, key: Any, sig: str | None) -> Header:
    """A collective's message (keyed: the first part of ``key`` is the operation's sequence number)."""
    return {KIND: MESSAGE, GROUP: group, KEY: key, SIG: sig}


def p2p(group: Any, tag: int, number: int) -> Header:
    """A point-to-point message."""
    return {KIND: P2P, GROUP: group, TAG: tag, NUMBER: number}


def p2p_skip(group: Any, tag: int, number: int) -> Header:
    """Point-to-point message ``number`` of (group, tag) will not come: its send gave up, perhaps before it was queued.

    Sent on the same link after the send ended, so a receiver that got the
    message itself got it first (and ignores this); otherwise it stops waiting
    for that number, and the messages after it are delivered.
    """
    return {KIND: P2P, GROUP: group, TAG: tag, NUMBER: number, SKIP: 1}


def hello(job: str, rank: int, world: int, to: int, auth: Header) -> Header:
    return {KIND: HELLO, JOB: job, RANK: rank, WORLD: world, TO: to, **auth}


def challenge(auth: Header) -> Header:
    return {KIND: CHALLENGE, **auth}


def answer(auth: Header) -> Header:
    return {KIND: ANSWER, **auth}


def refused(reason: str | None = None, condemned: str | None = None, *, gone: bool = False) -> Header:
    h: Header = {KIND: REFUSED}
    if reason is not None:
        h[REASON] = reason
    if condemned is not None:
        h[CONDEMNED] = condemned
    if gone:
        h[GONE] = 1
    return h


def fail(rank: int, how: str, root: tuple[int, str] | None = None) -> Header:
    """Rank ``rank`` failed (sent to the others, and to ``rank`` itself so it can blame itself); ``root``: the
    rank whose failure it left after and how, when the sender knows (so that the others name the root cause)."""
    if root is None:
        return {KIND: FAIL, RANK: rank, HOW: how}
    return {KIND: FAIL, RANK: rank, HOW: how, ROOT: [root[0], root[1]]}


def mismatch(group: Any, seq: int, text: str, calls: dict[int, Any], found: int | None = None) -> Header:
    """A mismatch report; ``found``: the rank that found it, when the sender relays that rank's report (``text``)."""
    h: Header = {KIND: MISMATCH, GROUP: group, SEQ: seq, TEXT: text, CALLS: [[int(k), str(v)] for k, v in calls.items()]}
    if found is not None:
        h[FOUND] = found
    return h


def call_failed(group: Any, seq: int, text: str, *, void: bool = False, found: int | None = None) -> Header:
    """A failed call's report; ``found``: the rank whose call failed, when the sender relays its report."""
    h: Header = {KIND: CALL_FAILED, GROUP: group, SEQ: seq, TEXT: text}
    if void:
        h[VOID] = True
    if found is not None:
        h[FOUND] = found
    return h


def welcome() -> Header:
    return {KIND: WELCOME}


def dup() -> Header:
    return {KIND: DUP}


def bye(after: tuple[int | None, str] | None = None, *, stopped: bool = False) -> Header:
    """This rank leaves; ``after``: (rank or None, how) of the failure it learned of first, if it leaves after one;
    ``stopped``: its launcher stopped it because of that failure."""
    if after is None:
        return {KIND: BYE}
    h: Header = {KIND: BYE, HOW: after[1]}
    if after[0] is not None:
        h[RANK] = after[0]
    if stopped:
        h[STOPPED] = True
    return h


def heartbeat() -> Header:
    return {KIND: HEARTBEAT}


# ---------------------------------------------------------------------- a peer's fields, looked at safely

def malformed(h: Header) -> str | None:
    """What makes a peer's frame unusable before anything looks it up: a group id, key or seq of a type
    no frame has (the frames of this module hold ints and strings there), or None."""
    g = h.get(GROUP)
    if g is not None and type(g) is not int and type(g) is not str:
        return f"a group id of type {type(g).__name__} ({brief(g)})"
    k = h.get(KEY)
    if k is not None and not _keyable(k, 0):
        return f"a message key no message has ({brief(k)})"
    s = h.get(SEQ)
    if s is not None and type(s) is not int:
        return f"a sequence number of type {type(s).__name__} ({brief(s)})"
    return None


def _keyable(k: Any, depth: int) -> bool:
    """Whether a key (lists and tuples of ints and strings, nested a little) can be looked up."""
    t = type(k)
    if t is list or t is tuple:
        try:
            hash(tuple(k))  # the common case: flat
            return True
        except TypeError:
            return depth < 4 and all(_keyable(x, depth + 1) for x in k)
    try:
        hash(k)
    except TypeError:
        return False
    return True
