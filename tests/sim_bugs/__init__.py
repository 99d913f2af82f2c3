"""Small programs with a classic synchronization bug each, and their fixed twins (see CATALOG).

Each module holds ``buggy`` and ``fixed``: ``async def`` programs of the
public aiodist API, written the way a user would, that run unchanged under
``aiodist run`` and ``python -m sim run``. The simulator must find every bug
by itself: timing bugs under plain ``sim.run`` defaults, restart and
partition bugs under ``faults=[sim.Swarm()]``; a fixed twin must pass every
seed, also under a swarm of the fault kind it was fixed for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from . import (
    any_source,
    barrier_reuse,
    blind_a,
    blind_b,
    blind_c,
    blind_d,
    blind_e,
    causal_order,
    check_then_act,
    lease,
    lost_update,
    lost_wakeup,
    restart_amnesia,
    split_brain,
    tight_timeout,
    variants,
)

Program = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class BugClass:
    name: str
    buggy: Program
    fixed: Program
    world_size: int
    swarm: frozenset[str] | None = None  # the fault kinds it needs (None: timing alone finds it)
    store_host: str = "rank0"
    symptom: str = "AssertionError"  # how the bug shows: the first failure's exception type
    marker: str = ""  # and a text its message holds (the program's own words), if any

    def is_the_bug(self, result: Any) -> bool:
        """The run failed, and the way this bug fails (not, say, because a swarm crashed the store)."""
        if not result.failures:
            return False
        message = result.failures[0].message
        return message.startswith(self.symptom) and self.marker in message


CATALOG = [
    BugClass("lost_update", lost_update.buggy, lost_update.fixed, 3),
    BugClass("check_then_act", check_then_act.buggy, check_then_act.fixed, 4),
    BugClass("lease_without_fencing", lease.buggy, lease.fixed, 3),
    BugClass("lost_wakeup", lost_wakeup.buggy, lost_wakeup.fixed, 2, symptom="StoreTimeoutError"),
    BugClass("causal_order", causal_order.buggy, causal_order.fixed, 3),
    BugClass("any_source_order", any_source.buggy, any_source.fixed, 3),
    BugClass("tight_receive_timeout", tight_timeout.buggy, tight_timeout.fixed, 2),
    BugClass("barrier_reuse", barrier_reuse.buggy, barrier_reuse.fixed, 3),
    BugClass("restart_amnesia", restart_amnesia.buggy, restart_amnesia.fixed, 3, frozenset({"restart"})),
    BugClass("split_brain", split_brain.buggy, split_brain.fixed, 3, frozenset({"partition"})),
]
"""The ten classes of the simulator's bug-finding promise (issue: "the simulator finds the bugs by itself")."""

VARIANTS = [
    BugClass("lost_update/queue", variants.ledger_buggy, variants.ledger_fixed, 4),
    BugClass("check_then_act/lock", variants.lock_buggy, variants.lock_fixed, 3),
    BugClass("any_source_order/gather", variants.gather_buggy, variants.gather_fixed, 4),
    BugClass("restart_amnesia/appends", variants.journal_buggy, variants.journal_fixed, 4, frozenset({"restart"})),
    BugClass("lost_wakeup/remote", variants.remote_wakeup_buggy, variants.remote_wakeup_fixed, 3,
             symptom="StoreTimeoutError"),
    BugClass("tight_receive_timeout/ask", variants.ask_buggy, variants.ask_fixed, 2),
    BugClass("split_brain/store", variants.store_leader_buggy, variants.store_leader_fixed, 3,
             frozenset({"partition"})),
]
"""Second programs of a few classes, written differently, to check that the exploration is not tuned to CATALOG."""


def _blind() -> list[BugClass]:
    """The programs of blind_a to blind_e (their own tables: world sizes, symptoms, swarm kinds)."""
    out = []
    for name, cls in blind_a.PROGRAMS.items():
        symptom = "StoreTimeoutError" if name == "job_board" else "AssertionError"
        out.append(BugClass(f"{cls.replace(' ', '_')}/blind_{name}", getattr(blind_a, name),
                            getattr(blind_a, f"{name}_fixed"), blind_a.WORLD[name], blind_a.SWARM_KINDS.get(name),
                            symptom=symptom, marker=blind_a.SYMPTOM[name]))
    for name, world in blind_b.PROGRAMS.items():
        swarm = frozenset({"partition"}) if name.startswith("split_brain") else None
        # (barrier_flags_reused: a rank that missed a deleted flag waits in the barrier until its store wait times out)
        symptom, marker = ("StoreTimeoutError", "ready/") if name == "barrier_flags_reused" else ("AssertionError", "")
        out.append(BugClass(f"blind_{name}", getattr(blind_b, name), getattr(blind_b, f"{name}_fixed"), world,
                            swarm, symptom=symptom, marker=marker))
    # (blind_c, blind_d and blind_e: the same tables, one module each)
    for prefix, mod in (("blind_c", blind_c), ("blind_d", blind_d), ("blind_e", blind_e)):
        for name in mod.PROGRAMS:
            symptom, marker = mod.SYMPTOM[name]
            out.append(BugClass(f"{prefix}_{name}", getattr(mod, name), getattr(mod, f"{name}_fixed"),
                                mod.WORLD[name], mod.SWARM_KINDS.get(name), symptom=symptom, marker=marker))
    return out


BLIND = _blind()
"""Programs of every class written from the outside (without reading the ones above): a check that the
exploration finds what it was not tuned on."""
