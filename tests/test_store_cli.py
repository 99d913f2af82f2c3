"""``store serve``: a standalone server process that prints its address and stops on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from aiodist.errors import StoreConnectionLost
from aiodist.store import TCPStore

DRIVER = (
    "import argparse, sys\n"
    "from aiodist.store.cli import add_cli\n"
    "p = argparse.ArgumentParser(prog='aiodist')\n"
    "add_cli(p.add_subparsers())\n"
    "a = p.parse_args(sys.argv[1:])\n"
    "sys.exit(a.func(a))\n"
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_serve_prints_address_serves_and_stops_cleanly(sig: signal.Signals) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DRIVER, "store", "serve", "--host", "127.0.0.1", "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert line.startswith("aiodist store: listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        store = await TCPStore.connect("127.0.0.1", port, timeout=5)
        assert await store.add("cli", 2) == 2
        pending = asyncio.create_task(store.get("never", timeout=30))
        await asyncio.sleep(0.05)
        proc.send_signal(sig)
        out, err = await asyncio.wait_for(proc.communicate(), 10)
        assert proc.returncode == 0, err.decode()
        assert b"stopped" in out
        with pytest.raises(StoreConnectionLost):
            await asyncio.wait_for(pending, 2)
        await store.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_reports_a_port_in_use() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", DRIVER, "store", "serve", "--port", str(port),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 1
    assert f"127.0.0.1:{port}" in err.decode()
