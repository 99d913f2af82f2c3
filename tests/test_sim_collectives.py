"""The production process groups and collectives, run unchanged in the simulator."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np
import pytest

import aiodist
import sim
from aiodist import api
from aiodist.errors import AiodistError


async def conformance() -> Any:
    """Every rank checks exact results (integers, so no float-order tolerance is needed)."""
    pg = await api.init_process_group(timeout=60)
    r, p = pg.rank, pg.size
    x = np.arange(10, dtype=np.int64) + r
    await api.all_reduce(x)
    assert (x == np.arange(10) * p + p * (p - 1) // 2).all(), x
    y = np.full(3, r, dtype=np.int32)
    await api.all_reduce(y, op=api.ReduceOp.MAX)
    assert (y == p - 1).all()
    b = np.full(5, r, dtype=np.float32)
    await api.broadcast(b, src=p - 1)
    assert (b == p - 1).all()
    out = [np.zeros(2, dtype=np.int64) for _ in range(p)]
    await api.all_gather(out, np.full(2, r * 10, dtype=np.int64))
    assert [int(o[0]) for o in out] == [q * 10 for q in range(p)]
    rs = np.zeros(2, dtype=np.int64)
    await api.reduce_scatter(rs, [np.full(2, q, dtype=np.int64) for q in range(p)])
    assert (rs == r * p).all()
    a2a_out = [np.zeros(1, dtype=np.int64) for _ in range(p)]
    await api.all_to_all(a2a_out, [np.full(1, r * 100 + q, dtype=np.int64) for q in range(p)])
    assert [int(o[0]) for o in a2a_out] == [q * 100 + r for q in range(p)]
    # Several collectives in flight at once still match by call order.
    h1 = api.all_reduce(c1 := np.ones(4, dtype=np.int64))
    h2 = api.all_reduce(c2 := np.full(4, 2, dtype=np.int64))
    await h2
    await h1
    assert (c1 == p).all() and (c2 == 2 * p).all()
    objs = await api.all_gather_object({"rank": r})
    assert objs == [{"rank": q} for q in range(p)]
    await api.barrier()
    await api.destroy_process_group()
    return r


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7, 8, 13, 16, 32, 64])
def test_collectives_conform_in_sim(world_size: int) -> None:
    res = sim.run(conformance, world_size=world_size, seed=world_size, trace=False)
    assert res.ok, res.summary() + "\n" + "\n".join(f.traceback for f in res.failures)
    assert res.rank_results == list(range(world_size))


@pytest.mark.parametrize("seed", range(4))
def test_collectives_conform_across_schedules_and_latencies(seed: int) -> None:
    net = sim.Network(latency=sim.Exponential(2e-4, 1e-5), bandwidth=1e8)
    res = sim.run(conformance, world_size=6, seed=seed, network=net, schedule=("random", "pct")[seed % 2],
                  trace=False)
    assert res.ok, res.summary()


async def crash_tolerant() -> Any:
    pg = await api.init_process_group(timeout=60)
    x = np.ones(8, dtype=np.float32)
    await api.all_reduce(x)
    if pg.rank == 2:
        await asyncio.sleep(1000)  # crashed meanwhile
    await asyncio.sleep(2)
    try:
        await api.all_reduce(x, timeout=30)
    except AiodistError as e:
        return type(e).__name__, getattr(e, "rank", None)
    return "no error", None


def test_a_crashed_rank_is_named_by_the_survivors() -> None:
    # (fixed timing: the crash must come after the rendezvous, which a long pause of exploration may delay)
    res = sim.run(crash_tolerant, world_size=4, faults=[sim.Crash(2, at=1.0)], seed=1, explore=False)
    assert res.ok, res.summary() + "\n" + "\n".join(f.traceback for f in res.failures)
    assert res.crashed == [2]
    survivors = [res.rank_results[r] for r in (0, 1, 3)]
    assert all(name != "no error" for name, _ in survivors), survivors
    assert any(name == "PeerFailureError" and rank == 2 for name, rank in survivors), survivors


async def mismatched() -> Any:
    pg = await api.init_process_group(timeout=60)
    x = np.ones(4, dtype=np.float32)
    if pg.rank == 1:
        await api.broadcast(x, src=0, timeout=20)
    else:
        await api.all_reduce(x, timeout=20)


def test_mismatched_collectives_are_reported_not_hung() -> None:
    res = sim.run(mismatched, world_size=3, seed=0)
    assert not res.ok
    assert res.failures[0].kind == "exception"
    assert "CollectiveMismatchError" in res.failures[0].message
    assert "broadcast" in res.failures[0].message and "all_reduce" in res.failures[0].message
    assert res.virtual_time < 1  # detected at once, not after the 20 s timeout


async def compute_then_allreduce() -> Any:
    pg = await api.init_process_group(timeout=60)
    loop = asyncio.get_running_loop()
    x = np.full(16, float(pg.rank), dtype=np.float64)
    start = loop.time()
    await asyncio.sleep(0.1)  # "compute"
    await api.all_reduce(x)
    took = loop.time() - start
    await api.destroy_process_group()
    return took, float(x[0])


def test_a_straggler_slows_every_rank_of_a_collective() -> None:
    fast = sim.run(compute_then_allreduce, world_size=4, seed=0, network=sim.Network.fixed(1e-4), explore=False)
    slow = sim.run(compute_then_allreduce, world_size=4, seed=0, network=sim.Network.fixed(1e-4),
                   faults=[sim.Straggler(3, 10.0)], explore=False)
    assert fast.ok and slow.ok, slow.summary()
    assert all(v == 6.0 for _, v in slow.rank_results)
    assert max(t for t, _ in fast.rank_results) < 0.11
    assert min(t for t, _ in slow.rank_results[:3]) > 1.0  # the others waited for rank 3's 1 s of compute
    assert slow.rank_results[3][0] >= 1.0  # (rank 3 itself found their data already there)


async def allreduce_loop() -> Any:
    pg = await api.init_process_group(timeout=60)
    loop = asyncio.get_running_loop()
    done_at = []
    for i in range(5):
        x = np.full(8, i + pg.rank, dtype=np.int64)
        await asyncio.sleep(0.3)
        await api.all_reduce(x, timeout=60)
        assert (x == 4 * i + 6).all()
        done_at.append(round(loop.time(), 3))
    await api.destroy_process_group()
    return done_at


def test_collectives_survive_a_healed_partition_and_finish_after_the_heal() -> None:
    res = sim.run(allreduce_loop, world_size=4, seed=2, network=sim.Network.fixed(1e-4),
                  faults=[sim.Partition((0, 1), (2, 3), at=0.5, heal_at=2.0)], explore=False)
    assert res.ok, res.summary()
    times = res.rank_results[0]
    assert times[0] < 0.5  # before the cut
    assert 2.0 <= times[1] < 2.01  # held until the heal, then delivered in order
    # Every all_reduce ends on all ranks within a few link latencies of each other (compared with a
    # tolerance: equality of the times rounded to 1 ms fails when two ranks straddle a rounding boundary).
    for i in range(len(times)):
        ends = [r[i] for r in res.rank_results]
        assert max(ends) - min(ends) < 2e-3, (i, ends)


def test_a_reset_link_fails_the_collective_naming_the_peer() -> None:
    res = sim.run(allreduce_loop, world_size=4, seed=2, network=sim.Network.fixed(1e-4),
                  faults=[sim.ResetConnection(0, 1, at=1.0)], explore=False)
    assert not res.ok
    failure = res.failures[0]
    assert failure.kind == "exception" and "PeerFailureError" in failure.message
    assert ("rank 1 failed" in failure.message) if failure.rank == 0 else ("rank 0 failed" in failure.message)


def test_collectives_do_not_need_the_store_after_rendezvous() -> None:
    res = sim.run(allreduce_loop, world_size=4, seed=2, network=sim.Network.fixed(1e-4),
                  faults=[sim.CrashStore(at=1.0)], explore=False)
    assert res.ok, res.summary()
    assert any(e.kind == "crash" and "CrashStore" in e.detail for e in res.trace)


def test_a_clogged_link_delays_the_collectives_until_it_clears() -> None:
    res = sim.run(allreduce_loop, world_size=4, seed=2, network=sim.Network.fixed(1e-4),
                  faults=[sim.Clog((2, 3), at=0.5, until=1.5)], explore=False)
    assert res.ok, res.summary()
    assert res.rank_results[0][1] < 1.0 and res.rank_results[3][1] >= 1.5  # rank 3 waited for rank 2's data


async def _in_flight_on_the_same_memory() -> Any:
    """Collectives in flight at once on overlapping memory, as torch code with async_op=True writes them."""
    pg = await api.init_process_group(timeout=60)
    r, p = pg.rank, pg.size
    x = np.ones(64, dtype=np.int64)
    h1, h2 = api.all_reduce(x), api.all_reduce(x)  # the second reduces the first's result
    await asyncio.gather(h2, h1)
    y = np.ones(4 * p, dtype=np.int64)
    outs = [np.zeros(4, dtype=np.int64) for _ in range(p)]
    h3 = api.all_reduce(y)
    h4 = api.all_to_all(outs, [y[4 * q:4 * (q + 1)] for q in range(p)])  # reads views of y: after the reduce
    z = np.full(8, r, dtype=np.int64)
    h5 = api.broadcast(z[::2], src=0)  # interleaved views of one array: separate memory, no wait
    h6 = api.broadcast(z[1::2], src=p - 1)
    await asyncio.gather(h4, h3, h5, h6)
    return x.tolist() == [p * p] * 64, [int(o[0]) for o in outs] == [p] * p, z.tolist() == [0, p - 1] * 4


@pytest.mark.parametrize("seed", range(6))
def test_collectives_in_flight_on_overlapping_arrays_run_in_call_order(seed: int) -> None:
    """Before (shm probe): h1 = all_reduce(x); h2 = all_reduce(x) read and wrote x at once: the ranks got
    9, 11, 12, 13 or 16 (not 16 everywhere), and an all_to_all of views of y mixed reduced and unreduced
    blocks. A collective on memory an earlier one of its group still works on now waits for it (torch's
    stream order); on separate memory (interleaved views) they still run at once."""
    res = sim.run(_in_flight_on_the_same_memory, world_size=4, seed=seed)
    assert res.ok, res.summary()
    assert res.rank_results == [(True, True, True)] * 4, res.rank_results


async def _in_flight_on_strided_memory() -> Any:
    """As above, on arrays that are staged (copied to contiguous memory for the operation)."""
    pg = await api.init_process_group(timeout=60)
    r, p = pg.rank, pg.size
    f = np.arange(8, dtype=np.float64) + 1 + r
    h1 = api.all_reduce(f[::2])  # (strided: staged)
    h2 = api.all_reduce(f[0:4], op=api.ReduceOp.PRODUCT)  # (contiguous, overlapping f[0] and f[2])
    await asyncio.gather(h2, h1)
    fo = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3) + r)
    h3, h4 = api.all_reduce(fo), api.all_reduce(fo, op=api.ReduceOp.MAX)  # (Fortran order: staged, twice)
    g = np.full(6, float(r))
    h5 = api.broadcast(g, src=1)
    h6 = api.all_reduce(g[::2])  # (reads the broadcast's result)
    await asyncio.gather(h4, h3, h6, h5)
    return f.tolist(), fo.tolist(), g.tolist()


def _strided_expected(p: int) -> tuple[list[float], list[list[int]], list[float]]:
    f = [np.arange(8, dtype=np.float64) + 1 + r for r in range(p)]
    total = sum(x[::2] for x in f)  # the first all_reduce, then the product over f[0:4] as it left it
    mine = [x.copy() for x in f]
    for x in mine:
        x[::2] = total
    prod = np.prod([x[0:4] for x in mine], axis=0)
    fo_sum = sum(np.arange(6).reshape(2, 3) + r for r in range(p))
    return ([*prod, *mine[0][4:]], fo_sum.tolist(), [float(p) if i % 2 == 0 else 1.0 for i in range(6)])


@pytest.mark.parametrize("seed", range(4))
def test_collectives_in_flight_on_overlapping_strided_arrays_run_in_call_order(seed: int) -> None:
    """Before (porting probe): the order looked at the staging copy of a strided or Fortran-order array, not at
    the caller's memory, and the copy was taken at the call, before the earlier collective wrote: the ranks
    disagreed (f = [36, ..., 840, ...] on one, [0, ..., 84, ...] on another), a Fortran-order array reduced twice
    lost the first result."""
    res = sim.run(_in_flight_on_strided_memory, world_size=3, seed=seed)
    assert res.ok, res.summary()
    f, fo, g = _strided_expected(3)
    for r, (got_f, got_fo, got_g) in enumerate(res.rank_results):
        assert got_fo == fo and got_g == g, r
        assert got_f[:4] == f[:4], (r, got_f)


async def _two_groups_on_one_array() -> Any:
    pg = await api.init_process_group(timeout=60)
    sub = await api.new_group(list(range(pg.size)))
    x = np.ones(8)
    for _ in range(2):
        h1 = api.all_reduce(x)
        h2 = api.all_reduce(x, group=sub)  # (another group: not ordered after h1)
        await asyncio.gather(h1, h2)
    y = np.ones(8)
    await asyncio.gather(api.all_reduce(y[:4]), api.all_reduce(y[4:], group=sub))  # (separate memory: no warning)
    await api.destroy_process_group()


def test_a_collective_on_memory_another_groups_collective_still_uses_is_warned_of_once() -> None:
    """Collectives of different groups are not ordered (ranks may call them in different orders: waiting could
    deadlock). Before (porting probe), two in flight on one array gave each rank a different answer silently."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = sim.run(_two_groups_on_one_array, world_size=2, seed=0)
    assert res.ok, res.summary()
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "still in flight" in str(w.message)]
    assert len(said) == 2, said  # (once per rank: the second step is not warned again)
    assert said[0].startswith("all_reduce on group 1 (ranks [0, 1]) uses memory that all_reduce (seq 0) of world")
    assert all(w.filename == __file__ for w in caught if "still in flight" in str(w.message))


