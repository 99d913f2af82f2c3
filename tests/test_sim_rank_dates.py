"""datetime's now()/utcnow()/today() and time's localtime() family read a rank's virtual clock (sim/rank_dates.py).

Before, they read the OS clock: a lease that expired at ``datetime.now() +
timedelta(seconds=10)`` never expired in a run (a run takes real
milliseconds), a loop until such a deadline spun for as long as the machine
took, and two runs of one seed differed.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import pickle
import time
from typing import Any

import aiodist
import sim
from sim import rank_dates

REAL_DATETIME = datetime.datetime


async def _lease() -> Any:
    expires = datetime.datetime.now() + datetime.timedelta(seconds=10)
    await asyncio.sleep(11)
    return datetime.datetime.now() > expires, datetime.datetime.now() - expires


def test_a_lease_read_from_datetime_now_expires_in_virtual_time() -> None:
    res = sim.run(_lease, world_size=2, seed=1, explore=False)
    assert res.ok, res.summary()
    for expired, past in res.rank_results:
        assert expired and abs(past - datetime.timedelta(seconds=1)) < datetime.timedelta(milliseconds=1)


async def _poll_until() -> int:
    deadline = datetime.datetime.now() + datetime.timedelta(milliseconds=50)
    polls = 0
    while datetime.datetime.now() < deadline:  # (bounded: the clock moves 1 ms per poll)
        polls += 1
        await asyncio.sleep(0.001)
    await aiodist.init_process_group()
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return polls


def test_a_deadline_read_from_datetime_replays_exactly() -> None:
    runs = [sim.run(_poll_until, world_size=2, seed=0, explore=False) for _ in range(3)]
    assert all(r.ok for r in runs), runs[0].summary()
    assert [r.rank_results for r in runs] == [[50, 50]] * 3
    assert len({r.digest for r in runs}) == 1


async def _calendar() -> Any:
    now = datetime.datetime.now()
    utc = datetime.datetime.now(datetime.timezone.utc)
    later = now + datetime.timedelta(seconds=1)
    pickled = pickle.loads(pickle.dumps(now))
    return {
        "now_is_epoch": abs(utc.timestamp() - sim.VIRTUAL_EPOCH) < 1,
        "today": datetime.date.today() == utc.astimezone().date(),
        "isinstance": (isinstance(now, datetime.datetime), isinstance(later, datetime.datetime),
                       isinstance(REAL_DATETIME(2020, 1, 1), datetime.datetime), isinstance(now, datetime.date),
                       issubclass(datetime.datetime, datetime.date)),
        "repr": repr(REAL_DATETIME(2020, 1, 2)) == repr(datetime.datetime(2020, 1, 2)),
        "pickle": (pickled == now, pickle.dumps(datetime.datetime(2020, 1, 2)) == pickle.dumps(REAL_DATETIME(2020, 1, 2))),
        "copy": copy.deepcopy(now) == now,
        "localtime": (time.localtime().tm_year, time.gmtime()[:3], time.strftime("%Y"), time.ctime()[-4:],
                      time.asctime()[-4:], time.localtime(0).tm_year),
        "kept": now,
    }


def test_the_calendar_clocks_read_the_virtual_clock_and_the_classes_behave_as_the_real_ones() -> None:
    year = str(time.gmtime(sim.VIRTUAL_EPOCH).tm_year)
    res = sim.run(_calendar, world_size=1, seed=1)
    assert res.ok, res.summary()
    got = res.rank_results[0]
    assert got["now_is_epoch"] and got["today"]
    assert got["isinstance"] == (True, True, True, True, True)
    assert got["repr"] and got["pickle"] == (True, True) and got["copy"]
    local = time.localtime(sim.VIRTUAL_EPOCH)
    assert got["localtime"] == (local.tm_year, tuple(time.gmtime(sim.VIRTUAL_EPOCH)[:3]), str(local.tm_year), year,
                                year, time.localtime(0).tm_year)
    # after the run: the real classes and clocks are back, and what a rank kept still pickles
    assert datetime.datetime is REAL_DATETIME and time.localtime is rank_dates.REAL_LOCALTIME
    assert pickle.loads(pickle.dumps(got["kept"])) == got["kept"]
    assert abs(datetime.datetime.now().timestamp() - time.time()) < 5


def test_outside_a_rank_the_stand_ins_read_the_real_clock() -> None:
    assert abs(rank_dates.RankDatetime.now().timestamp() - time.time()) < 5
    assert rank_dates.RankDate.today() == datetime.date.today()


async def _real_values() -> Any:
    import msgpack

    # A program's own subclass, made in the rank (as a program file's top level is), findable by pickle.
    Stamp = type("Stamp", (datetime.datetime,), {"__module__": __name__})
    globals()["Stamp"] = Stamp

    now = datetime.datetime.now(datetime.timezone.utc)
    table = {datetime.datetime: "datetime", datetime.date: "date"}  # keyed by the classes the rank sees
    stamp = Stamp(2020, 1, 2)
    real, real_date = rank_dates.REAL_DATETIME, rank_dates.REAL_DATE  # (this module's top level runs in the rank)
    return {
        "real": (type(now) is real, type(datetime.date.today()) is real_date, type(datetime.datetime(2020, 1, 1)) is real),
        "table": (table.get(type(now)), table[real], {real: 1}.get(datetime.datetime)),
        "msgpack": len(msgpack.packb(now, datetime=True)) > 0,
        "subclass": (type(copy.deepcopy(stamp)).__name__, type(pickle.loads(pickle.dumps(stamp))).__name__,
                     repr(stamp), isinstance(real(2020, 1, 1), Stamp)),
    }


def test_values_are_real_datetimes_and_a_programs_subclass_stays_itself() -> None:
    # review24 probe: values of the stand-in's type failed exact-type checks (sqlite3, msgpack's datetime=True),
    # and a program's ``class Stamp(datetime)`` lost its class in copies and pickles.
    res = sim.run(_real_values, world_size=1, seed=0)
    assert res.ok, res.summary()
    got = res.rank_results[0]
    assert got["real"] == (True, True, True)
    assert got["table"] == ("datetime", "datetime", 1)
    assert got["msgpack"]
    assert got["subclass"] == ("Stamp", "Stamp", "Stamp(2020, 1, 2, 0, 0)", False)
