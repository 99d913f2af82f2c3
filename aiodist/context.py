"""Per-rank context: the rank's environment (from :mod:`.rankenv`), its network and its default group.

In a real job one process is one rank, and these fall back to the process
environment and the TCP network. In the simulator N ranks share a process;
each virtual rank's tasks run in a copy of the context where these variables
are set, so nothing here is process-global state.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .rankenv import getenv, rank_environ, set_rank_environ

if TYPE_CHECKING:
    from .net.base import Network

__all__ = [
    "current_network", "get_default_group", "getenv", "new_rank_scope", "rank_environ", "rank_scope",
    "set_default_group", "set_network", "set_rank_environ", "set_token_source", "token_bytes",
]

_network: contextvars.ContextVar[Network | None] = contextvars.ContextVar("aiodist_network", default=None)
_scope: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("aiodist_rank_scope", default=None)
_entropy: contextvars.ContextVar[Callable[[int], bytes] | None] = contextvars.ContextVar("aiodist_entropy", default=None)

# The scope of the one rank a real process is. The simulator gives each virtual
# rank its own scope dict through ``_scope`` instead.
_process_scope: dict[str, Any] = {}

_tcp_network: Network | None = None


def token_bytes(n: int) -> bytes:
    """``n`` unpredictable bytes for the calling rank (nonces): ``os.urandom`` outside the simulator.

    The simulator gives each virtual rank a generator drawn from the run's
    seed (:func:`set_token_source`), so a run that authenticates still replays.
    """
    source = _entropy.get()
    return os.urandom(n) if source is None else source(n)


def set_token_source(source: Callable[[int], bytes] | None) -> contextvars.Token[Callable[[int], bytes] | None]:
    """Give the current context its own source of :func:`token_bytes` (used by the simulator)."""
    return _entropy.set(source)


def current_network() -> Network:
    """The network of the calling rank: the simulator's if set, else real TCP."""
    net = _network.get()
    if net is not None:
        return net
    global _tcp_network
    if _tcp_network is None:
        from .net.tcp import TCPNetwork

        _tcp_network = TCPNetwork()
    return _tcp_network


def set_network(net: Network | None) -> contextvars.Token[Network | None]:
    """Make ``net`` the network of the current context (used by the simulator)."""
    return _network.set(net)


def rank_scope() -> dict[str, Any]:
    """The calling rank's mutable scope (default group, group registry, counters).

    Every task of a rank sees the same dict, whenever it was created, so a
    default group set in one task is seen by all of the rank's tasks.
    """
    scope = _scope.get()
    return scope if scope is not None else _process_scope


def new_rank_scope() -> contextvars.Token[dict[str, Any] | None]:
    """Give the current context a fresh, empty rank scope (used by the simulator)."""
    return _scope.set({})


def get_default_group() -> Any:
    """The calling rank's default process group, or ``None``."""
    scope = _scope.get()  # (rank_scope(), inlined: every module-level collective asks)
    return (scope if scope is not None else _process_scope).get("default_group")


def set_default_group(group: Any) -> None:
    """Set (``None``: clear) the calling rank's default process group."""
    rank_scope()["default_group"] = group
