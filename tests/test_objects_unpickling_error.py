"""An object whose unpickling fails on the receiving rank: its own error, with a note naming the rank it came from.

Before: the bare error (a ZeroDivisionError out of ``__setstate__``) with no hint of which rank's object it was.
The type stays (torch raises the original too; a program may catch it).
"""

from __future__ import annotations

from typing import Any

import sim

import aiodist


def _rebuild(origin: int) -> Poison:
    if aiodist.get_rank() != origin:
        raise ZeroDivisionError(f"cannot rebuild rank {origin}'s object here")
    return Poison(origin)


class Poison:
    """Unpickles only on the rank that made it."""

    def __init__(self, origin: int) -> None:
        self.origin = origin

    def __reduce__(self) -> Any:
        return _rebuild, (self.origin,)


async def _caught(work: Any) -> Any:
    try:
        await work
    except aiodist.PeerCallFailedError:
        return "peer failed"
    except Exception as e:
        return type(e).__name__, [n for n in getattr(e, "__notes__", []) if "unpickling" in n]
    return "ok"


async def main() -> dict[str, Any]:
    pg = await aiodist.init_process_group()
    r = pg.rank
    got: dict[str, Any] = {}
    obj = Poison(r) if r == 2 else r
    got["all_gather_object"] = await _caught(aiodist.all_gather_object([None] * 3, obj))
    got["gather_object"] = await _caught(aiodist.gather_object(Poison(r) if r == 1 else r, [None] * 3 if r == 0 else None, dst=0))
    got["broadcast_object_list"] = await _caught(aiodist.broadcast_object_list([Poison(1) if r == 1 else None], src=1))
    got["scatter_object_list"] = await _caught(
        aiodist.scatter_object_list([None], [Poison(2)] * 3 if r == 2 else None, src=2))
    if r == 0:
        got["recv_object_list"] = await _caught(aiodist.recv_object_list([None], src=1))
    elif r == 1:
        await aiodist.send_object_list([Poison(1)], dst=0)
    sub = await aiodist.new_group([1, 2])
    if r in (1, 2):
        got["sub gather_object"] = await _caught(aiodist.gather_object(Poison(r), [None] * 2 if r == 1 else None,
                                                                       dst=1, group=sub))
    await aiodist.barrier()
    await aiodist.destroy_process_group()
    return got


def _error(sender: str, op: str) -> tuple[str, list[str]]:
    return "ZeroDivisionError", [f"while unpickling the object from {sender} in {op}"]


def test_the_unpickling_error_keeps_its_type_and_names_the_sending_rank() -> None:
    # (fixed timing: where a peer's notice that its part failed comes before a rank's own data, that rank
    # raises PeerCallFailedError instead, as it may for real)
    res = sim.run(main, world_size=3, seed=0, trace=False, explore=False)
    assert res.ok, res.summary()
    r0, r1, r2 = res.rank_results
    assert r0["all_gather_object"] == _error("rank 2", "all_gather_object")
    assert r1["all_gather_object"] == _error("rank 2", "all_gather_object")
    assert r0["gather_object"] == _error("rank 1", "gather_object")
    assert r0["broadcast_object_list"] == _error("rank 1", "broadcast_object_list")
    assert r2["broadcast_object_list"] == _error("rank 1", "broadcast_object_list")
    assert r0["scatter_object_list"] == _error("rank 2", "scatter_object_list")
    assert r1["scatter_object_list"] == _error("rank 2", "scatter_object_list")
    assert r0["recv_object_list"] == _error("rank 1", "recv_object_list")
    # in a subgroup: the global rank, and the group rank that differs from it
    (note,) = r1["sub gather_object"][1]
    assert r1["sub gather_object"][0] == "ZeroDivisionError"
    assert note.startswith("while unpickling the object from rank 2 (rank 1 of ") and note.endswith(") in gather_object")
