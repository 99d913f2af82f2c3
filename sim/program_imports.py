"""The program's own modules, each virtual rank's copy: what ``import helper`` gives a rank's code.

A real process imports the modules beside its program file for itself, so a
registry, a counter or a cache kept in such a helper module is that
process's, and it starts empty in every run. In the simulator all ranks are
one process with one ``sys.modules``: had a rank's ``import helper`` taken
the process-wide module, the ranks would share its state (a per-process step
counter counts every rank's steps), it would survive a ``Restart``, and it
would carry over from one seed of a sweep to the next (a seed's outcome would
then depend on the seeds its worker ran before it, and its printed replay
would disagree with the sweep).

A rank's copy of the program module (:class:`~sim.program.ProgramMain`) runs
with builtins of its own whose ``__import__`` looks first in that copy's
:class:`Imports`: a plain module (one ``.py`` file, imported by its
top-level name) found on ``sys.path`` in the program file's own folder is
run afresh for that copy, once, and what it imports is looked up the same
way. So the helper modules follow the program module: one per rank (one per
run with ``--no-isolate``), fresh for a restarted rank and for every run.
Everything else (the standard library, installed packages, aiodist itself,
packages in the folder, ``importlib.import_module``) is imported as usual,
once for the whole process.

A helper copy runs under the name ``_sim_helper_<name>``; ``sys.modules``
holds, under that name, a stand-in that resolves to the calling rank's copy,
so an object of a helper's class pickled by one rank (an object collective)
unpickles in another as an instance of that rank's class of the name.
"""

from __future__ import annotations

import builtins
import contextvars
import importlib.machinery
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

__all__ = ["Helpers", "Imports"]

_real_import = builtins.__import__


class Helpers:
    """Which top-level module names are the program's own helper modules (those in ``folder``), and their
    code, compiled once for every copy. ``loading`` is set while a copy's top level runs."""

    def __init__(self, folder: Path, current: Callable[[], Imports | None],
                 loading: contextvars.ContextVar[Path | None]) -> None:
        self.folder = folder
        self._current = current  # (the calling rank's Imports: a stand-in's view)
        self.loading = loading
        self._code: dict[str, tuple[CodeType, str] | None] = {}
        self._standins: dict[str, ModuleType] = {}

    def code(self, name: str) -> tuple[CodeType, str] | None:
        """(code, file) of the helper module ``name``, None when ``name`` is no helper module."""
        try:
            return self._code[name]
        except KeyError:
            pass
        found = spec = None
        if self._on_path():
            try:
                spec = importlib.machinery.PathFinder.find_spec(name, [str(self.folder)])
            except (ImportError, ValueError, OSError):
                spec = None
        origin = getattr(spec, "origin", None)
        if spec is not None and spec.submodule_search_locations is None and isinstance(origin, str) and \
                origin.endswith(".py"):
            try:
                with open(origin, "rb") as f:
                    found = (compile(f.read(), origin, "exec"), origin)
            except (OSError, SyntaxError, ValueError):
                found = None  # (imported as usual: the import shows the error as it would)
        self._code[name] = found
        return found

    def _on_path(self) -> bool:
        """Whether the folder is on ``sys.path`` (else a plain ``import`` of a module there fails, as it does
        for real). Its modules are found there first, as a script's folder is ``sys.path[0]``."""
        folder = str(self.folder)
        for entry in sys.path:
            try:
                if os.path.realpath(entry or os.curdir) == folder:
                    return True
            except (TypeError, ValueError, OSError):
                continue
        return False

    def standin(self, name: str) -> ModuleType:
        """``sys.modules``' entry for the helper ``name`` (made sys.modules' entry again whenever a copy of
        it is made: the running program's, where another program's helper has the same name)."""
        standin = self._standins.get(name)
        if standin is None:
            standin = self._standins[name] = _HelperStandIn(self, name)
        return standin

    def current(self) -> Imports | None:
        return self._current()


def module_name(name: str) -> str:
    """The name a helper module's copies run under (and ``sys.modules``' stand-in for them)."""
    return f"_sim_helper_{name}"


class Imports:
    """The helper modules of one copy of the program module, and the builtins its code runs with."""

    def __init__(self, helpers: Helpers) -> None:
        self.helpers = helpers
        self.modules: dict[str, ModuleType] = {}
        self.builtins: dict[str, Any] = dict(vars(builtins))
        self.builtins["__import__"] = self._import

    def _import(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                level: int = 0) -> Any:
        if level == 0 and "." not in name:
            module = self.get(name)
            if module is not None:
                return module
        return _real_import(name, globals, locals, fromlist, level)

    def get(self, name: str) -> ModuleType | None:
        """This copy's module ``name`` if it is a helper (run now if not yet), else None."""
        module = self.modules.get(name)
        if module is not None:
            return module
        found = self.helpers.code(name)
        if found is None:
            return None
        code, origin = found
        module = ModuleType(module_name(name))
        module.__file__ = origin
        module.__dict__["__builtins__"] = self.builtins
        self.modules[name] = module  # (before its top level runs: an import cycle finds it, as in sys.modules)
        # While its top level runs, the copy is sys.modules' entry for its name (code there, e.g. dataclasses,
        # looks its module up); then the stand-in is again.
        sys.modules[module.__name__] = module
        token = self.helpers.loading.set(Path(origin))
        try:
            exec(code, module.__dict__)  # noqa: S102 - the user's own module, as its import would run it
        except BaseException:
            del self.modules[name]
            raise
        finally:
            self.helpers.loading.reset(token)
            sys.modules[module.__name__] = self.helpers.standin(name)
        return module


class _HelperStandIn(ModuleType):
    """``sys.modules``' entry for a helper's copies: the calling rank's copy, looked up per access."""

    def __init__(self, helpers: Helpers, name: str) -> None:
        super().__init__(module_name(name))
        self._helpers = helpers
        self._name = name

    def _copy(self) -> ModuleType:
        imports = self._helpers.current()
        module = imports.get(self._name) if imports is not None else None
        if module is None:
            raise AttributeError(f"no copy of the helper module {self._name!r} here")
        return module

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        return self._copy().__dict__

    def __getattr__(self, name: str) -> Any:
        return getattr(self._copy(), name)
