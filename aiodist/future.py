"""The future of an operation (``work.get_future()``): an asyncio future that also speaks torch's ``Future``.

Its asyncio side (``await fut``, ``fut.result()``, ``add_done_callback``) gives the operation's result as
:class:`~aiodist.work.Work` does: the array, the output list, the object list. Its torch side keeps
torch's shapes, so that a torch program's future code runs as written:

- ``fut.value()`` -- the value of a finished future, as a list of the outputs as torch gives it:
  ``[array]`` for all_reduce, broadcast, reduce (and every operation whose result is one array), the
  output list for all_gather and the other list results, ``[]`` for barrier. It raises the operation's
  error, and ``InvalidStateError`` while the operation runs (call it after ``wait()`` or in ``then``).
- ``await fut.wait()`` -- waits, then returns ``value()`` (torch's ``wait()`` blocks; here you await it).
- ``fut.then(callback)`` -- a new :class:`Future` resolved with ``callback(fut)``'s return value once
  ``fut`` is done (or failed with what ``callback`` raised: a RuntimeError as it is, anything else inside
  a :class:`~aiodist.errors.CallbackError`, as torch wraps it); its ``value()`` is that return value as is.
  ``callback`` is a plain function called from the event loop, as torch's is called from its thread.

Cancelling a future (or a task awaiting it) does not cancel the operation; a ``then`` future of a
cancelled future is cancelled.

An operation's future carries its Work's duty to be awaited: the operation counts as awaited once its
future is consumed (awaited, ``wait()``, ``value()``, ``result()``, ``exception()``, ``then()``, a done
callback added, or ``done()`` seen true for a success), not when ``get_future()`` is called, so a
forgotten future is reported as the forgotten Work would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import CallbackError
from .polls import polled

T = TypeVar("T")
S = TypeVar("S")

__all__ = ["Future", "torch_value"]


def torch_value(result: Any) -> list[Any]:
    """An operation's result in torch's future shape: a list of outputs (``None`` -> ``[]``, one array -> ``[array]``)."""
    if result is None:
        return []
    if isinstance(result, list):
        return result
    if isinstance(result, tuple):
        return list(result)
    return [result]


class Future(asyncio.Future[T]):
    """An asyncio future with torch's ``value()``, ``wait()`` and ``then()`` (see the module's docstring)."""

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None, torch_shape: bool = False,
                 consumed: Callable[[], None] | None = None) -> None:
        super().__init__(loop=loop)
        self._torch_shape = torch_shape
        self._consumed = consumed  # (called once, when the future is first consumed: its Work counts as awaited)

    def _consume(self) -> None:
        hook = self._consumed
        if hook is not None:
            self._consumed = None
            hook()

    def __await__(self) -> Any:
        self._consume()
        return super().__await__()

    __iter__ = __await__

    def result(self) -> T:
        self._consume()
        return super().result()

    def exception(self) -> BaseException | None:
        self._consume()
        return super().exception()

    def add_done_callback(self, fn: Any, *, context: Any = None) -> None:
        self._consume()
        super().add_done_callback(fn, context=context)

    def done(self) -> bool:
        finished = super().done()
        if not finished and self._torch_shape:  # (an operation's future: a poll that cannot end raises)
            polled(self, "an operation's future")
        if finished and self._consumed is not None and not self.cancelled() and super().exception() is None:
            self._consume()  # (a success seen done: its value is read next, as torch code polls then reads)
        return finished

    def value(self) -> Any:
        """The finished future's value, in torch's shape for an operation's own future (its error is raised)."""
        result = self.result()
        return torch_value(result) if self._torch_shape else result

    async def wait(self) -> Any:
        """Wait until the future is done, then return :meth:`value` (cancelling the waiter cancels the future)."""
        await self
        return self.value()

    def then(self, callback: Callable[[Future[T]], S]) -> Future[S]:
        """A new future, resolved with ``callback(self)`` once this one is done (or failed with its error)."""
        chained: Future[S] = Future(loop=self.get_loop())

        def run(_: asyncio.Future[T]) -> None:
            if chained.done():
                return
            if self.cancelled():
                chained.cancel()
                return
            try:
                value = callback(self)
            except RuntimeError as e:  # (the callback's own error, aiodist's among them: the chained future carries it)
                chained.set_exception(e)
            except Exception as e:  # a RuntimeError around it, as torch's (a port's except RuntimeError sees it)
                wrapped = CallbackError(f"the callback of then() raised {type(e).__name__}: {e}", error=e)
                wrapped.__cause__ = e
                chained.set_exception(wrapped)
            else:
                chained.set_result(value)

        self.add_done_callback(run)
        return chained
