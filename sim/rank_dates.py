"""The calendar clocks a rank reads: ``datetime``'s ``now()``, ``utcnow()``, ``today()`` and :mod:`time`'s ``localtime()`` family.

:func:`time.time` reads the virtual clock in a rank (:mod:`sim.process`), but
``datetime.datetime.now()`` reads the OS clock in C, and ``time.localtime()``
with no argument reads it too: a lease that expires at ``datetime.now() +
timedelta(seconds=10)`` would never expire in virtual time (a run takes real
milliseconds), a loop until such a deadline would spin for real seconds, and
no seed would replay. While a run is on, :func:`install` puts stand-ins for
:class:`datetime.datetime` and :class:`datetime.date` in the :mod:`datetime`
module (a program that imports them, or calls ``datetime.datetime.now()``, at
run time gets them) and wraps the argument-less forms of ``localtime``,
``gmtime``, ``ctime``, ``asctime`` and ``strftime``. In a rank they read the
rank's ``time.time()``; elsewhere the real clock.

The stand-ins are subclasses of the real classes that make real values:
their clocks and constructors (``datetime.datetime(2026, 1, 1)``, and so
``fromisoformat``, ``strptime``...) return instances of the real classes, so
values pickle, print, compare and pass exact-type checks (sqlite3, msgpack)
as real ones; ``isinstance(x, datetime.datetime)`` holds for them through the
stand-in's metaclass. A program's own subclass (``class Stamp(datetime)`` in a
rank) is a subclass of the stand-in and keeps its class through copies and pickles. A module that bound
the real class before the run (``from datetime import datetime`` in a module
imported before it) keeps the real clock, as for :mod:`time`'s functions.
Local times use the machine's time zone.
"""

from __future__ import annotations

import copyreg
import datetime as _datetime
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

REAL_DATETIME = _datetime.datetime
REAL_DATE = _datetime.date
REAL_LOCALTIME = time.localtime

_wall: Callable[[], float | None] = lambda: None
"""The calling rank's ``time.time()``, or None outside a rank (set by :func:`install`)."""


class _StandIn(type):
    """The stand-ins' metaclass: an instance (or subclass) of the real class counts as one of the stand-in.

    Only for the stand-ins themselves: a program's own subclass of one (``class Stamp(datetime)`` in a rank)
    checks as any class does (a real datetime is no Stamp).
    """

    _sim_real: type

    def __instancecheck__(cls, obj: Any) -> bool:
        real = cls.__dict__.get("_sim_real")
        return isinstance(obj, real) if real is not None else type.__instancecheck__(cls, obj)

    def __subclasscheck__(cls, sub: type) -> bool:
        real = cls.__dict__.get("_sim_real")
        return issubclass(sub, real) if real is not None else type.__subclasscheck__(cls, sub)

    # A stand-in equals its real class and hashes as it: a table keyed by class (a library's representers,
    # a program's dispatch dict) finds a real value's class under the stand-in and the other way round,
    # whichever of the two it was filled with. (``type(x) is datetime.datetime`` still tells them apart.)
    def __eq__(cls, other: object) -> bool:
        real = cls.__dict__.get("_sim_real")
        return cls is other or (real is not None and other is real)

    def __ne__(cls, other: object) -> bool:
        return not cls.__eq__(other)

    def __hash__(cls) -> int:
        real = cls.__dict__.get("_sim_real")
        return hash(real) if real is not None else type.__hash__(cls)


