"""A view of another store with every key under ``prefix/``."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidArgumentTypeError, QueueEmptyError
from .base import Store, Timeout, Value, as_block, as_key, as_keys


class PrefixStore(Store):
    """``PrefixStore(prefix, store)``: the same methods, key ``k`` stored as ``"prefix/k"``.

    Prefix stores nest (``PrefixStore("a", PrefixStore("b", s))`` uses
    ``"b/a/k"``). Errors (timeouts included) name the full, prefixed keys, as
    they are on the server.

    ``num_keys`` delegates to the underlying store: it counts every key of
    the whole store, not only those under the prefix (as torch's PrefixStore).
    The prefix store does not own the underlying store: ``close`` leaves it
    open (close the underlying store yourself).
    """

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise InvalidArgumentTypeError(f"prefix must be str, not {type(prefix).__name__}")
        if not isinstance(store, Store) and not all(hasattr(store, m) for m in ("set", "get", "add", "wait")):
            raise InvalidArgumentTypeError(f"PrefixStore wraps a store, not {type(store).__name__}")
        self.prefix = prefix
        self.store = store
        self._p = prefix + "/"

    @property
    def timeout(self) -> float:  # type: ignore[override]
        return self.store.timeout

    def set_timeout(self, timeout: Timeout) -> None:
        """Set the wrapped store's default timeout (the one this view uses)."""
        self.store.set_timeout(timeout)

    @property
    def underlying_store(self) -> Store:
        """The wrapped store (torch's name)."""
        return self.store

    def __repr__(self) -> str:
        return f"<PrefixStore {self.prefix!r} over {self.store!r}>"

    async def __aenter__(self) -> PrefixStore:
        return self

    def _k(self, key: str) -> str:
        return self._p + as_key(key)

    def _ks(self, keys: Sequence[str]) -> list[str]:
        p = self._p
        return [p + k for k in as_keys(keys)]

    async def set(self, key: str, value: Value) -> None:
        await self.store.set(self._k(key), value)

    async def get(self, key: str, *, timeout: Timeout = None) -> bytes:
        return await self.store.get(self._k(key), timeout=timeout)

    async def add(self, key: str, amount: int) -> int:
        return await self.store.add(self._k(key), amount)

    async def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return await self.store.compare_set(self._k(key), expected, desired)

    async def wait(self, keys: Sequence[str], timeout: Timeout = None) -> None:
        await self.store.wait(self._ks(keys), timeout=timeout)

    async def check(self, keys: Sequence[str]) -> bool:
        return await self.store.check(self._ks(keys))

    async def delete_key(self, key: str) -> bool:
        return await self.store.delete_key(self._k(key))

    async def num_keys(self) -> int:
        return await self.store.num_keys()

    async def append(self, key: str, value: Value) -> None:
        await self.store.append(self._k(key), value)

    async def multi_get(self, keys: Sequence[str], *, timeout: float | None = None) -> list[bytes]:
        return await self.store.multi_get(self._ks(keys), timeout=timeout)

    async def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        await self.store.multi_set(self._ks(keys), values)

    async def queue_push(self, key: str, value: Value) -> None:
        await self.store.queue_push(self._k(key), value)

    async def queue_pop(self, key: str, block: bool = True, *, timeout: Timeout = None) -> bytes:
        if block is not True:  # (the store's own non-blocking pop; the error names this store's key)
            try:
                return await self.store.queue_pop(self._k(key), as_block(block))
            except QueueEmptyError:
                raise QueueEmptyError(key) from None
        return await self.store.queue_pop(self._k(key), timeout=timeout)

    async def queue_len(self, key: str) -> int:
        return await self.store.queue_len(self._k(key))

    async def close(self) -> None:
        """Nothing to release: the underlying store stays open."""
