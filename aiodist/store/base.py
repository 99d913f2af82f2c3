"""What every store offers (:class:`Store`), and argument checks shared by all of them.

Keys are ``str`` (``bytes`` in UTF-8 are taken as the str they encode). Values are ``bytes`` or ``str`` (encoded as UTF-8);
``bytearray`` and ``memoryview`` are accepted and copied. Anything else raises
:class:`TypeError` before a request is made.
"""

from __future__ import annotations

import abc
import datetime
import operator
from collections.abc import Sequence
from typing import Any

from ..arguments import seconds
from ..errors import InvalidArgumentError, InvalidArgumentTypeError, QueueEmptyError, StoreTimeoutError

Value = bytes | str | bytearray | memoryview


def as_value(value: Any) -> bytes:
    """``value`` as bytes (str: UTF-8), or TypeError."""
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgumentTypeError(f"store values must be bytes or str, not {type(value).__name__}")


def as_key(key: Any) -> str:
    """``key`` if it is a str that UTF-8 can encode; else TypeError (not a str) or ValueError (a lone surrogate).

    ``bytes`` in UTF-8 are taken as the str they encode (torch takes them too: the same key).
    """
    if isinstance(key, str):
        return key if key.isascii() else _encodable(key)
    if type(key) is bytes:
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidArgumentError(f"a bytes store key must be UTF-8: {key[:64]!r} is not (at index {e.start})") \
                from None
    raise InvalidArgumentTypeError(f"store keys must be str, not {type(key).__name__}")


def _encodable(key: str) -> str:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"store keys must be valid Unicode text: {key[:64]!r} has a lone surrogate at "
                                   f"index {e.start} (UTF-8 cannot encode it)") from None
    return key


def as_keys(keys: Any) -> list[str]:
    """A list of keys (one str is NOT taken as a sequence of characters)."""
    if isinstance(keys, (str, bytes)):
        raise InvalidArgumentTypeError("expected a sequence of keys; wrap a single key in a list")
    try:
        items = list(keys)
    except TypeError:
        raise InvalidArgumentTypeError(f"expected a sequence of str keys, not {type(keys).__name__}") from None
    return [as_key(key) for key in items]


AMOUNT_LIMIT = 1 << 63
"""Add amounts are signed 64-bit integers (as the values they add to): ``-AMOUNT_LIMIT <= n < AMOUNT_LIMIT``."""


def as_amount(amount: Any) -> int:
    """An add amount: an int (not a bool) of 64 bits, else InvalidArgumentTypeError / InvalidArgumentError."""
    n: int | None = amount if type(amount) is int else None
    if n is None and not isinstance(amount, bool):
        try:
            n = operator.index(amount)  # numpy integers too
        except TypeError:
            pass
    if n is None:
        raise InvalidArgumentTypeError(f"store add amounts must be int, not {type(amount).__name__}")
    if not -AMOUNT_LIMIT <= n < AMOUNT_LIMIT:
        raise InvalidArgumentError(f"store add amount {n} does not fit in 64 bits (a signed 64-bit integer)")
    return n


Timeout = float | datetime.timedelta | None
"""A blocking call's timeout: seconds, a timedelta (torch's form), or None (the store's default)."""


LONGEST = 10 * 365 * 86400.0
"""What an infinite timeout waits, in seconds (ten years): a finite deadline every store understands."""


def as_timeout(timeout: Any, default: float) -> float:
    """The timeout to use: ``default`` for None, else a non-negative number of seconds (or a timedelta, torch's
    form); ``math.inf`` waits :data:`LONGEST`."""
    if timeout is None:
        return default
    timeout = seconds(timeout)
    if not timeout >= 0:
        raise InvalidArgumentError(f"timeout must be >= 0, got {timeout!r}")
    return min(float(timeout), LONGEST)


