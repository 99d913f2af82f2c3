"""What ``aiodist run`` and the simulator's ``python -m sim run`` share: the default number of ranks and the output prefix.

Both runners start the same program file, so they agree on these: a program
run without ``-n`` gets the same number of ranks under either, and each line a
rank prints is tagged the same way (torchrun's ``[rank0]: `` format, which
torch users and their log filters already know).
"""

from __future__ import annotations

__all__ = ["DEFAULT_NPROC", "rank_tag"]

DEFAULT_NPROC = 4
"""Ranks started when ``-n`` is not given (``aiodist run`` and ``python -m sim run``)."""


def rank_tag(rank: int) -> str:
    """The prefix of ``rank``'s output lines: ``"[rank2]: "``."""
    return f"[rank{rank}]: "
