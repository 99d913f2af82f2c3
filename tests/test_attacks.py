"""The attacks of issue 13, replayed against real processes: a foreign process on the same machine.

* the address-rewrite attack: a process without the job's secret connects
  to a default ``aiodist run -n 2`` job's store (refused), and a relay whose
  address was written into the store (as if with the real secret) sits
  between the ranks (the rank-link handshake refuses it: the job fails
  loudly instead of computing through the relay);
* a refusal reveals nothing (no job id, no key);
* 8 connections each sending ~40 bytes (a frame header that announces a
  huge payload) cost the store server and a rank's listener at most 16 MB;
* 1000 connections that send the preamble and nothing more cost a rank's
  listener little (at most ``AIODIST_MAX_HANDSHAKES`` are kept), and the job
  still makes its links.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from attacker import HOST, Job, Relay, child_env, rss, rss_growth
from rank_procs import free_port

from aiodist.auth import AuthenticationError
from aiodist.store import TCPStore
from aiodist.wire import PREAMBLE
from store_wire import handshake

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------ the address-rewrite attack


async def test_a_foreign_process_is_refused_by_a_default_jobs_store_and_learns_nothing(tmp_path: Path) -> None:
    job = Job(tmp_path, 2)
    try:
        job_id = job.ready[0][2]
        # The attacker runs as the same user, with its own (default) secret: not the job's fresh one.
        with pytest.raises(AuthenticationError):
            await TCPStore.connect(HOST, job.port, timeout=5)
        r, w = await asyncio.open_connection(HOST, job.port)
        refusal = await handshake(r, w, secret=None)
        rest = await asyncio.wait_for(r.read(), 5)
        w.close()
        assert refusal == {"op": "error", "err": "refused", "msg": "authentication failed"} and rest == b""
        assert job_id not in repr(refusal) and "addr" not in repr(refusal)
    finally:
        code, out, err = job.finish()
    assert code == 0, err
    assert out.count("wrong 0") == 2, out  # not one corrupted result


async def test_a_relay_written_into_the_store_with_the_real_secret_fails_the_rank_link_handshake(tmp_path: Path) -> None:
    """Even an attacker who could write to the store cannot sit between two ranks.

    Passes once the rank links authenticate (their proofs bind the address
    the dialer dialed): before that, the job computes through the relay.
    """
    secret_file = tmp_path / "secret"
    secret_file.write_text("the job's shared secret\n")
    secret_file.chmod(0o600)
    job = Job(tmp_path, 2, "--secret-file", str(secret_file), iterations=5)
    relays: list[Relay] = []
    try:
        async with await TCPStore.connect(HOST, job.port, secret=secret_file.read_bytes().strip(), timeout=5) as store:
            for rank in (0, 1):
                host, _, port = job.ready[rank][1].rpartition("|")
                relay = Relay((host, int(port)))
                relays.append(relay)
                await store.set(f"aiodist/0/addr/{rank}", f"{HOST}|{await relay.start()}")
        code, out, err = await asyncio.to_thread(job.finish, 60)
    finally:
        for relay in relays:
            relay.close()
        if job.proc.poll() is None:
            job.proc.kill()
    assert any(relay.seen for relay in relays), "the ranks never dialed the rewritten addresses"
    assert code != 0 and "wrong 0" not in out, (out, err)
    assert "AuthenticationError" in err or "prove" in err, err  # named as what it is, not a lost connection


# ------------------------------------------------------------------ memory before the bytes


def claims(kind: str, n: int) -> bytes:
    """What each attacking connection sends: ~40 bytes announcing a huge frame."""
    hello = msgpack.packb({"op": "hello", "proto": "aiodist-store", "v": 2}, use_bin_type=True)
    if kind == "payload":  # a hello announcing a 100 MiB payload
        return PREAMBLE + struct.pack("<IQ", len(hello), 100 << 20) + hello
    return PREAMBLE + struct.pack("<IQ", 1 << 20, 0) + hello  # a 1 MiB header, 20 bytes of it sent


@pytest.mark.parametrize("kind", ["payload", "header"])
async def test_eight_connections_announcing_huge_frames_cost_the_store_server_little(kind: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiodist", "store", "serve", "--port", str(port)],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        growth = await rss_growth(proc.pid, port, claims(kind, 8))
        assert growth <= 16 << 20, f"store server RSS grew by {growth / 2**20:.0f} MB"
        async with await TCPStore.connect(HOST, port, timeout=5) as c:  # and it still serves
            assert await c.add("n", 1) == 1
    finally:
        proc.terminate()
        proc.wait(10)


async def test_eight_connections_announcing_huge_frames_cost_a_rank_listener_little(tmp_path: Path) -> None:
    """Passes once a rank's listener limits frames before the peer authenticated."""
    job = Job(tmp_path, 1, iterations=1)
    try:
        pid, addr, _ = job.ready[0]
        host, _, port = addr.rpartition("|")
        hello = msgpack.packb({"t": "hello", "job": "?"}, use_bin_type=True)
        growth = await rss_growth(pid, int(port), PREAMBLE + struct.pack("<IQ", len(hello), 512 << 20) + hello)
        assert growth <= 16 << 20, f"rank listener RSS grew by {growth / 2**20:.0f} MB"
    finally:
        code, out, err = job.finish()
    assert code == 0, err



async def test_a_flood_of_preamble_only_connections_costs_a_rank_listener_little_and_the_job_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passes once a rank's listener bounds the connections in their handshake (``AIODIST_MAX_HANDSHAKES``: a
    new one resets the oldest) and allocates no 64 KiB staging area before the peer authenticated: before,
    each of these cost ~72 KiB and was held 30 s, however many."""
    monkeypatch.setenv("AIODIST_MAX_HANDSHAKES", "64")
    job = Job(tmp_path, 2, iterations=5)
    socks: list[socket.socket] = []
    try:
        pid, addr, _ = job.ready[0]
        port = int(addr.rpartition("|")[2])
        before = rss(pid)
        for _ in range(1000):
            s = socket.create_connection((HOST, port))
            socks.append(s)
            try:
                s.sendall(PREAMBLE)
            except OSError:  # (reset already: it made room for a newer one)
                pass
        await asyncio.sleep(1.0)
        growth = rss(pid) - before
        reset = sum(_closed(s) for s in socks)
        # The job's own links are made now, during the flood (its ranks dial each other for the all_reduces).
        code, out, err = await asyncio.to_thread(job.finish, 60)
    finally:
        for s in socks:
            s.close()
        if job.proc.poll() is None:
            job.proc.kill()
    assert code == 0, err
    assert out.count("wrong 0") == 2, out
    assert reset >= 1000 - 64 - 16, reset  # all but the newest 64 (and a few not yet seen by the rank)
    assert growth <= 12 << 20, f"rank listener RSS grew by {growth / 2**20:.1f} MB"  # (before: ~70 MB)
    assert "max_handshakes" in err, err  # logged (once per interval, with a count)


def _closed(s: socket.socket) -> bool:
    """True if the other end closed or reset ``s`` (what it sent before, its preamble, is read past)."""
    s.setblocking(False)
    try:
        while s.recv(4096):
            pass
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True
