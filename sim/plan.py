"""A run's fault plan: the world it is checked against, generators expanded, every fault validated.

Generators (``Chaos``, ``Swarm``) draw concrete faults from the seed
(:func:`expand`); every concrete fault must name only hosts the world has
(:func:`validate`), or the run does not start: a fault that silently does
nothing is a test that silently tests nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .explore import budget_of
from .faults import Fault, FaultError, HostRef
from .storehost import STORE_HOST


@dataclass(frozen=True)
class World:
    """What faults are drawn for and checked against: the seed, the ranks, the store's host, the failure detector."""

    seed: int | str
    world_size: int
    store_separate: bool
    detector: tuple[float, int] | None  # the ranks' heartbeat (interval, misses) from their environment

    @property
    def budget(self) -> float:
        """Seconds of silence the failure detector tolerates (see :func:`sim.explore.budget_of`)."""
        return budget_of(self.detector)[0]

    @property
    def hosts(self) -> tuple[str, ...]:
        ranks = tuple(f"rank{r}" for r in range(self.world_size))
        return (*ranks, STORE_HOST) if self.store_separate else ranks

    def check_host(self, fault: object, ref: HostRef) -> None:
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            raise FaultError(fault, f"{ref!r} is not a rank (int) or a host name (str)")
        if isinstance(ref, int):
            if not 0 <= ref < self.world_size:
                raise FaultError(fault, f"names rank {ref}, which is outside the world (ranks 0-{self.world_size - 1})")
            return
        if ref in self.hosts:
            return
        if ref == STORE_HOST:
            raise FaultError(fault, "names host 'store', which exists only with store_host='separate' "
                                    "(the store runs on rank 0's host: use rank 0, or CrashStore)")
        raise FaultError(fault, f"names host {ref!r}, which does not exist (hosts: "
                                f"{', '.join(self.hosts[:3])}{', ...' if len(self.hosts) > 3 else ''})")


def expand(faults: Sequence[Any], world: World) -> list[Fault]:
    """Every fault, generators (anything with ``expand(world)``) replaced by what they draw for this world."""
    out: list[Fault] = []
    for fault in faults:
        drawer = getattr(type(fault), "expand", None)  # (Chaos, Swarm)
        out.extend(drawer(fault, world) if drawer is not None else [fault])
    return out


def validate(faults: Iterable[Fault], world: World) -> None:
    """Raise :class:`~sim.faults.FaultError` for the first fault that names a host the world does not have."""
    for fault in faults:
        hosts = getattr(type(fault), "hosts", None)
        if hosts is None or not hasattr(fault, "install"):
            raise FaultError(fault, "is not a fault (sim.Crash, sim.Partition, ...: see sim.faults)")
        for ref in hosts(fault):
            world.check_host(fault, ref)
