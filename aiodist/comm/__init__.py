"""The peer transport: connections between ranks, routing, and the Channel of a group's operations.

* :mod:`.transport` -- one rank's transport: sending, routing frames, the groups' books;
* :mod:`.peers` -- its links to the other ranks, driven (dial, accept, read);
* :mod:`.links` -- what a link's events mean: a pure state machine (:mod:`.actions`: its outputs);
* :mod:`.handshake` / :mod:`.connect` -- a connection's authenticated handshake, and its I/O;
* :mod:`.detector` / :mod:`.heartbeats` -- the failure detector, and the timer that runs it;
* :mod:`.frames` -- every frame and wire key of a rank link;
* :mod:`.router` -- matching incoming messages to posted receives: the driver of
  :mod:`.routing` (the pure tables, with :mod:`.op_book`, :mod:`.p2p_routing`,
  :mod:`.admission` and :mod:`.failures`), which resolves the receives they end; records in :mod:`.receives`;
* :mod:`.registry`, :mod:`.mismatch_reports`, :mod:`.settings` -- groups and p2p numbers, mismatch reports, settings;
* :mod:`.channel` -- a group's numbering and the Channel one operation runs over.
"""

from .channel import GroupComm, OpChannel
from .router import Delivery, Receive, Router
from .transport import Transport

__all__ = ["Delivery", "GroupComm", "OpChannel", "Receive", "Router", "Transport"]
