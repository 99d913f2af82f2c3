"""A process group's object operations and coalesced collectives (mixins of :class:`~aiodist.group.ProcessGroup`).

Object operations move picklable Python objects: the object collectives
(:mod:`aiodist.collectives.objects`), and ``send_object_list`` /
``recv_object_list`` (one point-to-point message: the pickled list; it
carries the label ``pickle`` where an array's message carries its dtype, so
a tensor receive that gets it fails naming both). Unpickling runs arbitrary
code: use them among trusted ranks only, as with torch.distributed.

Coalesced collectives (torch's ``all_reduce_coalesced``,
``all_gather_coalesced``) run several arrays of one dtype as one
collective: packed into one buffer, reduced or gathered once, unpacked. Their
signature lists every array's element count, so ranks that pass different
lists fail with CollectiveMismatchError (torch does not check this).

Same rules as the group's other operations: group ranks, validation before
any communication, one sequence number per call, a finished Work doing
nothing on a rank that is not a member.
"""

from __future__ import annotations

import pickle
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from . import p2p
from .arguments import refuse_off_root
from .collectives.allreduce import all_reduce_flat
from .collectives.buffers import as_flat
from .collectives.objects import (
    all_gather_object, broadcast_object_list, dumps, gather_object, scatter_object_list, unpickling_note,
)
from .collectives.allgather import all_gather_into_tensor
from .collectives.ops import PremulSum, ReduceOp, premultiply
from .channel import Channel
from .comm import GroupComm
from .comm.channel import peer_name
from .errors import (
    CollectiveMismatchError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidArrayError,
    InvalidRankError,
)
from .op_runner import OpRunner, in_step
from .signatures import reduction
from .work import Work

__all__ = ["CoalescedOperations", "ObjectOperations"]

PICKLE = p2p.PICKLE


class _GroupParts:
    """What the mixins use of :class:`~aiodist.group.ProcessGroup`."""

    _comm: GroupComm
    _runner: OpRunner
    name: str

    @property
    def rank(self) -> int:
        raise NotImplementedError  # pragma: no cover

    @property
    def size(self) -> int:
        raise NotImplementedError  # pragma: no cover

    def _check_peer(self, peer: Any, what: str) -> int:
        raise NotImplementedError  # pragma: no cover


