"""How a launched program is started: as a plain script, or through the bootstrap.

The rule (pure: it reads source text, never imports or runs it):

* A file with a top-level ``if __name__ == "__main__":`` guard is a *script*:
  the guard decides what runs, and the launcher starts ``python prog.py``
  exactly as a user would.
* A file without that guard that defines a top-level ``main`` function
  (``async def main()`` typically, a plain ``def main()`` too, or imports one:
  ``from train import main``) and does not
  itself call ``main`` at module level is a *module program*: running it as a
  script would do nothing, so the launcher starts
  ``python -m aiodist.launch_bootstrap prog.py``, which imports the file and
  runs ``main()`` (an ``async`` one on a fresh event loop, uvloop when
  installed). This is the same contract as ``python -m sim run``, which imports
  the module and calls ``main()``.
* Anything else (top-level code, a file that calls ``main()`` itself, a file
  that does not parse) is run as a script, unchanged.

So the portable shape of a program is a module with ``async def main()``;
adding ``if __name__ == "__main__": asyncio.run(main())`` is optional and
changes nothing under either runner.
"""

from __future__ import annotations

import ast
import enum

__all__ = ["ProgramKind", "classify_source"]


class ProgramKind(enum.Enum):
    """How to start a program."""

    SCRIPT = "script"
    """Run it as it is (``python prog.py`` / ``python -m module``)."""

    MAIN_FUNCTION = "main"
    """Import it and call its top-level ``main()`` (through the bootstrap)."""


def classify_source(source: str | bytes, *, filename: str = "<program>") -> ProgramKind:
    """Classify a program's source text by the rule in the module docstring."""
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError):
        return ProgramKind.SCRIPT  # let Python itself report the error
    if any(_is_main_guard(stmt) for stmt in tree.body):
        return ProgramKind.SCRIPT
    if not _defines_main(tree.body):
        return ProgramKind.SCRIPT
    if any(_uses_main(stmt) for stmt in tree.body):
        return ProgramKind.SCRIPT
    return ProgramKind.MAIN_FUNCTION


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = (test.left, test.comparators[0])
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


def _defines_main(body: list[ast.stmt]) -> bool:
    """Whether the last top-level definition named ``main`` is a function (or imported: ``from train import main``)."""
    found = False
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "main":
            found = True
        elif isinstance(stmt, ast.ClassDef) and stmt.name == "main":
            found = False
        elif isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == "main" for a in stmt.names):
            found = True
    return found


def _uses_main(stmt: ast.stmt) -> bool:
    """Whether a top-level statement reads the name ``main`` when the module runs.

    Bodies of function and class definitions do not run at import and are
    skipped; their decorators and default values do run and are checked.
    """
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        nodes: list[ast.AST] = [*stmt.decorator_list, stmt.args]
    elif isinstance(stmt, ast.ClassDef):
        nodes = [*stmt.decorator_list, *stmt.bases, *stmt.keywords]
    else:
        nodes = [stmt]
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id == "main" and isinstance(sub.ctx, ast.Load):
                return True
    return False
