"""A program file as the simulator's CLI runs it: compiled once, its module made afresh for every run.

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
calls that module's ``main``; the other ranks of the run call the same
module's. Within one run the module is shared by the virtual ranks, as the
README's known limits say, except by a restarted rank: its new process runs
the file afresh, so what the old one kept in module globals is gone (its
classes stay the run's: see :meth:`ProgramMain._module`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import inspect
import io
import sys
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from .process import current_process

__all__ = ["RUN", "ProgramMain", "fresh_per_run", "loading"]

RUN: contextvars.ContextVar[object | None] = contextvars.ContextVar("sim_run", default=None)
"""The simulation a rank belongs to (set for each rank by the runner; None outside any run)."""

_LOADING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("sim_loading", default=None)


def loading() -> Path | None:
    """The program file whose top level is running afresh for a run right now (None: none is)."""
    return _LOADING.get()


class ProgramMain:
    """``main`` (or another function, ``name``) of the program file ``path``, a fresh module per run."""

    def __init__(self, path: Path, name: str = "main", *, package: str | None = None) -> None:
        self.path = path
        self.name = name
        self.package = package
        self.module_name = f"_sim_program_{path.stem}"
        self._code: CodeType = compile(path.read_bytes(), str(path), "exec")
        self._modules: weakref.WeakKeyDictionary[Any, ModuleType] = weakref.WeakKeyDictionary()
        self.first = self._load()
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
                       f"{self.name}(): code there runs outside any rank -- a module-level `asyncio.run(main())` or "
                       "`aiodist.run(main())` needs `if __name__ == \"__main__\":` in front of it)")
            raise
        except BaseException:
            sys.stderr.write(out.getvalue())
            raise

    def _module(self, shared: ModuleType | None = None) -> ModuleType:
        """The file run in a new module, registered in ``sys.modules`` (pickled objects of its classes
        resolve to it) -- unless ``shared`` is given: the module of a restarted rank, run afresh as a new
        process runs it (what the old process kept in the module's globals is gone), not registered, and
        with ``shared``'s classes (the module the other ranks run) in place of its own, so that objects
        pickled from or to that rank, and ``isinstance`` checks on objects others sent, see one class per
        name (their methods read ``shared``'s globals)."""
        spec = importlib.util.spec_from_file_location(self.module_name, self.path)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        if self.package:  # (an imported module of a package: its relative imports resolve as when imported)
            module.__package__ = self.package
        if shared is None:
            sys.modules[self.module_name] = module
        token = _LOADING.set(self.path)
        try:
            exec(self._code, module.__dict__)  # noqa: S102 - the user's program, as `python prog.py` would run it
        finally:
            _LOADING.reset(token)
        if shared is not None:
            for key, value in list(module.__dict__.items()):
                if isinstance(value, type) and value.__module__ == self.module_name:
                    kept = getattr(shared, key, None)
                    if isinstance(kept, type) and kept.__qualname__ == value.__qualname__:
                        setattr(module, key, kept)
        return module

    def function(self, module: ModuleType) -> Callable[..., Awaitable[Any]] | None:
        """The module's function ``name`` (None when it has none, or it is not callable)."""
        fn = getattr(module, self.name, None)
        return fn if callable(fn) else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = RUN.get()
        if run is None:  # (called outside a simulation: the module loaded first)
            module = self.first
        else:
            module = self._modules.get(run)  # type: ignore[assignment]
            if module is None:
                module = self._modules[run] = self._module()
            else:
                process = current_process()
                if process is not None and process.incarnation > 0:  # a restarted rank: a new process
                    module = self._module(shared=module)
        fn = self.function(module)
        if fn is None:
            raise TypeError(f"{self.path} has no {self.name}() in this run (its top level removed it)")
        return fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_program_main, (self.path, self.name, self.package))


def _program_main(path: Path, name: str, package: str | None) -> ProgramMain:
    return ProgramMain(path, name, package=package)


def fresh_per_run(main: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``main`` run from a fresh copy of its module in every run (a :class:`ProgramMain` of the module's file),
    as a new process would run it, so that what one seed left in the module's globals cannot change the next
    (``sim.sweep`` runs many seeds in one worker process). ``main`` itself when it is no module-level function
    of a module loaded from a ``.py`` file (a closure, a ``functools.partial``, a function typed into a
    notebook: their state is the caller's), or when its module cannot be run again apart from its package
    (an ImportError at its top level)."""
    given = main
    if isinstance(main, ProgramMain) or not inspect.isfunction(main) or "." in main.__qualname__:
        return given
    module = sys.modules.get(main.__module__)
    file = getattr(module, "__file__", None)
    if module is None or not isinstance(file, str) or not file.endswith(".py") or \
            getattr(module, main.__name__, None) is not main:
        return given
    shown = io.StringIO()  # (what its top level printed, shown if it raised: ProgramMain._load)
    try:
        with contextlib.redirect_stderr(shown):
            return ProgramMain(Path(file), main.__name__, package=module.__package__ or None)
    except ImportError:
        return given
    except BaseException:
        sys.stderr.write(shown.getvalue())
        raise

