"""The peer transport: connections between ranks, routing, and the Channel of a group's operations.

* :mod:`.router` -- pure matching of incoming messages to posted receives;
* :mod:`.transport` -- one rank's connections (lazy, one per pair, hello with job id);
* :mod:`.channel` -- a group's numbering and the Channel one operation runs over.
"""

from .channel import GroupComm, OpChannel
from .router import Delivery, Receive, Router
from .transport import Transport

__all__ = ["Delivery", "GroupComm", "OpChannel", "Receive", "Router", "Transport"]