class RankDate(REAL_DATE, metaclass=_StandIn):
    """:class:`datetime.date` whose ``today()`` is the calling rank's (virtual) day.

    Constructing it gives a real ``date`` (a subclass of it, a subclass instance): values are never of
    the stand-in's type, so code that checks the exact type (sqlite3, msgpack) takes them.
    """

    _sim_real = REAL_DATE

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is RankDate:
            return REAL_DATE(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    @classmethod
    def today(cls) -> Any:
        t = _wall()
        if t is None:
            return REAL_DATE.today()
        return (REAL_DATE if cls is RankDate else cls).fromtimestamp(t)


class RankDatetime(REAL_DATETIME, metaclass=_StandIn):
    """:class:`datetime.datetime` whose ``now()``, ``utcnow()`` and ``today()`` read the calling rank's clock.

    Constructing it gives a real ``datetime`` (a subclass of it, a subclass instance), as its clocks do.
    """

    _sim_real = REAL_DATETIME

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is RankDatetime:
            return REAL_DATETIME(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> Any:
        t = _wall()
        if t is None:
            return REAL_DATETIME.now(tz) if cls is RankDatetime else super().now(tz)
        return (REAL_DATETIME if cls is RankDatetime else cls).fromtimestamp(t, tz)

    @classmethod
    def utcnow(cls) -> Any:
        if sys.version_info >= (3, 12):  # (as the real one warns: the caller's line, not this one)
            warnings.warn("datetime.datetime.utcnow() is deprecated and scheduled for removal in a future version. "
                          "Use timezone-aware objects to represent datetimes in UTC: "
                          "datetime.datetime.now(datetime.UTC).", DeprecationWarning, stacklevel=2)
        t = _wall()
        made = (REAL_DATETIME if cls is RankDatetime else cls).fromtimestamp(
            time.time() if t is None else t, _datetime.timezone.utc)
        return made.replace(tzinfo=None)

    @classmethod
    def today(cls) -> Any:
        return cls.now()


for _cls, _name in ((RankDate, "date"), (RankDatetime, "datetime")):
    _cls.__name__ = _cls.__qualname__ = _name
    _cls.__module__ = "datetime"


def _now_or_given(real: Callable[..., Any]) -> Callable[..., Any]:
    """``localtime``/``gmtime``/``ctime`` as a rank calls them: no argument (or None) means the rank's now."""

    def call(*args: Any) -> Any:
        if not args or args[0] is None:
            t = _wall()
            if t is not None:
                return real(t)
        return real(*args)

    call.__name__ = call.__qualname__ = real.__name__
    call.__doc__ = real.__doc__
    return call


_MISSING = object()


class _Entry:
    """One key of a dict seen as the attribute ``value``, so that ``patch`` can set it and put back what was
    there (or nothing: :data:`_MISSING`)."""

    def __init__(self, table: dict[Any, Any], key: Any) -> None:
        self.__dict__.update(table=table, key=key)

    def __getattr__(self, name: str) -> Any:
        return self.__dict__["table"].get(self.__dict__["key"], _MISSING)

    def __setattr__(self, name: str, value: Any) -> None:
        table, key = self.__dict__["table"], self.__dict__["key"]
        if value is _MISSING:
            table.pop(key, None)
        else:
            table[key] = value


def _reducer(real: type) -> Callable[[Any], Any]:
    """How a real ``date``/``datetime`` pickles (and copies) while its module names the stand-in.

    pickle names a class by its module and name and checks that the name finds that very class: the
    real class is not what ``datetime.datetime`` finds during a run, so a real value would not pickle.
    It is pickled as the real class would be, naming whatever the module holds (the stand-in now, whose
    constructor makes a real value from the state; the real class once the run is over): the bytes are
    those of a real value.
    """
    def reduce(value: Any) -> Any:
        state = real.__reduce_ex__(value, 4)[1]  # type: ignore[call-arg]
        return (getattr(_datetime, real.__name__), state)

    return reduce


def install(patch: Callable[[Any, str, Any], None], wall: Callable[[], float | None]) -> None:
    """Put the stand-ins in place with ``patch(obj, name, value)`` (which records what to restore)."""
    global _wall
    _wall = wall
    patch(_datetime, "datetime", RankDatetime)
    patch(_datetime, "date", RankDate)
    for real_class in (REAL_DATETIME, REAL_DATE):
        patch(_Entry(copyreg.dispatch_table, real_class), "value", _reducer(real_class))
    real_localtime = time.localtime
    for name in ("localtime", "gmtime", "ctime"):
        patch(time, name, _now_or_given(getattr(time, name)))
    real_asctime = time.asctime
    real_strftime = time.strftime

    def asctime(*args: Any) -> str:
        t = _wall() if not args else None
        return real_asctime(real_localtime(t)) if t is not None else real_asctime(*args)

    def strftime(format: str, *args: Any) -> str:
        t = _wall() if not args else None
        return real_strftime(format, real_localtime(t)) if t is not None else real_strftime(format, *args)

    for fn, real in ((asctime, real_asctime), (strftime, real_strftime)):
        fn.__doc__ = real.__doc__
        patch(time, fn.__name__, fn)
