"""Latency models: how long a message's first byte takes to cross a link.

Each model samples from the generator it is given (the run's seeded "net"
stream), never from the global one. :class:`Tail` is not a model of its own:
it adds a rare long delay on top of whichever model a link has.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


def finite(v: object) -> bool:
    """Whether ``v`` is a finite real number (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _seconds(model: object, **values: float) -> None:
    """ValueError unless every one of ``values`` is a finite number of seconds >= 0."""
    for name, v in values.items():
        if not finite(v) or v < 0:
            raise ValueError(f"{type(model).__name__}: {name} must be a finite number of seconds >= 0, got {v!r}")


@dataclass(frozen=True, slots=True)
class Constant:
    """Always ``value`` seconds."""

    value: float

    def __post_init__(self) -> None:
        _seconds(self, value=self.value)

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

    def __post_init__(self) -> None:
        _seconds(self, low=self.low, high=self.high)
        if self.low > self.high:
            raise ValueError(f"Uniform needs low <= high, got {self!r}")

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

    def __post_init__(self) -> None:
        _seconds(self, mean_extra=self.mean_extra, minimum=self.minimum)

    def sample(self, rng: random.Random) -> float:
        return self.minimum + rng.expovariate(1.0 / self.mean_extra) if self.mean_extra > 0 else self.minimum

    @property
    def mean(self) -> float:
        return self.minimum + self.mean_extra


LatencyModel = Constant | Uniform | Exponential


@dataclass(frozen=True, slots=True)
class Tail:
    """With probability ``p`` a message is delayed by an extra log-uniform amount in [``low``, ``high``] seconds.

    Real latency has a tail (scheduling, a GC pause, a retransmission): a
    band such as ``Uniform(50e-6, 150e-6)`` never reorders two events more
    than its width apart, a tail does. Log-uniform: each decade between
    ``low`` and ``high`` is as likely as the next. ``budget`` bounds the
    delays added up (a message-heavy program would otherwise pay a tail in
    almost every step).
    """

    p: float
    low: float
    high: float
    budget: float | None = None
    """At most this many seconds of extra delay in all (then no more tails): None, no bound."""

    def __post_init__(self) -> None:
        if (not 0.0 <= self.p <= 1.0 or not 0.0 < self.low <= self.high or not math.isfinite(self.high)
                or (self.budget is not None and not self.budget >= 0)):
            raise ValueError(f"Tail needs 0 <= p <= 1, 0 < low <= high and budget >= 0, got {self!r}")

    def to_cli(self) -> str:
        return f"{self.p!r}:{self.low!r}:{self.high!r}" + (f":{self.budget!r}" if self.budget is not None else "")

    @classmethod
    def parse(cls, spec: str) -> Tail:
        """``P:LOW:HIGH[:BUDGET]`` (seconds)."""
        p, low, high, *budget = (float(x) for x in spec.split(":"))
        return cls(p, low, high, budget[0] if budget else None)


def as_model(value: float | LatencyModel) -> LatencyModel:
    """Accept a plain number of seconds as a :class:`Constant`."""
    if isinstance(value, (Constant, Uniform, Exponential)):
        return value
    return Constant(float(value))
