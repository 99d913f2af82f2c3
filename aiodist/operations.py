"""Every operation as a module-level function on the calling rank's default group, with torch's signatures.

Each acts on the default group unless ``group=`` names another, takes
*global* ranks for ``src``/``dst`` (or ranks of the group as ``group_src`` /
``group_dst``), and returns a :class:`~aiodist.work.Work` that is already
started: await it (``await work`` and ``await work.wait()`` are the same).

torch's forms work as written for torch.distributed, plus ``await``: the same
argument order and keyword names (``tensor=``, ``tensor_list=``,
``output_tensor_list=``, ``object_list=``...), ``async_op=`` (accepted; the
call returns an awaitable Work either way), a timeout in seconds or as a
``timedelta``, torch's argument orders for the object collectives
(``all_gather_object(object_list, obj)`` fills ``object_list``). aiodist's own
forms keep working (``x=``, ``out_list=``, ``all_gather_object(obj)`` returning
the list, ``gather_object(obj, dst)``).

On a rank that is not a member of ``group`` every operation does nothing and
returns a finished Work (a warning the first time), as torch's do; except
``send``, ``send_object_list`` and ``recv_object_list``, which raise
:class:`~aiodist.errors.NotMemberError` (a ValueError) there, as torch 2.13's
raise ValueError "Invalid process group specified" (``isend``, ``irecv`` and
``recv`` do nothing, with a warning, in both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .arguments import MISSING, either, root
from .collectives.ops import ReduceOp
from .current import operating
from .errors import InvalidArgumentTypeError
from .group import ProcessGroup
from .work import Work

__all__ = [
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object", "all_gather_single", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
    "gather", "gather_object", "irecv", "isend", "monitored_barrier", "recv", "recv_object_list", "reduce",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "send_object_list",
]

_SUM = ReduceOp.SUM


def _root(fn: str, pg: ProcessGroup, global_rank: Any, group_rank: Any, what: str) -> int:
    """:func:`~aiodist.arguments.root` for a collective: a root refused here (no such rank, not a member)
    still takes the call's sequence number and the other members are told (as for the group's own
    argument checks: see :func:`~aiodist.op_runner.in_step`), so the group stays in step."""
    try:
        return root(fn, pg, global_rank, group_rank, what)
    except (ValueError, TypeError) as e:
        pg._runner.refused(fn, e)
        raise


# ---------------------------------------------------------------------- collectives


def all_reduce(
    tensor: Any = MISSING, op: Any = _SUM, group: ProcessGroup | None = None, async_op: bool = False,
    *, timeout: Any = None, x: Any = MISSING,
) -> Work[Any]:
    """Reduce ``tensor`` over the group in place (``op``: a ReduceOp); the Work returns ``tensor``."""
    if tensor is MISSING or x is not MISSING:
        tensor = either("all_reduce", tensor, "tensor", x, "x")
    return operating(group, "all_reduce").all_reduce(tensor, op, timeout=timeout)


def broadcast(
    tensor: Any = MISSING, src: int | None = None, group: ProcessGroup | None = None, async_op: bool = False,
    group_src: int | None = None, *, timeout: Any = None, x: Any = MISSING,
) -> Work[Any]:
    """Copy the ``tensor`` of global rank ``src`` (default 0; or ``group_src``) into every rank's ``tensor``."""
    tensor = either("broadcast", tensor, "tensor", x, "x")
    pg = operating(group, "broadcast")
    if pg.rank < 0:
        return pg.broadcast(tensor)
    return pg.broadcast(tensor, _root("broadcast", pg, src, group_src, "src"), timeout=timeout)


