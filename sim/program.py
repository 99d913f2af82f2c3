"""A program file as the simulator's CLI runs it: compiled once, its module made afresh for every run and rank.

A real job starts each of its processes from a fresh interpreter, so a
program's module-level state (a cache, a counter, a flag set by an earlier
call) starts empty in every run. A sweep runs many seeds in one worker
process, and ``--check-determinism`` and ``--shrink`` run one seed several
times: had the module been imported once, what one run left in its globals
would change the next run, and a seed's outcome would depend on the worker
that ran it and on the seeds before it (its printed replay command would
then disagree with the sweep).

:class:`ProgramMain` is the program's ``main`` as a callable: the first rank
of a run that calls it executes the file's code in a new module (in that
rank's context, so that what the module's top level draws from ``random``
or reads from the environment is the same in every replay), registers it
under the module's name (pickled objects of its classes resolve to it) and
calls that module's ``main``. Every other rank of the run, and a restarted
rank, is a process of its own: it runs the file afresh in its own context
(a per-process counter or checkpoint in a module global is its own, as
under ``aiodist run``). ``sys.modules`` holds, under the module's name, a
stand-in (:class:`_RankModule`) that reads and writes the calling rank's
module, so an object pickled by one rank unpickles in another as an instance
of that rank's class of the name. Modules the file imports stay shared by the
virtual ranks, as the README's known limits say; those of its own folder are
imported afresh for every run (:meth:`ProgramMain.forget_imports`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import inspect
import io
import os
import pickle
import sys
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from .process import current_process


__all__ = ["RUN", "ProgramMain", "fresh_per_run", "loading", "refuse_while_loading"]

RUN: contextvars.ContextVar[object | None] = contextvars.ContextVar("sim_run", default=None)
"""The simulation a rank belongs to (set for each rank by the runner; None outside any run)."""

_LOADING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("sim_loading", default=None)


def loading() -> Path | None:
    """The program file whose top level is running afresh for a run right now (None: none is)."""
    return _LOADING.get()


def refuse_while_loading(call: str) -> None:
    """Raise RuntimeError if ``call`` (``"sim.run"``, ``"sim.sweep"``) comes from the top level of a program
    file the simulator is running afresh for a rank: it would run that file again, and again."""
    running = _LOADING.get()
    if running is not None:
        raise RuntimeError(f"{call}() was called by the top level of {running.name} while the simulator ran that "
                           "file afresh for a rank (as a new process runs it): put the call under "
                           "`if __name__ == \"__main__\":`")


class ProgramMain:
    """``main`` (or another function, ``name``) of the program file ``path``, a fresh module per run and rank."""

    def __init__(self, path: Path, name: str = "main", *, package: str | None = None,
                 imported_as: str | None = None, per_rank: bool = True, helpers: frozenset[str] = frozenset()) -> None:
        self.path = path
        self.name = name
        self.per_rank = per_rank  # (False: one module per run, shared by the ranks; a restarted rank's own)
        self.package = package
        self.imported_as = imported_as  # (the caller's name of the module, for a main sim.run isolates)
        self.module_name = f"_sim_program_{path.stem}"
        self._code: CodeType = compile(path.read_bytes(), str(path), "exec")
        # What was imported before the file was (its caller's): a module of the file's folder imported since
        # (by the file, as a process would) is imported afresh for every run (forget_imports); ``helpers``:
        # those the file imported where this copy was made (a sweep worker's copy of the CLI's).
        self._folder = str(path.resolve().parent) + os.sep
        self._before = frozenset(sys.modules)
        self._helpers = helpers
        # run -> (rank, incarnation) -> that process's module
        self._modules: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], ModuleType]] = \
            weakref.WeakKeyDictionary()
        self._proxy = _RankModule(self)
        self.first = self.latest = self._load()
        if imported_as is None:  # (only a file loaded as a program forgets them: forget_imports)
            self._helpers |= frozenset(self._imported())
        self.__name__ = name
        self.__qualname__ = name
        self.__module__ = self.module_name
        self.__doc__ = getattr(self.function(self.first), "__doc__", None)

    def __repr__(self) -> str:
        return f"<sim.ProgramMain {self.path}:{self.name}>"

    def _load(self) -> ModuleType:
        """The module run once at load, to check what it defines and show its errors at once; its output is
        dropped unless it raised (each run runs the module again, and prints what it prints then)."""
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return self._module()
        except Exception as e:
            sys.stderr.write(out.getvalue())
            e.add_note(f"(raised while the simulator ran {self.path.name}'s top level, as an import, to find "
                       f"{self.name}(): code there runs once outside any rank -- no RANK, WORLD_SIZE or LOCAL_RANK "
                       f"in the environment: read them in {self.name}() or give them a default; a module-level "
                       "`asyncio.run(main())` or `aiodist.run(main())` needs `if __name__ == \"__main__\":` in "
                       "front of it)")
            raise
        except BaseException:
            sys.stderr.write(out.getvalue())
            raise

    def _module(self) -> ModuleType:
        """The file run in a new module. While its top level runs, the module is ``sys.modules``' entry for its
        name (code there, e.g. ``dataclasses``, looks its module up); then the entry is the rank-aware stand-in
        (:class:`_RankModule`), so that an object pickled by one rank is unpickled by another as an instance
        of that rank's class of the same name."""
        spec = importlib.util.spec_from_file_location(self.module_name, self.path)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        if self.package:  # (an imported module of a package: its relative imports resolve as when imported)
            module.__package__ = self.package
        sys.modules[self.module_name] = module
        token = _LOADING.set(self.path)
        paths = len(sys.path)
        try:
            exec(self._code, module.__dict__)  # noqa: S102 - the user's program, as `python prog.py` would run it
        finally:
            _LOADING.reset(token)
            sys.modules[self.module_name] = self._proxy
            if len(sys.path) > paths:
                _drop_repeats(sys.path)
        return module

    def current(self) -> ModuleType:
        """The module of the calling rank's process; outside a rank, the latest run's first (or the loaded one)."""
        run, process = RUN.get(), current_process()
        if run is not None and process is not None:
            module = self._modules.get(run, {}).get((process.rank, process.incarnation))
            if module is not None:
                return module
        return self.latest

    def function(self, module: ModuleType) -> Callable[..., Awaitable[Any]] | None:
        """The module's function ``name`` (None when it has none, or it is not callable)."""
        fn = getattr(module, self.name, None)
        return fn if callable(fn) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run, process = RUN.get(), current_process()
        if run is None or process is None:  # (called outside a simulation: the module loaded first)
            module = self.first
        else:  # (every rank, and every incarnation of a restarted rank, is a process of its own)
            modules = self._modules.setdefault(run, {})
            if not modules and self.imported_as is None:
                self.forget_imports()  # (the run's first rank: the run imports them afresh)
            if self.per_rank or not modules or process.incarnation > 0:
                module = self._module()
            else:  # (--no-isolate: the run's first module, shared)
                module = next(iter(modules.values()))
            modules[(process.rank, process.incarnation)] = module
            if len(modules) == 1:
                self.latest = module
        fn = self.function(module)
        if fn is None:
            raise TypeError(f"{self.path} has no {self.name}() in this run (its top level removed it)")
        if self.imported_as is not None and module is not self.first and (args or kwargs):
            args, kwargs = self._own_copies(args, kwargs)
        return fn(*args, **kwargs)

    def forget_imports(self) -> None:
        """Drop from ``sys.modules`` the modules of the file's folder (and below) that the file imported (its
        helper modules), so that a run imports them afresh, as a new process does: what one run left in a
        helper module's globals cannot change the next (a sweep's seeds would then depend on the seeds its
        worker ran before, and disagree with their replays). Only for a file loaded as a program (the CLI's): a
        caller that imported the file's module holds its helpers itself. Within a run its ranks share them."""
        for name in self._imported():
            del sys.modules[name]

    def _imported(self) -> list[str]:
        """The modules of the file's folder in ``sys.modules`` that the file imported (see forget_imports)."""
        before, helpers, folder = self._before, self._helpers, self._folder
        found = []
        for name in [n for n in sys.modules if n not in before or n in helpers]:  # (sys.modules' order)
            top = name.partition(".")[0]
            if top in before and top not in helpers:  # (a late submodule of a package loaded before: aiodist's)
                continue
            file = getattr(sys.modules.get(name), "__file__", None)
            if isinstance(file, str) and os.path.realpath(file).startswith(folder) and name != self.module_name:
                found.append(name)
        return found

    def _own_copies(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The caller's arguments, as they are unless they hold objects of the module's classes: then as this
        rank's own copies, those objects made objects of the rank's classes of the names (as ``spawn`` pickles
        a process's arguments), so that the rank's ``isinstance`` and ``is`` checks hold. As they are, too,
        when they do not pickle."""
        try:
            data = pickle.dumps((args, kwargs))
        except Exception:  # noqa: BLE001 - (a lambda, a socket...: passed as it is)
            return args, kwargs
        caller, mine = self.imported_as, self.module_name
        rebound: list[str] = []

        class _Rebound(pickle.Unpickler):
            def find_class(self, module_name: str, name: str) -> Any:
                if module_name == caller:
                    rebound.append(name)
                    module_name = mine
                return super().find_class(module_name, name)

        copied: tuple[tuple[Any, ...], dict[str, Any]] = _Rebound(io.BytesIO(data)).load()
        return copied if rebound else (args, kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_program_main, (self.path, self.name, self.package, self.imported_as, self.per_rank, self._helpers))


class _RankModule(ModuleType):
    """``sys.modules``' entry for a program file's module: the calling rank's own module, looked up per access
    (what pickle resolves a class by name through; ``vars()`` of it is that module's namespace too)."""

    def __init__(self, program: ProgramMain) -> None:
        super().__init__(program.module_name)
        self._program = program

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        return self._program.current().__dict__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program.current(), name)

    def __setattr__(self, name: str, value: Any) -> None:  # (``sys.modules[__name__].x = 1``: the rank's own)
        if name == "_program":
            super().__setattr__(name, value)
        else:
            setattr(self._program.current(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._program.current(), name)


def _drop_repeats(paths: list[str]) -> None:
    """Keep the first of each entry (a top level that inserts its own folder into ``sys.path``, run for every
    rank of every run in one process, would grow it without bound; imports use the first one anyway)."""
    seen: set[str] = set()
    paths[:] = [p for p in paths if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def _program_main(path: Path, name: str, package: str | None, imported_as: str | None = None,
                  per_rank: bool = True, helpers: frozenset[str] = frozenset()) -> ProgramMain:
    return ProgramMain(path, name, package=package, imported_as=imported_as, per_rank=per_rank, helpers=helpers)


_isolated: weakref.WeakKeyDictionary[Any, Callable[..., Awaitable[Any]]] = weakref.WeakKeyDictionary()
"""Each main as :func:`fresh_per_run` made it, once per process (its file compiled once)."""


def fresh_per_run(main: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``main`` run from a fresh copy of its module in every rank of every run (a :class:`ProgramMain` of the
    module's file), as a process of its own would run it: each rank has the module's globals to itself, and
    what one run left there cannot change the next (``sim.run``'s ``isolate``; ``sim.sweep`` runs many seeds
    in one worker process). ``main`` itself when it is no module-level function of a module imported from a
    ``.py`` file: a closure, a ``functools.partial``, a function typed into a notebook, or one of the script
    that is running (``__main__``, whose top level may be what calls ``sim.run``) -- their state is the
    caller's; or when its module cannot be run again apart from its package (an ImportError at its top
    level)."""
    given = main
    if isinstance(main, ProgramMain) or not inspect.isfunction(main) or "." in main.__qualname__ or \
            main.__module__ in ("__main__", "__mp_main__"):
        return given
    try:
        known = _isolated.get(main)
    except TypeError:  # pragma: no cover - (functions are weakly referable)
        return given
    if known is not None:
        return known
    module = sys.modules.get(main.__module__)
    file = getattr(module, "__file__", None)
    if module is None or not isinstance(file, str) or not file.endswith(".py") or \
            getattr(module, main.__name__, None) is not main:
        return given
    shown = io.StringIO()  # (what its top level printed, shown if it raised: ProgramMain._load)
    try:
        with contextlib.redirect_stderr(shown):
            fresh = ProgramMain(Path(file), main.__name__, package=module.__package__ or None,
                                imported_as=main.__module__)
    except ImportError:
        return given
    except BaseException:
        sys.stderr.write(shown.getvalue())
        raise
    _isolated[main] = fresh
    return fresh
