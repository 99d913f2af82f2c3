"""Errors raised by the simulator itself (not by the simulated program)."""

from __future__ import annotations

from aiodist.errors import AiodistError


class SimulationError(AiodistError):
    """Base class of errors about the simulation (misuse, deadlock, time limit)."""


class SimUnsupportedError(SimulationError, RuntimeError):
    """The simulated program used something that has no virtual-time model.

    Real sockets, threads, executors, subprocesses, file-descriptor readers,
    signal handlers: they would read the wall clock or the real network and
    break determinism, so the simulated loop refuses them loudly.
    ``.operation`` names the loop method (or other function) that was called; ``message``: what to say
    instead of the loop's standard text.
    """

    def __init__(self, operation: str, message: str | None = None) -> None:
        super().__init__(message or (
            f"loop.{operation}() is not available inside the simulator: it would touch real "
            "sockets, threads, processes or the wall clock. Use aiodist's network seam "
            "(aiodist.context.current_network()) and asyncio timers instead."
        ))
        self.operation = operation


class SweepWorkerError(SimulationError):
    """A sweep's worker failed to run a seed (it died: out of memory, killed; or the simulator itself failed).

    ``.seeds``: the seeds whose runs were lost with it (run each alone to see which one, e.g. ``--seed N``);
    the records already written stay, so a sweep with ``out=`` resumes after them.
    """

    def __init__(self, seeds: list[int], error: BaseException) -> None:
        super().__init__(f"the sweep lost its worker running seed(s) {', '.join(map(str, seeds))}: "
                         f"{type(error).__name__}: {error or 'no detail'} (a worker that died: out of memory "
                         "or killed?); run a seed alone to see which one")
        self.seeds = seeds


class SimDeadlockError(SimulationError):
    """Nothing is ready and no timer is pending, yet the awaited work is not done."""


class SimTimeLimitError(TimeoutError, SimulationError):
    """Virtual time reached the run's time limit. ``.time_limit`` holds it."""

    def __init__(self, time_limit: float) -> None:
        super().__init__(f"virtual time limit of {time_limit:g}s reached")
        self.time_limit = time_limit


class SimLivelockError(SimTimeLimitError):
    """Virtual time stopped advancing: ``.steps`` callbacks ran at one instant (e.g. a ``sleep(0)`` spin)."""

    def __init__(self, steps: int, at: float) -> None:
        SimulationError.__init__(
            self, f"livelock: {steps} callbacks ran at virtual time {at:.6f}s without the clock advancing"
        )
        self.time_limit = at
        self.steps = steps
