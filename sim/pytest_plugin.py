"""pytest plugin: run async test functions as programs in the simulator (see sim/README.md).

Registered as the ``aiodist_sim`` pytest11 entry point. Two ways to use it::

    @pytest.mark.sim(world_size=8, seeds=range(100))
    async def test_allreduce():          # the body is main(): it runs on every virtual rank
        pg = await aiodist.init_process_group()
        ...

    def test_race(sim_run):              # the fixture: run any main, check every seed
        results = sim_run(main, world_size=4, seeds=range(50))

Marker options: ``world_size`` (8), ``seeds`` (``range(10)``) or ``seed``,
plus any :func:`sim.run` keyword (``network``, ``faults``, ``time_limit``,
``schedule``). A failing seed fails the test with the run's summary and the
command that replays exactly that seed (``--sim-seed N``). ``--sim-seeds A:B``
overrides every marker's seeds (e.g. a longer nightly sweep).
"""

from __future__ import annotations

import argparse
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest

from .cli_checks import parse_seeds, pinned_hash_seed
from .result import Result
from .runner import run
from .sweep import unique_seeds


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aiodist-sim", "aiodist simulator")
    group.addoption("--sim-seed", type=int, default=None, help="run @pytest.mark.sim tests with this one seed only")
    group.addoption("--sim-seeds", default=None, help="A:B - run @pytest.mark.sim tests with seeds A..B-1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "sim(world_size=8, seeds=range(10), **sim_run_kwargs): run this async test as a program of "
        "world_size virtual ranks in the aiodist simulator, once per seed",
    )


def _seed_override(config: pytest.Config) -> list[int] | None:
    one = config.getoption("--sim-seed", default=None)
    if one is not None:
        return [int(one)]
    many = config.getoption("--sim-seeds", default=None)
    if many is not None:
        try:
            return parse_seeds(str(many))
        except argparse.ArgumentTypeError as e:
            raise pytest.UsageError(f"--sim-seeds {e}") from None
    return None


def _replay(nodeid: str, seed: int) -> str:
    hash_seed = pinned_hash_seed(os.environ)
    if hash_seed is not None:
        return f"PYTHONHASHSEED={hash_seed} pytest '{nodeid}' --sim-seed {seed}"
    return (f"pytest '{nodeid}' --sim-seed {seed}  (this process hashes str at random: a run that iterates a set of "
            f"str replays exactly only under one PYTHONHASHSEED; run pytest with PYTHONHASHSEED=0 to pin it)")


def run_seeds(
    main: Callable[..., Awaitable[Any]],
    *,
    seeds: Iterable[int],
    world_size: int = 8,
    nodeid: str | None = None,
    **kwargs: Any,
) -> list[Result]:
    """Run ``main`` for every seed (each once); ``pytest.fail`` at the first failing one with its replay command.

    No seeds at all fails too: a test that ran nothing must not pass.
    """
    results = []
    try:
        seeds = unique_seeds(seeds)
    except (TypeError, ValueError) as e:
        pytest.fail(f"sim: {e}" + (f" ({nodeid})" if nodeid else ""), pytrace=False)
    for seed in seeds:
        result = run(main, world_size=world_size, seed=seed, trace=False, **kwargs)
        if not result.ok:
            lines = [f"sim: seed {seed} failed ({world_size} ranks)", result.summary()]
            lines += [f.traceback.rstrip() for f in result.failures if f.traceback]
            if nodeid is not None:
                lines.append(f"replay with: {_replay(nodeid, seed)}")
            pytest.fail("\n".join(lines), pytrace=False)
        results.append(result)
    return results


def _original(fn: Any) -> Any:
    for _ in range(10):
        if inspect.iscoroutinefunction(fn):
            return fn
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            break
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    marker = pyfuncitem.get_closest_marker("sim")
    if marker is None:
        return None
    fn = _original(pyfuncitem.obj)
    if fn is None:
        pytest.fail("@pytest.mark.sim needs an async def test function", pytrace=False)
    kwargs = dict(marker.kwargs)
    world_size = int(kwargs.pop("world_size", 8))
    seeds: Iterable[int]
    if "seed" in kwargs:
        seeds = [int(kwargs.pop("seed"))]
    else:
        seeds = kwargs.pop("seeds", range(10))
    override = _seed_override(pyfuncitem.config)
    if override is not None:
        seeds = override
    argnames = pyfuncitem._fixtureinfo.argnames
    funcargs = {name: pyfuncitem.funcargs[name] for name in argnames}

    async def main() -> Any:
        return await fn(**funcargs)

    run_seeds(main, seeds=seeds, world_size=world_size, nodeid=pyfuncitem.nodeid, **kwargs)
    return True


@pytest.fixture
def sim_run(request: pytest.FixtureRequest) -> Callable[..., list[Result]]:
    """``sim_run(main, world_size=8, seeds=range(10), **sim_run_kwargs) -> [Result, ...]``.

    Fails the test at the first failing seed, printing the replay command.
    A ``main`` imported from a module runs isolated, as ``sim.run`` runs it
    (``isolate=True``: every rank a fresh copy of its module; the test cannot
    read what the ranks left in that module's globals, and a ``main`` defined
    in the test file itself runs without pytest's assertion rewriting).
    Pass ``isolate=False`` to share the module with the test.
    """
    nodeid = request.node.nodeid
    override = _seed_override(request.config)

    def runner(main: Callable[..., Awaitable[Any]], *, seeds: Iterable[int] = range(10), world_size: int = 8,
               **kwargs: Any) -> list[Result]:
        return run_seeds(main, seeds=override if override is not None else seeds, world_size=world_size,
                         nodeid=nodeid, **kwargs)

    return runner
