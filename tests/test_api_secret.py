"""init_process_group's secret= and ssl= options, with ranks as tasks of one process over real TCP."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import aiodist.api as dist
from aiodist.errors import CollectiveTimeoutError, PeerFailureError


async def _sum(secret_of: Any) -> list[Any]:
    async def rank(r: int) -> Any:
        pg = await dist.init_process_group(timeout=10, secret=secret_of(r))
        try:
            x = np.full(4, float(r + 1))
            try:
                await pg.all_reduce(x, timeout=3)
            except (PeerFailureError, CollectiveTimeoutError) as e:
                return type(e).__name__, str(e)
            return float(x[0])
        finally:
            await dist.destroy_process_group()

    return await run_ranks(2, rank)


async def test_the_same_secret_on_every_rank_works() -> None:
    assert await _sum(lambda r: b"s3cret") == [3.0, 3.0]
    assert await _sum(lambda r: "s3cret") == [3.0, 3.0]  # (a str is its UTF-8 bytes)


async def test_authentication_off_on_every_rank_works() -> None:
    assert await _sum(lambda r: None) == [3.0, 3.0]


async def test_ranks_with_different_secrets_never_exchange_data() -> None:
    """The dialing side says why; the other one (which cannot tell an impostor from a peer) times out."""
    results = await _sum(lambda r: f"secret-{r}".encode())
    assert all(isinstance(res, tuple) for res in results), results
    assert any(res[0] == "PeerFailureError" and "authentication failed" in res[1] for res in results), results


async def test_ssl_is_refused_rather_than_ignored() -> None:
    with pytest.raises(NotImplementedError):
        await dist.init_process_group(timeout=1, ssl=object())
    assert not dist.is_initialized()