def reduce(
    tensor: Any = MISSING, dst: int | None = None, op: Any = _SUM, group: ProcessGroup | None = None,
    async_op: bool = False, group_dst: int | None = None, *, timeout: Any = None, x: Any = MISSING,
) -> Work[Any]:
    """Reduce every rank's ``tensor`` into that of global rank ``dst`` (default 0; or ``group_dst``)."""
    tensor = either("reduce", tensor, "tensor", x, "x")
    pg = operating(group, "reduce")
    if pg.rank < 0:
        return pg.reduce(tensor)
    return pg.reduce(tensor, _root("reduce", pg, dst, group_dst, "dst"), op, timeout=timeout)


def all_gather(
    tensor_list: Any = MISSING, tensor: Any = MISSING, group: ProcessGroup | None = None, async_op: bool = False,
    *, timeout: Any = None, out_list: Any = MISSING, x: Any = MISSING,
) -> Work[Any]:
    """Fill ``tensor_list[i]`` with rank i's ``tensor``; returns ``tensor_list``."""
    tensor_list = either("all_gather", tensor_list, "tensor_list", out_list, "out_list")
    tensor = either("all_gather", tensor, "tensor", x, "x")
    return operating(group, "all_gather").all_gather(tensor_list, tensor, timeout=timeout)


def all_gather_into_tensor(
    output_tensor: Any = MISSING, input_tensor: Any = MISSING, group: ProcessGroup | None = None,
    async_op: bool = False, *, timeout: Any = None, out: Any = MISSING, x: Any = MISSING,
) -> Work[Any]:
    """Concatenate every rank's ``input_tensor`` into ``output_tensor``; returns ``output_tensor``."""
    output_tensor = either("all_gather_into_tensor", output_tensor, "output_tensor", out, "out")
    input_tensor = either("all_gather_into_tensor", input_tensor, "input_tensor", x, "x")
    return operating(group, "all_gather_into_tensor").all_gather_into_tensor(output_tensor, input_tensor, timeout=timeout)


def gather(
    tensor: Any = MISSING, gather_list: Sequence[Any] | None = None, dst: int | None = None,
    group: ProcessGroup | None = None, async_op: bool = False, group_dst: int | None = None,
    *, timeout: Any = None, x: Any = MISSING,
) -> Work[Any]:
    """Collect every rank's ``tensor`` into ``gather_list`` on global rank ``dst`` (default 0; or ``group_dst``)."""
    tensor = either("gather", tensor, "tensor", x, "x")
    pg = operating(group, "gather")
    if pg.rank < 0:
        return pg.gather(tensor)
    return pg.gather(tensor, gather_list, _root("gather", pg, dst, group_dst, "dst"), timeout=timeout)


def scatter(
    tensor: Any = MISSING, scatter_list: Sequence[Any] | None = None, src: int | None = None,
    group: ProcessGroup | None = None, async_op: bool = False, group_src: int | None = None,
    *, timeout: Any = None, x: Any = MISSING,
) -> Work[Any]:
    """Global rank ``src`` (default 0; or ``group_src``) sends ``scatter_list[i]`` to rank i's ``tensor``."""
    tensor = either("scatter", tensor, "tensor", x, "x")
    pg = operating(group, "scatter")
    if pg.rank < 0:
        return pg.scatter(tensor)
    return pg.scatter(tensor, scatter_list, _root("scatter", pg, src, group_src, "src"), timeout=timeout)


def reduce_scatter(
    output: Any = MISSING, input_list: Any = MISSING, op: Any = _SUM, group: ProcessGroup | None = None,
    async_op: bool = False, *, timeout: Any = None, out: Any = MISSING, in_list: Any = MISSING,
) -> Work[Any]:
    """``output`` = the reduction over ranks of their ``input_list[rank]``; returns ``output``.

    The chunks may differ in size, as gloo allows: ``input_list[i]`` has the same size on every rank and
    ``output`` that of ``input_list[rank]``.
    """
    output = either("reduce_scatter", output, "output", out, "out")
    input_list = either("reduce_scatter", input_list, "input_list", in_list, "in_list")
    return operating(group, "reduce_scatter").reduce_scatter(output, input_list, op, timeout=timeout)