class ObjectOperations(_GroupParts):
    """The object collectives and object point-to-point of a group."""

    @in_step
    def all_gather_object(
        self, obj: Any, *, timeout: Any = None, object_list: list[Any] | None = None
    ) -> Work[list[Any]]:
        """Every rank's (picklable) ``obj``, as a list indexed by group rank.

        ``object_list`` (torch's form): also written into its first ``size`` entries, and returned.
        """
        if self._comm.rank < 0:
            return self._runner.absent("all_gather_object")
        body: Callable[..., Awaitable[Any]] = all_gather_object
        if object_list is not None:
            if not isinstance(object_list, list) or len(object_list) < self._comm.size:
                raise InvalidArgumentError(
                    f"all_gather_object: object_list must be a list of at least {self._comm.size} entries (one per rank "
                    f"of {self.name}), got {_describe_list(object_list)}"
                )
            body = _filling(object_list)
        return self._runner.collective("all_gather_object", "all_gather_object", body, (obj,), timeout)

    @in_step
    def broadcast_object_list(self, object_list: list[Any], src: int = 0, *, timeout: Any = None) -> Work[list[Any]]:
        """Replace the entries of ``object_list`` with rank ``src``'s; returns ``object_list``."""
        if self._comm.rank < 0:
            return self._runner.absent("broadcast_object_list", object_list)
        root = self._check_peer(src, "src")
        if not isinstance(object_list, list):
            raise InvalidArgumentTypeError(f"object_list must be a list, not {type(object_list).__name__}")
        return self._runner.collective(
            "broadcast_object_list", f"broadcast_object_list src={root}", broadcast_object_list,
            (object_list, root), timeout, result=object_list,
        )

    @in_step
    def gather_object(
        self, obj: Any, dst: int = 0, *, timeout: Any = None, object_gather_list: list[Any] | None = None
    ) -> Work[list[Any] | None]:
        """Every rank's ``obj`` as a list on rank ``dst`` (None elsewhere).

        ``object_gather_list`` (torch's form; used on ``dst`` only): the objects are written into its
        first ``size`` entries too (as torch does; later entries are left alone).
        """
        if self._comm.rank < 0:
            return self._runner.absent("gather_object")
        root = self._check_peer(dst, "dst")
        if self._comm.rank != root:
            refuse_off_root("gather_object", "object_gather_list", object_gather_list, self._comm.rank, root, "dst")
            object_gather_list = None
        elif object_gather_list is not None:
            if not isinstance(object_gather_list, list) or len(object_gather_list) < self._comm.size:
                raise InvalidArgumentError(
                    f"gather_object: object_gather_list must be a list of at least {self._comm.size} entries on the "
                    f"destination rank, got {_describe_list(object_gather_list)}"
                )
        return self._runner.collective(
            "gather_object", f"gather_object dst={root}", gather_object, (obj, root, object_gather_list), timeout
        )

    @in_step
    def scatter_object_list(
        self, out: list[Any], in_list: Sequence[Any] | None = None, src: int = 0, *, timeout: Any = None
    ) -> Work[list[Any]]:
        """Rank ``src`` sends ``in_list[i]`` to rank i, which stores it as ``out[0]``; returns ``out``."""
        if self._comm.rank < 0:
            return self._runner.absent("scatter_object_list", out)
        root = self._check_peer(src, "src")
        if not isinstance(out, list) or not out:
            raise InvalidArgumentError("out must be a list with at least one entry (the received object goes in out[0])")
        if self._comm.rank == root:
            if in_list is None or len(in_list) != self._comm.size:
                raise InvalidArgumentError(f"scatter_object_list: rank {root} must pass in_list of {self._comm.size} objects")
        return self._runner.collective(
            "scatter_object_list", f"scatter_object_list src={root}", scatter_object_list,
            (out, in_list if self._comm.rank == root else None, root), timeout, result=out,
        )

    def send_object_list(self, object_list: list[Any], dst: int, tag: int = 0, *, timeout: Any = None) -> Work[None]:
        """Send the (picklable) objects of ``object_list`` to group rank ``dst`` as one message."""
        if self._comm.rank < 0:
            return self._runner.absent("send_object_list")
        self._runner.check_usable("send_object_list")
        peer = self._p2p_peer(dst, "dst", "send_object_list")
        assert peer is not None
        if not isinstance(object_list, list):
            raise InvalidArgumentTypeError(f"object_list must be a list, not {type(object_list).__name__}")
        data = np.frombuffer(dumps(list(object_list)), np.uint8)
        start = p2p.send(self._comm, data, peer, tag, timeout=self._runner.timeout_of(timeout), label=PICKLE)
        return self._runner.spawn(start, op="send_object_list")

    def recv_object_list(
        self, object_list: list[Any], src: int | None = None, tag: int = 0, *, timeout: Any = None
    ) -> Work[int]:
        """Receive the objects a ``send_object_list`` sent into ``object_list`` (same length); returns the sender."""
        if self._comm.rank < 0:
            return self._runner.absent("recv_object_list", -1)
        self._runner.check_usable("recv_object_list")
        peer = self._p2p_peer(src, "src", "recv_object_list")
        if not isinstance(object_list, list):
            raise InvalidArgumentTypeError(f"object_list must be a list, not {type(object_list).__name__}")
        receive, posted = p2p.recv_message(self._comm, peer, tag, PICKLE, timeout=self._runner.timeout_of(timeout))

        async def unpack() -> tuple[int, list[Any]]:
            sender: int
            sender, payload = await receive()
            try:
                objs = pickle.loads(payload)
            except Exception as e:  # (its own type, as torch's; the note names the sender)
                e.add_note(unpickling_note(peer_name(self._comm.ranks, self.name, sender), "recv_object_list"))
                raise
            if len(objs) != len(object_list):
                raise CollectiveMismatchError(
                    f"recv_object_list (tag {tag}) of {self.name}: rank {sender} sent {len(objs)} objects but "
                    f"rank {self._comm.rank} receives into a list of {len(object_list)}",
                    calls={sender: f"send_object_list(len={len(objs)})", self._comm.rank: f"recv_object_list(len={len(object_list)})"},
                )
            return sender, objs

        def fill(got: tuple[int, list[Any]]) -> int:
            # When the awaiter takes the result, not when the message came: an awaiter cancelled in between
            # gives the message back to the next receive (see Work) and leaves its list as it was.
            sender, objs = got
            object_list[:] = objs
            return sender

        return self._runner.spawn(unpack, op="recv_object_list", withdraw=posted).then(fill)

    def _p2p_peer(self, peer: Any, what: str, op: str) -> int | None:
        if peer is None and what == "src":
            return None
        r = self._check_peer(peer, what)
        if r == self._comm.rank:
            raise InvalidRankError(f"{op}: {what}={peer} is this rank", rank=r, size=self._comm.size, argument=what)
        return r


def _filling(object_list: list[Any]) -> Callable[..., Awaitable[list[Any]]]:
    """all_gather_object that also writes the objects into ``object_list`` (torch's form)."""

    async def body(ch: Channel, seq: int, obj: Any) -> list[Any]:
        got = await all_gather_object(ch, seq, obj)
        object_list[: len(got)] = got
        return object_list

    return body


