"""The network seam (see :mod:`aiodist.net.base`) and its TCP implementation."""

from .base import Address, Connection, Frame, Listener, Network, PayloadSink
from .tcp import TCPConnection, TCPListener, TCPNetwork

__all__ = ["Address", "Connection", "Frame", "Listener", "Network", "PayloadSink", "TCPConnection", "TCPListener", "TCPNetwork"]
