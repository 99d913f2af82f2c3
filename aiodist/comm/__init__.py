"""The peer transport: connections between ranks, routing, and the Channel of a group's operations.

* :mod:`.router` -- matching incoming messages to posted receives: the driver of
  :mod:`.routing` (the pure tables, with :mod:`.p2p_routing`, :mod:`.admission`
  and :mod:`.failures`), which resolves the receives they end; records in :mod:`.receives`;
* :mod:`.transport` -- one rank's connections (lazy, one per pair, hello with job id);
* :mod:`.channel` -- a group's numbering and the Channel one operation runs over.
"""

from .channel import GroupComm, OpChannel
from .router import Delivery, Receive, Router
from .transport import Transport

__all__ = ["Delivery", "GroupComm", "OpChannel", "Receive", "Router", "Transport"]
