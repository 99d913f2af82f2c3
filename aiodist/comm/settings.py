"""The transport's settings: defaults, and the environment variables that change them.

Read through :func:`aiodist.context.getenv` (the calling rank's environment),
so the simulator's virtual ranks each have their own. A value that cannot be
used is ignored with a warning, never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..context import getenv

log = logging.getLogger("aiodist.comm")

HELLO_TIMEOUT = 30.0
"""Seconds a new connection may take for its whole handshake (then it is closed)."""

MAX_HANDSHAKES_ENV = "AIODIST_MAX_HANDSHAKES"
"""Connections a rank's listener lets be in their handshake (not yet authenticated) at once (default
:data:`aiodist.net.gate.DEFAULT_MAX_HANDSHAKES`, 1024, as the store's ``max_handshakes``). A new connection
over it resets the oldest one still in its handshake (logged once per 10 s with a count): a genuine peer's
takes a few round trips, so a flood of silent sockets cannot shut it out. Each is held at most
:data:`HELLO_TIMEOUT`."""

BYE_TIMEOUT = 2.0
"""Seconds :meth:`Transport.close` waits for its connections to finish closing."""


REPORT_GRACE = 1.0
"""Seconds a mismatch report may take to reach its rank (connecting first if needed)."""

RELAYED_CALL_FAILURES = 8
"""Failed calls of members (the last ones learned of) a rank passes on to its linked members before its ``bye``."""

DEPARTURE_LOOKUP = 1.0
"""Seconds a rank asks the store, after a dial failed, whether the peer left after a failure (and which)."""

EXPECT_LOWER = 0.5
"""Seconds a receive from a lower rank waits for that rank's connection (it dials when it sends) before
this rank dials it itself (speculatively): a rank that left before it ever connected is found out."""

DIAL_DEFER = 0.002
"""Seconds the higher rank of a pair waits for the lower rank's connection before dialing itself."""
DIAL_DEFER_ENV = "AIODIST_DIAL_DEFER"

MAX_EARLY_FRAMES_ENV = "AIODIST_MAX_EARLY_FRAMES"
"""Per peer: how many frames may wait for their receive (default :data:`.router.MAX_EARLY_FRAMES`)."""
MAX_EARLY_BYTES_ENV = "AIODIST_MAX_EARLY_BYTES"
"""Per peer: how many payload bytes may wait for their receive (default :data:`.router.MAX_EARLY_BYTES`).

A peer that exceeds either, or sends an impossible frame (see :mod:`.router`: a group this
rank will never know, a duplicate or absurd sequence number), is treated as failed: its
connection is closed after a ``fail`` notice naming the problem (so an aiodist rank on the
other end raises an error saying why), its buffered frames are dropped, and every group
containing it fails with PeerFailureError naming it, ``how`` starting with "sent bad input".
"""

HEARTBEAT_ENV = "AIODIST_HEARTBEAT_TIMEOUT"
"""Seconds of silence after which a connected peer is declared failed (0 or ``off``: no heartbeats).

When set it overrides ``interval * misses`` (the interval becomes timeout / misses).
"""
HEARTBEAT_INTERVAL_ENV = "AIODIST_HEARTBEAT_INTERVAL"
"""Seconds between heartbeat frames on each connection (default :data:`HEARTBEAT_INTERVAL`)."""
HEARTBEAT_MISSES_ENV = "AIODIST_HEARTBEAT_MISSES"
"""Heartbeat intervals of silence after which a peer is declared failed (default :data:`HEARTBEAT_MISSES`)."""
HEARTBEAT_MIN_BANDWIDTH = 1e6
"""Bytes/s: while a frame of n bytes arrives from a peer, its heartbeats wait behind it, so on a
connection that does not count what arrives (the simulator's: frames arrive whole) the peer is allowed
n / HEARTBEAT_MIN_BANDWIDTH more seconds of silence (a slow link is not a hung peer). Over TCP and shared
memory the frame's own bytes, as they come, are the signs of life instead (``Connection.progress``)."""
HEARTBEAT_GRACE_MIN_BYTES = 256 * 1024
HEARTBEAT_INTERVAL = 0.5
HEARTBEAT_MISSES = 6
"""Defaults: a hung peer (stopped, partitioned, or its event loop blocked) is declared failed after
3 s of silence, so within about 3.5 s.

Heartbeats are on by default. Each live connection carries a tiny ``hb`` frame
every interval (a few bytes per second: nothing next to collective traffic),
and any frame, or the start of a payload, counts as a sign of life. A rank
whose event loop is blocked (a long computation that never awaits) sends
nothing and cannot be told from a hung one: raise the timeout for such
programs (``init_process_group(heartbeat_interval=..., heartbeat_misses=...)``
or the environment variables above), or turn heartbeats off with
``AIODIST_HEARTBEAT_TIMEOUT=0``. A rank whose own loop was blocked does not
blame its peers for the silence it did not hear: a check that runs late
starts the count again.
"""


def env_number(name: str, default: Any, parse: Callable[[str], Any], *, zero_ok: bool) -> Any:
    """The number in environment variable ``name`` (parsed by ``parse``), or ``default`` if unset or unusable.

    Negative values are refused, and so is zero unless ``zero_ok``.
    """
    raw = getenv(name)
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not %s", name, raw, "a number" if parse is float else "an integer")
        return default
    return value if value > 0 or (zero_ok and value == 0) else default


def heartbeat_from_env() -> tuple[float, int] | None:
    """The heartbeat (interval, misses) from the environment (defaults: on); None when turned off."""
    interval, misses = HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
    raw = getenv(HEARTBEAT_MISSES_ENV)
    if raw:
        try:
            misses = max(1, int(raw))
        except ValueError:
            log.warning("ignoring %s=%r: not an integer", HEARTBEAT_MISSES_ENV, raw)
    raw = getenv(HEARTBEAT_INTERVAL_ENV)
    if raw:
        try:
            interval = float(raw)
        except ValueError:
            log.warning("ignoring %s=%r: not a number of seconds", HEARTBEAT_INTERVAL_ENV, raw)
    raw = getenv(HEARTBEAT_ENV)
    if raw:
        if raw.strip().lower() in ("off", "no", "false", "none"):
            return None
        try:
            timeout = float(raw)
        except ValueError:
            log.warning("ignoring %s=%r: not a number of seconds", HEARTBEAT_ENV, raw)
        else:
            if timeout <= 0:
                return None
            interval = timeout / misses
    return (interval, misses) if interval > 0 else None


def heartbeat_with(
    current: tuple[float, int] | None, interval: float | None, misses: int | None
) -> tuple[float, int] | None:
    """``current`` with ``interval`` (s; 0: off) and ``misses`` changed where given (None keeps a value)."""
    if interval is None and misses is None:
        return current
    cur_i, cur_m = current or (HEARTBEAT_INTERVAL, HEARTBEAT_MISSES)
    i = cur_i if interval is None else float(interval)
    m = cur_m if misses is None else int(misses)
    if i < 0 or m < 1:
        raise ValueError(f"heartbeat interval must be >= 0 and misses >= 1, got {interval!r}, {misses!r}")
    return (i, m) if i > 0 else None
