"""The launcher: ``aiodist run`` (child processes with torchrun's environment) and ``aiodist.spawn``.

Modules: :mod:`.env` (the variables a rank gets), :mod:`.program` (how a
program file is started), :mod:`.prefix` (rank-prefixed output lines),
:mod:`.status` (describing exits), :mod:`.job` (a launch's configuration and
result), :mod:`.supervisor` (attempts, restarts, signals and the root cause),
:mod:`.attempt` (one start of the ranks: processes, output, stopping), :mod:`.spawn` (the same from Python), :mod:`.cli` (the ``run``
subcommand), :mod:`.runner` (running a sync or async entry function).
"""

from __future__ import annotations

from .cli import add_cli, build_command, main, run_command
from .env import rank_env
from .program import ProgramKind, classify_source
from .spawn import spawn
from .supervisor import LaunchConfig, LaunchResult, RankExit, free_port, launch

__all__ = [
    "LaunchConfig",
    "LaunchResult",
    "ProgramKind",
    "RankExit",
    "add_cli",
    "build_command",
    "classify_source",
    "free_port",
    "launch",
    "main",
    "rank_env",
    "run_command",
    "spawn",
]
