"""Arrays with no zero-copy view (Fortran order, strided, tensor-likes) and bfloat16 go through collectives correctly.

The tensor paths are tested twice: with a small stand-in that behaves like
torch's ``Tensor`` where aiodist touches it (``numpy()`` refuses bfloat16 and
tensors that require grad, ``detach()``, ``view(dtype)``, ``device``), so CI
without torch covers them, and with torch itself when it is installed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import run_world

import aiodist.api as dist
import sim
from aiodist.collectives.buffers import UNCLAIMED, as_flat
from aiodist.collectives.ops import ReduceOp
from aiodist.errors import InvalidArrayError, UnsupportedReduceOpError

BF16 = np.dtype(ml_dtypes.bfloat16)

# the dtypes the stand-in's "library" offers (what ``torch.int16`` is to a torch tensor)
uint8, int16, int32, int64 = "uint8", "int16", "int32", "int64"


class _Device:
    def __init__(self, type: str) -> None:
        self.type = type

    def __str__(self) -> str:
        return self.type


class FakeTensor:
    """A tensor-like over a numpy array (possibly a strided view), with torch's rules for ``numpy()``."""

    def __init__(self, data: np.ndarray, dtype: str, *, requires_grad: bool = False, device: str = "cpu") -> None:
        self._data = data
        self.dtype = f"fake.{dtype}"
        self.requires_grad = requires_grad
        self.device = _Device(device)

    @classmethod
    def bfloat16(cls, values: np.ndarray, **kw: Any) -> FakeTensor:
        return cls(np.asarray(values, BF16).view(np.int16), "bfloat16", **kw)  # stored as raw bits

    def numpy(self) -> np.ndarray:
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        if self.dtype == "fake.bfloat16":
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self._data

    def detach(self) -> FakeTensor:
        t = FakeTensor(self._data, self.dtype.partition(".")[2], device=self.device.type)
        return t

    def view(self, dtype: str) -> FakeTensor:
        return FakeTensor(self._data.view(np.dtype(dtype)), dtype, device=self.device.type)

    def values(self) -> np.ndarray:
        return self._data.view(BF16) if self.dtype == "fake.bfloat16" else self._data


def _sim(main: Any, n: int = 3, seed: int = 0) -> list[Any]:
    res = sim.run(main, world_size=n, seed=seed)
    res.raise_on_failure()
    return list(res.rank_results)


# ------------------------------------------------------------------ numpy layouts


def test_fortran_order_and_strided_arrays_are_reduced_into_the_original() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group()
        r = pg.rank
        f = np.asfortranarray(np.arange(12.0).reshape(3, 4) + r)
        strided = np.zeros(20)[::2]
        strided[:] = r
        t = (np.arange(12).reshape(3, 4) * (r + 1)).T  # a transposed int view
        h1, h2, h3 = dist.all_reduce(f), dist.all_reduce(strided, op=ReduceOp.MAX), dist.all_reduce(t)
        assert await h1 is f and await h2 is strided and await h3 is t
        assert f.flags.f_contiguous and not UNCLAIMED
        await dist.destroy_process_group()
        return f.copy(), strided.copy(), t.copy()

    for f, strided, t in _sim(main):
        np.testing.assert_array_equal(f, 3 * np.arange(12.0).reshape(3, 4) + 3)
        np.testing.assert_array_equal(strided, np.full(10, 2.0))
        np.testing.assert_array_equal(t, (np.arange(12).reshape(3, 4) * 6).T)


