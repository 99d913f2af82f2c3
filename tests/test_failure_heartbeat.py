"""Heartbeat settings: defaults, environment, init_process_group kwargs; no false positive after our own stall."""

from __future__ import annotations

import contextvars
import time
from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import aiodist.api as dist
from aiodist.comm.settings import HEARTBEAT_INTERVAL, HEARTBEAT_MISSES
from aiodist.comm.settings import heartbeat_from_env as _heartbeat_timeout
from aiodist.context import new_rank_scope, set_rank_environ


def _parse(env: dict[str, str]) -> Any:
    ctx = contextvars.copy_context()

    def go() -> Any:
        set_rank_environ(env)
        new_rank_scope()
        return _heartbeat_timeout()

    return ctx.run(go)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (HEARTBEAT_INTERVAL, HEARTBEAT_MISSES)),
        ({"AIODIST_HEARTBEAT_TIMEOUT": "0"}, None),
        ({"AIODIST_HEARTBEAT_TIMEOUT": "off"}, None),
        ({"AIODIST_HEARTBEAT_TIMEOUT": "12"}, (2.0, 6)),
        ({"AIODIST_HEARTBEAT_INTERVAL": "0.2", "AIODIST_HEARTBEAT_MISSES": "5"}, (0.2, 5)),
        ({"AIODIST_HEARTBEAT_INTERVAL": "0"}, None),
        ({"AIODIST_HEARTBEAT_INTERVAL": "junk"}, (HEARTBEAT_INTERVAL, HEARTBEAT_MISSES)),
    ],
)
def test_heartbeat_settings_from_the_environment(env: dict[str, str], expected: Any) -> None:
    assert _parse(env) == expected


def test_defaults_detect_within_a_few_seconds() -> None:
    assert 1.0 <= HEARTBEAT_INTERVAL * HEARTBEAT_MISSES <= 4.0


@pytest.mark.parametrize("transport", ["auto", "tcp"])  # auto: Unix sockets and shared memory on this host
async def test_init_process_group_kwargs_set_the_heartbeat(transport: str) -> None:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10, heartbeat_interval=0.2, heartbeat_misses=4)
        try:
            return pg.transport.heartbeat
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(2, rank, env={"AIODIST_TRANSPORT": transport}) == [(0.2, 4)] * 2

    async def off(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10, heartbeat_interval=0)
        try:
            await pg.all_reduce(np.ones(2))
            return pg.transport.heartbeat
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(2, off, env={"AIODIST_TRANSPORT": transport}) == [None] * 2


@pytest.mark.parametrize("transport", ["auto", "tcp"])
async def test_a_rank_whose_own_loop_was_blocked_does_not_blame_its_peers(transport: str) -> None:
    """Both ranks share this process's loop: a blocking call stalls them all. When the loop resumes,
    the heartbeat watchers must not declare the (equally stalled) peers failed."""

    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10, heartbeat_interval=0.1, heartbeat_misses=5)
        try:
            x = np.ones(4)
            await pg.all_reduce(x)
            if r == 0:
                time.sleep(1.2)  # blocks the loop for more than the 0.5 s heartbeat timeout
            for _ in range(20):
                x[:] = 1
                await pg.all_reduce(x)
            return float(x[0]), pg.transport.failed_peers()
        finally:
            await dist.destroy_process_group()

    assert await run_ranks(2, rank, env={"AIODIST_TRANSPORT": transport}) == [(2.0, [])] * 2