async def _pairs(concurrent: bool) -> Any:
    """Pairs of collectives on shared memory, in flight together (``concurrent``) or awaited one by one."""
    pg = await api.init_process_group(timeout=60)
    r, p = pg.rank, pg.size

    async def both(first: Any, second: Any) -> None:
        if concurrent:
            w1, w2 = first(), second()
            await asyncio.gather(w2, w1)
        else:
            await first()
            await second()

    out: list[Any] = []
    x = np.full(2 * p, float(r + 1))  # in-place all_to_all_single reads x as the all_reduce left it
    await both(lambda: api.all_reduce(x), lambda: api.all_to_all_single(x, x))
    out.append(x.tolist())
    y = np.full(4, float(r + 1))  # PREMUL_SUM scales y when it starts, not at the call
    await both(lambda: api.all_reduce(y, op=api.ReduceOp.MAX),
               lambda: api.all_reduce(y, op=aiodist._make_nccl_premul_sum(-1.0)))
    out.append(y.tolist())
    z = np.full(4, float(r))  # a memoryview of z: the same memory
    await both(lambda: api.all_reduce(z), lambda: api.broadcast(memoryview(z), src=1))
    out.append(z.tolist())
    buf = np.ones(4 * p)  # the coalesced gather's outputs are in lists of lists
    await both(lambda: api.all_reduce(buf),
               lambda: api.all_gather_coalesced([[buf[4 * i:4 * (i + 1)]] for i in range(p)], [np.full(4, 10.0 + r)]))
    out.append(buf.tolist())
    f = np.ones(4 * p)  # a strided out, then the array it is a view of
    await both(lambda: api.all_to_all_single(f[::2], np.full(2 * p, 100.0 + r)), lambda: api.all_reduce(f))
    out.append(f.tolist())
    await api.destroy_process_group()
    return out


