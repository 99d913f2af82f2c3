"""The key-value store: a server, a TCP client, an in-process store and prefixed views."""

from .base import Store
from .client import TCPStore
from .limits import StoreLimits
from .memory import MemoryStore
from .prefix import PrefixStore
from .server import StoreServer

HashStore = MemoryStore
"""torch's name for a store living in one process."""

__all__ = ["HashStore", "MemoryStore", "PrefixStore", "Store", "StoreLimits", "StoreServer", "TCPStore"]
