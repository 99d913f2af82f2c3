"""A collective mismatch, a failed call, or a peer's failure reported by another rank: what it voids here (pure, on the router).

A rank that finds its call at sequence number ``seq`` of a group does not
match a peer's tells every member (a ``x`` frame, see :mod:`.frames`); each
member then fails its receives of that operation and of every later one of
the group, so nobody waits for a message that will never come.

A rank whose call at ``seq`` raised there (bad arguments, an object it could
not pickle) tells every member too (a ``xf`` frame): each fails its receives
of that operation only; the group stays usable.

A rank that declares a peer failed names, in the failure notice it sends
(to that peer first, and to every other peer), its operations of the peer's
groups that were waiting for a message: they fail where the notice comes
even where every message they need came, so a peer that was only paused and
resumes does not complete a collective its members failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import CollectiveMismatchError, PeerCallFailedError
from . import frames as F
from .router import Receive, Router


MAX_REPORT_TEXT = 4000
"""Characters kept of a report's text (each call it names: :data:`~.frames.MAX_TEXT`)."""


def _fault(router: Router, reporter: int, gid: object, seq: object, what: str) -> str | None:
    """Why a report (``what``) naming ``seq`` of group ``gid`` is impossible from ``reporter`` (None: it is possible)."""
    bad = router.vet(reporter, gid, seq)
    return None if bad is None else f"{what} with {bad}"


def _origin(router: Router, reporter: int, h: F.Header, gid: object, seq: object) -> int:
    """The rank a report is about: the one a relay names (``found``: the rank that found the mismatch, or whose
    call failed; a member of the group), else ``reporter`` itself."""
    found = h.get(F.FOUND, reporter)
    if type(found) is not int or found < 0 or found == reporter or router.vet(found, gid, seq) is not None:
        return reporter
    return found


def apply_report(router: Router, reporter: int, h: F.Header) -> str | None:
    """Void what rank ``reporter``'s mismatch report ``h`` names; the report's fault if it is bad input."""
    gid, seq = h.get(F.GROUP), h.get(F.SEQ)
    fault = _fault(router, reporter, gid, seq, "a mismatch report")
    if fault is not None or router.destroyed(gid):
        return fault  # (None for late news of a group destroyed here)
    try:
        calls = {int(k): F.shown(v) for k, v in h.get(F.CALLS, [])}
    except (TypeError, ValueError):
        return f"a malformed mismatch report (calls {F.shown(h.get(F.CALLS))})"
    message = F.shown(h.get(F.TEXT, "collective mismatch"), MAX_REPORT_TEXT)
    found = _origin(router, reporter, h, gid, seq)
    by = f"rank {found}" if found == reporter else f"rank {found} (relayed by rank {reporter})"

    def error() -> BaseException:
        # Global ranks in ``calls``; the group layer restates them.
        return CollectiveMismatchError(f"reported by {by}: {message}", calls=dict(calls), seq=None, found_by=found,
                                       finding=message)

    # The operation is void on every rank: its receives from every source fail now.
    router.fail_seq(gid, seq, None, lambda r: error())
    # ... and so are the group's later ones (the group is unusable after a mismatch): a rank
    # whose part of ``seq`` completed unawares (a broadcast root) stops waiting in the next one.
    router.fail_from(gid, seq, error)  # type: ignore[arg-type]  # (vet() checked it)
    return None


def apply_call_failed(router: Router, reporter: int, h: F.Header) -> CallFailure | str | None:
    """Void the operation that rank ``reporter``'s call-failed report ``h`` names (or relays: ``found``).

    Returns what was applied (a :class:`CallFailure`, for relaying), None for late news of a group
    destroyed here, or the report's fault if it is bad input (a str).
    """
    gid, seq = h.get(F.GROUP), h.get(F.SEQ)
    fault = _fault(router, reporter, gid, seq, "a call-failed report")
    if fault is not None or router.destroyed(gid):
        return fault  # (None for late news of a group destroyed here)
    text = F.shown(h.get(F.TEXT, "its call failed"), MAX_REPORT_TEXT)
    found = _origin(router, reporter, h, gid, seq)
    where = f"global rank {found}" if found == reporter else f"global rank {found} (relayed by rank {reporter})"

    def error(_: Receive) -> BaseException:
        return PeerCallFailedError(f"the call failed on {where}: {text}", global_rank=found, seq=seq)

    void = h.get(F.VOID) is True
    router.fail_seq(gid, seq, None, error, void=void)
    return CallFailure(gid, seq, found, text, void)  # type: ignore[arg-type]  # (vet() checked gid and seq)


def apply_voids(router: Router, reporter: int, accused: Any, voids: Any,
                error: Callable[[int], BaseException]) -> str | None:
    """Void the operations rank ``reporter`` failed on rank ``accused``'s failure, which its failure notice
    names (``voids``: ``[[group, seq], ...]``): they fail here too, even where every message they need came --
    on ``accused`` itself above all, resumed after a pause and finding their messages (``error(accused)``:
    the error they fail with). Returns the notice's fault if it is bad input (a str: not a list of
    ``[group id, seq]``). An operation of a group that is not this rank's (a subgroup it is not in, one
    not created here yet or destroyed), or of which ``reporter`` or ``accused`` is not a member, or out of
    the group's window, is skipped: the notice goes to every peer, whatever groups they share."""
    if type(accused) is not int or accused < 0:
        return None  # (the notice itself is ignored: see Links.reported)
    if type(voids) is not list:
        return f"a failure notice naming operations in a {type(voids).__name__} ({F.shown(voids)})"
    factory: Callable[[Receive], BaseException] = lambda r: error(accused)
    for item in voids:
        if (type(item) is not list or len(item) != 2 or type(item[0]) not in (int, str)
                or type(item[1]) is not int or item[1] < 0):
            return f"a failure notice naming an operation as {F.shown(item)}"
        gid, seq = item
        if router.knows(gid) and router.vet(reporter, gid, seq) is None and router.vet(accused, gid, seq) is None:
            router.fail_seq(gid, seq, None, factory, void=True)
    return None


class CallFailure(NamedTuple):
    """A member's call at ``seq`` of group ``gid`` failed there (rank ``found``, global): what it raised (``text``)."""

    gid: Any
    seq: int
    found: int
    text: str
    void: bool