class Store(abc.ABC):
    """The store API (torch.distributed's Store, awaitable).

    Blocking calls (``get``, ``wait``, ``multi_get``, ``queue_pop``) wait at
    most ``timeout`` seconds (``None``: the store's default) and then raise
    :class:`~aiodist.errors.StoreTimeoutError`; the store stays usable.
    Cancelling a call withdraws it: a cancelled blocking call is removed from
    the server and a value popped for a cancelled ``queue_pop`` is put back at
    the head of its queue; a cancelled write may or may not have been applied.
    """

    __slots__ = ()  # (implementations may be slotted)

    timeout: float

    def has_extended_api(self) -> bool:
        """torch's ``Store.has_extended_api()``: True, every store here has append, multi_get, multi_set and queues."""
        return True

    def set_timeout(self, timeout: Timeout) -> None:
        """Set the default timeout of blocking calls: seconds or a timedelta (torch's ``set_timeout``)."""
        self.timeout = as_timeout(timeout, self.timeout)  # type: ignore[misc]  # (a slot or attribute of each store)

    @abc.abstractmethod
    async def set(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key`` (overwriting)."""

    @abc.abstractmethod
    async def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        """The value of ``key``, waiting until it is set."""

    @abc.abstractmethod
    async def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer at ``key`` (missing counts as 0); the new value."""

    @abc.abstractmethod
    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (missing key: ``expected == b""``).

        Returns the value ``key`` holds afterwards; for a missing key and a
        non-empty ``expected`` it returns ``expected`` (torch semantics).
        """

    @abc.abstractmethod
    async def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        """Wait until every key in ``keys`` exists."""

    @abc.abstractmethod
    async def check(self, keys: Sequence[str]) -> bool:
        """Whether every key in ``keys`` exists now."""

    @abc.abstractmethod
    async def delete_key(self, key: str) -> bool:
        """Delete ``key`` (and its queue); whether it existed."""

    @abc.abstractmethod
    async def num_keys(self) -> int:
        """The number of keys in the store (queues not counted)."""

    @abc.abstractmethod
    async def append(self, key: str, value: Value) -> None:
        """Append ``value`` to ``key`` (a missing key starts empty)."""

    @abc.abstractmethod
    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        """The values of ``keys``, in order, waiting until all exist."""

    @abc.abstractmethod
    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set every ``keys[i]`` to ``values[i]``, atomically."""

    @abc.abstractmethod
    async def queue_push(self, key: str, value: Value) -> None:
        """Push ``value`` on queue ``key``; wakes exactly one waiting ``queue_pop``."""

    @abc.abstractmethod
    async def queue_pop(self, key: str, block: bool = True, *, timeout: Timeout = None) -> bytes:
        """Pop the oldest value of queue ``key``, waiting for one.

        ``block=False`` (torch's form, positional too): do not wait, raise
        :class:`~aiodist.errors.QueueEmptyError` if the queue is empty
        (:func:`as_block` checks it; :func:`pop_now` does it for a store that answers at once).
        """

    @abc.abstractmethod
    async def queue_len(self, key: str) -> int:
        """The number of values in queue ``key``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the store (idempotent); later calls raise ConnectionClosedError."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def as_block(block: Any) -> bool:
    """``queue_pop``'s ``block`` (torch's positional second argument): a bool, or InvalidArgumentTypeError."""
    if type(block) is not bool:
        raise InvalidArgumentTypeError(
            f"queue_pop's block must be a bool, got {type(block).__name__} (the timeout is keyword-only: timeout=...)"
        )
    return block


async def pop_now(store: Store, key: str, block: Any) -> bytes:
    """``store.queue_pop(key, block=False)`` for a store that answers at once (in-process): the oldest value, or
    :class:`QueueEmptyError` if there is none (a pop with a timeout of 0: the store looks once). (The TCP
    client has its own: its server's answer may take longer than a blocking call's grace.)
    """
    as_block(block)
    try:
        return await store.queue_pop(key, timeout=0)
    except StoreTimeoutError as e:
        if not e.waiting:
            raise
        raise QueueEmptyError(key) from None
