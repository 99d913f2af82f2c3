"""The comm tests' setup: n ranks' Transports in this process over one store, and op channels between them.

``closing`` is a fixture (import it into the test module): the list of
transports a test started, closed at its end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from aiodist.comm import GroupComm, OpChannel, Transport


async def start_transports(
    n: int,
    store: Any,
    *,
    job: str = "job",
    ranks: Sequence[int] | None = None,
    timeout: float = 5.0,
    mode: str | None = None,
    secrets: Sequence[Any] | None = None,
) -> list[Transport]:
    """The transports of ``ranks`` (default: all ``n``) of job ``job``, one after the other.

    ``secrets``: rank -> its secret (None: each takes it from its environment).
    """
    made = []
    for r in ranks if ranks is not None else range(n):
        kw: dict[str, Any] = {} if secrets is None else {"secret": secrets[r]}
        made.append(await Transport.start(rank=r, world_size=n, job_id=job, store=store, key_prefix="t/",
                                          timeout=timeout, mode=mode, **kw))
    return made


def channel(t: Transport, n: int, seq: int = 0, gid: int = 0) -> OpChannel:
    """Register group ``gid`` of all ``n`` ranks on ``t``; an op channel of its call number ``seq``."""
    t.register_group(gid, tuple(range(n)))
    return OpChannel(GroupComm(t, gid, tuple(range(n)), name="test"), op="test", seq=seq, sig="test")


@pytest.fixture
async def closing() -> AsyncIterator[list[Transport]]:
    made: list[Transport] = []
    yield made
    for t in made:
        await t.close()
