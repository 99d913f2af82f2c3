"""The launcher's run directory (the ranks' status records), and the sweep of those a killed launcher left.

A launcher removes its directory when it ends, whatever the ranks did; one
killed with SIGKILL (or by the OOM killer) cannot, and ``aiodist-run-*``
directories piled up in the temporary directory. Each directory now holds
the process id of its launcher and the id of that process's pid namespace
(``launcher.pid``); a launcher that starts removes the directories of this
user whose launcher is gone: same namespace (a pid of another one says
nothing here), and no process with that pid. A directory without the file
(being made right now, or made by an older version) is left alone; so is
anything not a plain directory of this user.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

__all__ = ["PREFIX", "PID_FILE", "make_run_dir", "sweep_stale"]

PREFIX = "aiodist-run-"
PID_FILE = "launcher.pid"


def _namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0  # (no /proc: pids are this host's)


def make_run_dir() -> tempfile.TemporaryDirectory[str]:
    """A new run directory (mode 0700), marked with this launcher's pid (see the module doc)."""
    run = tempfile.TemporaryDirectory(prefix=PREFIX)
    try:
        with open(os.path.join(run.name, PID_FILE), "x", encoding="ascii") as f:
            f.write(f"{os.getpid()} {_namespace()}\n")
    except OSError:
        pass  # (the sweep leaves a directory without it alone)
    return run


def _gone(path: str, namespace: int) -> bool:
    """Whether the launcher that made ``path`` is gone (False when that cannot be told)."""
    try:
        with open(os.path.join(path, PID_FILE), encoding="ascii") as f:
            pid_text, _, ns_text = f.read(64).strip().partition(" ")
        pid, ns = int(pid_text), int(ns_text)
    except (OSError, ValueError):
        return False
    if ns != namespace or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # (alive, another user's: not ours to judge)
        return False
    return False


def sweep_stale(directory: str | None = None, *, limit: int = 10_000) -> list[str]:
    """Remove the run directories of this user whose launcher is gone, in ``directory`` (default: the
    temporary directory); looks at no more than ``limit`` entries. Returns the paths removed. Never raises."""
    root = tempfile.gettempdir() if directory is None else directory
    namespace, uid = _namespace(), os.getuid()
    removed: list[str] = []
    try:
        entries = sorted(e.name for e in os.scandir(root) if e.name.startswith(PREFIX))[:limit]
    except OSError:
        return removed
    for name in entries:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        if _gone(path, namespace):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
