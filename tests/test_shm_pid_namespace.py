"""Ranks of one host in different PID namespaces (containers sharing the host's network) talk over TCP.

Two containers with host networking (Kubernetes ``hostNetwork`` pods) share the
host name, boot id and network namespace, so they find each other's Unix
socket; but a pid names another process in each namespace, and shared memory
is found by pid. Before, the handshake failed ("the peer (pid 0) announced a
ring of process N"): one rank lost its peer, the other waited out its whole
timeout. Here rank 1 runs in a PID namespace of its own (``unshare --pid``,
which needs root or user namespaces; skipped where neither is allowed).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROGRAM = """
import asyncio, os, sys
import numpy as np, aiodist

async def main():
    pg = await aiodist.init_process_group(timeout=20)
    r = pg.rank
    x = np.full(4 << 20, r + 1, np.float32)           # 16 MiB: the shared-memory engine's size
    await aiodist.all_reduce(x, timeout=20)
    s = np.full(1 << 20, r, np.float32)
    g = np.zeros_like(s)
    await asyncio.gather(aiodist.isend(s, 1 - r, timeout=20), aiodist.irecv(g, 1 - r, timeout=20))
    ok = bool(np.all(x == 3) and np.all(g == 1 - r))
    print(f"rank {r} pid {os.getpid()} ok={ok}", flush=True)
    await aiodist.destroy_process_group()

asyncio.run(main())
"""

REPO = Path(__file__).resolve().parent.parent


def _own_pid_namespace() -> list[str] | None:
    """The command prefix that runs a program in a new PID namespace, or None if this machine will not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for prefix in ([unshare, "--pid", "--fork", "--mount-proc"], [unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ranks_in_different_pid_namespaces_fall_back_to_tcp_and_finish(tmp_path: Any) -> None:
    prefix = _own_pid_namespace()
    if prefix is None:
        pytest.skip("no PID namespaces here (unshare needs root or user namespaces)")
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
               AIODIST_SECRET=secrets.token_hex(32), AIODIST_TRANSPORT="auto",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [
        subprocess.Popen([sys.executable, str(prog)], env=dict(env, RANK="0", LOCAL_RANK="0"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        subprocess.Popen([*prefix, sys.executable, str(prog)], env=dict(env, RANK="1", LOCAL_RANK="1"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=60)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"rank {r} " in out and "ok=True" in out, f"rank {r}:\n{out}"
    assert "pid 1 ok=True" in outs[1]  # (rank 1 did run in a namespace of its own)
    assert "announced a ring" not in "".join(outs)
