"""Describing how a rank ended (pure)."""

from __future__ import annotations

import signal as _signal

__all__ = ["describe_returncode", "signal_of", "launcher_exit_code", "failure_message"]


def signal_of(returncode: int) -> int | None:
    """The signal number that killed the process, from a subprocess-style return code (``-N``)."""
    return -returncode if returncode < 0 else None


def _signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_returncode(returncode: int) -> str:
    """``"exit code 1"`` or ``"signal SIGKILL (9)"``."""
    signum = signal_of(returncode)
    if signum is None:
        return f"exit code {returncode}"
    return f"signal {_signal_name(signum)} ({signum})"


def failure_message(*, rank: int, pid: int | None, returncode: int) -> str:
    """``"rank 2 (pid 1234) failed with exit code 1"`` / ``"... was killed by signal SIGKILL (9)"``."""
    who = f"rank {rank}" if pid is None else f"rank {rank} (pid {pid})"
    if signal_of(returncode) is None:
        return f"{who} failed with {describe_returncode(returncode)}"
    return f"{who} was killed by {describe_returncode(returncode)}"


def launcher_exit_code(returncode: int) -> int:
    """The launcher's own exit status for a failed rank: its exit code, or 128 + signal (shell convention)."""
    signum = signal_of(returncode)
    if signum is not None:
        return 128 + signum
    return returncode if 0 < returncode < 256 else 1
