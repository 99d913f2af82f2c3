"""An input that is also an output (or part of one) is read as it was when the call started, as torch's gloo reads it.

Before, the collectives wrote outputs while still reading inputs: ``all_to_all(l, l)`` and a scatter whose root
output is another rank's ``scatter_list`` entry gave wrong data on every path; ``all_gather(l, l[j])``,
``all_gather_into_tensor(out, out[other chunk])`` and ``reduce_scatter_tensor(x[other chunk], x)`` on the
shared-memory path (edge-case probe: a million wrong elements per rank at 4 MiB chunks). Byte order and
object dtypes, which were reinterpreted or failed deep in numpy, are refused up front.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import aiodist
import aiodist.api as dist
import sim
from aiodist.collectives import intranode
from aiodist.collectives.buffers import unaliased
from aiodist.errors import InvalidArrayError

# ------------------------------------------------------------------ the check itself (no I/O)


def test_separate_buffers_are_not_copied() -> None:
    ins = [np.zeros(4), np.zeros(4)]
    outs = [np.zeros(4), np.zeros(4)]
    assert unaliased(ins, outs) is ins


def test_an_input_inside_an_output_is_copied_and_the_others_are_kept() -> None:
    whole = np.arange(8.0)
    ins = [whole[0:4], np.arange(4.0), whole[2:6]]
    got = unaliased(ins, [whole[4:8]])
    assert got[0] is ins[0] and got[1] is ins[1]  # (whole[0:4] ends where the output starts: no overlap)
    assert got[2] is not ins[2] and not np.shares_memory(got[2], whole) and list(got[2]) == [2, 3, 4, 5]


def test_the_in_place_form_is_kept_unless_the_input_also_overlaps_an_output_without_its_slot() -> None:
    out = np.arange(6.0)
    chunks = [out[0:2], out[2:4], out[4:6]]
    assert unaliased([chunks[1]], chunks, in_place=(0, chunks[1]))[0] is chunks[1]
    assert unaliased([chunks[1]], [out], in_place=(0, chunks[1]))[0] is chunks[1]  # (the slot inside one output)
    assert unaliased([chunks[1]], chunks, in_place=(0, chunks[2]))[0] is not chunks[1]  # its slot is another
    overlapping = [out[0:4], out[2:6]]
    got = unaliased([out[2:6]], overlapping, in_place=(0, out[2:6]))[0]
    assert not np.shares_memory(got, out) and list(got) == [2, 3, 4, 5]
    many_in = [out[0:2], out[2:4], np.zeros(2)]
    got_list = unaliased(many_in, [out[2:4], out[4:6], np.zeros(3)], in_place=(1, out[2:4]))
    assert got_list[0] is many_in[0] and got_list[1] is many_in[1] and got_list[2] is many_in[2]
    got_list = unaliased(many_in, [out[3:5], np.zeros(3)], in_place=(1, out[2:4]))  # (two sides of many: sorted)
    assert got_list[0] is many_in[0] and got_list[1] is not many_in[1]


# ------------------------------------------------------------------ every aliased form, on every path

N = 3 * 350_000  # float32: 1.4 MB per rank's piece, 4 MB in all at 3 ranks (the shared-memory engine's sizes)


def _piece(owner: int, dest: int, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 1000) + 1000 * owner + 10 * dest


async def aliased_forms(rank: int, p: int, n: int) -> dict[str, int]:
    """Each aliased form once; the number of wrong elements per form on this rank."""
    wrong: dict[str, int] = {}
    other = (rank + 1) % p

    lst = [_piece(rank, j, n) for j in range(p)]  # all_to_all with the same list in and out
    await dist.all_to_all(lst, lst)
    wrong["all_to_all(l, l)"] = sum(int(np.count_nonzero(lst[j] != _piece(j, rank, n))) for j in range(p))

    x = np.concatenate([_piece(rank, j, n) for j in range(p)])  # all_to_all_single(x, x)
    await dist.all_to_all_single(x, x)
    wrong["all_to_all_single(x, x)"] = int(np.count_nonzero(x != np.concatenate([_piece(j, rank, n) for j in range(p)])))

    outs = [np.zeros(n, np.float32) for _ in range(p)]  # all_gather whose input is another rank's slot
    outs[other][:] = _piece(rank, 0, n)
    await dist.all_gather(outs, outs[other])
    wrong["all_gather(l, l[other])"] = sum(int(np.count_nonzero(outs[j] != _piece(j, 0, n))) for j in range(p))

    out = np.zeros(p * n, np.float32)  # all_gather_into_tensor whose input is another rank's chunk
    out[other * n:(other + 1) * n] = _piece(rank, 0, n)
    await dist.all_gather_into_tensor(out, out[other * n:(other + 1) * n])
    wrong["all_gather_into_tensor(out, other chunk)"] = int(
        np.count_nonzero(out != np.concatenate([_piece(j, 0, n) for j in range(p)])))

    x = np.concatenate([_piece(rank, j, n) for j in range(p)])  # reduce_scatter_tensor into another chunk of x
    want = sum(_piece(s, rank, n).astype(np.float64) for s in range(p))
    await dist.reduce_scatter_tensor(x[other * n:(other + 1) * n], x)
    wrong["reduce_scatter_tensor(x[other chunk], x)"] = int(np.count_nonzero(x[other * n:(other + 1) * n] != want))

    ins = [_piece(rank, j, n) for j in range(p)]  # reduce_scatter whose output is another rank's input
    await dist.reduce_scatter(ins[other], ins)
    wrong["reduce_scatter(l[other], l)"] = int(np.count_nonzero(ins[other] != want))

    root = 0  # scatter: the root's output is another rank's entry of scatter_list
    slist = [_piece(root, j, n) for j in range(p)] if rank == root else None
    arr = slist[1] if slist is not None else np.zeros(n, np.float32)
    await dist.scatter(arr, slist, src=root)
    wrong["scatter(out = scatter_list[1] on the root)"] = int(np.count_nonzero(arr != _piece(root, rank, n)))
    return wrong


def _all_zero(results: list[dict[str, int]]) -> None:
    bad = {(r, form): count for r, res in enumerate(results) for form, count in res.items() if count}
    assert not bad, bad


async def test_every_aliased_form_is_right_over_tcp() -> None:
    async def rank(r: int) -> dict[str, int]:
        await dist.init_process_group(timeout=30, transport="tcp")
        try:
            return await aliased_forms(r, 3, N // 3)
        finally:
            await dist.destroy_process_group()

    _all_zero(await run_ranks(3, rank, timeout=120))


async def test_every_aliased_form_is_right_through_shared_memory() -> None:
    async def rank(r: int) -> dict[str, int]:
        pg = await dist.init_process_group(timeout=30)
        try:
            res = await aliased_forms(r, 3, N)
            assert repr(intranode._ENGINES.get(pg._comm)).endswith(" on>")  # (the engine took them)
            return res
        finally:
            await dist.destroy_process_group()

    _all_zero(await run_ranks(3, rank, timeout=120))


async def _sim_rank() -> dict[str, int]:
    pg = await dist.init_process_group()
    res = await aliased_forms(pg.rank, pg.size, 1000)
    await dist.destroy_process_group()
    return res


@pytest.mark.parametrize("seed", range(4))
def test_every_aliased_form_is_right_in_the_simulator(seed: int) -> None:
    res = sim.run(_sim_rank, world_size=3, seed=seed)
    assert res.ok, res.summary()
    _all_zero(res.rank_results)


# ------------------------------------------------------------------ dtypes that cannot travel as bytes


async def _sends(x: Any) -> Any:
    pg = await dist.init_process_group()
    try:
        await dist.broadcast(x, src=0)
    except InvalidArrayError as e:
        return e.reason, str(e)
    finally:
        await dist.destroy_process_group()
    return None


@pytest.mark.parametrize(("x", "reason", "says"), [
    (np.array([1.5, 2.5], dtype=">f4"), "byte_order", "byte order"),
    (np.array([1, 2], dtype=">i4"), "byte_order", "byte order"),
    (np.array([1, "a"], dtype=object), "dtype", "Python objects"),
])
def test_a_foreign_byte_order_or_object_dtype_is_refused_before_anything_is_sent(x: Any, reason: str, says: str) -> None:
    # Before: '>f4' 1.5 arrived as 6.9e-41 (its bytes read as native numbers); object arrays failed inside numpy.
    res = sim.run(_sends, world_size=2, seed=0, args=(x,))
    assert res.ok, res.summary()
    for got in res.rank_results:
        assert got is not None and got[0] == reason and says in got[1], got


async def _complex_avg() -> Any:
    pg = await dist.init_process_group()
    x = np.array([complex(np.inf, 1), complex(np.nan, 1), complex(-0.0, -0.0), 1 + 1j], dtype=np.complex128)
    await dist.all_reduce(x, op=aiodist.ReduceOp.AVG)
    y = np.array([complex(np.inf, 1), 2 - 0j], dtype=np.complex128)
    await dist.all_reduce(y, op=aiodist._make_nccl_premul_sum(0.5))
    await dist.destroy_process_group()
    return x, y


def test_complex_avg_and_a_real_premul_factor_scale_each_component() -> None:
    # Before: divided as complex numbers, (inf+1j)/2 = (inf+nanj): NaN in the other component (torch: (inf+1j)).
    res = sim.run(_complex_avg, world_size=2, seed=0)
    assert res.ok, res.summary()
    for x, y in res.rank_results:
        assert str(x.tolist()) == str([complex(np.inf, 1), complex(np.nan, 1), complex(-0.0, -0.0), 1 + 1j]), x
        assert str(y.tolist()) == str([complex(np.inf, 1), 2 - 0j]), y