@pytest.mark.parametrize("seed", range(3))
def test_collectives_in_flight_on_shared_memory_whatever_form_it_is_given_in_run_in_call_order(seed: int) -> None:
    """Before (ordering probe), each pair below gave other answers in flight than awaited one by one, and
    ranks disagreed: an in-place all_to_all_single and PREMUL_SUM took their input at the call (a copy, a
    scaling in place while the earlier collective ran); a memoryview (or a tensor), a coalesced list of
    lists and the blocks of a strided out were not seen as the caller's memory at all."""
    together = sim.run(functools.partial(_pairs, True), world_size=3, seed=seed)
    apart = sim.run(functools.partial(_pairs, False), world_size=3, seed=seed)
    assert together.ok and apart.ok, together.summary() + apart.summary()
    assert together.rank_results == apart.rank_results


async def _waits_behind_a_late_one() -> Any:
    await api.init_process_group(timeout=60)
    x = np.ones(4)
    if api.get_rank() == 1:
        await asyncio.sleep(5)  # (late: the first all_reduce cannot end before)
    h1 = api.all_reduce(x)
    h2 = api.all_reduce(x, timeout=1)  # waits for h1 (the same memory) and times out meanwhile
    _, second = await asyncio.gather(h1, h2, return_exceptions=True)
    return str(second)


