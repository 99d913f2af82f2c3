"""The ledger of operations never awaited: a forgotten ``await`` is never silent.

Every :class:`~aiodist.work.Work` notes where the user started it (the first
frame outside aiodist: ``train.py:41 in step``) in its rank's ledger, and
takes the note out again when it is awaited (``await w``, ``await w.wait()``,
``w.result()``, ...). So the ledger holds exactly the operations nobody
awaited: :func:`unawaited_operations` lists them, :func:`clear_unawaited`
forgets them. A Work collected while still in the ledger also emits a
:class:`RuntimeWarning` naming the call site (as asyncio does for a coroutine
never awaited). The end of a launched rank (:func:`aiodist.api.finish_rank`)
raises :class:`UnawaitedOperationError` for all of them;
``destroy_process_group()`` for those whose Work is gone already (a Work
the program still holds may yet be awaited, e.g. to see that the destroy
cancelled it).

The ledger lives in the rank scope (each virtual rank of the simulator has its
own) and a Work keeps a reference to its own ledger, so a Work collected while
another rank runs is still booked to the rank that started it.

Cost on the path of every operation: a walk up the stack to the first frame
outside aiodist (a dict hit per frame), a tuple and a dict insert; the text
is formatted only when asked for.
"""

from __future__ import annotations

import asyncio
import os
import sys
import warnings
from types import CodeType
from typing import Any

from .context import rank_scope
from .errors import UnawaitedOperationError

__all__ = [
    "UnawaitedOperationError",
    "Ledger",
    "clear_unawaited",
    "ledger",
    "unawaited_operations",
]

MAX_ENTRIES = 10_000
"""Notes kept per rank; further un-awaited operations are only counted (a loop that never awaits stays bounded)."""
OVERFLOW = -1
"""The key of an operation booked beyond :data:`MAX_ENTRIES`: counted, without its call site (awaiting it
takes it off the count)."""

_AIODIST_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep
_INTERNAL: dict[str, bool] = {}  # co_filename -> whether the frame is aiodist's (or asyncio's) own


Site = tuple[str, "int | None", "str | None", "CodeType | None", int]
"""(op, seq, group, code of the user's frame, line number)."""


def _internal(filename: str) -> bool:
    hit = _INTERNAL.get(filename)
    if hit is None:
        path = os.path.abspath(filename)
        hit = path.startswith(_AIODIST_DIR) or path.startswith(_ASYNCIO_DIR) or filename.startswith("<frozen ")
        if len(_INTERNAL) < 4096:
            _INTERNAL[filename] = hit
    return hit


_getframe = sys._getframe


def call_site(depth: int, guess: int = 3) -> tuple[CodeType | None, int]:
    """The code and line of the first caller outside aiodist, ``depth`` frames above the caller of this.

    ``guess``: how many frames further up the user's frame usually is
    (``aiodist.all_reduce`` -> ``ProcessGroup.all_reduce`` -> ``_collective`` -> ``Work``).
    Frame objects of functions that are still running are made on demand
    and cost a copy when those functions return, so the frames in between
    are not looked at when the guess holds: only the guessed frame and the
    one below it.
    """
    base = depth + 1
    internal = _INTERNAL
    try:
        f: Any = _getframe(base + guess)
    except ValueError:
        f = None
    if f is not None:
        name = f.f_code.co_filename
        hit = internal.get(name)
        if hit is None:
            hit = _internal(name)
        if not hit:
            below = _getframe(base + guess - 1).f_code.co_filename
            hit_below = internal.get(below)
            if hit_below is None:
                hit_below = _internal(below)
            if hit_below:
                return f.f_code, f.f_lineno or 0
    # the guess did not hold: walk up from the start
    f = _getframe(base)
    while f is not None:
        code = f.f_code
        hit = internal.get(code.co_filename)
        if hit is None:
            hit = _internal(code.co_filename)
        if not hit:
            return code, f.f_lineno or 0
        f = f.f_back
    return None, 0


