"""Moving bytes over a Channel: one step's send and receive, run concurrently.

A blocking "send, then receive" ring deadlocks once messages exceed the
transport's buffers, so a step's send and receive overlap: :func:`sendrecv`
posts the receive before it sends (``Channel.exchange``), so the peer's
message lands in its buffer whenever it comes while the send waits for room,
without a task per step. Several sends and receives at once
(:func:`run_all`) run in tasks beside each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from ..channel import Channel
from ..eager import start_eager

__all__ = ["SMALL_SEND_BYTES", "MAX_MESSAGE_BYTES", "send", "recv_into", "sendrecv", "run_all"]

SMALL_SEND_BYTES = 64 * 1024
"""Up to this size, sends to several peers are awaited one by one before the receives are posted (no tasks)."""

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""Larger payloads travel as several messages (the wire refuses frames above 1 GiB)."""


def send(ch: Channel, peer: int, key: tuple[Any, ...], payload: memoryview) -> Awaitable[None]:
    """``ch.send``, cut into pieces of MAX_MESSAGE_BYTES for larger payloads.

    The first piece goes under ``key`` itself and piece i under ``key + (i,)``,
    so a receiver that expects another size still gets a size mismatch on the
    first piece rather than waiting for a key that never comes. (A plain
    function returning the awaitable: one coroutine frame fewer to resume on
    the path of every message.)
    """
    if payload.nbytes <= MAX_MESSAGE_BYTES:
        return ch.send(peer, key, payload)
    return _send_pieces(ch, peer, key, payload)


async def _send_pieces(ch: Channel, peer: int, key: tuple[Any, ...], payload: memoryview) -> None:
    for i, at in enumerate(range(0, payload.nbytes, MAX_MESSAGE_BYTES)):
        await ch.send(peer, key if i == 0 else key + (i,), payload[at : at + MAX_MESSAGE_BYTES])


def recv_into(ch: Channel, peer: int, key: tuple[Any, ...], out: memoryview) -> Awaitable[None]:
    """``ch.recv_into`` for what :func:`send` sent (pieces of MAX_MESSAGE_BYTES)."""
    if out.nbytes <= MAX_MESSAGE_BYTES:
        return ch.recv_into(peer, key, out)
    return _recv_pieces(ch, peer, key, out)


async def _recv_pieces(ch: Channel, peer: int, key: tuple[Any, ...], out: memoryview) -> None:
    for i, at in enumerate(range(0, out.nbytes, MAX_MESSAGE_BYTES)):
        await ch.recv_into(peer, key if i == 0 else key + (i,), out[at : at + MAX_MESSAGE_BYTES])


def sendrecv(
    ch: Channel,
    dst: int,
    send_key: tuple[Any, ...],
    payload: memoryview,
    src: int,
    recv_key: tuple[Any, ...],
    out: memoryview,
) -> Awaitable[None]:
    """Send ``payload`` to ``dst`` while receiving ``src``'s message into ``out``.

    Returns when both are done, so ``payload``'s buffer may then be reused.
    If either fails, the other is cancelled and awaited, and the first error
    propagates. Cancellation leaves ``out`` possibly partly written and the
    send either fully handed to the transport or not at all.
    """
    if payload.nbytes <= MAX_MESSAGE_BYTES and out.nbytes <= MAX_MESSAGE_BYTES:
        # One message each way (whether a message travels in pieces depends on its own size only,
        # on both sides): no task; the receive is posted before the send (see Channel.exchange).
        return ch.exchange(dst, send_key, payload, src, recv_key, out)
    return run_all((send(ch, dst, send_key, payload), recv_into(ch, src, recv_key, out)))


async def run_all(aws: Sequence[Awaitable[Any]]) -> None:
    """Await all of ``aws`` concurrently; on the first error cancel and await the rest, then raise it.

    The last awaitable runs in the calling task (one task fewer); the others
    run in tasks owned here, never left running after return or cancellation.
    """
    if not aws:
        return
    if len(aws) == 1:
        await aws[0]
        return
    # Started eagerly: their receives are posted (and sends handed over) before the
    # last one runs, so an early payload finds its buffer instead of being held back.
    loop = asyncio.get_running_loop()
    tasks = [start_eager(a, loop)[0] if asyncio.iscoroutine(a) else asyncio.ensure_future(a) for a in aws[:-1]]
    me = asyncio.current_task()
    failed: list[BaseException] = []  # the first sibling's error that interrupted us
    main_running = [True]

    def on_done(t: asyncio.Task[Any]) -> None:
        # Interrupt our own await only while it runs; later failures surface
        # when the task is awaited below.
        if main_running[0] and not failed and not t.cancelled():
            exc = t.exception()
            if exc is not None:
                failed.append(exc)
                if me is not None:
                    me.cancel()

    for t in tasks:
        t.add_done_callback(on_done)
    try:
        try:
            await aws[-1]
        finally:
            main_running[0] = False
        for t in tasks:
            await t
    except asyncio.CancelledError:
        await _cancel_and_wait(tasks)  # (a cancellation meanwhile counts, as the one we are handling)
        if failed and me is not None and me.uncancel() == 0:
            # We cancelled ourselves because a sibling failed: raise its error.
            raise failed[0] from None
        raise
    except BaseException:
        if await _cancel_and_wait(tasks) and me is not None:
            me.uncancel()  # (a cancellation that came meanwhile is dropped: the error is what ends us)
        raise
    finally:
        for t in tasks:
            t.remove_done_callback(on_done)


MAX_HELD = 64
"""Cancellations of its caller :func:`_cancel_and_wait` holds while its tasks end (each is counted once)."""


async def _cancel_and_wait(tasks: list[asyncio.Task[Any]]) -> bool:
    """Cancel the tasks still running and wait until every one ended; mark their errors retrieved.

    A cancellation of the caller that comes meanwhile (the group's deadline
    as a sibling's failure is being handled) does not cut the wait short:
    the tasks are owned here and none is left running, and every error is
    retrieved (a cut wait left a failed sibling's error unretrieved, logged
    by asyncio, and a caller cancelled twice ended as a plain cancellation
    instead of its timeout). Returns whether one came; it stays requested
    (``uncancel()`` it to drop it).
    """
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    held = False
    for _ in range(MAX_HELD):  # (bounded: each pass ends with the tasks, or holds one cancellation)
        if not pending:
            break
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            held = True
        pending = [t for t in pending if not t.done()]
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # mark retrieved: the first error is the one reported
    return held
