"""The secret and the store limits a launched job gets: ``aiodist run``, ``aiodist.spawn``, ``init_process_group``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_ranks

import aiodist
import aiodist.api as dist
from aiodist.errors import StoreRequestError
from aiodist.launch.security import job_environment
from aiodist.launch.spawn import spawn

ROOT = Path(__file__).resolve().parents[1]

SHOW = """\
import asyncio, os
import aiodist as dist

async def main():
    pg = await dist.init_process_group(timeout=30)
    env = os.environ
    print("secret", pg.rank, env.get("AIODIST_SECRET"), env.get("AIODIST_SECRET_FILE"), env.get("AIODIST_INSECURE"),
          flush=True)
    if pg.rank == 0:
        try:
            await pg.store.set("big", b"x" * 5000)
            print("stored", flush=True)
        except dist.StoreRequestError as e:
            print("refused", e.code, flush=True)
    await pg.barrier()
    await dist.destroy_process_group()

asyncio.run(main())
"""


def run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "show.py").write_text(SHOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIODIST_SECRET") and k != "AIODIST_INSECURE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "aiodist", "run", "-n", "2", *options, "show.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)


def seen(out: str) -> dict[int, list[str]]:
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if "secret" in words:
            i = words.index("secret")
            rows[int(words[i + 1])] = words[i + 2 : i + 5]
    return rows


def test_each_job_gets_a_fresh_secret_shared_by_its_ranks(tmp_path: Path) -> None:
    first, second = run(tmp_path), run(tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    a, b = seen(first.stdout), seen(second.stdout)
    assert a[0][0] == a[1][0] and len(a[0][0]) == 64  # one secret per job, in every rank
    assert b[0][0] == b[1][0] and a[0][0] != b[0][0]  # and a new one for the next job
    assert a[0][1:] == ["None", "None"]
    assert "stored" in first.stdout  # the default quotas leave room


def test_a_secret_file_is_handed_to_the_ranks_and_a_world_readable_one_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "job.secret"
    secret.write_text("shared between nodes\n")
    secret.chmod(0o644)
    refused = run(tmp_path, "--secret-file", str(secret))
    assert refused.returncode == 2 and "chmod 600" in refused.stderr and "readable" in refused.stderr
    secret.chmod(0o600)
    ok = run(tmp_path, "--secret-file", str(secret))
    assert ok.returncode == 0, ok.stderr
    assert seen(ok.stdout)[1] == ["None", str(secret), "None"]


def test_insecure_switches_authentication_off_with_a_warning(tmp_path: Path) -> None:
    res = run(tmp_path, "--insecure")
    assert res.returncode == 0, res.stderr
    assert seen(res.stdout)[0] == ["None", "None", "1"]
    assert "authentication is OFF" in res.stderr


def test_store_limits_reach_the_store_rank_0_starts(tmp_path: Path) -> None:
    res = run(tmp_path, "--store-limits", "max_client_bytes=1K")
    assert res.returncode == 0, res.stderr
    assert "refused quota_exceeded" in res.stdout
    bad = run(tmp_path, "--store-limits", "max_conections=3")
    assert bad.returncode == 2 and "max_conections" in bad.stderr


def test_the_environment_a_job_gets() -> None:
    assert job_environment({})["AIODIST_SECRET"] != job_environment({})["AIODIST_SECRET"]
    assert job_environment({"AIODIST_SECRET": "mine"})["AIODIST_SECRET"] == "mine"  # the caller's choice stays
    assert "AIODIST_SECRET" not in job_environment({}, single_node=False)  # several nodes: the user's secret file
    assert job_environment({"AIODIST_SECRET": "x"}, insecure=True) == {"AIODIST_INSECURE": "1"}
    assert job_environment({}, store_limits="max_connections=9")["AIODIST_STORE_LIMITS"] == "max_connections=9"
    with pytest.raises(ValueError):
        job_environment({}, store_limits="max_connections=lots")


def spawned_secret() -> str | None:
    return os.environ.get("AIODIST_SECRET")


def test_spawn_gives_each_job_a_fresh_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIODIST_SECRET", raising=False)
    monkeypatch.delenv("AIODIST_SECRET_FILE", raising=False)
    first = spawn(spawned_secret, 2, timeout=60)
    second = spawn(spawned_secret, 2, timeout=60)
    assert first[0] == first[1] and first[0] is not None and len(first[0]) == 64
    assert second[0] == second[1] and second[0] != first[0]
    assert spawn(spawned_secret, 1, env={"AIODIST_SECRET": "given"}, timeout=60) == ["given"]
    assert os.environ.get("AIODIST_SECRET") is None  # the caller's environment is left as it was


async def test_init_process_group_passes_store_limits_to_the_store_it_starts() -> None:
    async def rank(r: int) -> Any:
        await dist.init_process_group(timeout=10, store_limits=aiodist.StoreLimits(max_client_bytes=1000))
        try:
            pg = dist.get_default_group()
            if r == 0:
                with pytest.raises(StoreRequestError) as info:
                    await pg.store.set("big", b"x" * 2000)
                return info.value.code
            return None
        finally:
            await dist.destroy_process_group()

    assert (await run_ranks(2, rank))[0] == "quota_exceeded"


def test_the_launcher_help_lists_the_security_options() -> None:
    out = subprocess.run([sys.executable, "-m", "aiodist", "run", "--help"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=30).stdout
    for option in ("--secret-file", "--insecure", "--store-limits"):
        assert option in out
