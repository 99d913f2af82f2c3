"""The store server's limits: one frozen record, parsed from a short text spec.

Every limit of :class:`~aiodist.store.server.StoreServer` lives in
:class:`StoreLimits`, so that the same values can travel from
``aiodist run --store-limits SPEC`` (through the ranks' environment,
``AIODIST_STORE_LIMITS``) or ``aiodist store serve`` to the server rank 0
starts. A spec is comma-separated ``name=value`` pairs, for example
``max_connections=2000,max_client_bytes=256MiB,idle_timeout=none``; sizes
take ``K``/``M``/``G`` (powers of 1024, ``KiB``/``MiB``/``GiB`` too), times
are seconds, ``none`` switches a limit off where that is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .state import DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_VALUE_BYTES

LIMITS_ENV: Final = "AIODIST_STORE_LIMITS"
"""The environment variable rank 0 reads the limits of the store it starts from."""

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

PRE_AUTH_MAX_FRAME: Final = 4 * KiB
"""Largest frame a connection may send before it has authenticated."""

_HEADER_ROOM: Final = 1 * MiB  # a frame's header and keys beside its largest values


@dataclass(frozen=True, kw_only=True)
class StoreLimits:
    """What one store server allows (``None``: no limit, where allowed).

    * ``max_connections``: connections open at once, authenticated or not;
      ``max_handshakes``: of those, connections still in their handshake (so
      that sockets that never authenticate cannot crowd out real clients). A
      connection over ``max_connections`` is told the server is busy and
      closed (the client retries with backoff); one over ``max_handshakes``
      closes the oldest connection still in its handshake. Both are logged
      once per ``log_interval`` seconds, with a count.
    * ``max_key_bytes`` / ``max_value_bytes``: one key, one value. One
      request or reply carries at most two values of the maximum size: a
      ``multi_set`` or ``multi_get`` over ``2 * max_value_bytes`` of values
      is refused with ``code="request_too_large"`` (repeated keys count
      each time).
    * ``max_frame_bytes``: one request frame once authenticated (``None``:
      two values of the maximum size, a key and 1 MiB of header). Before
      authentication frames are limited to :data:`PRE_AUTH_MAX_FRAME`.
    * ``max_client_bytes``: keys and values stored by one connection (what it
      wrote and nobody overwrote or deleted since), each entry (a key, or one
      queued value) counted as its key's characters, its value's bytes and
      128 bytes for what the server spends to keep it
      (:data:`~aiodist.store.quota.ENTRY_BYTES`); ``max_total_bytes``: by
      everyone. A write over a quota is refused with ``code="quota_exceeded"``.
    * ``max_waiter_bytes``: what one connection keeps blocked on the server,
      i.e. its waiting ``get``/``wait``/``multi_get``/``queue_pop`` requests,
      each counted as its keys' characters plus 64 bytes per key plus 512
      bytes per request (about the memory the server holds for it; see
      :func:`~aiodist.store.waiters.waiter_cost`), from when it starts waiting
      until it completes, times out, is cancelled or the connection goes. A
      blocking request over it is refused at once with
      ``code="waiter_quota_exceeded"`` (``.limit`` and ``.limit_value`` of the
      :class:`~aiodist.errors.StoreRequestError` name the limit and its
      value); the connection stays usable. The default, 64 MiB, holds about
      100,000 blocked single-key requests, or a dozen of the largest a client
      sends (512 KiB of keys each).
    * ``max_outbox_bytes``: replies waiting to be written to one client
      (``None``: twice the frame limit); ``send_timeout``: how long a client
      may leave its replies unread while the socket is full. Over either, the
      client is cut off (its connection reset, its waiters and replies
      dropped).
    * ``idle_timeout``: a connection waiting for nothing and silent that long
      is closed (clients ping); ``handshake_timeout``: the whole handshake,
      authentication included.
    """

    max_connections: int = 16384
    max_handshakes: int = 1024
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_frame_bytes: int | None = None
    max_client_bytes: int | None = 1 * GiB
    max_total_bytes: int | None = 4 * GiB
    max_waiter_bytes: int | None = 64 * MiB
    max_outbox_bytes: int | None = None
    send_timeout: float | None = 60.0
    idle_timeout: float | None = 120.0
    handshake_timeout: float = 10.0
    log_interval: float = 10.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                if f.name in _REQUIRED:
                    raise ValueError(f"store limit {f.name} cannot be switched off")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"store limit {f.name} must be a number, not {type(value).__name__}")
            if f.name in _INTEGERS and not isinstance(value, int):
                raise TypeError(f"store limit {f.name} must be an integer, got {value!r}")
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"store limit {f.name} must be a positive number, got {value!r}")

    @property
    def frame_bytes(self) -> int:
        """The frame limit in force after authentication."""
        if self.max_frame_bytes is not None:
            return self.max_frame_bytes
        return 2 * self.max_value_bytes + self.max_key_bytes + _HEADER_ROOM

    @property
    def outbox_bytes(self) -> int:
        """The outbox limit in force."""
        return self.max_outbox_bytes if self.max_outbox_bytes is not None else 2 * self.frame_bytes

    def replace(self, **changes: Any) -> StoreLimits:
        """A copy with ``changes`` (unknown names raise TypeError)."""
        unknown = sorted(set(changes) - _NAMES)
        if unknown:
            raise TypeError(f"unknown store limit(s) {', '.join(unknown)}; known: {', '.join(sorted(_NAMES))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls, spec: str, *, base: StoreLimits | None = None) -> StoreLimits:
        """Limits from ``name=value,...`` over ``base`` (default limits when omitted); ValueError if malformed."""
        changes: dict[str, Any] = {}
        for item in spec.split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, raw = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in _NAMES:
                known = ", ".join(sorted(_NAMES))
                raise ValueError(f"store limits: expected name=value with a name among {known}, got {item!r}")
            changes[name] = _PARSERS[name](raw.strip(), name)
        try:
            return (base or cls()).replace(**changes)
        except TypeError as e:
            raise ValueError(f"store limits: {e}") from None

    def spec(self) -> str:
        """The spec that :meth:`parse` turns back into these limits (only what differs from the defaults)."""
        default = StoreLimits()
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                parts.append(f"{f.name}={'none' if value is None else value}")
        return ",".join(parts)

    @classmethod
    def from_environment(cls, getenv: Callable[[str], str | None]) -> StoreLimits:
        """Limits from ``AIODIST_STORE_LIMITS`` as ``getenv`` sees it (defaults if unset)."""
        raw = getenv(LIMITS_ENV)
        if not raw:
            return cls()
        try:
            return cls.parse(raw)
        except ValueError as e:
            raise ValueError(f"{LIMITS_ENV}={raw!r}: {e}") from None


_SIZE = re.compile(r"(?i)^\s*([0-9]+)\s*(k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib|b)?\s*$")
_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024 * GiB}


def parse_size(raw: str, name: str = "size") -> int | None:
    """``"64MiB"`` -> 67108864; ``"none"`` -> None."""
    if raw.lower() in ("none", "off", "unlimited"):
        return None
    m = _SIZE.match(raw)
    if m is None:
        raise ValueError(f"{name}: {raw!r} is not a size (e.g. 4096, 256K, 64MiB, 2G or none)")
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _UNITS[unit]


def _parse_count(raw: str, name: str) -> int | None:
    if raw.lower() in ("none", "off", "unlimited"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not an integer") from None


def _parse_seconds(raw: str, name: str) -> float | None:
    if raw.lower() in ("none", "off", "never"):
        return None
    try:
        value = float(raw.rstrip("sS"))
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a number of seconds") from None
    return value


_NAMES: Final = frozenset(f.name for f in dataclasses.fields(StoreLimits))
_REQUIRED: Final = frozenset(
    {"max_connections", "max_handshakes", "max_key_bytes", "max_value_bytes", "handshake_timeout", "log_interval"}
)
_COUNTS: Final = frozenset({"max_connections", "max_handshakes"})
_INTEGERS: Final = _COUNTS | {
    "max_key_bytes", "max_value_bytes", "max_frame_bytes", "max_client_bytes", "max_total_bytes", "max_outbox_bytes",
    "max_waiter_bytes",
}
_PARSERS: Final[dict[str, Callable[[str, str], Any]]] = {
    name: (_parse_count if name in _COUNTS else parse_size if name in _INTEGERS else _parse_seconds)
    for name in sorted(_NAMES)
}
