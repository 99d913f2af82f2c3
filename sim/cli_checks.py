"""The command line's checks: values parsed with a reason when they are wrong, paths and executors checked
before anything runs, so a mistake is a usage error (exit status 2) and never a traceback after a long run."""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .sweep import process_executor


class UsageError(SystemExit):
    """A mistake on the command line: ``python -m sim`` prints ``sim: MESSAGE`` and exits with status 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


HASH_SEED = "0"
"""The ``PYTHONHASHSEED`` the command line runs programs under when none is given (see ``sim.cli``)."""


def pinned_hash_seed(environ: Mapping[str, str]) -> str | None:
    """The hash seed a process with ``environ`` runs under, if it is pinned (a number), else None."""
    value = environ.get("PYTHONHASHSEED", "")
    return value if value.isdigit() else None


def parse_seeds(spec: str) -> list[int]:
    """``A:B`` (B excluded, A < B) or ``A,B,C`` (each once): a sweep's seeds, never none."""
    try:
        if ":" in spec:
            a, b = spec.split(":", 1)
            seeds = list(range(int(a), int(b)))
            if not seeds:
                raise argparse.ArgumentTypeError(f"{spec!r} is an empty range (A:B runs A..B-1: B must be above A)")
            return seeds
        seeds = list(dict.fromkeys(int(x) for x in spec.split(",") if x.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected A:B (seeds A..B-1) or A,B,C (integers)") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"{spec!r}: no seeds (expected A:B or A,B,C)")
    return seeds


def positive_int(spec: str) -> int:
    try:
        n = int(spec)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: must be at least 1")
    return n


def positive_float(spec: str) -> float:
    try:
        x = float(spec)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not a number of seconds") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{spec}: must be above 0")
    return x


def explained(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` whose ValueError / TypeError says why (argparse would say "invalid parse_pause value")."""
    if isinstance(parse, type) or getattr(parse, "_explained", False):
        return parse

    @functools.wraps(parse)
    def checked(spec: str) -> Any:
        try:
            return parse(spec)
        except (ValueError, TypeError) as e:
            if isinstance(e, argparse.ArgumentTypeError):
                raise
            reason = str(e).strip() or type(e).__name__
            raise argparse.ArgumentTypeError(reason if repr(spec) in reason else f"{spec!r}: {reason}") from None

    checked._explained = True  # type: ignore[attr-defined]
    return checked


def explain_types(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # (argparse keeps its actions there; no public accessor)
        if callable(action.type):
            action.type = explained(action.type)


def looks_like_program(token: str) -> bool:
    return token.endswith(".py") or ".py:" in token


def swarm_before_program(argv: list[str]) -> list[str]:
    """``--swarm prog.py ...``: ``--swarm`` takes an optional value; a program after it is not that value."""
    out = list(argv)
    for i, tok in enumerate(out[:-1]):
        if tok == "--swarm" and looks_like_program(out[i + 1]):
            out[i] = "--swarm=all"
    return out


def writable_dir_of(path: str, what: str) -> None:
    """Make ``path``'s directory if missing; refuse (:class:`UsageError`) a path that cannot be written."""
    if os.path.isdir(path):
        raise UsageError(f"{what} {path} is a directory: name a file")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot write {what} {path}: {e.strerror or e}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write {what} {path}: its directory {parent} is not writable")


def executor_of(ns: argparse.Namespace) -> tuple[Any, Any]:
    """(the executor for a sweep or None to run here, the one to shut down afterwards or None)."""
    jobs = ns.jobs if ns.jobs is not None else (os.cpu_count() or 1)
    spec = ns.executor or ("process" if jobs > 1 else "inline")
    if spec == "inline":
        return None, None
    if spec == "process":
        ex = process_executor(jobs)
        return ex, ex
    if spec.startswith("dask:"):
        return _dask(spec[len("dask:"):], ns.jobs)
    module, _, attr = spec.partition(":")
    if not attr or not module:
        raise UsageError(f"unknown --executor {spec!r}: expected process, inline, dask:ADDRESS, dask:local[:N] "
                         "or MODULE:FUNCTION")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except ImportError as e:
        raise UsageError(f"--executor {spec}: cannot import {module}: {e}") from None
    except AttributeError:
        raise UsageError(f"--executor {spec}: module {module} has no {attr}") from None
    ex = factory() if callable(factory) else factory
    if not isinstance(ex, concurrent.futures.Executor) and not callable(getattr(ex, "submit", None)):
        raise UsageError(f"--executor {spec}: {module}.{attr}() returned {type(ex).__name__}, not a "
                         "concurrent.futures.Executor")
    return ex, ex


def _dask(where: str, jobs: int | None) -> tuple[Any, Any]:
    try:
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        raise UsageError("--executor dask:... needs Dask's distributed: pip install 'aiodist[cluster]'") from None
    if where == "local" or where.startswith("local:"):
        count = where.partition(":")[2]
        try:
            n = int(count or jobs or 1)
        except ValueError:
            raise UsageError(f"--executor dask:{where}: {count!r} is not a number of workers") from None
        if n < 1:
            raise UsageError(f"--executor dask:{where}: a cluster needs at least 1 worker")
        client = distributed.Client(distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                           dashboard_address=None))
        return client.get_executor(), client
    if not where:
        raise UsageError("--executor dask:ADDRESS: no address (e.g. dask:tcp://scheduler:8786 or dask:local:4)")
    try:
        client = distributed.Client(where, timeout=30)
    except (OSError, TimeoutError, ValueError) as e:
        raise UsageError(f"--executor dask:{where}: cannot reach the scheduler: {e}") from None
    return client.get_executor(), client


def program_file(path: str) -> Path:
    return Path(path.rpartition(":")[0] if not Path(path).is_file() and ":" in path else path)
