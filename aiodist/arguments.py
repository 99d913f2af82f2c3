"""torch.distributed's ways of passing arguments, turned into aiodist's: timeouts, renamed keywords, roots, backends.

Pure helpers (no I/O) used by the module-level API (:mod:`aiodist.api`,
:mod:`aiodist.operations`) so that a call written for torch.distributed means
the same here:

* a timeout is seconds (int or float) or a :class:`datetime.timedelta`;
* a keyword that torch and aiodist name differently (``tensor=`` / ``x=``)
  may be given under either name, not both;
* a root is a global rank (``src=``/``dst=``) or a rank of the group
  (``group_src=``/``group_dst=``), not both;
* a backend name is one torch knows (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``...):
  recorded for :func:`aiodist.get_backend`; every backend runs over aiodist's own transport.
"""

from __future__ import annotations

import datetime
import numbers
from typing import Any

from .errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["MISSING", "BACKENDS", "Backend", "backend_name", "either", "is_backend", "seconds"]


class _Missing:
    """The default of a parameter that may be given under another name instead."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


def seconds(timeout: Any, what: str = "timeout") -> float:
    """``timeout`` in seconds: a number, or a :class:`datetime.timedelta` (torch's form)."""
    t = type(timeout)
    if t is float or t is int:  # (the usual case, without the ABC check below)
        return float(timeout)
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        return float(timeout)  # (numpy numbers too; not a bool, not a str: "5" was taken as 5 s)
    raise InvalidArgumentTypeError(
        f"{what} must be a number of seconds or a datetime.timedelta, not {type(timeout).__name__}"
    )


def port_number(port: Any, what: str, *, any_free: bool) -> int:
    """``port`` checked: an int in 1..65535, or 0 too when ``any_free`` (listening: the OS picks a free one)."""
    if isinstance(port, bool) or not isinstance(port, numbers.Integral):
        raise InvalidArgumentTypeError(f"{what}: port must be an int, not {type(port).__name__}")
    low, number = (0 if any_free else 1), int(port)
    if not low <= number <= 65535:
        raise InvalidArgumentError(f"{what}: port must be in {low}..65535, got {number}")
    return number


def optional_seconds(timeout: Any, what: str = "timeout") -> float | None:
    return None if timeout is None else seconds(timeout, what)


def either(fn: str, value: Any, name: str, alias_value: Any, alias: str, *, required: bool = True) -> Any:
    """The argument given as ``name`` or as its other spelling ``alias`` (TypeError for both, or neither if required)."""
    if value is MISSING:
        if alias_value is MISSING:
            if required:
                raise InvalidArgumentTypeError(f"{fn}() missing required argument: {name!r}")
            return None
        return alias_value
    if alias_value is not MISSING:
        raise InvalidArgumentTypeError(f"{fn}() got {name!r} and {alias!r}: they are the same argument, pass one")
    return value


def root(fn: str, pg: Any, global_rank: Any, group_rank: Any, what: str, default: int | None = 0) -> int:
    """The group rank of a root given as a global rank (``src``) or a group rank (``group_src``); torch's rules.

    Neither given: global rank ``default`` (None: an error, as torch's send requires a destination).
    """
    if group_rank is not None:
        if global_rank is not None:
            raise InvalidArgumentError(f"{fn}(): pass {what}= (a global rank) or group_{what}= (a rank of the group), not both")
        return _in_group(pg, group_rank, f"group_{what}", what)
    if global_rank is None:
        if default is None:
            raise InvalidArgumentError(f"{fn}(): pass {what}= (a global rank) or group_{what}= (a rank of the group)")
        global_rank = default
    return _local(pg, global_rank, what)


def _in_group(pg: Any, group_rank: Any, argument: str, what: str) -> int:
    """``group_rank`` (passed as ``argument``, ``group_src``/``group_dst``) checked against ``pg``'s size; the
    error names that argument (the group's own check knows it only as ``src``/``dst``)."""
    from .errors import InvalidRankError

    group_rank = _int_rank(group_rank, f"{argument} must be an int rank (a rank of the group)")
    size: int = pg.size
    if not 0 <= group_rank < size:
        raise InvalidRankError(
            f"{argument}={group_rank} is out of range for {with_ranks(pg.name, pg.ranks)} of {size} ranks "
            f"({argument} is a rank of the group, 0 to {size - 1}; {what}= takes a global rank)",
            rank=group_rank,
            size=size,
            argument=argument,
        )
    return int(group_rank)


def _int_rank(value: Any, must: str) -> int:
    """``value`` as an int (numpy integers too; not a bool), else InvalidArgumentTypeError saying ``must``."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import operator

            return operator.index(value)  # numpy integers
        except TypeError:
            raise InvalidArgumentTypeError(f"{must}, not {type(value).__name__}") from None
    return value


def _local(pg: Any, global_rank: Any, what: str) -> int:
    from .errors import InvalidRankError

    global_rank = _int_rank(global_rank, f"{what} must be an int rank")
    r: int = pg.group_rank(global_rank)
    if r < 0:
        raise InvalidRankError(
            f"{what}={global_rank} is not a member of {with_ranks(pg.name, pg.ranks)}",
            rank=global_rank,
            size=pg.size,
            argument=what,
        )
    return r


# ---------------------------------------------------------------------- backends


class Backend(str):
    """A backend name as torch spells it (``Backend.GLOO == "gloo"``); ``Backend("GLOO")`` is ``"gloo"``.

    aiodist has one transport (its own, over TCP or the simulator's network):
    the name is recorded for :func:`aiodist.get_backend` and changes nothing.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"Backend name must be a string, not {type(name).__name__}")
        return super().__new__(cls, backend_name(name))


BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl", "undefined", "aiodist")
"""Backend names torch programs pass (alone, or per device as in ``"cpu:gloo,cuda:nccl"``)."""


def is_backend(name: Any) -> bool:
    """Whether ``name`` is a backend name (as opposed to an init method such as ``"env://"``)."""
    if not isinstance(name, str) or "://" in name:
        return False
    try:
        backend_name(name)
    except ValueError:
        return False
    return True


def backend_name(name: str) -> str:
    """``name`` checked and lower-cased: a backend, or ``device:backend`` pairs separated by commas."""
    text = name.strip().lower()
    parts = [p.strip() for p in text.split(",")] if text else []
    if not parts:
        raise InvalidArgumentError(f"backend {name!r} is empty")
    for part in parts:
        device, sep, backend = part.rpartition(":")
        if sep and not device:
            raise InvalidArgumentError(f"backend {name!r}: {part!r} names no device")
        if backend not in BACKENDS:
            raise InvalidArgumentError(
                f"unknown backend {name!r}: use one torch knows ({', '.join(BACKENDS[:5])}, or per device as "
                "'cpu:gloo,cuda:nccl'); every backend runs over aiodist's own transport"
            )
    return text


def with_ranks(name: str, ranks: Any) -> str:
    """A group's ``name`` followed by its global ranks, unless the name shows them already (a subgroup's does)."""
    return name if "(ranks " in name else f"{name} (ranks {list(ranks)})"


def refuse_off_root(fn: str, argument: str, given: Any, rank: int, root_rank: int, what: str) -> None:
    """Raise if a root-only list (``gather_list``, ``scatter_list``, ``object_gather_list``) is given on a rank
    that is not the root, as torch does: there it would be neither filled nor read. None or an empty list is fine.

    ``rank`` / ``root_rank`` are ranks of the group; ``what`` is ``"dst"`` or ``"src"``.
    """
    if given is None:
        return
    try:
        if len(given) == 0:
            return
    except TypeError:
        pass
    from .errors import InvalidArrayError

    role = "destination" if what == "dst" else "source"
    raise InvalidArrayError(
        f"{fn}: {argument} was passed on rank {rank}, which is not the {role} ({what} is rank {root_rank} of the "
        f"group): only the {role}'s {argument} is {'filled' if what == 'dst' else 'read'}, so this rank's would be "
        f"ignored. Pass {argument} on the {role} only (torch.distributed raises ValueError here too: "
        f"\"Argument ``{argument}`` must NOT be specified on non-{role} ranks.\")",
        argument=argument,
        reason="not_root",
    )