def test_a_collective_that_times_out_waiting_for_an_earlier_one_on_its_memory_says_so() -> None:
    """Before (ordering probe): 'still waiting for nobody (stuck locally)'."""
    res = sim.run(_waits_behind_a_late_one, world_size=2, seed=0, stop_on_error=False)
    said = res.rank_results[0]
    assert "still waiting for all_reduce (seq 0) of world to end first" in said, said


async def _one_rank_late(late: float) -> Any:
    await api.init_process_group(timeout=60)
    if api.get_rank() == 2:
        await asyncio.sleep(late)
    try:
        await api.all_reduce(np.ones(4), timeout=2.0)
    except Exception as e:  # noqa: BLE001 - what each rank was told
        return f"{type(e).__name__}: {e}"
    return None


def test_a_timeout_names_the_rank_that_never_reached_the_call() -> None:
    """Cancellation probe: a rank waited for may itself wait for another (rank 0 said 'still waiting for rank 1',
    which was on time, and no error named the late rank 2). The store's fingerprints, which a rank in a call
    for longer than the check's delay notes there, now name the rank that had not reached the call."""
    res = sim.run(functools.partial(_one_rank_late, 5.0), world_size=3, seed=0, explore=False, stop_on_error=False)
    timed_out = [r for r in res.rank_results if r and r.startswith("CollectiveTimeoutError")]
    assert timed_out, res.rank_results
    for said in res.rank_results:
        assert "the store shows no sign of rank 2 (global 2) in this call" in said, res.rank_results
    # on time within the timeout (no fingerprint check yet, or everyone reached it): nothing more is said
    res = sim.run(functools.partial(_one_rank_late, 0.1), world_size=3, seed=0, explore=False)
    assert res.rank_results == [None, None, None]