def reduce_scatter_tensor(
    output: Any = MISSING, input: Any = MISSING, op: Any = _SUM, group: ProcessGroup | None = None,
    async_op: bool = False, *, timeout: Any = None, out: Any = MISSING, x: Any = MISSING,
) -> Work[Any]:
    """``output`` = the reduction over ranks of their chunk ``rank`` of ``input``; returns ``output``."""
    output = either("reduce_scatter_tensor", output, "output", out, "out")
    input = either("reduce_scatter_tensor", input, "input", x, "x")
    return operating(group, "reduce_scatter_tensor").reduce_scatter_tensor(output, input, op, timeout=timeout)


all_gather_single = all_gather_into_tensor
"""torch's newer name for :func:`all_gather_into_tensor`."""

reduce_scatter_single = reduce_scatter_tensor
"""torch's newer name for :func:`reduce_scatter_tensor`."""


def all_to_all(
    output_tensor_list: Any = MISSING, input_tensor_list: Any = MISSING, group: ProcessGroup | None = None,
    async_op: bool = False, *, timeout: Any = None, out_list: Any = MISSING, in_list: Any = MISSING,
) -> Work[Any]:
    """Rank i's ``input_tensor_list[j]`` lands in rank j's ``output_tensor_list[i]``."""
    output_tensor_list = either("all_to_all", output_tensor_list, "output_tensor_list", out_list, "out_list")
    input_tensor_list = either("all_to_all", input_tensor_list, "input_tensor_list", in_list, "in_list")
    return operating(group, "all_to_all").all_to_all(output_tensor_list, input_tensor_list, timeout=timeout)


def all_to_all_single(
    output: Any = MISSING, input: Any = MISSING, output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None, group: ProcessGroup | None = None, async_op: bool = False,
    *, timeout: Any = None, out: Any = MISSING, x: Any = MISSING,
) -> Work[Any]:
    """all_to_all on single arrays split along their first dimension; returns ``output``."""
    output = either("all_to_all_single", output, "output", out, "out")
    input = either("all_to_all_single", input, "input", x, "x")
    return operating(group, "all_to_all_single").all_to_all_single(output, input, output_split_sizes, input_split_sizes, timeout=timeout)


def barrier(
    group: ProcessGroup | None = None, async_op: bool = False, device_ids: Any = None, timeout: Any = None
) -> Work[None]:
    """Wait until every rank of the group reached its barrier (``device_ids`` is accepted and ignored)."""
    return operating(group, "barrier").barrier(timeout=timeout)


def monitored_barrier(group: ProcessGroup | None = None, timeout: Any = None, wait_all_ranks: bool = False) -> Work[None]:
    """A barrier through rank 0 whose timeout names the ranks that did not arrive (see ProcessGroup.monitored_barrier)."""
    return operating(group, "monitored_barrier").monitored_barrier(timeout, wait_all_ranks)


def all_reduce_coalesced(
    tensors: Sequence[Any], op: Any = _SUM, group: ProcessGroup | None = None, async_op: bool = False,
    *, timeout: Any = None,
) -> Work[Any]:
    """all_reduce of every array of ``tensors`` (one dtype) as one collective; returns ``tensors``."""
    return operating(group, "all_reduce_coalesced").all_reduce_coalesced(tensors, op, timeout=timeout)


def all_gather_coalesced(
    output_tensor_lists: Sequence[Sequence[Any]], input_tensor_list: Sequence[Any],
    group: ProcessGroup | None = None, async_op: bool = False, *, timeout: Any = None,
) -> Work[Any]:
    """``output_tensor_lists[r][i]`` = rank r's ``input_tensor_list[i]``, as one collective."""
    return operating(group, "all_gather_coalesced").all_gather_coalesced(output_tensor_lists, input_tensor_list, timeout=timeout)


# ---------------------------------------------------------------------- point to point


