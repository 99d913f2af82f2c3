"""Point-to-point send and receive within a group.

Point-to-point messages use their own key space, apart from the collectives'
sequence: a message is routed by (group, tag), and each carries the sender's
running number for its (group, destination, tag), taken when ``send`` is
*called*. The receiver delivers the messages of one (source, tag) in that
order, and matches them to receives in the order the receives were *called*
(a receive is posted at call time). A receive with ``src=None`` takes the
first message from any source and reports who sent it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .collectives.buffers import as_flat, byte_view
from .comm import GroupComm
from .comm.channel import new_receive
from .errors import CollectiveTimeoutError, PeerFailureError
from .inflight import waiting_in


def send(comm: GroupComm, x: Any, dst: int, tag: int, *, timeout: float) -> Any:
    """Validate and number a send to group rank ``dst`` now; return the coroutine that sends it.

    ``x`` must not be modified until the send completes. Cancellation: the
    message was handed to the transport whole or not at all (a number that
    was taken but never sent makes later messages of that (dst, tag) wait).
    """
    flat = as_flat(x, "x", writable=False)
    tag = _check_tag(tag)
    gdst = comm.ranks[dst]
    n = comm.transport.next_p2p_number(comm.gid, gdst, tag)
    header = {"t": "p", "g": comm.gid, "tag": tag, "n": n}
    payload = byte_view(flat)

    async def run() -> None:
        with waiting_in("send", group=comm.name, peer=dst, tag=tag):
            try:
                async with asyncio.timeout(timeout) as cm:
                    await comm.transport.send(gdst, header, payload, group=comm.gid)
            except PeerFailureError as e:
                raise comm.localize(e, op="send", seq=None) from None
            except TimeoutError:
                if not cm.expired():
                    raise
                raise _timeout("send", comm, [dst], tag, timeout) from None

    return run()


def recv(comm: GroupComm, x: Any, src: int | None, tag: int, *, timeout: float) -> Any:
    """Validate and post a receive into ``x`` now; return the coroutine that awaits it (-> group rank of the sender).

    Cancellation withdraws the receive if no message was matched to it yet;
    a message already being written into ``x`` is lost with it.
    """
    flat = as_flat(x, "x", writable=True)
    tag = _check_tag(tag)
    gsrc = None if src is None else comm.ranks[src]
    r, fut = new_receive(comm, src=gsrc, out=byte_view(flat), tag=tag)
    comm.transport.post(r)

    async def run() -> int:
        with waiting_in("recv", group=comm.name, peer=src, tag=tag):
            try:
                async with asyncio.timeout(timeout) as cm:
                    result = await fut
            except TimeoutError:
                comm.transport.router.cancel(r)
                if not cm.expired():
                    raise
                waiting = [src] if src is not None else [i for i in range(comm.size) if i != comm.rank]
                raise _timeout("recv", comm, waiting, tag, timeout) from None
            except BaseException:
                comm.transport.router.cancel(r)
                raise
        if isinstance(result, PeerFailureError):
            raise comm.localize(result, op="recv", seq=None)
        if isinstance(result, BaseException):
            raise result
        return comm.group_rank(result.src)

    return run()


def _check_tag(tag: Any) -> int:
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"tag must be an int, not {type(tag).__name__}")
    return tag


def _timeout(op: str, comm: GroupComm, waiting: list[int], tag: int, timeout: float) -> CollectiveTimeoutError:
    who = ", ".join(str(w) for w in waiting)
    return CollectiveTimeoutError(
        f"{op} (tag {tag}) of {comm.name} timed out after {timeout:g}s on rank {comm.rank}; waiting for rank(s) {who}",
        op=op,
        seq=None,
        waiting_for=waiting,
        timeout=timeout,
    )
