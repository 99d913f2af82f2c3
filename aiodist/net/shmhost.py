"""Which network a rank uses: this host's identity, the transport mode, and the choice.

Two ranks share a host when their *host ids* are equal: a hash of the host
name and the kernel's boot id (``/proc/sys/kernel/random/boot_id``), so a
machine that rebooted, or another machine with the same name, is another
host. ``AIODIST_HOST_ID`` overrides it (tests fake several hosts on one
machine that way).

The transport mode is ``"auto"`` (shared memory with ranks of this host, TCP
with the others: the default) or ``"tcp"`` (TCP with everyone). It comes from
``init_process_group(transport=...)``, else ``AIODIST_TRANSPORT``, else
``"auto"``. The simulator's network is never replaced: it models the network
on its own.
"""

from __future__ import annotations

import functools
import hashlib
import socket

from ..context import getenv
from .base import Network
from .shmnet import HostNetwork
from .tcp import TCPNetwork

__all__ = ["MODES", "TRANSPORT_ENV", "HOST_ID_ENV", "host_id", "transport_mode", "choose_network", "is_real_network", "uses_shared_memory"]

MODES = ("auto", "tcp")
TRANSPORT_ENV = "AIODIST_TRANSPORT"
HOST_ID_ENV = "AIODIST_HOST_ID"


@functools.lru_cache(maxsize=1)
def _machine_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    digest = hashlib.sha256(f"{socket.gethostname()}\0{boot}".encode()).hexdigest()
    return digest[:16]


def host_id() -> str:
    """This rank's host id: ``AIODIST_HOST_ID`` if set, else a hash of the host name and boot id."""
    override = getenv(HOST_ID_ENV)
    if override:
        return override.replace("/", "_")[:48]
    return _machine_id()


def transport_mode(mode: str | None = None) -> str:
    """The transport mode: ``mode`` if given, else ``AIODIST_TRANSPORT``, else ``"auto"``.

    ValueError names the accepted values when the given or configured one is unknown.
    """
    source = "transport="
    if mode is None:
        mode, source = getenv(TRANSPORT_ENV) or "auto", f"{TRANSPORT_ENV}="
    value = mode.strip().lower()
    if value not in MODES:
        raise ValueError(f"{source}{mode!r} is not a transport mode; use one of {', '.join(MODES)}")
    return value


def choose_network(base: Network, *, mode: str | None = None) -> Network:
    """The network a rank should use given its ``base`` network and the transport ``mode``.

    Real TCP in mode ``"auto"`` becomes a :class:`~aiodist.net.shm.HostNetwork`
    (shared memory with the processes of this host, TCP with the others);
    anything else (mode ``"tcp"``, the simulator's network) is returned as it is.
    """
    chosen = transport_mode(mode)
    if chosen == "tcp" or not isinstance(base, TCPNetwork):
        return base
    return HostNetwork(base, host_id=host_id())


def is_real_network(net: Network) -> bool:
    """True for the networks of real processes (TCP, with or without shared memory), not the simulator's."""
    return isinstance(net, (HostNetwork, TCPNetwork))


def uses_shared_memory(net: Network) -> bool:
    """True when ``net`` reaches the processes of its host through shared memory."""
    return isinstance(net, HostNetwork)
