"""A sweep's results file: what it swept (its *key*), checked before anything runs, locked while written.

Every record a sweep writes carries ``key``: a hash of what was swept (the
program's source and name, its arguments, the world size and every option
that changes a run; :func:`key_of`). A later sweep on the same file reuses
only records with its own key; a file holding records of another sweep (or
records without a key, or lines that are not records) is refused up front
with :class:`SweepFileError`, before any seed runs: mixing them would report
seeds as passed that this sweep never ran. The file is locked (``flock``)
while a sweep appends to it, so a second sweep on it at once is refused too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .errors import SimulationError

try:  # (POSIX; elsewhere a results file is not locked)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["SweepFileError", "key_of", "canonical", "source_digest", "load", "open_for_append", "json_lines"]


class SweepFileError(SimulationError, ValueError):
    """A results file that cannot be used for this sweep (another sweep's, not a results file, not writable)."""


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def canonical(value: Any) -> Any:
    """A JSON-ready form of ``value`` that depends only on its contents (for :func:`key_of`).

    Dataclasses by type and fields, mappings with sorted keys, sets sorted,
    functions and classes by their qualified names, anything else by its
    ``repr`` without memory addresses.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [type(value).__qualname__,
                {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}]
    if isinstance(value, Mapping):
        return sorted([json.dumps(canonical(k), sort_keys=True), canonical(v)] for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return sorted(json.dumps(canonical(v), sort_keys=True) for v in value)
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return _ADDRESS.sub("", repr(value))


def source_digest(main: Callable[..., Any]) -> str:
    """A hash of the source file ``main`` was defined in (its code object's bytes when the file is unknown)."""
    code = getattr(main, "__code__", None) or getattr(getattr(main, "__call__", None), "__code__", None)
    path = getattr(code, "co_filename", None)
    try:
        data = Path(path).read_bytes() if path else b""
    except OSError:
        data = b""
    if not data and code is not None:
        data = repr((code.co_code, code.co_consts, code.co_names)).encode()
    return hashlib.sha256(data).hexdigest()


def key_of(*parts: Any) -> str:
    """The key of a sweep: a short hash of ``parts`` (see :func:`canonical`)."""
    text = json.dumps([canonical(p) for p in parts], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_ANOTHER = ("Use another results file (--out / out=), or delete {path} to start this sweep over.")


def load(path: str | os.PathLike[str], key: str | None) -> dict[int, dict[str, Any]]:
    """The records of ``path`` by seed (none if it does not exist), checked against ``key``.

    A line that is not JSON is skipped (a sweep killed while writing leaves a
    torn line). Refused (:class:`SweepFileError`): a file that is not text,
    a directory, a record without the fields a report needs, and (with a
    ``key``) a record of another sweep or one without a key.
    """
    p = Path(path)
    if p.is_dir():
        raise SweepFileError(f"results file {path} is a directory: name a file in it (e.g. {p / 'results.jsonl'})")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise SweepFileError(f"cannot read results file {path}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SweepFileError(f"{path} is not a sweep's results file (not text: byte {e.start} is not UTF-8). "
                             + _ANOTHER.format(path=path)) from e
    records: dict[int, dict[str, Any]] = {}
    for n, rec in json_lines(text.splitlines()):
        problem = _problem(rec)
        if problem:
            raise SweepFileError(f"{path} line {n} is not a sweep record ({problem}). " + _ANOTHER.format(path=path))
        if key is not None and rec.get("key") != key:
            what = "without a sweep key (written by an older sim)" if "key" not in rec else "of another sweep"
            raise SweepFileError(
                f"{path} holds records {what}: a different program, program source, world size, program "
                f"arguments or options (line {n}, seed {rec['seed']}); its seeds are not reused for this sweep. "
                + _ANOTHER.format(path=path))
        records.setdefault(rec["seed"], rec)
    return records


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each JSON line; blank lines and torn ones (an interrupted sweep's last) are skipped."""
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue  # (a torn line)
        yield n, value


def _problem(rec: Any) -> str:
    if not isinstance(rec, dict):
        return "not a JSON object"
    if not isinstance(rec.get("seed"), int) or isinstance(rec.get("seed"), bool):
        return "no integer 'seed'"
    if not isinstance(rec.get("ok"), bool):
        return "no boolean 'ok'"
    if not rec["ok"]:
        failures = rec.get("failures")
        if not isinstance(failures, list) or not failures or not all(isinstance(f, dict) for f in failures):
            return "a failing seed without its 'failures'"
    return ""


def open_for_append(path: str | os.PathLike[str], key: str | None) -> tuple[IO[str], dict[int, dict[str, Any]]]:
    """``path`` opened for appending records and locked (its directory made if missing), and its records.

    Refused (:class:`SweepFileError`, nothing written): a path that cannot
    be written, a file another sweep is writing, a file :func:`load`
    refuses. An interrupted sweep's torn last line is ended with a newline.
    """
    if Path(path).is_dir():
        raise SweepFileError(f"results file {path} is a directory: name a file in it "
                             f"(e.g. {Path(path) / 'results.jsonl'})")
    try:
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        sink = open(path, "a+")  # noqa: SIM115 - the caller closes it
    except OSError as e:
        raise SweepFileError(f"cannot write results file {path}: {e.strerror or e}") from e
    try:
        if fcntl is not None:
            try:
                fcntl.flock(sink.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                raise SweepFileError(f"another sweep is writing {path} right now (it is locked): wait for it "
                                     "to end, or use another results file") from e
        records = load(path, key)
        sink.seek(0, os.SEEK_END)
        if sink.tell() > 0:
            sink.seek(sink.tell() - 1)
            if sink.read(1) != "\n":
                sink.write("\n")
                sink.flush()
    except BaseException:
        sink.close()
        raise
    return sink, records
