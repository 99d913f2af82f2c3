"""A launch's job: what to run and how (:class:`LaunchConfig`) and how it ended (:class:`RankExit`, :class:`LaunchResult`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .outcome import Blame
from .status import failure_message

__all__ = ["LaunchConfig", "LaunchResult", "RankExit", "ON_FAILURE"]

ON_FAILURE = ("stop", "restart", "continue")


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """What to run and how. ``command`` is the complete argv of one rank (interpreter included)."""

    command: Sequence[str]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    """``None``: the launcher picks a free port, a new one for every attempt (single node only)."""
    max_restarts: int = 0
    on_failure: str = "stop"
    """What a rank's failure does: ``"stop"`` the others (with ``max_restarts`` > 0: restart), ``"restart"`` the
    whole job (up to ``max_restarts`` times), or ``"continue"``: the survivors run to their end."""
    run_id: str = "none"
    role: str = "default"
    """The ranks' ``ROLE_NAME`` (torchrun's ``--role``)."""
    grace_period: float = 5.0
    """Seconds between SIGTERM and SIGKILL when stopping ranks."""
    timeout: float | None = None
    """Limit on the whole job (all attempts), in seconds; ``None``: none."""
    prefix_output: bool = True
    """``False``: ranks inherit the launcher's stdout/stderr, unprefixed."""
    env: Mapping[str, str] | None = None
    """Base environment of the ranks; ``None``: the launcher's own."""
    cwd: str | None = None
    restart_base: int = 0
    """Restarts that happened before this launch (the elastic agent's earlier rounds): added to the
    restart count the ranks see."""
    reported_max_restarts: int | None = None
    """The TORCHELASTIC_MAX_RESTARTS / AIODIST_MAX_RESTARTS the ranks see; ``None``: ``max_restarts``. (The
    elastic agent runs each round as a launch that never restarts, under its own ``--max-restarts``.)"""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("command must not be empty")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.max_restarts < 0 or (self.reported_max_restarts or 0) < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {', '.join(ON_FAILURE)}, not {self.on_failure!r}")
        if self.on_failure == "continue" and self.max_restarts:
            raise ValueError("on_failure='continue' never restarts: max_restarts must be 0")
        if self.grace_period < 0:
            raise ValueError("grace_period must be >= 0")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be > 0")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("with nnodes > 1 every node must be given the same master_port")


@dataclass(frozen=True)
class RankExit:
    """How one rank of one attempt ended."""

    rank: int
    local_rank: int
    pid: int
    returncode: int

    @property
    def message(self) -> str:
        return failure_message(rank=self.rank, pid=self.pid, returncode=self.returncode)


@dataclass(frozen=True)
class LaunchResult:
    """The outcome of :func:`launch`. ``exit_code`` is what the launcher process should exit with."""

    exit_code: int
    attempts: int
    failures: tuple[RankExit, ...] = ()
    """Ranks of the last attempt that failed (stopped ones excepted); the root cause's first when it exited non-zero."""
    root_cause: Blame | None = None
    """The rank that started the failure of the last attempt, and how (see :mod:`aiodist.launch.outcome`)."""
    signal: int | None = None
    """The signal that interrupted the launcher, if one did."""
    timed_out: bool = False
    store_lost: bool = False
    """Elastic: the rendezvous store went away with the node that hosted it (no new round can be formed)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0
