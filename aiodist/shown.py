"""A peer's values as text for errors and log lines, safely: cut short, however deep their nesting.

What a peer sends (a frame's fields, a handshake's) is untrusted input: ``repr`` of
a list nested a thousand deep raises RecursionError, and a long string would
flood the log. Every message that quotes a peer's value goes through these.
"""

from __future__ import annotations

import reprlib
from typing import Any, Final

MAX_TEXT: Final = 300
"""Characters kept of a peer's text (a failure's cause, a refusal's reason, a mismatch report) in errors and logs."""

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother = 3, 120, 120


def shown(value: Any, limit: int = MAX_TEXT) -> str:
    """A peer's value as text for an error or a log line: at most ``limit`` characters, whatever its nesting."""
    text = value if type(value) is str else _SHOW.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def first_few(items: list[str], limit: int = 8) -> str:
    """The repr of at most ``limit`` of ``items``, and how many more (keys of a call: a wait on 20,000 keys made
    a 260 kB message)."""
    return repr(items) if len(items) <= limit else f"{items[:limit]!r} and {len(items) - limit} more"


def brief(value: Any) -> str:
    """A peer's value's repr, cut short (strings to 120 characters, 3 levels of nesting): for ids and keys."""
    return _SHOW.repr(value)