def send(
    tensor: Any = MISSING, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
    group_dst: int | None = None, *, timeout: Any = None, x: Any = MISSING,
) -> Work[None]:
    """Send ``tensor`` to global rank ``dst`` (or ``group_dst``) with ``tag``.

    On a rank that is not a member of ``group`` it raises :class:`~aiodist.errors.NotMemberError` (a
    ValueError), as torch's send does; :func:`isend` does nothing there, with a warning, as torch's does.
    """
    tensor = either("send", tensor, "tensor", x, "x")
    pg = operating(group, "send")
    if pg.rank < 0:
        pg._runner.refuse_not_member("send")
    return pg.send(tensor, root("send", pg, dst, group_dst, "dst", default=None), tag, timeout=timeout)


def isend(
    tensor: Any = MISSING, dst: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
    group_dst: int | None = None, *, timeout: Any = None, x: Any = MISSING,
) -> Work[None]:
    """:func:`send` (every call returns a Work to await), except on a rank that is not a member of ``group``:
    there it does nothing and returns a finished Work (a warning the first time), as torch's isend does."""
    tensor = either("isend", tensor, "tensor", x, "x")
    pg = operating(group, "isend")
    if pg.rank < 0:
        return pg._runner.absent("isend")
    return pg.send(tensor, root("isend", pg, dst, group_dst, "dst", default=None), tag, timeout=timeout)


def recv(
    tensor: Any = MISSING, src: int | None = None, group: ProcessGroup | None = None, tag: int = 0,
    group_src: int | None = None, *, timeout: Any = None, x: Any = MISSING,
) -> Work[int]:
    """Receive into ``tensor`` from global rank ``src`` (or ``group_src``; neither: any rank); the Work returns the sender's global rank.

    Cancelling a task that awaits it withdraws the receive (see :mod:`aiodist.work`).
    """
    tensor = either("recv", tensor, "tensor", x, "x")
    pg = operating(group, "recv")
    if pg.rank < 0:
        return pg.recv(tensor)
    local = None if src is None and group_src is None else root("recv", pg, src, group_src, "src")
    return pg.recv(tensor, local, tag, timeout=timeout).then(pg.global_rank)


irecv = recv


# ---------------------------------------------------------------------- objects


def all_gather_object(
    object_list: Any = MISSING, obj: Any = MISSING, group: ProcessGroup | None = None, *, timeout: Any = None
) -> Work[list[Any]]:
    """Every rank's picklable object, in rank order.

    torch's form ``all_gather_object(object_list, obj, group=None)`` fills
    ``object_list`` (one entry per rank); aiodist's ``all_gather_object(obj,
    group=None)`` returns the list. Both Works return the list.
    """
    if obj is MISSING or isinstance(obj, ProcessGroup):  # aiodist's form: (obj) or (obj, group)
        if object_list is MISSING:
            raise InvalidArgumentTypeError("all_gather_object() missing required argument: 'obj'")
        if isinstance(obj, ProcessGroup):
            if group is not None:
                raise InvalidArgumentTypeError("all_gather_object(obj, group): group given twice")
            group = obj
        return operating(group, "all_gather_object").all_gather_object(object_list, timeout=timeout)
    if object_list is MISSING:  # all_gather_object(obj=...)
        return operating(group, "all_gather_object").all_gather_object(obj, timeout=timeout)
    return operating(group, "all_gather_object").all_gather_object(obj, timeout=timeout, object_list=object_list)


