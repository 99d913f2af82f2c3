"""A store server out of file descriptors says so and keeps serving the clients it has (a real process, ulimit -n 64)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aiodist.store import TCPStore

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

SERVER = """\
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
sys.argv = ["aiodist", "store", "serve", "--port", sys.argv[1], "--handshake-timeout", "1"]
from aiodist.cli import main
sys.exit(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_out_of_file_descriptors_is_logged_and_open_clients_are_served(loop: str) -> None:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT), AIODIST_NO_UVLOOP="1" if loop == "asyncio" else "0")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER, str(port), env=env, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    flood: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        assert b"listening" in await asyncio.wait_for(proc.stdout.readline(), 20)
        async with await TCPStore.connect(HOST, port, timeout=10) as good:
            for _ in range(150):  # far more than the server's 64 descriptors: the rest wait in its backlog
                flood.append(socket.create_connection((HOST, port), timeout=5))
            await asyncio.sleep(1.0)
            for i in range(5):
                assert await asyncio.wait_for(good.add("served", 1), 5) == i + 1  # served throughout
            for s in flood:
                s.close()
            flood.clear()
            async with await TCPStore.connect(HOST, port, timeout=15) as late:  # accepted again once fds free
                assert await late.add("served", 1) == 6
    finally:
        for s in flood:
            s.close()
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    log = err.decode()
    assert "cannot accept connections" in log and "ulimit -n is 64" in log, log[-2000:]
    assert log.count("cannot accept connections") <= 3  # once per interval, not once per failed accept
