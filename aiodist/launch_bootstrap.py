"""Start a program that is a module with a top-level ``main()`` (used by ``aiodist run``).

    python -m aiodist.launch_bootstrap prog.py [args...]
    python -m aiodist.launch_bootstrap -m package.module [args...]

Imports the program and calls its ``main()``; an ``async def main`` runs on a
fresh event loop (uvloop's when installed), and when it returns the rank is
finished (:func:`aiodist.api.finish_rank`: its groups destroyed in order,
operations never awaited are an error). ``sys.argv`` and ``sys.path[0]`` are
what ``python prog.py`` / ``python -m package.module`` would give. A program
that does not match the rule of :mod:`aiodist.launch.program` (it has an
``if __name__ == "__main__":`` guard, or no ``main``) is run as ``python``
would run it (``runpy``), except that its ``asyncio.run(main())`` finishes the
rank the same way when ``main`` returns with the group still alive. ``main``'s
return value is ignored: the process exits 0 unless ``main`` raises or calls
``sys.exit``. How the rank ended is recorded for the launcher
(:mod:`aiodist.launch.outcome`); a traceback is printed without the
bootstrap's own frames.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import runpy
import sys
import traceback
from types import ModuleType, TracebackType

from . import eventloop
from .launch import outcome, stopped
from .launch.program import ProgramKind, classify_source
from .launch.runner import call_entry, finishing_asyncio_run

__all__ = ["main"]

_USAGE = "usage: python -m aiodist.launch_bootstrap (prog.py | -m module) [args...]"


def _run_main_of(module: ModuleType) -> None:
    entry = getattr(module, "main", None)
    if not callable(entry):
        raise SystemExit(f"aiodist.launch_bootstrap: {module.__name__} has no callable main()")
    call_entry(entry)


def _run_file(path: str, args: list[str]) -> None:
    abspath = os.path.abspath(path)
    sys.argv = [path, *args]
    sys.path[0] = os.path.dirname(abspath)
    try:
        with open(abspath, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise SystemExit(f"aiodist.launch_bootstrap: can't open file {path!r}: {exc}") from None
    if classify_source(source, filename=path) is ProgramKind.SCRIPT:
        _run_script(lambda: runpy.run_path(abspath, run_name="__main__"))
        return
    stem = os.path.splitext(os.path.basename(abspath))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else "__aiodist_main__"
    spec = importlib.util.spec_from_file_location(name, abspath)
    if spec is None or spec.loader is None:
        raise SystemExit(f"aiodist.launch_bootstrap: cannot load {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _run_main_of(module)


def _run_module(name: str, args: list[str]) -> None:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SystemExit(f"aiodist.launch_bootstrap: no module named {name!r}")
    if spec.submodule_search_locations is not None:  # a package: python -m runs its __main__
        name = f"{name}.__main__"
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise SystemExit(f"aiodist.launch_bootstrap: {name!r} not found; cannot run the package")
    sys.argv = [spec.origin or name, *args]
    source = spec.loader.get_source(name) if spec.loader is not None and hasattr(spec.loader, "get_source") else None
    if source is None or classify_source(source, filename=spec.origin or name) is ProgramKind.SCRIPT:
        _run_script(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True))
        return
    _run_main_of(importlib.import_module(name))


def _run_script(run: object) -> None:
    """Run a script with ``asyncio.run`` / ``aiodist.run`` finishing the rank when its coroutine returns."""
    import aiodist

    saved = asyncio.run, eventloop.run, aiodist.run
    asyncio.run = finishing_asyncio_run(saved[0])
    eventloop.run = aiodist.run = finishing_asyncio_run(saved[1])
    try:
        run()  # type: ignore[operator]
    finally:
        asyncio.run, eventloop.run, aiodist.run = saved


_OWN_DIRS = tuple(os.path.dirname(os.path.abspath(m.__file__ or "")) + os.sep for m in (runpy, asyncio))
_OWN_FILES = (os.path.abspath(__file__), os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch", "runner.py"))


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the leading frames of the bootstrap, runpy and asyncio's runner (what ``python prog.py`` shows)."""
    t = tb
    while t is not None:
        name = t.tb_frame.f_code.co_filename
        path = os.path.abspath(name)
        if not name.startswith("<frozen ") and path not in _OWN_FILES and not path.startswith(_OWN_DIRS):
            return t
        t = t.tb_next
    return tb


def main(argv: list[str] | None = None) -> None:
    """Run the program named by ``argv`` (default ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(_USAGE)
    if argv[0] == "-m" and len(argv) < 2:
        raise SystemExit(_USAGE)
    stopped.install()  # (a rank stopped by SIGTERM says what it was waiting in)
    try:
        if argv[0] == "-m":
            _run_module(argv[1], argv[2:])
        else:
            _run_file(argv[0], argv[1:])
    except SystemExit as exc:
        outcome.rank_ended(exc)
        raise
    except BaseException as exc:
        outcome.rank_ended(exc)
        traceback.print_exception(type(exc), exc, _user_traceback(exc.__traceback__))
        sys.stderr.flush()
        raise SystemExit(130 if isinstance(exc, KeyboardInterrupt) else 1) from None
    outcome.rank_ended(None)


if __name__ == "__main__":
    main()
