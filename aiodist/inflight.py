"""What each rank is waiting in right now.

Blocking operations (store calls, collectives, point-to-point) register a short
description while they wait. The simulator reads this to report, on deadlock,
the operation each rank is blocked in; the flight recorder and timeouts use it
to say who waited for what. It lives in the rank scope, so every virtual rank
has its own.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from .context import rank_scope


def _table() -> dict[int, dict[str, Any]]:
    scope = rank_scope()
    table = scope.get("inflight")
    if table is None:
        table = scope["inflight"] = {}
        scope["inflight_ids"] = itertools.count()
    return table


@contextlib.contextmanager
def waiting_in(op: str, **details: Any) -> Iterator[dict[str, Any]]:
    """Register ``op`` (with details such as ``seq``, ``peer``, ``key``) while the block runs.

    The yielded dict may be updated in place (e.g. the peer currently awaited).
    """
    table = _table()
    token = next(rank_scope()["inflight_ids"])
    entry = {"op": op, **details}
    table[token] = entry
    try:
        yield entry
    finally:
        table.pop(token, None)


def snapshot() -> list[dict[str, Any]]:
    """The calling rank's in-flight operations, oldest first."""
    return [dict(e) for _, e in sorted(_table().items())]
