"""A message larger than a frame carries (1 GiB) is refused by its sender, before anything is sent.

Before (both probes): a 1.1 GiB send or pickled object went out; the receiver took the frame for an attack and
dropped the link: PeerFailureError on both sides blaming the healthy peer, the link dead for the next barrier.
The limit is lowered here so that the test moves kilobytes, not gigabytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aiodist
import aiodist.api as dist
import sim
from aiodist import wire
from aiodist.errors import InvalidArgumentError, InvalidArrayError, PeerCallFailedError


async def _oversized() -> Any:
    pg = await dist.init_process_group()
    seen: list[Any] = []
    if pg.rank == 0:
        with pytest.raises(InvalidArrayError, match="one message carries at most 1000 bytes") as e:
            await dist.send(np.zeros(2000, np.uint8), 1)
        seen.append(e.value.reason)
        with pytest.raises(InvalidArgumentError, match="a pickled object of"):
            await dist.send_object_list([bytes(5000)], 1)
        await dist.send(np.arange(10, dtype=np.uint8), 1)  # the link is still up
    elif pg.rank == 1:
        x = np.zeros(10, np.uint8)
        await dist.recv(x, 0)
        seen.append(int(x.sum()))
    objs = [bytes(5000)] if pg.rank == 0 else [None]
    try:
        await dist.broadcast_object_list(objs, src=0)
    except (InvalidArgumentError, PeerCallFailedError) as e:
        seen.append(type(e).__name__)
    await dist.barrier()
    await dist.destroy_process_group()
    return seen


def test_an_oversized_message_is_refused_by_its_sender_and_the_link_stays_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 1000)
    res = sim.run(_oversized, world_size=3, seed=0)
    assert res.ok, res.summary()
    assert res.rank_results == [["size", "InvalidArgumentError"], [45, "PeerCallFailedError"], ["PeerCallFailedError"]]


def test_the_limit_is_what_a_link_frame_carries_besides_its_header() -> None:
    assert wire.MAX_MESSAGE_BYTES == 1 << 30 and wire.MAX_MESSAGE_BYTES < wire.DEFAULT_MAX_FRAME_SIZE
    assert aiodist.comm.connect.LINK_MAX_FRAME - wire.MAX_MESSAGE_BYTES >= wire.DEFAULT_MAX_HEADER_SIZE
