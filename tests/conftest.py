"""Shared test helpers: run N ranks as tasks of one process, each in its own rank context.

``run_ranks(n, fn)`` runs ``fn(rank)`` for every rank concurrently; each task
has its own environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LOCAL_RANK, LOCAL_WORLD_SIZE) and its own rank scope, so each has its own
default process group -- exactly what the simulator does with virtual ranks.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aiodist.context import new_rank_scope, set_rank_environ
from rank_procs import free_port, rank_env  # (tests import them from here too)


ROOT = Path(__file__).resolve().parent.parent


def printed_by_fresh_interpreters(code: str, hashseeds: Sequence[str], *, timeout: float = 300) -> set[str]:
    """What ``code`` prints when run by a new interpreter (in the project root) under each PYTHONHASHSEED."""
    printed = set()
    for hashseed in hashseeds:
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=timeout)
        assert out.returncode == 0, out.stderr
        printed.add(out.stdout.strip())
    return printed


def aiodist_run_source(tmp_path: Path, source: str, n: int, *, timeout: float = 60,
                       env: Mapping[str, str] | None = None, options: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """``source`` written to ``tmp_path/prog.py`` and run as ``aiodist run -n N [options] prog.py`` (real
    processes); ``env``: variables added to the environment."""
    (tmp_path / "prog.py").write_text(source)
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run([sys.executable, "-m", "aiodist", "run", "-n", str(n), *options, "prog.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def sim_run_source(tmp_path: Path, source: str, n: int, seeds: range, *, explore: bool = True) -> list[Any]:
    """``source`` written to ``tmp_path/prog.py``, its ``main`` simulated on ``n`` ranks for each seed (all must
    pass): each seed's rank results. ``explore=False``: fixed timing (a program whose deadlines of its own are
    part of what it shows)."""
    import sim
    from sim.cli import load_main

    (tmp_path / "prog.py").write_text(source)
    main = load_main(str(tmp_path / "prog.py"))
    results = []
    for seed in seeds:
        res = sim.run(main, world_size=n, seed=seed, trace=False, explore=explore)
        assert res.ok, res.summary()
        results.append(res.rank_results)
    return results


def load_file(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` (an example, a benchmark) as the module ``name``, registered in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def run_on(loop_name: str, coro_fn: Callable[[], Awaitable[Any]], *, timeout: float = 30.0) -> Any:
    """Run ``coro_fn()`` on a new event loop of ``loop_name`` ("asyncio"; "uvloop": skipped where it is missing)."""
    if loop_name == "uvloop":
        factory: Callable[[], asyncio.AbstractEventLoop] = pytest.importorskip("uvloop").new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(asyncio.wait_for(coro_fn(), timeout))


def rank_context(env: Mapping[str, str]) -> contextvars.Context:
    """A copy of the current context with its own environment and a fresh rank scope."""
    ctx = contextvars.copy_context()

    def setup() -> None:
        set_rank_environ(env)
        new_rank_scope()

    ctx.run(setup)
    return ctx


async def run_ranks(
    n: int,
    fn: Callable[[int], Awaitable[Any]],
    *,
    timeout: float = 20.0,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    return_exceptions: bool = False,
) -> list[Any]:
    """Run ``fn(rank)`` for ranks ``0..n-1`` concurrently, each in its own rank context.

    Returns the results in rank order. The first error cancels the other
    ranks and is raised (or, with ``return_exceptions``, every rank's result
    or exception is returned). ``timeout`` bounds the whole run.
    """
    port = free_port() if port is None else port
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(fn(r), context=rank_context(rank_env(r, n, port, env))) for r in range(n)]
    try:
        async with asyncio.timeout(timeout):
            if return_exceptions:
                return list(await asyncio.gather(*tasks, return_exceptions=True))
            return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_world(
    n: int,
    body: Callable[[Any], Awaitable[Any]],
    *,
    timeout: float = 20.0,
    op_timeout: float = 10.0,
    return_exceptions: bool = False,
) -> list[Any]:
    """``run_ranks`` where each rank runs ``body(pg)`` between init_process_group (env://) and destroy."""
    import aiodist.api as api

    async def rank(r: int) -> Any:
        pg = await api.init_process_group(timeout=op_timeout)
        try:
            return await body(pg)
        finally:
            await api.destroy_process_group()

    return await run_ranks(n, rank, timeout=timeout, return_exceptions=return_exceptions)