def test_non_contiguous_outputs_of_every_writing_collective_and_of_recv() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group()
        r, p = pg.rank, pg.size
        out: dict[str, Any] = {}
        b = np.zeros((4, 3), order="F")
        if r == 0:
            b[:] = np.arange(12.0).reshape(4, 3)
        await dist.broadcast(b, src=0)
        out["bcast"] = b.copy()
        gl = [np.zeros(8)[::2] for _ in range(p)]
        await dist.all_gather(gl, np.arange(4.0) + 10 * r)
        out["gather"] = [g.copy() for g in gl]
        big = np.zeros(2 * 4 * p)[::2]
        await dist.all_gather_into_tensor(big, np.full(4, float(r)))
        out["into"] = big.copy()
        ro = np.zeros(6)[::2]
        await dist.reduce_scatter_tensor(ro, np.arange(3.0 * p) + r)
        out["rs"] = ro.copy()
        a2a = np.zeros(2 * p)[::2]  # (before: InvalidArrayError, "the group API copies it back")
        await dist.all_to_all_single(a2a, np.arange(float(p)) + 10 * r)
        out["a2a"] = a2a.copy()
        if r == 0:
            await dist.send(np.asfortranarray(np.arange(6).reshape(2, 3)), 1)
        elif r == 1:
            got = np.zeros((2, 3), dtype=np.int64, order="F")
            assert await dist.recv(got, 0) == 0
            out["recv"] = got.copy()
        await dist.destroy_process_group()
        return out

    results = _sim(main)
    for r, out in enumerate(results):
        np.testing.assert_array_equal(out["bcast"], np.arange(12.0).reshape(4, 3))
        for i, g in enumerate(out["gather"]):
            np.testing.assert_array_equal(g, np.arange(4.0) + 10 * i)
        np.testing.assert_array_equal(out["into"], np.repeat(np.arange(3.0), 4))
        np.testing.assert_array_equal(out["rs"], 3 * (np.arange(3.0) + 3 * r) + 3)
        np.testing.assert_array_equal(out["a2a"], 10 * np.arange(3.0) + r)
    np.testing.assert_array_equal(results[1]["recv"], np.arange(6).reshape(2, 3))


def test_a_call_that_fails_validation_leaves_no_stale_copy_behind() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group()
        x = np.asfortranarray(np.ones((2, 2)))
        with pytest.raises(UnsupportedReduceOpError):
            dist.all_reduce(x, op=ReduceOp.BAND)  # staged, then refused: the copy is dropped
        x[:] = 5.0  # changed after the failed call: the next call must see it
        await dist.all_reduce(x)
        await dist.destroy_process_group()
        return x.copy()

    for x in _sim(main, n=2):
        np.testing.assert_array_equal(x, np.full((2, 2), 10.0))