async def _rank_3_missing() -> Any:
    await api.init_process_group(timeout=60)
    if api.get_rank() == 3:
        await asyncio.sleep(8.0)
        return None
    try:  # (rank 0 times out first: it waits for rank 2, which is on time and waits for rank 3)
        await api.all_reduce(np.ones(1), timeout=2.0 if api.get_rank() == 0 else 4.0)
    except (aiodist.CollectiveTimeoutError, aiodist.PeerCallFailedError) as e:  # (its own, or rank 0's quoted)
        return str(e)
    return None


def test_a_timeout_names_the_missing_rank_before_the_rank_it_waited_for() -> None:
    """Torch port probe s21, finding 6: rank 3 never calls all_reduce; rank 0's error began "still waiting for
    rank 2 (global 2)" (rank 2 was on time, waiting for rank 3 in turn), and named rank 3 only after that. Now
    the rank the store shows no sign of is named first, and the rank waited for after it."""
    res = sim.run(_rank_3_missing, world_size=4, seed=0, explore=False, stop_on_error=False)
    said = res.rank_results[0]
    assert said is not None and said.startswith("all_reduce (seq 0) of world timed out after 2s on rank 0; "), said
    assert said.endswith(
        "; the store shows no sign of rank 3 (global 3) in this call (not reached yet, or its part ended); "
        "this rank was still waiting for rank 2 (global 2) (which may be waiting for it in turn)"), said
    for other in res.rank_results[1:3]:  # (rank 0's verdict, quoted)
        assert other is not None and said in other, res.rank_results
