"""The calling rank's environment variables: its own mapping in the simulator, else the process's.

A leaf (it imports nothing of aiodist): the network and the other low layers
read RANK, MASTER_ADDR... through :func:`getenv` without depending on
:mod:`aiodist.context`, which re-exports these.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Mapping

_env: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("aiodist_env", default=None)


def getenv(name: str, default: str | None = None) -> str | None:
    """Look ``name`` up in this rank's environment (the process env outside the simulator)."""
    env = _env.get()
    if env is not None:
        return env.get(name, default)
    return os.environ.get(name, default)


def rank_environ() -> Mapping[str, str]:
    """This rank's whole environment mapping."""
    env = _env.get()
    return env if env is not None else os.environ


def set_rank_environ(env: Mapping[str, str] | None) -> contextvars.Token[Mapping[str, str] | None]:
    """Give the current context its own environment (used by the simulator)."""
    return _env.set(None if env is None else dict(env))