def test_outside_an_operation_a_copy_is_made_only_for_reading() -> None:
    f = np.asfortranarray(np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(as_flat(f, "x", writable=False), np.arange(6))
    with pytest.raises(InvalidArrayError, match="np.ascontiguousarray"):
        as_flat(f, "x", writable=True)


async def test_fortran_order_over_real_tcp() -> None:
    async def body(pg: Any) -> Any:
        x = np.asfortranarray(np.arange(6.0).reshape(2, 3) * (pg.rank + 1))
        await pg.all_reduce(x)
        return x

    for x in await run_world(2, body):
        np.testing.assert_array_equal(x, 3 * np.arange(6.0).reshape(2, 3))


# ------------------------------------------------------------------ bfloat16


def test_bfloat16_numpy_arrays_reduce_as_floats() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group()
        r = pg.rank
        s = np.full(5, 1.5, BF16)
        m = np.array([r, -r, 2.0], BF16)
        a = np.full(3, float(r), BF16)
        await dist.all_reduce(s)
        await dist.all_reduce(m, op=ReduceOp.MAX)
        await dist.all_reduce(a, op=ReduceOp.AVG)
        with pytest.raises(UnsupportedReduceOpError, match="BAND"):
            dist.all_reduce(s, op=ReduceOp.BAND)
        await dist.destroy_process_group()
        return s, m, a

    for s, m, a in _sim(main, n=4):
        assert s.dtype == BF16 and a.dtype == BF16
        np.testing.assert_array_equal(s.astype(np.float32), np.full(5, 6.0))
        np.testing.assert_array_equal(m.astype(np.float32), [3.0, 0.0, 2.0])
        np.testing.assert_array_equal(a.astype(np.float32), np.full(3, 1.5))


# ------------------------------------------------------------------ tensor-likes (torch's rules, without torch)


def test_tensor_likes_bfloat16_requires_grad_and_non_contiguous() -> None:
    async def main() -> Any:
        pg = await dist.init_process_group()
        r = pg.rank
        bf = FakeTensor.bfloat16(np.full(6, r + 1.0))
        grad = FakeTensor(np.full(4, float(r)), "float32", requires_grad=True)
        nc = FakeTensor(np.zeros((3, 4)).T, "float64")  # numpy() is a transposed (strided) view
        nc.numpy()[:] = r
        bf_nc = FakeTensor.bfloat16(np.zeros(8))
        bf_nc._data = bf_nc._data[::2]  # a strided bfloat16 tensor
        bf_nc.values()[:] = np.asarray(r, BF16)
        await dist.all_reduce(bf)
        await dist.all_reduce(grad)
        await dist.all_reduce(nc, op=ReduceOp.MAX)
        await dist.all_reduce(bf_nc)
        await dist.destroy_process_group()
        return bf.values().astype(np.float32), grad._data.copy(), nc._data.copy(), bf_nc.values().astype(np.float32)

    for bf, grad, nc, bf_nc in _sim(main):
        np.testing.assert_array_equal(bf, np.full(6, 6.0))
        np.testing.assert_array_equal(grad, np.full(4, 3.0))
        np.testing.assert_array_equal(nc, np.full((4, 3), 2.0))
        np.testing.assert_array_equal(bf_nc, np.full(4, 3.0))


def test_all_to_all_takes_lists_of_tensors() -> None:
    """Before (torch probe): ``all_to_all(out_list, in_list)`` with torch tensors raised TypeError "Cannot
    interpret 'torch.int32' as a data type" on every rank: the list's dtype was read as ``np.dtype(t.dtype)``."""
    async def main() -> Any:
        pg = await dist.init_process_group()
        r, p = pg.rank, pg.size
        ins = [FakeTensor(np.arange(j + 1, dtype=np.int32) + 100 * r, "int32") for j in range(p)]
        outs = [FakeTensor(np.zeros(r + 1, dtype=np.int32), "int32") for _ in range(p)]
        bf_in = [FakeTensor.bfloat16(np.full(2, r + 0.5)) for _ in range(p)]
        bf_out = [FakeTensor.bfloat16(np.zeros(2)) for _ in range(p)]
        await dist.all_to_all(outs, ins)
        await dist.all_to_all(bf_out, bf_in)
        await dist.destroy_process_group()
        return [o._data.tolist() for o in outs], [o.values().astype(np.float32).tolist() for o in bf_out]

    for r, (got, bf) in enumerate(_sim(main)):
        assert got == [(np.arange(r + 1) + 100 * j).tolist() for j in range(len(got))]
        assert bf == [[j + 0.5, j + 0.5] for j in range(len(bf))]


def test_a_tensor_on_another_device_is_refused_with_advice_that_fits() -> None:
    with pytest.raises(InvalidArrayError, match=r"on cuda.*x\.cpu\(\)"):
        as_flat(FakeTensor(np.zeros(3), "float32", device="cuda"), "x", writable=True)


# ------------------------------------------------------------------ torch itself


def test_torch_tensors_of_every_dtype_numpy_or_ml_dtypes_has() -> None:
    torch = pytest.importorskip("torch")
    names = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
             "complex64", "complex128", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]
    dtypes = [getattr(torch, n) for n in names if hasattr(torch, n)]

    async def main() -> Any:
        pg = await dist.init_process_group()
        out = {}
        for dt in dtypes:
            t = torch.ones(4, 6, dtype=dt)
            nc = torch.ones(6, 4, dtype=dt).t()
            await dist.all_reduce(t)
            await dist.all_reduce(nc, op=ReduceOp.MAX if dt == torch.bool else ReduceOp.SUM)
            out[str(dt)] = (t.float().sum().item() if not t.is_complex() else t.real.sum().item(),
                            nc.float().sum().item() if not nc.is_complex() else nc.real.sum().item())
        p = torch.nn.Parameter(torch.ones(3))
        await dist.all_reduce(p)
        out["parameter"] = tuple(p.detach().tolist())
        await dist.destroy_process_group()
        return out

    for out in _sim(main, n=2):
        for dt in dtypes:
            expect = 24.0 if dt == torch.bool else 48.0
            assert out[str(dt)] == (expect, expect), dt
        assert out["parameter"] == (2.0, 2.0, 2.0)


def test_torch_dtypes_without_a_numpy_view_are_refused_naming_the_dtype() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(InvalidArrayError, match="torch.complex32"):
        as_flat(torch.zeros(2, dtype=torch.complex32), "x", writable=False)


def test_no_staging_copy_outlives_its_operation() -> None:
    from aiodist.collectives import buffers

    async def main() -> Any:
        await dist.init_process_group()
        xs = [np.asfortranarray(np.ones((2, 2))) for _ in range(5)]
        await asyncio.gather(*(dist.all_reduce(x) for x in xs))
        await dist.destroy_process_group()
        return len(buffers._STAGED), len(buffers.TASKS)

    assert _sim(main, n=2) == [(0, 0), (0, 0)]


def test_importing_aiodist_and_the_simulator_leaves_ml_dtypes_for_later() -> None:
    """ml_dtypes takes ~0.7 s to import: every rank, CLI call and sweep paid it at start-up. It is imported when a
    tensor of a dtype only it has (bfloat16, float8) is first viewed."""
    code = ("import sys, aiodist, aiodist.api, aiodist.collectives.buffers, sim, sim.runner\n"
            "print('ml_dtypes' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "False"
