"""``Chaos``: a fixed number of random faults per kind, drawn from the seed (the older, simpler cousin of ``Swarm``).

``Chaos(crashes=1, partitions=2, window=(0, 5))`` draws exactly that many
concrete faults at times in the window; :class:`sim.Swarm` draws a whole
destructive plan per seed, kinds switched on and off (see :mod:`sim.swarm`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .faults import Clog, Crash, Fault, Partition, ResetConnection, Straggler

if TYPE_CHECKING:
    from .plan import World

@dataclass(frozen=True)
class Chaos:
    """Random faults drawn from the run's seed (FoundationDB/VOPR style): same seed, same faults.

    Draws ``crashes`` crashes, ``partitions`` partitions (random halves, healed
    after up to ``max_duration``), ``clogs`` clogged links, ``resets``
    connection resets and ``stragglers`` slow ranks (x2..x10), at times
    uniform in ``window``. Ranks in ``spare`` are never crashed (rank 0 hosts
    the store by default). The concrete faults are listed in
    ``Result.faults`` and marked in the trace.
    """

    crashes: int = 0
    partitions: int = 0
    clogs: int = 0
    resets: int = 0
    stragglers: int = 0
    window: tuple[float, float] = (0.0, 1.0)
    max_duration: float = 1.0
    spare: tuple[int, ...] = (0,)

    def draw(self, seed: int | str, world_size: int) -> list[Fault]:
        """The concrete faults for ``seed`` (pure: no simulation needed)."""
        rng = random.Random(f"{seed}:chaos")
        lo, hi = self.window
        ranks = list(range(world_size))
        victims = [r for r in ranks if r not in self.spare]
        out: list[Fault] = []

        def when() -> float:
            return round(lo + (hi - lo) * rng.random(), 6)

        def duration() -> float:
            return round(self.max_duration * rng.random(), 6)

        for _ in range(self.crashes):
            if victims:
                out.append(Crash(victims.pop(rng.randrange(len(victims))), at=when()))
        if world_size >= 2:
            for _ in range(self.partitions):
                shuffled = ranks[:]
                rng.shuffle(shuffled)
                cut = rng.randrange(1, world_size)
                at = when()
                out.append(Partition(tuple(sorted(shuffled[:cut])), tuple(sorted(shuffled[cut:])), at=at,
                                     heal_at=round(at + duration(), 6), one_way=rng.random() < 0.25))
            for _ in range(self.clogs):
                a, b = rng.sample(ranks, 2)
                at = when()
                out.append(Clog((a, b), at=at, until=round(at + duration(), 6)))
            for _ in range(self.resets):
                a, b = rng.sample(ranks, 2)
                out.append(ResetConnection(a, b, at=when()))
        for _ in range(self.stragglers):
            out.append(Straggler(rng.choice(ranks), float(rng.randint(2, 10)), at=when()))
        return out

    def expand(self, world: World) -> list[Fault]:
        """What the run gets: the faults drawn for its seed."""
        return self.draw(world.seed, world.world_size)

    def to_cli(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("crashes", "partitions", "clogs", "resets", "stragglers")
                 if getattr(self, k)]
        parts.append(f"window={self.window[0]!r}:{self.window[1]!r}")
        if self.max_duration != 1.0:
            parts.append(f"max_duration={self.max_duration!r}")
        if self.spare != (0,):
            parts.append(f"spare={'/'.join(str(r) for r in self.spare)}")
        return f"--chaos {','.join(parts)}"


def parse_chaos(spec: str) -> Chaos:
    """``crashes=1,partitions=2,clogs=1,resets=1,stragglers=1,window=0:5,max_duration=2,spare=0/1``."""
    kw: dict[str, object] = {}
    for item in spec.split(","):
        if not item:
            continue
        key, _, value = item.partition("=")
        if key in ("crashes", "partitions", "clogs", "resets", "stragglers"):
            kw[key] = int(value)
        elif key == "window":
            a, b = value.split(":", 1)
            kw[key] = (float(a), float(b))
        elif key == "max_duration":
            kw[key] = float(value)
        elif key == "spare":
            kw[key] = tuple(int(r) for r in value.split("/") if r)
        else:
            raise ValueError(f"unknown --chaos option {key!r}")
    return Chaos(**kw)  # type: ignore[arg-type]
