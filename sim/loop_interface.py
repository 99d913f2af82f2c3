"""The asyncio event-loop interface of the simulated loop, around its scheduler.

:class:`LoopInterface` is the part of :class:`~sim.loop.SimLoop` that is
asyncio's ``AbstractEventLoop`` surface but not its scheduling: running and
stopping (``run_forever``, ``run_until_complete``), closing, calls handed to
an executor (run inline, resolved after a virtual cost), the task factory,
the exception handler (it records, never prints) and the debug flag; and
the I/O, subprocess and signal methods a simulation does not have (they
raise :class:`~sim.errors.SimUnsupportedError`).
"""

from __future__ import annotations

import asyncio
import threading
from asyncio import events
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import SimDeadlockError, SimUnsupportedError
from .loop_lanes import stretched

if TYPE_CHECKING:
    from .ready import FifoReady, PctReady, RandomReady


class _Idle(Exception):
    """Internal: nothing ready, nothing scheduled."""


class LoopInterface(asyncio.AbstractEventLoop):
    """asyncio's loop interface around the scheduler; :class:`~sim.loop.SimLoop` holds the state named here."""

    now: float
    _heap: list[tuple[float, int, int, Any]]
    _far: list[tuple[float, int, int, Any]]
    _daemons: list[tuple[float, int, int, Any]]
    _ready: FifoReady | RandomReady | PctReady
    _closed: bool
    _running: bool
    _stopping: bool
    _interrupt: BaseException | None
    _debug: bool
    _exc_handler: Callable[..., Any] | None
    _task_factory: Callable[..., Any] | None
    _thread_id: int | None
    unhandled: list[dict[str, Any]]
    lane: int
    _stretch: dict[int, tuple[float, float, float | None]]

    if TYPE_CHECKING:
        def _run(self) -> None: ...

    def run_forever(self) -> None:
        """Run until :meth:`stop`. Raises SimTimeLimitError; returns when idle is impossible.

        Raises the internal ``_Idle`` when nothing can ever run again; use
        :meth:`run_until_complete` which turns that into SimDeadlockError.
        """
        if self._closed:
            raise RuntimeError("Event loop is closed")
        if self._running:
            raise RuntimeError("This event loop is already running")
        previous = events._get_running_loop()
        events._set_running_loop(self)
        self._running = True
        self._thread_id = threading.get_ident()
        try:
            self._run()
        finally:
            self._stopping = False
            self._running = False
            self._thread_id = None
            events._set_running_loop(previous)
            if self._interrupt is not None:  # (it wins over whatever else ended the run)
                exc, self._interrupt = self._interrupt, None
                raise exc

    def run_until_complete(self, future: Any) -> Any:
        """Run until ``future`` is done and return its result.

        Raises :class:`SimDeadlockError` if nothing can run any more while it is
        pending, :class:`SimTimeLimitError` past ``time_limit``. In both cases
        the future is left pending (the caller decides whether to cancel it).
        """
        fut = asyncio.ensure_future(future, loop=self)
        fut.add_done_callback(self._stop_cb)
        try:
            self.run_until_idle_or_stopped()
        finally:
            fut.remove_done_callback(self._stop_cb)
        if not fut.done():
            raise SimDeadlockError(
                f"deadlock at virtual time {self.now:.6f}s: nothing is ready, no timer is pending, "
                "and the awaited work is not done"
            )
        return fut.result()

    def run_until_idle_or_stopped(self) -> bool:
        """Run until :meth:`stop` is called (True) or nothing can ever run again (False)."""
        try:
            self.run_forever()
        except _Idle:
            return False
        return True

    def _stop_cb(self, _fut: Any) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping = True

    def interrupt(self, exc: BaseException) -> bool:
        """Stop after the callback that runs now, then raise ``exc`` from :meth:`run_forever` (not in a rank's
        code, where an ``except BaseException`` or a ``__del__`` could swallow it). False when the loop is not
        running or an interrupt is pending already (the caller raises it where it is)."""
        if not self._running or self._interrupt is not None:
            return False
        self._interrupt = exc
        self._stopping = True
        return True

    def is_running(self) -> bool:
        return self._running

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._running:
            raise RuntimeError("Cannot close a running event loop")
        self._closed = True
        self._heap.clear()
        self._far.clear()
        self._daemons.clear()
        self._ready.clear()

    async def shutdown_asyncgens(self) -> None:
        return None

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        return None

    # ------------------------------------------------------------------ executors (threads), inline

    executor_cost: float | Callable[[Callable[..., Any], tuple[Any, ...]], float] = 0.0
    """Virtual seconds an offloaded call takes: a number, or ``cost(func, args)`` (see run_in_executor)."""

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        """Run ``func(*args)`` now, inline, and resolve the future ``executor_cost`` virtual seconds later.

        What a thread pool (``asyncio.to_thread``, any ``executor``) would do,
        without a thread: the call runs to its end before anything else, in
        the caller's context; meanwhile the loop goes on, as it would beside a
        thread. Its result or exception is delivered when the charged time
        has passed (longer on a straggler, as its sleeps are). As in a thread, no event loop runs during the call
        (``asyncio.get_running_loop()`` raises there, and aiodist's operations
        refuse to start). A function that blocks waiting for the loop (e.g.
        ``run_coroutine_threadsafe(...).result()``) cannot work this way.
        """
        fut = self.create_future()
        running = asyncio._get_running_loop()
        asyncio._set_running_loop(None)  # (a thread has none)
        try:
            outcome, failed = func(*args), False
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - the thread's error goes to whoever awaits
            outcome, failed = exc, True
        finally:
            asyncio._set_running_loop(running)
        cost = self.executor_cost
        delay = float(cost(func, args) if callable(cost) else cost)
        stretch = self._stretch.get(self.lane) if self._stretch else None
        if stretch is not None and delay > 0:  # (a straggler computes slower too, as it sleeps slower)
            delay = stretched(delay, *stretch, now=self.now)
        self.call_at(self.now + delay, _settle, fut, outcome, failed)
        return fut

    def set_default_executor(self, executor: Any) -> None:
        """Accepted and unused: offloaded calls run inline (see :meth:`run_in_executor`)."""

    # ------------------------------------------------------------------ tasks

    def set_task_factory(self, factory: Callable[..., Any] | None) -> None:
        self._task_factory = factory

    def get_task_factory(self) -> Callable[..., Any] | None:
        return self._task_factory

    # ------------------------------------------------------------------ errors and debug

    def get_exception_handler(self) -> Callable[..., Any] | None:
        return self._exc_handler

    def set_exception_handler(self, handler: Callable[..., Any] | None) -> None:
        self._exc_handler = handler

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        """Record (never print) what asyncio reports: the simulation result lists it."""
        self.unhandled.append(context)

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        if self._exc_handler is None:
            self.default_exception_handler(context)
        else:
            try:
                self._exc_handler(self, context)
            except Exception as exc:  # noqa: BLE001 - mirror asyncio: never let the handler kill the loop
                self.default_exception_handler({"message": "exception in exception handler", "exception": exc})

    def get_debug(self) -> bool:
        return self._debug

    def set_debug(self, enabled: bool) -> None:
        self._debug = enabled


def _unsupported(name: str) -> Callable[..., Any]:
    def method(self: LoopInterface, *args: Any, **kwargs: Any) -> Any:
        raise SimUnsupportedError(name)

    method.__name__ = name
    method.__doc__ = f"Not available in the simulator: raises SimUnsupportedError({name!r})."
    return method


def _settle(fut: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if fut.cancelled():
        return
    if failed:
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


_UNSUPPORTED = (
    "getaddrinfo", "getnameinfo", "create_connection",
    "create_server", "sendfile", "start_tls", "create_unix_connection", "create_unix_server",
    "connect_accepted_socket", "create_datagram_endpoint", "connect_read_pipe", "connect_write_pipe",
    "subprocess_shell", "subprocess_exec", "add_reader", "remove_reader", "add_writer", "remove_writer",
    "sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into", "sock_sendall", "sock_sendto",
    "sock_connect", "sock_accept", "sock_sendfile", "add_signal_handler", "remove_signal_handler",
)
for _name in _UNSUPPORTED:
    setattr(LoopInterface, _name, _unsupported(_name))
del _name
