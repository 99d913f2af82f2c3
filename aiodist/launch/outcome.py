"""How each rank ended, as the rank itself saw it, and which rank started a failure.

A launched rank (the bootstrap, :mod:`aiodist.launch_bootstrap`) writes one
small JSON record into ``$AIODIST_STATUS_DIR/rank<R>.json`` as it ends:

* ``returned``: its main returned (or the script ran to its end);
* ``raised``: an exception escaped; with its type, message, the user's line
  that raised it, and, when the exception is the *consequence* of another
  rank's failure (:class:`~aiodist.errors.PeerFailureError`, a lost store, a
  group aborted because of a peer), the rank it blames and the operation it
  was in (and, when the peer it lost said which failure it left after, that
  failure's rank and how it failed: ``cause``);
* ``exit``: ``sys.exit(N)``.

The launcher reads the records of the ranks that ended and picks the root
cause with :func:`root_cause` (pure): the first rank to fail *on its own*
(an exception that is not a consequence, a signal the launcher did not send,
an exit code without a record; of the ranks that raised a collective
mismatch, the one that found it, not those it told), else a rank that returned while the others
still needed it (the ranks that failed blame it), else the rank most of them
blame, else the first to exit. The message says which kind it was:
``rank 2 raised RuntimeError: boom (train.py:41)``, ``rank 3 exited cleanly
while ranks 0-2 wait in all_reduce #7``; a rank of another node by how its
peers were told it failed: ``rank 3 (on another node) raised ValueError: boom
(train.py:8); ranks 0, 1 lost it in all_reduce #3``.

Before the launcher of a job of several nodes stops the other ranks after a
failure, it writes the root cause into ``$AIODIST_STATUS_DIR/stop.json``
(:func:`write_stop_reason`): a rank stopped so tells its peers, as it leaves,
that it leaves because of that failure (:func:`stop_reason`,
:mod:`aiodist.launch.stopped`), and the peers on other nodes, whose launchers
know nothing of it, name that failure, not the rank that was stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..launch_marks import JOINED, STATUS_DIR_ENV, WAITING  # (the directory a launched rank writes its end record into)
from .status import describe_returncode, signal_of

__all__ = ["STATUS_DIR_ENV", "STOP_REASON", "Blame", "blamed", "describe_exception", "load", "raised_text", "rank_ended",
           "record", "root_cause", "stop_reason", "write_stop_reason"]


STOP_REASON = "stop.json"
"""The file of that directory in which the launcher says, before it stops the ranks, which failure it stops them for."""

_INTERNAL_DIRS = (
    os.path.dirname(os.path.abspath(os.__file__)) + os.sep,  # the standard library (asyncio, runpy, json, ...)
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # aiodist
)


def _user_frame(exc: BaseException) -> str | None:
    """``"train.py:41"``: the innermost traceback frame outside aiodist and the standard library."""
    where = None
    for fs in traceback.extract_tb(exc.__traceback__):
        if fs.filename.startswith("<frozen ") or fs.filename.endswith((".pyx", ".pxd", ".pxi")):
            continue  # (frozen modules; compiled extensions' frames, e.g. uvloop's loop.pyx)
        path = os.path.abspath(fs.filename)
        if not path.startswith(_INTERNAL_DIRS):
            where = f"{os.path.basename(fs.filename)}:{fs.lineno}"
    return where


def _blamed(exc: BaseException) -> tuple[int | None, str | None, str | None]:
    """(rank blamed, operation, how it failed) if ``exc`` is the consequence of another rank's failure, else Nones.

    The rank blamed is the root cause when the peer lost said which failure it left after (its own, or
    another rank's: :attr:`~aiodist.errors.PeerFailureError.culprit`), with how it failed; else the peer.
    """
    from ..comm.links import AUTH_FAILED
    from ..errors import (AbortedError, CollectiveTimeoutError, PeerCallFailedError, PeerFailureError,
                          RendezvousTimeoutError, StoreConnectionLost)

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the exception or what caused it
        seen.add(id(e))
        if isinstance(e, PeerFailureError):
            if (e.how or "").startswith(AUTH_FAILED):
                return None, None, None  # (its own finding: something at the peer's address did not prove the secret)
            rank = e.global_rank if e.global_rank is not None else e.rank
            op = None
            if e.op:
                op = e.op if e.seq is None else f"{e.op} #{e.seq}"
            culprit = getattr(e, "culprit", None)
            if type(culprit) is int and culprit >= 0:  # (the peer left after that rank's failure: the root)
                cause = getattr(e, "cause", None)
                return culprit, op, cause if isinstance(cause, str) else None
            return (rank if isinstance(rank, int) else -1), op, None
        if isinstance(e, PeerCallFailedError):  # (the call failed on that rank: its error is the cause)
            return (e.global_rank if isinstance(e.global_rank, int) else -1), None, None
        if isinstance(e, CollectiveTimeoutError) and e.absent and _every_rank_needed(e.op):
            # (a rank's part of such a call cannot end without every rank: the store's absent ones had not reached it)
            op = e.op if e.seq is None else f"{e.op} #{e.seq}"
            others = e.absent[1:]
            nor = "" if not others else f", nor had {'rank' if len(others) == 1 else 'ranks'} {_ranges(others)},"
            return e.absent[0], op, f"had not reached {op}{nor} when its peers timed out in it"
        if isinstance(e, RendezvousTimeoutError) and e.missing:  # (waited for a rank that never joined)
            missing = f"rank {e.missing[0]}" if len(e.missing) == 1 else f"ranks {_ranges(e.missing)}"
            return e.missing[0], RENDEZVOUS_OP, f"never joined the rendezvous ({missing} missing after {e.timeout:.3g}s)"
        if isinstance(e, (StoreConnectionLost, AbortedError)):
            return -1, None, None
        e = e.__cause__ or e.__context__
    return None, None, None


def _every_rank_needed(op: str) -> bool:
    """Whether no rank's part of collective ``op`` can end before every rank joined it (all_*, barrier, reduce_scatter)."""
    return op.startswith("all_") or op in ("barrier", "reduce_scatter", "reduce_scatter_tensor")


def describe_exception(exc: BaseException) -> dict[str, Any]:
    """The record of a rank that ``exc`` ended (see the module doc); an exception group by its first error."""
    from ..errors import innermost

    exc = innermost(exc)
    blamed, op, cause = _blamed(exc)
    message = str(exc).splitlines()[0] if str(exc) else ""
    if len(message) > 300:
        message = message[:297] + "..."
    out: dict[str, Any] = {"kind": "raised", "type": type(exc).__name__, "message": message,
                           "where": _user_frame(exc)}
    if blamed is not None:
        out["blames"] = None if blamed < 0 else blamed
        out["op"] = op
        if cause:
            out["cause"] = cause
    found_by = getattr(exc, "found_by", None)  # a collective mismatch another rank found and told us of
    if type(found_by) is int:
        out["found_by"] = found_by
    calls = getattr(exc, "global_calls", None)  # (what each rank called, as far as this one knows: see _odd_one_out)
    if calls and isinstance(getattr(exc, "group", None), str) and type(getattr(exc, "seq", None)) is int:
        out["mismatch"] = {"group": exc.group, "seq": exc.seq,  # type: ignore[attr-defined]
                           "calls": {str(r): c[:200] for r, c in sorted(calls.items())[:64]}}
    return out


def _odd_one_out(records: Mapping[int, Mapping[str, Any]], mismatch: Any) -> tuple[int, str, str, list[int]] | None:
    """The one rank that called something else at a mismatched collective where the others agree, if there is one.

    Every rank's record lists the calls it knows of (its own, the finder's
    pair): together they may show ``(rank, its call, the others' call, the
    others)``. None when the calls do not split one against two or more.
    """
    if not isinstance(mismatch, dict):
        return None
    calls: dict[int, str] = {}
    for rec in records.values():
        m = rec.get("mismatch")
        if isinstance(m, dict) and m.get("group") == mismatch.get("group") and m.get("seq") == mismatch.get("seq"):
            for k, v in (m.get("calls") or {}).items():
                if str(k).isdigit():
                    calls.setdefault(int(k), str(v))
    by_call: dict[str, list[int]] = {}
    for r in sorted(calls):
        by_call.setdefault(calls[r], []).append(r)
    if len(by_call) != 2:
        return None
    (odd_call, odd), (call, others) = sorted(by_call.items(), key=lambda kv: (len(kv[1]), kv[0]))
    if len(odd) != 1 or len(others) < 2:
        return None
    return odd[0], odd_call, call, others


def record(outcome: Mapping[str, Any], *, rank: int | None = None) -> Path | None:
    """Write the calling rank's end record (when launched: ``$AIODIST_STATUS_DIR`` is set); errors are ignored."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return None
    if rank is None:
        raw = os.environ.get("RANK", "")
        if not raw.isdigit():
            return None
        rank = int(raw)
    data = {"rank": rank, "time": time.time(), **outcome}
    path = Path(directory) / f"rank{rank}.json"
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, default=repr))
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def load(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """The records in ``directory``, by rank (unreadable ones are skipped)."""
    out: dict[int, dict[str, Any]] = {}
    for p in sorted(Path(directory).glob("rank*.json")):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("rank"), int):
            out[data["rank"]] = data
    return out


@dataclass(frozen=True)
class Blame:
    """The rank that started a failure, how (``kind``: raised, signal, exit, returned, unknown), and the message.

    ``cause``: how that rank failed, without its name (``raised ValueError: boom (train.py:8)``,
    ``was killed by signal SIGKILL (9)``); None when not known (what the launcher tells the ranks it stops).
    """

    rank: int
    kind: str
    message: str
    cause: str | None = None


def _ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}\u2013{rs[j]}" if j > i + 1 else f"{rs[i]}, {rs[j]}")
        i = j + 1
    return ", ".join(parts)


def never_joined(gone: Sequence[int], marks: Mapping[int, str]) -> list[int]:
    """The ranks of ``gone`` (exited 0) that never joined their rendezvous (``marks``:
    :func:`aiodist.launch_marks.load_marks`): one that had joined strands no one."""
    return [r for r in gone if marks.get(r) != JOINED]


def stranded(gone: Sequence[int], running: Collection[int], marks: Mapping[int, str]) -> Blame | None:
    """The first of ``gone`` (ranks that exited 0 and :func:`never_joined`) if ranks still ``running`` wait in
    their rendezvous: they wait for it, and would wait out their whole timeout. None when it strands no one."""
    waiting = sorted(r for r in running if marks.get(r) == WAITING)
    if not gone or not waiting:
        return None
    who = f"rank {waiting[0]} waits" if len(waiting) == 1 else f"ranks {_ranges(waiting)} wait"
    return Blame(gone[0], "returned", f"rank {gone[0]} exited cleanly while {who} in rendezvous")


def raised_text(rec: Mapping[str, Any]) -> str:
    """``"raised RuntimeError: boom (train.py:41)"`` from a ``raised`` record."""
    text = f"raised {rec.get('type', 'an exception')}"
    if rec.get("message"):
        text += f": {rec['message']}"
    if rec.get("where"):
        text += f" ({rec['where']})"
    return text


def _blame_chain(rank: int, consequences: Mapping[int, Mapping[str, Any]]) -> int | None:
    """Follow "rank r lost rank b" from ``rank`` to the first rank that is not itself a consequence."""
    seen = {rank}
    b = consequences[rank].get("blames")
    while isinstance(b, int) and b in consequences and b not in seen:
        seen.add(b)
        nxt = consequences[b].get("blames")
        if not isinstance(nxt, int):
            break
        b = nxt
    return b if isinstance(b, int) else None


def blamed(records: Mapping[int, Mapping[str, Any]]) -> set[int]:
    """The ranks that some rank's failure was the consequence of (its record blames them)."""
    return {b for rec in records.values() if rec.get("kind") == "raised" and type(b := rec.get("blames")) is int}


def _told_by_finder(rec: Mapping[str, Any], records: Mapping[int, Mapping[str, Any]]) -> bool:
    """Is ``rec`` a collective mismatch another rank found, whose own record (it raised the mismatch) is here?"""
    finder = records.get(rec["found_by"]) if type(rec.get("found_by")) is int else None
    return (finder is not None and finder.get("kind") == "raised" and finder.get("type") == rec.get("type")
            and "blames" not in finder and "found_by" not in finder)


def root_cause(
    exits: Sequence[tuple[int, int]],
    records: Mapping[int, Mapping[str, Any]],
    *,
    stopped: Sequence[int] = (),
    local: Collection[int] | None = None,
    exit_times: Mapping[int, float] | None = None,
) -> Blame | None:
    """The rank that started the failure of a job (None: nothing failed).

    ``exits``: (rank, returncode) in the order the ranks exited; ``records``:
    the ranks' end records (:func:`load`); ``stopped``: ranks the launcher
    itself stopped (their signal is not a cause); ``local``: the ranks this
    launcher runs (None: all), so that a rank of another node is not said to be
    still running. ``exit_times``: when the launcher saw ranks exit (wall clock, as
    the records' times): a rank that left no record (killed) is ordered by it.
    """
    failed = [(r, code) for r, code in exits if code != 0 and r not in stopped]
    consequences = {r: rec for r, rec in records.items() if rec.get("kind") in ("raised", "exit") and "blames" in rec}
    if not failed and not consequences:
        return None
    exited = {r for r, _ in exits}
    # 1. the earliest failure of a rank on its own
    own: list[tuple[float, int, Blame]] = []
    order = {r: i for i, (r, _) in enumerate(exits)}
    for r, code in failed:
        rec = records.get(r)
        when = float(rec["time"]) if rec and isinstance(rec.get("time"), (int, float)) else float("inf")
        if rec is None and exit_times is not None:
            when = exit_times.get(r, when)
        if rec is None or rec.get("kind") == "returned":
            if signal_of(code) is not None:
                own.append((when, order[r], _own(r, "signal", f"was killed by {describe_returncode(code)}")))
            else:
                own.append((when, order[r], _own(r, "exit", f"exited with code {code}")))
        elif rec.get("kind") == "exit" and "blames" not in rec:  # (an exit while handling a peer's failure: its consequence)
            own.append((when, order[r], _own(r, "exit", f"exited with code {rec.get('code', code)}")))
        elif rec.get("kind") == "interrupted":  # (SIGINT that the launcher did not send)
            at = f" at {rec['where']}" if rec.get("where") else ""
            own.append((when, order[r], _own(r, "signal", f"was interrupted ({rec.get('type')}){at}")))
    clean = {r for r, code in exits if code == 0}
    for r, rec in records.items():  # an own exception counts from its record on, exited or not yet
        if rec.get("kind") == "raised" and "blames" not in rec and r not in clean and not _told_by_finder(rec, records):
            when = float(rec["time"]) if isinstance(rec.get("time"), (int, float)) else float("inf")
            own.append((when, order.get(r, len(order)), _own(r, "raised", raised_text(rec))))
    if own:
        own.sort(key=lambda t: (t[0], t[1]))
        first = own[0][2]
        odd = _odd_one_out(records, (records.get(first.rank) or {}).get("mismatch"))
        if odd is not None:  # (a mismatch: its finder is not its cause; the rank the others disagree with is)
            rank, its_call, call, others = odd
            m = records[first.rank]["mismatch"]
            what = (f"called {its_call!r} where {'ranks' if len(others) > 1 else 'rank'} {_ranges(others)} called "
                    f"{call!r} (a collective mismatch at seq {m['seq']} of {m['group']}, found by rank {first.rank})")
            return Blame(rank, "raised", f"rank {rank} {what}", what)
        return first
    # 2. a rank the others blame: it returned early, or it is still missing
    votes: dict[int, list[int]] = {}
    for r in sorted(consequences):
        b = _blame_chain(r, consequences)  # rank 0 lost rank 1, which lost rank 3: rank 0 waits on rank 3 too
        if b is not None:
            votes.setdefault(b, []).append(r)
    if votes:
        culprit = max(sorted(votes), key=lambda b: len(votes[b]))
        waiting = [r for r in votes[culprit] if r != culprit] or votes[culprit]  # (an evicted rank blames itself)
        ops = sorted({str(records[r].get("op")) for r in waiting if records[r].get("op")})
        where = f" in {' / '.join(ops)}" if ops else ""
        rec = records.get(culprit)
        who = "ranks" if len(waiting) > 1 else "rank"
        if local is not None and culprit not in local:  # (its own launcher knows how it ended)
            cause = next((str(records[r]["cause"]) for r in sorted(votes[culprit])
                          if records[r].get("cause") and records[r].get("blames") == culprit), None)
            what = _predicate(cause) if cause else "failed or left"  # (how its peers were told it failed, if they were)
            if ops == [RENDEZVOUS_OP] and cause and cause.startswith("never "):  # (it never came: nothing was lost)
                return Blame(culprit, "unknown", f"rank {culprit} (on another node) {what}; {who} {_ranges(waiting)} "
                                                 "waited for it: is that node started, with the same "
                                                 "--master-addr/--master-port (or --rdzv-endpoint)?", cause)
            return Blame(culprit, "unknown", f"rank {culprit} (on another node) {what}; {who} "
                                             f"{_ranges(waiting)} lost it{where}", cause)
        if rec is None and dict(exits).get(culprit) == 0:  # exited 0 without a record: os._exit(0), say
            return Blame(culprit, "returned",
                         f"rank {culprit} exited with code 0 (without returning from its main) while {who} "
                         f"{_ranges(waiting)} wait{'s' if len(waiting) == 1 else ''}{where}")
        if rec is not None and rec.get("kind") == "returned":
            return Blame(culprit, "returned",
                         f"rank {culprit} exited cleanly while {who} {_ranges(waiting)} wait{'s' if len(waiting) == 1 else ''}{where}")
        if culprit not in exited:
            late = next((str(records[r]["cause"]) for r in waiting
                         if str(records[r].get("cause") or "").startswith("had not reached ")), None)
            if late is not None:  # (alive, and late: slow, or stuck before the call)
                return Blame(culprit, "unknown",
                             f"rank {culprit} {late.replace(' when its peers', f' when {who} {_ranges(waiting)}')} "
                             "(it is still running: slow, or stuck before it?)", late)
            return Blame(culprit, "unknown",
                         f"rank {culprit} stopped responding (still running) while {who} {_ranges(waiting)} "
                         f"wait{'s' if len(waiting) == 1 else ''}{where}")
        if rec is not None and rec.get("blames") == culprit:  # it was told the others declared it failed
            cut = str(rec.get("message") or "").partition(_CUT_OFF)[2]
            if cut:  # (not hung: a peer refused what it sent, e.g. far more than that peer had asked for yet)
                return Blame(culprit, "unknown", f"rank {culprit} was cut off by its peers, which refused what it "
                                                 f"sent: {cut.rstrip(')')}; {who} {_ranges(waiting)} lost it{where}")
            return Blame(culprit, "unknown", f"rank {culprit} stopped responding (the others declared it failed); "
                                             f"{who} {_ranges(waiting)} lost it{where}")
        return Blame(culprit, "unknown", f"rank {culprit} failed; {who} {_ranges(waiting)} lost it{where}")
    # 3. the first to exit non-zero
    if failed:
        r, code = failed[0]
        rec = records.get(r)
        if rec is not None and rec.get("kind") == "raised":
            return _own(r, "raised", raised_text(rec))
        return _own(r, "exit", f"failed with {describe_returncode(code)}")
    r = min(consequences)
    return _own(r, "raised", raised_text(consequences[r]))


_CUT_OFF = "sent bad input: "
"""How a rank's record says its peers closed its connection for what it sent (see ``Links.bad_input``)."""

_VERBS = ("raised ", "was ", "exited ", "failed ", "left ", "stopped ", "never ")
RENDEZVOUS_OP = "rendezvous"
"""The operation a rank's record names when it waited in the rendezvous for ranks that never joined."""


def _predicate(cause: str) -> str:
    """What a rank did, from how its failure was described: ``raised ValueError: boom`` as it is (its own
    words, or its launcher's), ``failed: connection lost`` for what a peer saw of it."""
    return cause if cause.startswith(_VERBS) else f"failed: {cause}"


def _own(rank: int, kind: str, what: str) -> Blame:
    """``rank`` failed so (``what``): its Blame, whose message names it."""
    return Blame(rank, kind, f"rank {rank} {what}", what)


def write_stop_reason(directory: str | os.PathLike[str], blame: Blame | None) -> None:
    """Before stopping the ranks after a failure: say which (when its rank and how it failed are known)."""
    if blame is None or not blame.cause:
        return
    path = Path(directory) / STOP_REASON
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": blame.rank, "cause": blame.cause}))
        os.replace(tmp, path)
    except OSError:
        pass


def stop_reason() -> tuple[int, str] | None:
    """In a launched rank: (rank, how it failed) of the failure its launcher stops it for, if it said."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return None
    try:
        data = json.loads((Path(directory) / STOP_REASON).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or type(data.get("rank")) is not int or not isinstance(data.get("cause"), str):
        return None
    return data["rank"], data["cause"]


_ENDED = False


def rank_ended(exc: BaseException | None) -> None:
    """Record how this launched rank ended (once: the first call wins); an own exception is flight-recorded too.

    ``exc`` None: main returned. ``SystemExit`` is an exit (0/None: returned).
    """
    global _ENDED
    if _ENDED:
        return
    _ENDED = True
    if exc is None:
        record({"kind": "returned"})
        return
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            record({"kind": "returned"})
        else:
            rec = {"kind": "exit", "code": code if isinstance(code, int) else 1,
                   "message": "" if isinstance(code, int) else str(code), "time": time.time()}
            lost = exc.__context__  # sys.exit(3) in an ``except PeerFailureError:``: a consequence of that peer
            if lost is not None:
                told = describe_exception(lost)
                if "blames" in told:
                    rec.update({k: told[k] for k in ("blames", "op", "cause", "type") if k in told})
            record(rec)
        return
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):  # Ctrl-C (SIGINT): not a failure of its own
        where = _user_frame(exc)
        record({"kind": "interrupted", "type": type(exc).__name__, "where": where, "time": time.time()})
        try:
            os.write(2, f"rank {os.environ.get('RANK', '?')}: interrupted{f' at {where}' if where else ''}\n".encode())
        except OSError:
            pass
        return
    rec = describe_exception(exc)
    rec["time"] = time.time()
    record(rec)
    if "blames" not in rec:  # the rank's own error: the flight recorder names it (its peers' records follow from it)
        from .. import flight

        try:
            flight.dump(raised_text(rec), outcome=rec)
        except Exception:
            pass
