"""TCP: once a send of a large payload has ended, however it ended, the caller's buffer is free at once.

Free means not exported: a bytearray can be resized (no garbage collection
needed). The ends that are easy to miss keep an exception alive, and with it
the frames of the send: a cancelled task keeps its ``CancelledError`` as
long as the task exists; a connection keeps the error its senders raise.

* A send cancelled in the instant after its last slice was handed over: the
  frame is on its way whole and the wait is over, but the sending task has
  not resumed when ``cancel()`` comes, so it still gets ``CancelledError``.
  Under load a timer and the socket's readiness often fall in one loop
  iteration, which is this moment; here it is made on purpose: the test polls
  once per iteration and so is always ahead of the woken sender in the queue.
* A send whose connection is lost while it waits.
"""

from __future__ import annotations

import asyncio
import ssl

import pytest

from aiodist.errors import ConnectionClosedError
from aiodist.net.tcp import TCPNetwork
from net_conformance.test_tcp_tls import contexts, paired  # noqa: F401 - (contexts: a fixture)
from test_net_tcp import LOOPS, run_on

MIB = 1 << 20


@pytest.mark.parametrize("secure", ["tls", "plain"])
@pytest.mark.parametrize("loop", LOOPS)
def test_a_send_cancelled_right_after_its_frame_was_handed_over_frees_the_callers_buffer(
        loop: str, secure: str, request: pytest.FixtureRequest) -> None:
    contexts: tuple[ssl.SSLContext, ssl.SSLContext] | None = request.getfixturevalue("contexts") if secure == "tls" else None

    async def main() -> None:
        async with paired(TCPNetwork(), contexts) as (a, b):
            payload = bytearray(b"\x01" * (8 * MIB))  # more than the transport takes at once
            send = asyncio.ensure_future(a.send({"i": "big"}, payload))
            await asyncio.sleep(0)
            assert not a._outbox.empty, "the send is waiting"  # type: ignore[attr-defined]
            for _ in range(1_000_000):  # once per loop iteration, until the frame is handed over whole
                await asyncio.sleep(0)
                if a._outbox.empty:  # type: ignore[attr-defined]
                    break
            else:
                pytest.fail("the frame was never handed over")
            assert not send.done(), "the woken sender must not have run before this task"
            send.cancel()
            await asyncio.gather(send, return_exceptions=True)
            assert send.cancelled()
            payload[:] = b"\x02" * len(payload)
            payload.extend(b"more")  # BufferError if anything still referred to it
            await a.send({"i": "end"})
            frames = [await asyncio.wait_for(b.recv(), 20) for _ in range(2)]
            assert [f.header["i"] for f in frames] == ["big", "end"]
            assert bytes(frames[0].payload) == b"\x01" * (8 * MIB)

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_send_whose_connection_is_lost_frees_the_callers_buffer(loop: str) -> None:
    async def main() -> None:
        async with paired(TCPNetwork(), None) as (a, b):
            payload = bytearray(b"\x01" * (32 * MIB))  # more than the buffers hold: the send waits
            send = asyncio.ensure_future(a.send({"i": "big"}, payload))
            await asyncio.sleep(0)
            assert not a._outbox.empty, "the send is waiting"  # type: ignore[attr-defined]
            b.abort()
            with pytest.raises(ConnectionClosedError):
                await asyncio.wait_for(send, 10)
            payload.extend(b"more")  # BufferError if anything still referred to it

    run_on(loop, main)
