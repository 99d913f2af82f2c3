"""Bad arguments raise errors of aiodist's one hierarchy: AiodistError and also ValueError or TypeError.

Before, the same mistake landed in different families (``dst=4``: an
AiodistError; ``dst=1.0``: a plain TypeError), timeouts, store keys and
new_group's ranks raised plain ValueError/TypeError, and ``timeout="5"`` or
``timeout=True`` was taken as 5 s / 1 s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import run_world

import aiodist
import aiodist.api as dist


def _raises(kind: type[BaseException], call: Any) -> BaseException:
    with pytest.raises(kind) as info:
        call()
    assert isinstance(info.value, aiodist.AiodistError), (type(info.value).__mro__, info.value)
    return info.value


async def test_bad_arguments_are_aiodist_errors_and_value_or_type_errors() -> None:
    async def body(pg: Any) -> None:
        x = np.ones(2)
        peer = 1 - pg.rank
        _raises(TypeError, lambda: dist.send(x, dst=1.0))
        _raises(ValueError, lambda: dist.send(x, dst=4))
        _raises(TypeError, lambda: pg.send(x, dst=peer, tag="t"))
        _raises(ValueError, lambda: pg.send(x, dst=peer, tag=2**64))
        for bad in ("5", True, [1]):
            e = _raises(TypeError, lambda: pg.recv(x, src=peer, timeout=bad))
            assert "number of seconds" in str(e)
        _raises(ValueError, lambda: pg.recv(x, src=peer, timeout=-1))
        _raises(TypeError, lambda: pg.broadcast(x, src="0"))
        with pytest.raises(TypeError) as info:
            await pg.store.set(1, b"x")
        assert isinstance(info.value, aiodist.AiodistError)
        with pytest.raises(TypeError) as info:
            await pg.store.get("k", timeout="1")
        assert isinstance(info.value, aiodist.AiodistError)
        with pytest.raises(ValueError) as info:
            await dist.new_group([0, 0])
        assert isinstance(info.value, aiodist.AiodistError)
        await pg.barrier()  # (the refused calls above took their sequence numbers on both ranks alike)

    await run_world(2, body)
