"""Choosing the event loop: uvloop when available, unless disabled.

aiodist works on any asyncio loop. :func:`run` is ``asyncio.run`` with uvloop
installed when it can be (set ``AIODIST_NO_UVLOOP=1`` to keep the default loop).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """True when uvloop is importable and not disabled by ``AIODIST_NO_UVLOOP``."""
    if os.environ.get("AIODIST_NO_UVLOOP", "") not in ("", "0"):
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory :func:`run` uses (``None``: asyncio's default)."""
    if not uvloop_enabled():
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """Run ``main`` to completion on a fresh loop (uvloop when enabled)."""
    with asyncio.Runner(debug=debug, loop_factory=loop_factory()) as runner:
        return runner.run(main)