def _describe_list(x: Any) -> str:
    return f"a list of {len(x)}" if isinstance(x, list) else type(x).__name__


class CoalescedOperations(_GroupParts):
    """torch's coalesced collectives: several arrays of one dtype as one operation."""

    @in_step
    def all_reduce_coalesced(self, tensors: Sequence[Any], op: Any = None, *, timeout: Any = None) -> Work[Any]:
        """Reduce every array of ``tensors`` over the group in place, as one collective; returns ``tensors``."""
        if self._comm.rank < 0:
            return self._runner.absent("all_reduce_coalesced", tensors)
        op = ReduceOp.SUM if op is None else op
        flats = _same_dtype_list(tensors, "tensors", writable=True)
        rop, what = reduction(op, flats[0])
        sizes = [f.size for f in flats]
        sig = f"all_reduce_coalesced {what} n={sizes}"
        factor = op if type(op) is PremulSum else None
        return self._runner.collective(
            "all_reduce_coalesced", sig, _reduce_packed, (flats, rop, factor), timeout, result=tensors
        )

    @in_step
    def all_gather_coalesced(
        self, output_lists: Sequence[Sequence[Any]], input_list: Sequence[Any], *, timeout: Any = None
    ) -> Work[Any]:
        """``output_lists[r][i]`` = rank r's ``input_list[i]``, as one collective; returns ``output_lists``."""
        if self._comm.rank < 0:
            return self._runner.absent("all_gather_coalesced", output_lists)
        ins = _same_dtype_list(input_list, "input_tensor_list", writable=False)
        if not isinstance(output_lists, Sequence) or len(output_lists) != self._comm.size:
            raise InvalidArrayError(
                f"output_tensor_lists must be a list of {self._comm.size} lists (one per rank of {self.name})",
                argument="output_tensor_lists", reason="length",
            )
        outs: list[list[np.ndarray]] = []
        for r, lst in enumerate(output_lists):
            name = f"output_tensor_lists[{r}]"
            if not isinstance(lst, Sequence) or len(lst) != len(ins):
                raise InvalidArrayError(
                    f"{name} must be a list of {len(ins)} arrays (one per input)", argument=name, reason="length"
                )
            row = []
            for i, a in enumerate(lst):
                flat = as_flat(a, f"{name}[{i}]", writable=True)
                if flat.dtype != ins[0].dtype or flat.size != ins[i].size:
                    raise InvalidArrayError(
                        f"{name}[{i}] is {flat.dtype.name}[{flat.size}], expected {ins[i].dtype.name}[{ins[i].size}]",
                        argument=f"{name}[{i}]", reason="size" if flat.dtype == ins[0].dtype else "dtype",
                    )
                row.append(flat)
            outs.append(row)
        sig = f"all_gather_coalesced {ins[0].dtype.name} n={[f.size for f in ins]}"
        return self._runner.collective(
            "all_gather_coalesced", sig, _gather_packed, (outs, ins), timeout, result=output_lists
        )


def _same_dtype_list(arrs: Any, argument: str, *, writable: bool) -> list[np.ndarray]:
    if isinstance(arrs, np.ndarray) or not isinstance(arrs, Sequence) or not arrs:
        raise InvalidArrayError(f"{argument} must be a non-empty list of arrays", argument=argument, reason="type")
    flats = [as_flat(a, f"{argument}[{i}]", writable=writable) for i, a in enumerate(arrs)]
    for i, f in enumerate(flats[1:], start=1):
        if f.dtype != flats[0].dtype:
            raise InvalidArrayError(
                f"{argument}[{i}] has dtype {f.dtype.name} but {argument}[0] has {flats[0].dtype.name}: "
                "a coalesced collective takes arrays of one dtype",
                argument=f"{argument}[{i}]", reason="dtype",
            )
    return flats


async def _reduce_packed(ch: Channel, seq: int, flats: list[np.ndarray], op: Any, factor: PremulSum | None) -> None:
    buf = np.concatenate(flats) if len(flats) > 1 else flats[0]
    if factor is not None:
        premultiply(factor, buf, in_place=True)
    await all_reduce_flat(ch, seq, buf, op)
    if buf is flats[0]:
        return
    at = 0
    for f in flats:
        f[...] = buf[at : at + f.size]
        at += f.size


async def _gather_packed(ch: Channel, seq: int, outs: list[list[np.ndarray]], ins: list[np.ndarray]) -> None:
    mine = np.concatenate(ins) if len(ins) > 1 else ins[0]
    out = np.empty(mine.size * ch.size, mine.dtype)
    await all_gather_into_tensor(ch, seq, out, mine)
    at = 0
    for row in outs:
        for f in row:
            f[...] = out[at : at + f.size]
            at += f.size
