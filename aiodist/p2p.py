"""Point-to-point send and receive within a group.

Point-to-point messages use their own key space, apart from the collectives'
sequence: a message is routed by (group, tag), and each carries the sender's
running number for its (group, destination, tag), taken when ``send`` is
*called*. The receiver delivers the messages of one (source, tag) in that
order, and matches them to receives in the order the receives were *called*
(a receive is posted at call time). A receive with ``src=None`` takes the
first message from any source and reports who sent it.

A message carries its array's dtype and shape (header keys ``dt``, ``sh``).
A receive refuses a message of another dtype, or of another number of
elements, with :class:`~aiodist.errors.CollectiveMismatchError` naming both
(the message is dropped; nothing is written into the receive's buffer):
bytes of one dtype are never silently read as another. A different shape
with the same number of elements is accepted, as torch.distributed does
(``send(torch.tensor(7.0))`` into ``torch.zeros(1)``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any, Final

import numpy as np

from . import wire
from .collectives.buffers import as_flat, byte_view
from .comm import GroupComm
from .comm.channel import new_receive
from .comm.links import LinkState
from .comm.router import Delivery, Receive
from .comm.settings import HELLO_TIMEOUT
from .deadline import Deadline
from .errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    InvalidArrayError,
    PeerFailureError,
)
from .inflight import waiting_in
from .signatures import dtype_name

DTYPE: Final = "dt"
SHAPE: Final = "sh"
PICKLE: Final = "pickle"
"""The label of a message of pickled objects (send_object_list), where an array's message names its dtype."""

def _shape(x: Any, flat: np.ndarray) -> list[int]:
    shape = getattr(x, "shape", None)
    return [flat.size] if shape is None else [int(d) for d in shape]


def _describe(dtype: Any, shape: Any) -> str:
    if dtype == PICKLE:
        return "pickled objects (send_object_list)"
    return f"{dtype}{list(shape) if isinstance(shape, (list, tuple)) else '[?]'}"


def send(
    comm: GroupComm, x: Any, dst: int, tag: int, *, timeout: float, label: str | None = None
) -> Callable[[], Coroutine[Any, Any, None]]:
    """Validate and number a send to group rank ``dst`` now; return the coroutine function that sends it.

    (A function, not a coroutine: the coroutine is made only by whatever runs it, so an operation that
    never starts -- its task cancelled or dropped before its first step -- leaves no coroutine behind
    that was "never awaited".)

    ``x`` must not be modified until the send completes. ``label``: what the
    header says in place of the dtype (a message that is no array, e.g. pickled
    objects). The timeout does not cut short a frame handed over together with
    it (:class:`~.deadline.Deadline`). Cancellation (or the timeout): the
    message was handed to the transport whole or not at all; either way its
    number is given up (a skip frame follows it:
    :meth:`~.comm.transport.Transport.give_up_p2p`; one that gave up before the
    link was up waits for it as long as the send's timeout or the handshake's,
    whichever is longer), so the messages sent after it to ``dst`` with
    ``tag`` do not wait for it.
    """
    flat = as_flat(x, "x", writable=False)
    if flat.nbytes > wire.MAX_MESSAGE_BYTES:
        raise InvalidArrayError(
            f"x is {flat.nbytes} bytes: one message carries at most "
            f"{wire.MAX_MESSAGE_BYTES} bytes; send it in parts (collectives on arrays split large ones themselves)",
            argument="x", reason="size")
    tag = _check_tag(tag)
    gdst = comm.ranks[dst]
    n = comm.transport.next_p2p_number(comm.gid, gdst, tag)
    header = {"t": "p", "g": comm.gid, "tag": tag, "n": n, DTYPE: label or dtype_name(flat.dtype),
              SHAPE: _shape(x, flat)}
    payload = byte_view(flat)

    async def run() -> None:
        with waiting_in("send", group=comm.name, peer=dst, tag=tag):
            try:
                async with Deadline(timeout) as cm:  # (a frame handed over together with its deadline: sent)
                    await comm.transport.send(gdst, header, payload, group=comm.gid)
            except PeerFailureError as e:
                raise comm.localize(e, op="send", seq=None) from None
            except (TimeoutError, asyncio.CancelledError) as e:
                comm.transport.give_up_p2p(gdst, comm.gid, tag, n, grace=max(timeout, HELLO_TIMEOUT))
                if isinstance(e, TimeoutError) and cm.expired():
                    raise _timeout("send", comm, [dst], tag, timeout, link=comm.transport.link_state(gdst)) from None
                raise

    return run


