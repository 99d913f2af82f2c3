"""torch's batched point-to-point: :class:`P2POp` and :func:`batch_isend_irecv`.

``batch_isend_irecv([P2POp(aiodist.isend, x, 1), P2POp(aiodist.irecv, y, 1)])``
starts every operation of the list, in order, and returns their Works (await
each, or ``asyncio.gather`` them; or await the list itself: ``await
batch_isend_irecv(ops)`` waits for all of them and returns the list, so the
README's rule "``await`` every operation" holds here too). Every receive is
posted and every send numbered when the call returns, so a ring exchange
written this way cannot deadlock, as in torch.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

from . import operations
from .errors import InvalidArgumentError
from .work import Work

__all__ = ["P2POp", "WorkList", "batch_isend_irecv"]


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv` (torch's signature).

    ``op``: ``aiodist.isend`` or ``aiodist.irecv`` (``send``/``recv`` are taken
    as they: each operation starts as an ``isend``/``irecv``); ``peer``: a global
    rank, or ``group_peer``: a rank of ``group``.
    """

    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(
        self,
        op: Callable[..., Work[Any]],
        tensor: Any,
        peer: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        if op is operations.send:
            op = operations.isend
        if op is not operations.isend and op is not operations.irecv:
            raise InvalidArgumentError(
                f"P2POp: op must be aiodist.isend or aiodist.irecv, not {getattr(op, '__qualname__', op)!r}"
            )
        if peer is None and group_peer is None:
            raise InvalidArgumentError("P2POp: pass peer= (a global rank) or group_peer= (a rank of the group)")
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        what = "isend" if self.op is operations.isend else "irecv"
        who = f"peer={self.peer}" if self.peer is not None else f"group_peer={self.group_peer}"
        return f"P2POp({what}, {who}, tag={self.tag})"


class WorkList(list[Work[Any]]):
    """The Works of :func:`batch_isend_irecv`: a list, that can also be awaited as a whole.

    ``await works`` awaits every Work in order and returns the list; if some
    failed, the first error is raised once all of them ended (each was awaited,
    so none is reported as never awaited). Cancelling the awaiter withdraws the
    receives not yet awaited, as cancelling their own awaiters would.
    """

    def __await__(self) -> Generator[Any, None, WorkList]:
        return self._all().__await__()

    async def _all(self) -> WorkList:
        first: Exception | None = None
        for w in self:
            try:
                await w
            except Exception as e:  # (the others still end and are awaited)
                if first is None:
                    first = e
        if first is not None:
            raise first
        return self


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> WorkList:
    """Start every operation of ``p2p_op_list`` in order; their Works (await them, or the list)."""
    if isinstance(p2p_op_list, P2POp) or not isinstance(p2p_op_list, Sequence) or not p2p_op_list:
        raise InvalidArgumentError("batch_isend_irecv: p2p_op_list must be a non-empty list of P2POp")
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise InvalidArgumentError(f"batch_isend_irecv: p2p_op_list[{i}] is a {type(p).__name__}, not a P2POp")
    works = WorkList()
    try:
        for p in p2p_op_list:
            if p.op is operations.isend:
                works.append(operations.isend(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer))
            else:
                works.append(operations.recv(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer))
    except Exception as e:
        # The caller never gets the Works already started: none of them is reported as never awaited
        # (the warning would blame this call's line for what it could not await), and their receives
        # are withdrawn (a message for one is left for a later receive); their sends still go out.
        for w in works:
            w.abandon()
        if works:
            e.add_note(f"batch_isend_irecv: p2p_op_list[{len(works)}] was refused; the {len(works)} before it "
                       "had started (their receives were withdrawn, their sends go out)")
        raise
    return works
