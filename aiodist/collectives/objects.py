"""Object collectives: picklable Python objects instead of arrays.

Objects travel pickled. The Channel's ``recv_bytes`` receives a message of
any size, so unlike torch (which first exchanges sizes to size its tensors)
each edge carries a single message; the byte count is the message's length.

Unpickling runs arbitrary code: use these only among trusted ranks, as with
torch.distributed. An object whose unpickling raises here raises that error,
of its own type (as torch's), with a note naming the rank it came from.
"""

from __future__ import annotations

import pickle
from collections.abc import MutableSequence, Sequence
from typing import Any

from .rooted import check_root
from .schedules import binomial_tree, ring
from .transfer import SMALL_SEND_BYTES, run_all
from ..channel import Channel
from .. import wire
from ..errors import CollectiveMismatchError, InvalidArgumentError, InvalidArrayError

__all__ = ["all_gather_object", "broadcast_object_list", "dumps", "gather_object", "scatter_object_list"]


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for one message (refused past :data:`~aiodist.wire.MAX_MESSAGE_BYTES`)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > wire.MAX_MESSAGE_BYTES:
        raise InvalidArgumentError(
            f"a pickled object of {len(data)} bytes: one message carries at most {wire.MAX_MESSAGE_BYTES} bytes; "
            "send large arrays with the array collectives (they split them), or the object in parts")
    return data


def _loads(ch: Channel, payload: bytes | memoryview, src: int, op: str) -> Any:
    """Unpickle what group rank ``src`` pickled; an error keeps its type, with a note naming ``src`` and ``op``."""
    try:
        return pickle.loads(payload)
    except Exception as e:
        e.add_note(unpickling_note(ch.peer_name(src), op))
        raise


def unpickling_note(who: str, op: str) -> str:
    """The note on an error raised by unpickling the object(s) ``who`` ("rank 3") sent in ``op``."""
    return f"while unpickling the object from {who} in {op}"


async def all_gather_object(ch: Channel, seq: int, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (ring of p-1 steps)."""
    p, rank = ch.size, ch.rank
    payloads: list[bytes | memoryview] = [b""] * p
    payloads[rank] = dumps(obj)
    plan = ring(p, rank)
    for s, (sb, rb) in enumerate(plan.allgather):
        key = (seq, s)
        outgoing = payloads[sb]
        if len(outgoing) <= SMALL_SEND_BYTES:
            await ch.send(plan.right, key, outgoing)
            payloads[rb] = await ch.recv_bytes(plan.left, key)
        else:
            box: list[memoryview] = []

            async def fetch() -> None:
                box.append(await ch.recv_bytes(plan.left, key))

            await run_all([ch.send(plan.right, key, outgoing), fetch()])
            payloads[rb] = box[0]
    return [_loads(ch, b, i, "all_gather_object") for i, b in enumerate(payloads)]


async def broadcast_object_list(ch: Channel, seq: int, object_list: MutableSequence[Any], root: int) -> None:
    """Replace the items of every rank's ``object_list`` with ``root``'s, in place (binomial tree).

    The lists must have the same length on all ranks (a difference raises
    CollectiveMismatchError on the rank that has it).
    """
    p, rank = ch.size, ch.rank
    root = check_root(root, p, "src")
    if p == 1:
        return
    tree = binomial_tree(p, rank, root)
    payload: bytes | memoryview
    if tree.parent is None:
        payload = dumps(list(object_list))
    else:
        payload = await ch.recv_bytes(tree.parent, (seq, tree.parent_step))
    for child, step in tree.children:
        await ch.send(child, (seq, step), payload)
    if rank != root:
        objs = _loads(ch, payload, root, "broadcast_object_list")
        if len(objs) != len(object_list):
            raise CollectiveMismatchError(
                f"rank {root} broadcast a list of {len(objs)} objects into this rank's list of {len(object_list)}",
                calls={root: f"broadcast_object_list(len={len(objs)})", rank: f"broadcast_object_list(len={len(object_list)})"},
                seq=seq,
            )
        object_list[:] = objs


async def gather_object(
    ch: Channel, seq: int, obj: Any, root: int, object_gather_list: MutableSequence[Any] | None = None
) -> list[Any] | None:
    """Collect every rank's ``obj`` at ``root``: the list there (also written into ``object_gather_list``), else None."""
    p, rank = ch.size, ch.rank
    root = check_root(root, p, "dst")
    if rank != root:
        await ch.send(root, (seq, 0), dumps(obj))
        return None
    if object_gather_list is not None and len(object_gather_list) < p:
        raise InvalidArrayError(
            f"object_gather_list has {len(object_gather_list)} entries, fewer than the group's {p} ranks",
            argument="object_gather_list",
            reason="length",
        )
    got: list[Any] = [None] * p
    got[root] = obj
    for i in range(p):
        if i != root:
            got[i] = _loads(ch, await ch.recv_bytes(i, (seq, 0)), i, "gather_object")
    if object_gather_list is not None:
        object_gather_list[:p] = got  # (torch's: the first p entries; the list keeps its length)
    return got


async def scatter_object_list(
    ch: Channel,
    seq: int,
    output_list: MutableSequence[Any],
    input_list: Sequence[Any] | None,
    root: int,
) -> Any:
    """Give rank ``i`` the root's ``input_list[i]`` as ``output_list[0]``; return it too."""
    p, rank = ch.size, ch.rank
    root = check_root(root, p, "src")
    if len(output_list) < 1:
        raise InvalidArrayError("output_list must have at least one entry", argument="output_list", reason="length")
    if rank != root:
        output_list[0] = _loads(ch, await ch.recv_bytes(root, (seq, 0)), root, "scatter_object_list")
        return output_list[0]
    if input_list is None or len(input_list) != p:
        raise InvalidArrayError(
            f"input_list must have one object per rank ({p}) on the source rank",
            argument="input_list",
            reason="length",
        )
    await run_all([ch.send(i, (seq, 0), dumps(input_list[i])) for i in range(p) if i != root])
    output_list[0] = input_list[root]
    return output_list[0]