def recv(
    comm: GroupComm, x: Any, src: int | None, tag: int, *, timeout: float
) -> tuple[Callable[[], Coroutine[Any, Any, int]], Receive]:
    """Validate and post a receive into ``x`` now; return the coroutine function that awaits it (-> group rank
    of the sender; see :func:`send`) and the posted receive.

    Cancellation withdraws the receive, and loses no message: one it got
    already, or one still being written into ``x`` (``x`` may be written until
    it is complete), goes to the next receive. A timeout is not a cancellation
    of that kind: a message matched by the time the deadline is handled (both
    came due while the process was not running, or its payload is still
    arriving) is the receive's result, not lost behind a CollectiveTimeoutError.
    (A task that runs the coroutine and is cancelled before it starts must
    withdraw the receive itself: ``comm.transport.router.withdraw(receive)``.)
    """
    flat = as_flat(x, "x", writable=True)
    tag = _check_tag(tag)
    gsrc = None if src is None else comm.ranks[src]
    mine = (dtype_name(flat.dtype), flat.size, _shape(x, flat))
    r, fut = new_receive(comm, src=gsrc, out=byte_view(flat), tag=tag, check=_checker(comm, mine, tag))
    comm.transport.post(r)

    async def run() -> int:
        result = await _received(comm, r, fut, src, tag, timeout)
        return comm.group_rank(result.src)

    return run, r


def recv_message(
    comm: GroupComm, src: int | None, tag: int, label: str, *, timeout: float
) -> tuple[Callable[[], Coroutine[Any, Any, tuple[int, memoryview]]], Receive]:
    """Post a receive of a message of any size labelled ``label`` (see :func:`send`) now; return the coroutine
    function that awaits it (-> (group rank of the sender, its payload)) and the posted receive. Cancellation:
    as :func:`recv`.
    """
    tag = _check_tag(tag)
    gsrc = None if src is None else comm.ranks[src]
    r, fut = new_receive(comm, src=gsrc, out=None, tag=tag, check=_checker(comm, (label, -1, []), tag))
    comm.transport.post(r)

    async def run() -> tuple[int, memoryview]:
        result = await _received(comm, r, fut, src, tag, timeout)
        return comm.group_rank(result.src), result.payload if result.payload is not None else memoryview(b"")

    return run, r


async def _received(comm: GroupComm, r: Receive, fut: Any, src: int | None, tag: int, timeout: float) -> Delivery:
    """Wait for the posted receive ``r`` (bounded by ``timeout``); withdraw it if that ends otherwise.

    A message that came before the deadline is the receive's result even if its
    payload is still arriving then (the failure detector bounds a sender that
    stalls). Cancellation withdraws the receive without losing a message: one it
    got, or one still arriving into its buffer, goes to the next receive (the
    buffer may still be written until that message is complete).
    """
    router = comm.transport.router
    with waiting_in("recv", group=comm.name, peer=src, tag=tag):
        try:
            try:
                async with asyncio.timeout(timeout) as cm:
                    result = await fut
            except TimeoutError:
                if not cm.expired():
                    raise
                if router.arriving(r):  # its header came in time: the rest of the message is due
                    if fut.cancelled():  # (asyncio cancels the future a cancelled task waits on: a new one)
                        fut = r.fut = asyncio.get_running_loop().create_future()
                    await asyncio.wait((fut,))
                if not fut.done() or fut.cancelled():  # (withdrawn on the way out, below)
                    waiting = [src] if src is not None else [i for i in range(comm.size) if i != comm.rank]
                    raise _timeout("recv", comm, waiting, tag, timeout, _unmatched(comm, r, tag),
                                   any_source=src is None) from None
                # The message came in the same stretch as the deadline (e.g. both while the loop was
                # blocked): it was matched and written into the buffer, so it is the receive's result.
                result = fut.result()
        except BaseException:
            router.withdraw(r)
            raise
    if isinstance(result, PeerFailureError):
        raise comm.localize(result, op="recv", seq=None)
    if isinstance(result, BaseException):
        raise result
    return result  # type: ignore[no-any-return]


