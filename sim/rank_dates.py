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

The stand-ins are subclasses of the real classes, and everything but the
clock is the real classes' own: ``isinstance`` holds either way (an instance
of the real class counts as one of the stand-in, and the stand-in's are real
ones), values compare, hash and do arithmetic as real ones do, ``repr``
reads as the real one's, and a pickle names the class by the name the real
one has (``datetime.datetime``: the bytes are the real class's, and unpickle
as it outside a run; an instance pickled after the run names the real class). A module that bound
the real class before the run (``from datetime import datetime`` in a module
imported before it) keeps the real clock, as for :mod:`time`'s functions.
Local times use the machine's time zone.
"""

from __future__ import annotations

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
    """The stand-ins' metaclass: an instance (or subclass) of the real class counts as one of the stand-in."""

    _sim_real: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._sim_real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._sim_real)


def _qualified(text: str) -> str:
    return text if text.startswith("datetime.") else "datetime." + text


class RankDate(REAL_DATE, metaclass=_StandIn):
    """:class:`datetime.date` whose ``today()`` is the calling rank's (virtual) day."""

    _sim_real = REAL_DATE

    @classmethod
    def today(cls) -> Any:
        t = _wall()
        return REAL_DATE.today() if t is None else cls.fromtimestamp(t)

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_datetime.date, *super().__reduce_ex__(protocol)[1:])

    def __repr__(self) -> str:
        return _qualified(super().__repr__())


class RankDatetime(REAL_DATETIME, metaclass=_StandIn):
    """:class:`datetime.datetime` whose ``now()``, ``utcnow()`` and ``today()`` read the calling rank's clock."""

    _sim_real = REAL_DATETIME

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> Any:
        t = _wall()
        return REAL_DATETIME.now(tz) if t is None else cls.fromtimestamp(t, tz)

    @classmethod
    def utcnow(cls) -> Any:
        if sys.version_info >= (3, 12):  # (as the real one warns: the caller's line, not this one)
            warnings.warn("datetime.datetime.utcnow() is deprecated and scheduled for removal in a future version. "
                          "Use timezone-aware objects to represent datetimes in UTC: "
                          "datetime.datetime.now(datetime.UTC).", DeprecationWarning, stacklevel=2)
        t = _wall()
        return cls.fromtimestamp(time.time() if t is None else t, _datetime.timezone.utc).replace(tzinfo=None)

    @classmethod
    def today(cls) -> Any:
        return cls.now()

    def __reduce_ex__(self, protocol: Any) -> Any:
        return (_datetime.datetime, *super().__reduce_ex__(protocol)[1:])

    def __repr__(self) -> str:
        return _qualified(super().__repr__())


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


def install(patch: Callable[[Any, str, Any], None], wall: Callable[[], float | None]) -> None:
    """Put the stand-ins in place with ``patch(obj, name, value)`` (which records what to restore)."""
    global _wall
    _wall = wall
    patch(_datetime, "datetime", RankDatetime)
    patch(_datetime, "date", RankDate)
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
