"""init_process_group's secret= and ssl= options, with ranks as tasks of one process over real TCP."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_ranks

import aiodist.api as dist
from aiodist.auth import AuthenticationError
from aiodist.errors import CollectiveTimeoutError, PeerFailureError, RendezvousTimeoutError


async def _sum(secret_of: Any, timeout: float = 10) -> list[Any]:
    async def rank(r: int) -> Any:
        try:
            pg = await dist.init_process_group(timeout=timeout, secret=secret_of(r))
        except (AuthenticationError, RendezvousTimeoutError) as e:
            return type(e).__name__, str(e)
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
    """Rank 0's store refuses rank 1 (the store cannot prove rank 1's secret): it never joins, rank 0 times out."""
    results = await _sum(lambda r: f"secret-{r}".encode(), timeout=2)
    assert results[1][0] == "AuthenticationError" and "did not prove the job's secret" in results[1][1], results
    assert results[0][0] == "RendezvousTimeoutError" and "ranks [1] did not join" in results[0][1], results


async def test_an_ssl_option_that_is_not_tls_is_refused_rather_than_ignored() -> None:
    with pytest.raises(TypeError):
        await dist.init_process_group(timeout=1, ssl=object())
    assert not dist.is_initialized()
