"""sim: run an unchanged aiodist program as N virtual ranks on a virtual clock.

>>> import sim
>>> result = sim.run(main, world_size=8, seed=3, network=sim.Network(latency=1e-4), faults=[sim.Crash(2, at=1.0)])
>>> result.ok, result.virtual_time, result.digest, result.rank_results, result.failures

See :mod:`sim.loop` (the deterministic loop), :mod:`sim.network` (the
simulated network), :mod:`sim.faults` and :mod:`sim.runner`.
"""

from .errors import (SimDeadlockError, SimLivelockError, SimTimeLimitError, SimulationError, SimUnsupportedError,
                     SweepWorkerError)
from .chaos import Chaos
from .explore import Exploration, replay_plan
from .faults import Clog, Crash, CrashStore, FaultError, Partition, Pause, ResetConnection, Restart, Straggler
from .latency import Constant, Exponential, Tail, Uniform
from .loop import SimLoop
from .network import Network
from .process import VIRTUAL_EPOCH
from .result import Failure, Result
from .runner import run
from .shrink import Shrunk, shrink, signature
from .swarm import Swarm
from .sweep import SweepInterrupted, SweepReport, sweep
from .sweep_file import SweepFileError
from .trace import TraceEvent
from .triggers import MessageReceived, MessageSent

__all__ = [
    "run", "sweep", "SweepReport", "Result", "Failure", "Network", "Constant", "Uniform", "Exponential", "Tail",
    "SimLoop", "TraceEvent",
    "Chaos", "Crash", "Restart", "Pause", "Straggler", "CrashStore", "Partition", "Clog", "ResetConnection",
    "FaultError", "Exploration", "replay_plan", "Swarm", "shrink", "Shrunk", "signature",
    "MessageSent", "MessageReceived", "VIRTUAL_EPOCH",
    "SimulationError", "SimUnsupportedError", "SimDeadlockError", "SimTimeLimitError", "SimLivelockError",
    "SweepWorkerError", "SweepFileError", "SweepInterrupted",
]
