"""Latency models: how long a message's first byte takes to cross a link.

Each model samples from the generator it is given (the run's seeded "net"
stream), never from the global one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Constant:
    """Always ``value`` seconds."""

    value: float

    def sample(self, rng: random.Random) -> float:
        return self.value

    @property
    def mean(self) -> float:
        return self.value


@dataclass(frozen=True, slots=True)
class Uniform:
    """Uniform in [low, high] seconds."""

    low: float
    high: float

    def sample(self, rng: random.Random) -> float:
        return self.low + (self.high - self.low) * rng.random()

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class Exponential:
    """``minimum`` plus an exponential tail of the given mean (seconds)."""

    mean_extra: float
    minimum: float = 0.0

    def sample(self, rng: random.Random) -> float:
        return self.minimum + rng.expovariate(1.0 / self.mean_extra) if self.mean_extra > 0 else self.minimum

    @property
    def mean(self) -> float:
        return self.minimum + self.mean_extra


LatencyModel = Constant | Uniform | Exponential


def as_model(value: float | LatencyModel) -> LatencyModel:
    """Accept a plain number of seconds as a :class:`Constant`."""
    if isinstance(value, (Constant, Uniform, Exponential)):
        return value
    return Constant(float(value))