def describe(site: Site) -> str:
    """``"all_reduce #7 of world (train.py:41 in step)"``."""
    op, seq, group, code, line = site
    text = op if seq is None else f"{op} #{seq}"
    if group:
        text += f" of {group}"
    if code is not None:
        text += f" ({os.path.basename(code.co_filename)}:{line} in {code.co_name})"
    return text


class Ledger:
    """One rank's operations not awaited yet (see the module doc). ``live``: key -> site, in start order."""

    __slots__ = ("live", "gone", "next", "overflow")

    def __init__(self) -> None:
        self.live: dict[int, Site] = {}
        self.gone: dict[int, None] = {}  # keys of ``live`` whose Work was collected
        self.next = 0  # the next key
        self.overflow = 0

    def __repr__(self) -> str:
        return f"<unawaited ledger {len(self.live)} pending>"

    def note(self, site: Site) -> int | None:
        """Book an operation just started; the key to :meth:`settle` it with (None: not booked, over the cap)."""
        if len(self.live) >= MAX_ENTRIES:
            self.overflow += 1
            return None
        key = self.next
        self.next = key + 1
        self.live[key] = site
        return key

    def settle(self, key: int) -> None:
        """The operation was awaited: take it out."""
        if key == OVERFLOW:
            self.overflow = max(self.overflow - 1, 0)
        else:
            self.live.pop(key, None)

    def collected(self, key: int) -> None:
        """The Work of a booked operation was garbage-collected un-awaited: warn at its call site (it stays booked)."""
        site = self.live.get(key)
        if site is None:
            return
        self.gone[key] = None
        code, line = site[3], site[4]
        message = f"{describe(site)} was never awaited: its result (and any error) is lost; `await` it"
        if code is None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return
        module = os.path.splitext(os.path.basename(code.co_filename))[0]
        warnings.warn_explicit(message, RuntimeWarning, code.co_filename, line, module=module)

    def descriptions(self, *, collected_only: bool = False) -> list[str]:
        if collected_only:
            return [describe(self.live[k]) for k in self.gone]
        out = [describe(site) for site in self.live.values()]
        if self.overflow:
            out.append(f"... and {self.overflow} more (their call sites were not kept beyond {MAX_ENTRIES})")
        return out

    def count(self) -> int:
        """How many operations are booked (those whose call site was kept, and those only counted)."""
        return len(self.live) + self.overflow

    def clear(self, *, collected_only: bool = False) -> None:
        if collected_only:
            for k in self.gone:
                del self.live[k]
        else:
            self.live.clear()
            self.overflow = 0
        self.gone.clear()


_KEY = "unawaited_ledger"


def ledger() -> Ledger:
    """The calling rank's ledger (created on first use)."""
    scope = rank_scope()
    book: Ledger | None = scope.get(_KEY)
    if book is None:
        book = scope[_KEY] = Ledger()
    return book


def unawaited_operations(*, collected_only: bool = False) -> list[str]:
    """The calling rank's operations never awaited, oldest first (collected Works and live ones).

    Each as ``"all_reduce #7 of world (train.py:41 in step)"``: the user's frame
    that started it. ``collected_only``: only those whose Work is gone.
    """
    book = rank_scope().get(_KEY)
    return [] if book is None else book.descriptions(collected_only=collected_only)


def clear_unawaited(*, collected_only: bool = False) -> None:
    """Forget the calling rank's un-awaited operations (those still alive are not booked again)."""
    book = rank_scope().get(_KEY)
    if book is not None:
        book.clear(collected_only=collected_only)


def raise_if_unawaited(context: str, *, rank: int | None = None, collected_only: bool = False) -> None:
    """Raise UnawaitedOperationError (and forget them) if the calling rank has un-awaited operations."""
    ops = unawaited_operations(collected_only=collected_only)
    if not ops:
        return
    book: Ledger = rank_scope()[_KEY]
    n = len(ops) if collected_only else book.count()
    clear_unawaited(collected_only=collected_only)
    who = "" if rank is None else f" on rank {rank}"
    listing = "; ".join(ops)
    raise UnawaitedOperationError(
        f"{context}: {n} operation{'s' if n != 1 else ''} started{who} never awaited: {listing}. "
        f"Every aiodist operation returns a Work: `await` it (or `await work.wait()`)",
        operations=ops,
    )