def _checker(comm: GroupComm, mine: tuple[str, int, list[int]], tag: int) -> Any:
    """The receive's check of a message's header: the sender's dtype and element count against this buffer's."""
    dtype, size, shape = mine

    def check(header: dict[str, Any], src: int, nbytes: int) -> BaseException | None:
        theirs = header.get(DTYPE)
        if theirs is None:  # (a message without them: only its byte count is checked)
            return None
        their_shape = header.get(SHAPE)
        count = math.prod(their_shape) if isinstance(their_shape, (list, tuple)) else size
        if theirs == dtype and (count == size or size < 0):  # (size -1: a message of any size)
            return None
        who = comm.group_rank(src)
        sent, into = _describe(theirs, their_shape), _describe(dtype, shape)
        what = "dtype" if theirs != dtype else "number of elements"
        return CollectiveMismatchError(
            f"recv (tag {tag}) of {comm.name}: rank {who} sent {sent} but rank {comm.rank} receives into {into}: "
            f"the {what} differs (the message was dropped; the receive buffer is untouched)",
            calls={src: f"send {sent}", comm.transport.rank: f"recv {into}"},
        )

    return check


TAG_MIN, TAG_MAX = -(2**63), 2**63 - 1
"""The tags a frame can carry (a signed 64-bit integer, as torch's)."""


def _check_tag(tag: Any) -> int:
    if isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer)):
        raise InvalidArgumentTypeError(f"tag must be an int, not {type(tag).__name__}")
    value = int(tag)
    if not TAG_MIN <= value <= TAG_MAX:
        raise InvalidArgumentError(f"tag must be a 64-bit signed integer, got {value}")
    return value


UNMATCHED_SHOWN: Final = 3
"""How many of the messages waiting that a receive that timed out did not match its error names, at most."""


def _unmatched(comm: GroupComm, r: Receive, tag: int) -> list[tuple[int, int]]:
    """(group rank, tag) of the messages waiting here that a receive ``r`` with ``tag`` that timed out may have
    been meant to take: from its source with another tag, or with its tag from another source; at most
    ``UNMATCHED_SHOWN + 1`` (one more: there are more). (Looked up only when the timeout came.)"""
    near = comm.transport.router.unmatched_p2p(comm.gid, r.src, tag, UNMATCHED_SHOWN + 1)
    return [(comm.group_rank(s), t) for s, t in near]


def _hint(unmatched: list[tuple[int, int]], any_source: bool, tag: int) -> str:
    if not unmatched:
        return ""
    shown = unmatched[:UNMATCHED_SHOWN]
    if len(shown) == 1:
        (s, t), = shown
        meant = f"tag {t}" if t != tag else f"src={s}"
        return f" (a message from rank {s} with tag {t} is waiting here: was {meant} intended?)"
    listed = ", ".join(f"from rank {s} with tag {t}" for s, t in shown)
    more = ", and more" if len(unmatched) > UNMATCHED_SHOWN else ""
    return f" (messages waiting here that it does not match: {listed}{more}: was another " \
           f"{'tag' if any_source else 'tag or src'} intended?)"


def _timeout(op: str, comm: GroupComm, waiting: list[int], tag: int, timeout: float,
             unmatched: list[tuple[int, int]] | None = None, any_source: bool = False,
             link: LinkState | None = None) -> CollectiveTimeoutError:
    """``unmatched``: a receive's (see :func:`_unmatched`; ``any_source``: it had no ``src``), named in the
    message and kept in ``.unmatched``. ``link``: a send's link to its peer (what it was waiting for)."""
    who = ", ".join(str(w) for w in waiting)
    why = ""
    if link is LinkState.READY:
        why = " to take the message (the connection was full: it was not reading)"
    elif link is not None:
        why = f" to be reached (no connection yet: its address from the store, the connection or its handshake; {link.value})"
    e = CollectiveTimeoutError(
        f"{op} (tag {tag}) of {comm.name} timed out after {timeout:g}s on rank {comm.rank}; waiting for rank(s) {who}"
        f"{why}{_hint(unmatched or [], any_source, tag)}",
        op=op,
        seq=None,
        waiting_for=waiting,
        timeout=timeout,
    )
    e.unmatched = (unmatched or [])[:UNMATCHED_SHOWN]
    return e