def gather_object(
    obj: Any, object_gather_list: Any = None, dst: Any = None, group: ProcessGroup | None = None,
    group_dst: int | None = None, *, timeout: Any = None,
) -> Work[list[Any] | None]:
    """Every rank's object as a list on global rank ``dst`` (default 0; or ``group_dst``), None elsewhere.

    torch's form ``gather_object(obj, object_gather_list, dst)`` also fills
    ``object_gather_list`` on ``dst``; aiodist's ``gather_object(obj, dst, group)`` works too.
    """
    if isinstance(object_gather_list, int) and not isinstance(object_gather_list, bool):  # aiodist's (obj, dst, group)
        if isinstance(dst, ProcessGroup):
            if group is not None:
                raise InvalidArgumentTypeError("gather_object(obj, dst, group): group given twice")
            group, dst = dst, None
        elif dst is not None:
            raise InvalidArgumentTypeError(f"gather_object(obj, {object_gather_list}, {dst!r}): dst given twice")
        object_gather_list, dst = None, object_gather_list
    pg = operating(group, "gather_object")
    if pg.rank < 0:
        return pg.gather_object(obj)
    r = _root("gather_object", pg, dst, group_dst, "dst")
    return pg.gather_object(obj, r, timeout=timeout, object_gather_list=object_gather_list)


def broadcast_object_list(
    object_list: list[Any], src: int | None = None, group: ProcessGroup | None = None, device: Any = None,
    group_src: int | None = None, *, timeout: Any = None,
) -> Work[list[Any]]:
    """Replace the entries of every rank's ``object_list`` with those of global rank ``src`` (default 0)."""
    pg = operating(group, "broadcast_object_list")
    if pg.rank < 0:
        return pg.broadcast_object_list(object_list)
    r = _root("broadcast_object_list", pg, src, group_src, "src")
    return pg.broadcast_object_list(object_list, r, timeout=timeout)


def scatter_object_list(
    scatter_object_output_list: Any = MISSING, scatter_object_input_list: Sequence[Any] | None = None,
    src: int | None = None, group: ProcessGroup | None = None, group_src: int | None = None,
    *, timeout: Any = None, out: Any = MISSING, in_list: Any = MISSING,
) -> Work[list[Any]]:
    """Global rank ``src`` (default 0) sends ``scatter_object_input_list[i]`` to rank i's ``scatter_object_output_list[0]``."""
    output = either("scatter_object_list", scatter_object_output_list, "scatter_object_output_list", out, "out")
    inputs = either("scatter_object_list", scatter_object_input_list if scatter_object_input_list is not None
                    else MISSING, "scatter_object_input_list", in_list, "in_list", required=False)
    pg = operating(group, "scatter_object_list")
    if pg.rank < 0:
        return pg.scatter_object_list(output)
    r = _root("scatter_object_list", pg, src, group_src, "src")
    return pg.scatter_object_list(output, inputs, r, timeout=timeout)


def send_object_list(
    object_list: list[Any], dst: int | None = None, group: ProcessGroup | None = None, device: Any = None,
    group_dst: int | None = None, use_batch: bool = False, *, tag: int = 0, timeout: Any = None,
) -> Work[None]:
    """Send the picklable objects of ``object_list`` to global rank ``dst`` (or ``group_dst``)."""
    pg = operating(group, "send_object_list")
    if pg.rank < 0:  # (as torch's: ValueError "Invalid process group specified")
        pg._runner.refuse_not_member("send_object_list")
    r = root("send_object_list", pg, dst, group_dst, "dst", default=None)
    return pg.send_object_list(object_list, r, tag, timeout=timeout)


def recv_object_list(
    object_list: list[Any], src: int | None = None, group: ProcessGroup | None = None, device: Any = None,
    group_src: int | None = None, use_batch: bool = False, *, tag: int = 0, timeout: Any = None,
) -> Work[int]:
    """Receive what ``send_object_list`` sent into ``object_list`` (same length); the Work returns the sender's global rank."""
    pg = operating(group, "recv_object_list")
    if pg.rank < 0:  # (as torch's: ValueError "Invalid process group specified")
        pg._runner.refuse_not_member("recv_object_list")
    local = None if src is None and group_src is None else root("recv_object_list", pg, src, group_src, "src")
    return pg.recv_object_list(object_list, local, tag, timeout=timeout).then(pg.global_rank)
