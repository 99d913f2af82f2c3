"""The router's records: receives, routed frames, deliveries, buffered messages and completions.

A :class:`Receive` is what a waiter posts; a :class:`Match` is what routing
decided for one incoming frame when its header arrived; a :class:`Delivery`
is what a receive ends with when its message came (else it ends with an
exception); a :class:`Buffered` message waits in the tables for its receive.
The tables (:mod:`.routing`) never hand a result to a waiter themselves: they
return :class:`Completion` records, which the :class:`~.router.Router`
resolves once the tables are consistent again (a waiter may post or cancel
from inside its callback).

Plain records and the few functions that belong to them; no table logic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import CollectiveMismatchError

Header = dict[str, Any]
ErrorFactory = Callable[["Receive"], BaseException]
"""Builds the exception a failed receive ends with (called once per receive)."""


def freeze(key: Any) -> Any:
    """A hashable form of a message key (lists, as msgpack returns tuples, become tuples)."""
    t = type(key)
    if t is list:
        key = tuple(key)
        t = tuple
    if t is tuple:
        try:
            hash(key)  # the common case: flat (ints, strings), nothing to convert
            return key
        except TypeError:
            return tuple(freeze(k) for k in key)
    if isinstance(key, (list, tuple)):
        return tuple(freeze(k) for k in key)
    return key


@dataclass(slots=True)
class Delivery:
    """A received message: who sent it, its header and its payload.

    ``payload`` is the receive's own ``out`` view for a sized receive, else the
    payload as received (``None`` when empty).
    """

    src: int
    header: Header
    payload: memoryview | None
    nbytes: int


Result = Delivery | BaseException
"""What a receive ends with."""


class Receive:
    """A posted receive (built with keywords).

    ``group``: the group id. ``src``: the sender (global rank), ``None`` for
    any source (point-to-point only). ``out``: the byte view to fill (its size
    must equal the message's) or ``None`` to take a message of any size.
    Keyed receives (collectives) have a ``key``, point-to-point ones a
    ``tag``. ``check(header, src, nbytes)`` may veto a message (returning the
    exception the receive fails with). ``sig``: a keyed receive's call
    signature; a message of the same sequence number with another one is a
    mismatch (``check`` is not asked about a message with the same one). The result goes to the asyncio future ``fut`` (unless it is done
    already), or else to the callback ``on_done``. ``done``: the receive has
    ended (it got its result, or was withdrawn). ``withdrawn``: a point-to-point
    receive withdrawn while its message was arriving (the message goes to the
    next receive when it is complete). ``arriving``: (connection, header) of
    the message arriving into ``out`` (point-to-point; set by the transport).
    """

    __slots__ = ("group", "src", "out", "key", "tag", "check", "sig", "fut", "on_done", "done", "withdrawn",
                 "arriving")

    def __init__(
        self,
        *,
        group: Any,
        src: int | None,
        out: memoryview | None,
        key: Any = None,
        tag: int | None = None,
        check: Callable[[Header, int, int], BaseException | None] | None = None,
        sig: str | None = None,
        fut: Any = None,
        on_done: Callable[[Result], None] | None = None,
    ) -> None:
        self.group = group
        self.src = src
        self.out = out
        self.key = key
        self.tag = tag
        self.check = check
        self.sig = sig
        self.fut = fut
        self.on_done = on_done
        self.done = False
        self.withdrawn = False
        self.arriving: Any = None

    def __repr__(self) -> str:
        what = f"key={self.key!r}" if self.tag is None else f"tag={self.tag}"
        state = " done" if self.done else ""
        return f"<Receive group={self.group!r} src={self.src} {what}{state}>"


def resolve(r: Receive, result: Result) -> None:
    """Hand ``result`` to the receive's future, or to its ``on_done`` (the receive has ended)."""
    fut = r.fut
    if fut is None:
        r.on_done(result)  # type: ignore[misc]
    elif not fut.done():
        fut.set_result(result)


class Completion:
    """A receive the tables ended, and its result: what the router's driver resolves."""

    __slots__ = ("receive", "result")

    def __init__(self, receive: Receive, result: Result) -> None:
        self.receive = receive
        self.result = result

    def __repr__(self) -> str:
        return f"<Completion {self.receive!r} -> {type(self.result).__name__}>"


def resolve_all(completions: Iterable[Completion]) -> None:
    """Resolve ``completions`` in order (a callback may post or cancel receives meanwhile)."""
    for c in completions:
        resolve(c.receive, c.result)


@dataclass(slots=True, eq=False)
class Match:
    """What routing decided for one incoming frame, when its header arrived."""

    src: int
    header: Header
    nbytes: int
    receive: Receive | None = None
    drop: bool = False
    in_order: bool = True  # point-to-point: its number was the one expected next
    violation: str | None = None  # the frame is impossible (bad input): why; it is dropped
    charged: bool = False  # counted in its sender's budget from routing until it completes
    late: bool = False  # for an operation retired here: dropped (see Router.retire)
    slot: Any = None  # keyed: (group, frozen key, src), once routing computed it
    ended: list[Completion] | None = None  # receives routing this frame ended (vetoed, mismatched)

    @property
    def sink(self) -> memoryview | None:
        """The buffer the payload should be written into, if any."""
        r = self.receive
        if r is None or r.out is None or r.out.nbytes != self.nbytes or self.nbytes == 0:
            return None
        return r.out


@dataclass(slots=True)
class Buffered:
    """A message that arrived before its receive: it waits in the tables."""

    src: int
    header: Header
    payload: memoryview | None
    nbytes: int


def delivery(r: Receive, src: int, header: Header, payload: memoryview | None, nbytes: int) -> Delivery:
    """The Delivery of a message to ``r``: a sized receive gets the payload in its ``out``."""
    out = r.out
    if out is None:
        return Delivery(src, header, payload, nbytes)
    if nbytes and payload is not out:  # an early arrival, or a network that ignored the sink
        out[:] = payload  # type: ignore[assignment]
    return Delivery(src, header, out, nbytes)


def deliver(r: Receive, src: int, header: Header, payload: memoryview | None, nbytes: int) -> Result:
    """What ``r`` ends with for a complete message it did not vet yet: its veto, or the delivery."""
    err = veto(r, src, header, nbytes)
    return err if err is not None else delivery(r, src, header, payload, nbytes)


def end(r: Receive, result: Result) -> Result | None:
    """Mark ``r`` ended with ``result``: the result to resolve (None if it had ended already)."""
    if r.done:
        return None
    r.done = True
    return result


def ended(r: Receive, result: Result, out: list[Completion]) -> None:
    """Mark ``r`` ended with ``result`` and add it to ``out`` (nothing if it had ended already)."""
    if not r.done:
        r.done = True
        out.append(Completion(r, result))


def refused(m: Match, r: Receive, err: BaseException) -> None:
    """Receive ``r`` (taken off the tables) vetoed the frame ``m`` (``err``): it ends, the frame is dropped.

    The receive's end is in ``m.ended``.
    """
    m.drop = True
    r.done = True
    m.ended = [Completion(r, err)]


def violate(m: Match, why: str) -> Match:
    """``m`` is impossible (bad input): it is dropped, and its sender is to blame."""
    m.violation = why
    m.drop = True
    m.receive = None
    return m


def veto(r: Receive, src: int, header: Header, nbytes: int) -> BaseException | None:
    """Why ``r`` refuses this message (its check, or a size that differs from its buffer's), if it does.

    A receive with a signature takes a message that carries the same one (``"o"``) without asking
    its ``check``: the check is what builds the error for one that does not.
    """
    check = r.check
    if check is not None and (r.sig is None or header.get("o") != r.sig):
        err = check(header, src, nbytes)
        if err is not None:
            return err
    if r.out is not None and r.out.nbytes != nbytes:
        return size_mismatch(r, src, nbytes)
    return None


def size_mismatch(receive: Receive, src: int, nbytes: int) -> CollectiveMismatchError:
    what = f"key {receive.key!r}" if receive.tag is None else f"tag {receive.tag}"
    assert receive.out is not None
    return CollectiveMismatchError(
        f"message from rank {src} ({what}, group {receive.group!r}) has {nbytes} bytes "
        f"but the receive buffer has {receive.out.nbytes}: the ranks passed buffers of different sizes",
        calls={src: f"{nbytes} bytes"},
    )
