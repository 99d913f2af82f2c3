"""The store's pure state machine: keys, counters, queues and waiters.

No I/O, no asyncio, no clock, no randomness. A driver (the TCP
:class:`~aiodist.store.server.StoreServer` or the in-process
:class:`~aiodist.store.memory.MemoryStore`) feeds requests in and sends out the
:class:`Reply` objects that come back.

Every request is identified by ``(client, request)``: ``client`` is any
hashable the driver chooses (a connection number), ``request`` the client's
request id. Every operation returns a list of replies to send. A request that
completes at once appears in that list; a blocking request that cannot
complete yet (``get``, ``wait``, ``multi_get``, ``queue_pop``) becomes a
*waiter* and its reply is returned later by whichever operation makes it
satisfiable (``set``, ``add``, ``append``, ``compare_set``, ``multi_set``,
``queue_push``). :meth:`StoreState.cancel` (timeout, cancellation) and
:meth:`StoreState.drop_client` (disconnect) remove waiters without a reply.

Semantics follow torch.distributed's TCPStore:

* ``add`` works on an ASCII decimal integer value; a missing key counts as 0;
  any other existing value is an error (``code="not_integer"``).
* ``compare_set(key, expected, desired)``: a missing key with ``expected ==
  b""`` stores ``desired``; an existing key equal to ``expected`` is replaced
  by ``desired``. The reply is the value the key holds afterwards; for a
  missing key with a non-empty ``expected`` it is ``expected`` (as in torch).
* Queues live beside keys under the same names: ``check``/``wait`` count a
  non-empty queue as an existing key, ``delete_key`` removes both,
  ``num_keys`` counts plain keys only; ``get``/``multi_get`` of a key that
  holds a queue and no value fail (``code="holds_queue"``) rather than wait.
  ``queue_push`` hands the value to the oldest waiting ``queue_pop``
  (exactly one) or enqueues it.

Ordering is deterministic: waiters are kept in insertion-ordered dicts and
woken oldest first; nothing iterates a set (see :mod:`.waiters`). Replies and
error codes: :mod:`.replies`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Final

from .quota import QUOTA_EXCEEDED as QUOTA_EXCEEDED  # a write over a quota (see :mod:`.quota`)
from .quota import Ledger, entry_cost
from .replies import BAD_REQUEST as BAD_REQUEST
from .replies import DUPLICATE_REQUEST as DUPLICATE_REQUEST
from .replies import HOLDS_QUEUE as HOLDS_QUEUE
from .replies import KEY_TOO_LARGE as KEY_TOO_LARGE
from .replies import NOT_INTEGER as NOT_INTEGER
from .replies import OVERFLOW as OVERFLOW
from .replies import REQUEST_TOO_LARGE as REQUEST_TOO_LARGE
from .replies import VALUE_TOO_LARGE as VALUE_TOO_LARGE
from .replies import WAITER_QUOTA_EXCEEDED as WAITER_QUOTA_EXCEEDED
from .replies import Failure as Failure
from .replies import Reply as Reply
from .waiters import _GET, _MULTI_GET, _POP, _WAIT, Waiters, _Waiter

DEFAULT_MAX_KEY_BYTES: Final = 8 * 1024
DEFAULT_MAX_VALUE_BYTES: Final = 64 * 1024 * 1024

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

_INTEGER = re.compile(rb"[+-]?[0-9]+")


_SHORT_INT: Final = 19
"""A value of at most this many ASCII digits converts with int() at once (far below Python's digit limit)."""
_SIGNIFICANT: Final = 20
"""More significant digits than this: no 64-bit amount brings the value back within 64 bits."""
_TOO_LONG: Final = -1 << 80  # (an int outside any 64-bit range: _integer's "too long" answer)
_SCANNED: Final = 1 << 16
"""``add`` reads a value of at most this many bytes (leading zeros and all); a longer one is refused unread, so
that repeated adds on a huge value cost nothing each (it could never hold a 64-bit integer anyway)."""


def _integer(value: bytes | bytearray) -> int | None:
    """The integer an ASCII decimal ``value`` ([+-] digits) holds, None if it is not one, or :data:`_TOO_LONG`
    for one of more than 20 significant digits (int() refuses over 4,300: its sum could never fit anyway)."""
    if _INTEGER.fullmatch(value) is None:
        return None
    negative = value[:1] == b"-"
    digits = value.lstrip(b"+-").lstrip(b"0")
    if len(digits) > _SIGNIFICANT:
        return _TOO_LONG
    n = int(digits) if digits else 0
    return -n if negative else n


# Reply(...) runs namedtuple's Python-level __new__; the hot operations build
# their replies with tuple.__new__ directly, twice as fast. Same objects.
_new_tuple = tuple.__new__


class StoreState(Waiters):
    """Keys -> bytes, queues, and the waiters blocked on them.

    ``max_key_bytes`` bounds a key's UTF-8 size, ``max_value_bytes`` a value's
    size (including the result of ``append``). ``max_client_bytes`` and
    ``max_total_bytes`` (``None``: no quota, the default) bound what one
    client and everyone keep stored (see :mod:`.quota`).
    ``max_waiter_bytes`` (``None``: no bound, the default) bounds what one
    client keeps blocked: the keys of its waiting ``get``/``wait``/
    ``multi_get``/``queue_pop`` requests, as :func:`~.waiters.waiter_cost`
    counts them (see :mod:`.waiters`). Violations are refused with a
    :class:`Failure` reply; the state is left unchanged.
    """

    __slots__ = (
        "max_key_bytes",
        "max_value_bytes",
        "_values",
        "_queues",
        "_key_waiters",
        "_queue_waiters",
        "_by_client",
        "_ledger",
        "max_waiter_bytes",
        "_waiter_bytes",
    )

    def __init__(
        self,
        *,
        max_key_bytes: int = DEFAULT_MAX_KEY_BYTES,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        max_client_bytes: int | None = None,
        max_total_bytes: int | None = None,
        max_waiter_bytes: int | None = None,
    ) -> None:
        if max_key_bytes < 1 or max_value_bytes < 1:
            raise ValueError("store limits must be positive")
        if any(q is not None and q < 1 for q in (max_client_bytes, max_total_bytes, max_waiter_bytes)):
            raise ValueError("store quotas must be positive (or None)")
        self.max_key_bytes = max_key_bytes
        self.max_value_bytes = max_value_bytes
        self._values: dict[str, bytes | bytearray] = {}  # (a bytearray: grown by append since last read)
        self._queues: dict[str, deque[bytes]] = {}
        # key -> {(client, request): waiter}, oldest first
        self._key_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]] = {}
        self._queue_waiters: dict[str, dict[tuple[Hashable, int], _Waiter]] = {}
        # client -> {request: waiter}
        self._by_client: dict[Hashable, dict[int, _Waiter]] = {}
        # what is stored by whom; None when no quota is set (nothing to account)
        self._ledger: Ledger | None = None
        if max_client_bytes is not None or max_total_bytes is not None:
            self._ledger = Ledger(max_client=max_client_bytes, max_total=max_total_bytes)
        # client -> bytes its waiters are charged (only with a max_waiter_bytes)
        self.max_waiter_bytes = max_waiter_bytes
        self._waiter_bytes: dict[Hashable, int] = {}

    # ------------------------------------------------------------ inspection

    def __len__(self) -> int:
        return len(self._values)

    def peek(self, key: str) -> bytes | None:
        """The value of ``key`` or ``None`` (for tests and debugging)."""
        value = self._values.get(key)
        return None if value is None else self._frozen(key, value)

    def stored_bytes(self, client: Hashable | None = None) -> int:
        """Bytes of keys and values kept, with :data:`~.quota.ENTRY_BYTES` per entry (charged to ``client``, or in total); 0 without quotas."""
        ledger = self._ledger
        if ledger is None:
            return 0
        return ledger.total if client is None else ledger.used_by(client)

    def waiter_bytes(self, client: Hashable | None = None) -> int:
        """Bytes charged for blocked requests (of ``client``, or of everybody); 0 without ``max_waiter_bytes``."""
        if client is not None:
            return self._waiter_bytes.get(client, 0)
        return sum(self._waiter_bytes.values())

    def waiter_count(self, client: Hashable | None = None) -> int:
        """Number of blocked requests (of ``client``, or of everybody)."""
        if client is not None:
            return len(self._by_client.get(client, ()))
        return sum(len(w) for w in self._by_client.values())

    # ------------------------------------------------------------ validation

    def _bad_key(self, key: str) -> Failure | None:
        # A str of n code points takes at most 4n UTF-8 bytes: skip encoding short keys.
        if len(key) * 4 <= self.max_key_bytes or len(key.encode("utf-8", "surrogatepass")) <= self.max_key_bytes:
            return None
        return Failure(KEY_TOO_LARGE, f"key of {len(key.encode('utf-8', 'surrogatepass'))} bytes exceeds the limit of {self.max_key_bytes} bytes", key[:64])

    def _bad_keys(self, keys: Sequence[str]) -> Failure | None:
        for key in keys:
            bad = self._bad_key(key)
            if bad is not None:
                return bad
        return None

    def _bad_value(self, key: str, size: int) -> Failure | None:
        if size <= self.max_value_bytes:
            return None
        return Failure(VALUE_TOO_LARGE, f"value of {size} bytes for key {key[:64]!r} exceeds the limit of {self.max_value_bytes} bytes", key[:64])

    # ------------------------------------------------------------ quotas

    def _quota(self, client: Hashable, key: str, old: bytes | bytearray | None, new_len: int) -> Failure | None:
        """Charge ``client`` for writing ``new_len`` value bytes over ``old``; a Failure (nothing charged) if over a quota."""
        assert self._ledger is not None
        why = self._ledger.write(client, key, old, new_len)
        return None if why is None else Failure(QUOTA_EXCEEDED, f"writing key {key[:64]!r} refused: {why}", key[:64])

    # ------------------------------------------------------------ operations

    def set(self, client: Hashable, request: int, key: str, value: bytes) -> list[Reply]:
        """Store ``value`` under ``key``; wakes waiters that it satisfies."""
        bad = self._bad_key(key) or self._bad_value(key, len(value))
        if bad is None and self._ledger is not None:
            bad = self._quota(client, key, self._values.get(key), len(value))
        if bad is not None:
            return [Reply(client, request, None, bad)]
        self._values[key] = value
        out = [_new_tuple(Reply, (client, request, None, None))]
        if key in self._key_waiters:
            self._wake(key, out)
        return out

    def get(self, client: Hashable, request: int, key: str) -> list[Reply]:
        """The value of ``key``, or block until it is set."""
        value = self._values.get(key)
        if value is not None:
            if type(value) is bytearray:
                value = self._frozen(key, value)
            return [_new_tuple(Reply, (client, request, value, None))]
        bad = self._bad_key(key) or self._holds_queue("get", key)
        if bad is not None:
            return [Reply(client, request, None, bad)]
        return self._block(client, request, _GET, (key,))

    def _holds_queue(self, op: str, key: str) -> Failure | None:
        """``key`` holds a queue and no value: ``get`` would wait for a value while ``check``/``wait`` say it
        exists (they count a queue), so it fails at once, saying so."""
        if key in self._queues and key not in self._values:
            return Failure(HOLDS_QUEUE, f"{op} of key {key[:64]!r}: it holds a queue, not a value "
                           "(queue_pop reads it; check and wait count it as existing)", key[:64])
        return None

    def add(self, client: Hashable, request: int, key: str, amount: int) -> list[Reply]:
        """Add ``amount`` to the integer in ``key`` (missing: 0); replies with the new int."""
        old = self._values.get(key)
        if old is None:
            bad = self._bad_key(key)
            if bad is not None:
                return [Reply(client, request, None, bad)]
            current = 0
        elif len(old) <= _SHORT_INT and old.isdigit():  # the usual counter: no regex needed
            current = int(old)
        elif len(old) > _SCANNED:
            return [Reply(client, request, None, Failure(OVERFLOW, f"add on key {key[:64]!r}: its value of {len(old)} bytes is longer than any integer add takes (at most {_SCANNED} characters)", key[:64]))]
        else:
            parsed = _integer(old)
            if parsed is None:
                shown = bytes(old[:32])
                return [Reply(client, request, None, Failure(NOT_INTEGER, f"add on key {key[:64]!r}: its value {shown!r} is not an integer", key[:64]))]
            if parsed == _TOO_LONG:
                return [Reply(client, request, None, Failure(OVERFLOW, f"add on key {key[:64]!r}: its value, an integer of {len(old)} characters, + {amount} does not fit in 64 bits", key[:64]))]
            current = parsed
        new = current + amount
        if not INT64_MIN <= new <= INT64_MAX:
            return [Reply(client, request, None, Failure(OVERFLOW, f"add on key {key[:64]!r}: {current} + {amount} does not fit in 64 bits", key[:64]))]
        value = b"%d" % new
        if self._ledger is not None:
            bad = self._quota(client, key, old, len(value))
            if bad is not None:
                return [Reply(client, request, None, bad)]
        self._values[key] = value
        out = [_new_tuple(Reply, (client, request, new, None))]
        if key in self._key_waiters:
            self._wake(key, out)
        return out

    def compare_set(self, client: Hashable, request: int, key: str, expected: bytes, desired: bytes) -> list[Reply]:
        """torch's compare_set; replies with the value ``key`` holds afterwards."""
        bad = self._bad_key(key) or self._bad_value(key, max(len(desired), len(expected)))
        if bad is not None:
            return [Reply(client, request, None, bad)]
        current = self._values.get(key)
        if current is None:
            if expected:
                return [Reply(client, request, expected)]
        elif current != expected:
            return [_new_tuple(Reply, (client, request, self._frozen(key, current), None))]
        if self._ledger is not None:
            bad = self._quota(client, key, current, len(desired))
            if bad is not None:
                return [Reply(client, request, None, bad)]
        self._values[key] = desired
        out = [_new_tuple(Reply, (client, request, desired, None))]
        if key in self._key_waiters:
            self._wake(key, out)
        return out

    def append(self, client: Hashable, request: int, key: str, value: bytes) -> list[Reply]:
        """Append ``value`` to ``key`` (a missing key starts empty).

        The value grows in place, in a bytearray (amortised O(appended
        bytes), not a copy of the whole value per append); the next read
        freezes it back to bytes (see :meth:`_frozen`).
        """
        old = self._values.get(key)
        size = len(value) if old is None else len(old) + len(value)
        bad = self._bad_key(key) or self._bad_value(key, size)
        if bad is None and self._ledger is not None:
            bad = self._quota(client, key, old, size)
        if bad is not None:
            return [Reply(client, request, None, bad)]
        if old is None:
            self._values[key] = value
        elif type(old) is bytearray:
            old += value
        else:
            self._values[key] = bytearray(old) + value
        out = [Reply(client, request, None)]
        if key in self._key_waiters:
            self._wake(key, out)
        return out

    def check(self, client: Hashable, request: int, keys: Sequence[str]) -> list[Reply]:
        """Whether every key in ``keys`` exists (a non-empty queue counts)."""
        return [Reply(client, request, all(self._exists(k) for k in keys))]

    def wait(self, client: Hashable, request: int, keys: Sequence[str]) -> list[Reply]:
        """Complete once every key in ``keys`` exists at the same time."""
        bad = self._bad_keys(keys)
        if bad is not None:
            return [Reply(client, request, None, bad)]
        keys = tuple(keys)
        at = self._missing_from(_WAIT, keys, 0, len(keys))
        if at == len(keys):
            return [Reply(client, request, None)]
        return self._block(client, request, _WAIT, keys, at)

    def multi_get(self, client: Hashable, request: int, keys: Sequence[str]) -> list[Reply]:
        """The values of ``keys`` in order, once all of them exist (blocks like ``get``)."""
        values = self._values
        try:
            found = [values[k] for k in keys]
        except KeyError:
            pass
        else:
            return [self._multi_get_reply(client, request, keys, found)]
        bad = self._bad_keys(keys)
        if bad is not None:
            return [Reply(client, request, None, bad)]
        keys = tuple(keys)
        at = self._missing_from(_MULTI_GET, keys, 0, len(keys))
        if self._queues:  # (any key holding a queue and no value fails it at once, not only the first missing)
            for k in keys:
                queued = self._holds_queue("multi_get", k)
                if queued is not None:
                    return [Reply(client, request, None, queued)]
        return self._block(client, request, _MULTI_GET, keys, at)

    def multi_set(self, client: Hashable, request: int, keys: Sequence[str], values: Sequence[bytes]) -> list[Reply]:
        """Set every ``keys[i]`` to ``values[i]`` atomically (all or nothing)."""
        if len(keys) != len(values):
            return [Reply(client, request, None, Failure(BAD_REQUEST, f"multi_set got {len(keys)} keys but {len(values)} values"))]
        for key, value in zip(keys, values):
            bad = self._bad_key(key) or self._bad_value(key, len(value))
            if bad is not None:
                return [Reply(client, request, None, bad)]
        if self._ledger is not None:
            why = self._ledger.write_many(client, keys, values, self._values.get)
            if why is not None:
                return [Reply(client, request, None, Failure(QUOTA_EXCEEDED, f"multi_set of {len(keys)} keys refused: {why}"))]
        store = self._values
        for key, value in zip(keys, values):
            store[key] = value
        out = [Reply(client, request, None)]
        waiting = self._key_waiters
        for key in keys:
            if key in waiting:
                self._wake(key, out)
        return out

    def delete_key(self, client: Hashable, request: int, key: str) -> list[Reply]:
        """Remove ``key`` and its queue; replies whether anything existed."""
        old = self._values.pop(key, None)
        q = self._queues.pop(key, None)
        if self._ledger is not None:
            if old is not None:
                self._ledger.delete(key, old)
            if q:
                self._ledger.drop_queue(key, q)
        return [Reply(client, request, old is not None or bool(q))]

    def num_keys(self, client: Hashable, request: int) -> list[Reply]:
        """The number of plain keys (queues are not counted)."""
        return [Reply(client, request, len(self._values))]

    def queue_push(self, client: Hashable, request: int, key: str, value: bytes) -> list[Reply]:
        """Give ``value`` to the oldest waiting ``queue_pop`` on ``key``, or enqueue it."""
        bad = self._bad_key(key) or self._bad_value(key, len(value))
        if bad is not None:
            return [Reply(client, request, None, bad)]
        out = [Reply(client, request, None)]
        waiting = self._queue_waiters.get(key)
        ledger = self._ledger
        if not waiting and ledger is not None:
            why = ledger.refusal(client, entry_cost(key, len(value)), 0, 0)
            if why is not None:
                return [Reply(client, request, None, Failure(QUOTA_EXCEEDED, f"queue_push on {key[:64]!r} refused: {why}", key[:64]))]
        if waiting:
            _, w = next(iter(waiting.items()))
            del waiting[(w.client, w.request)]
            if not waiting:
                del self._queue_waiters[key]
            self._forget(w)
            out.append(Reply(w.client, w.request, value))
            return out
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = deque()
        q.append(value)
        if ledger is not None:
            ledger.enqueue(client, key, value)
        if key in self._key_waiters:
            self._wake(key, out)
        return out

    def queue_pop(self, client: Hashable, request: int, key: str) -> list[Reply]:
        """The oldest value of queue ``key``, or block until one is pushed."""
        q = self._queues.get(key)
        if q:
            value = q.popleft()
            if not q:
                del self._queues[key]
            if self._ledger is not None:
                self._ledger.dequeue(key, value)
            return [Reply(client, request, value)]
        bad = self._bad_key(key)
        if bad is not None:
            return [Reply(client, request, None, bad)]
        return self._block(client, request, _POP, (key,))

    def queue_len(self, client: Hashable, request: int, key: str) -> list[Reply]:
        """The number of values waiting in queue ``key``."""
        q = self._queues.get(key)
        return [Reply(client, request, len(q) if q else 0)]

    def unpop_refusal(self, client: Hashable, key: str, value: bytes) -> Failure | None:
        """Why :meth:`queue_unpop` of ``value`` by ``client`` must be refused, or None: the checks of
        ``queue_push`` (key and value size, quotas), for drivers that cannot trust what a client gives back."""
        bad = self._bad_key(key) or self._bad_value(key, len(value))
        if bad is not None:
            return bad
        ledger = self._ledger
        if ledger is not None and not self._queue_waiters.get(key):
            why = ledger.refusal(client, entry_cost(key, len(value)), 0, 0)
            if why is not None:
                return Failure(QUOTA_EXCEEDED, f"unpop on {key[:64]!r} refused: {why}", key[:64])
        return None

    def queue_unpop(self, key: str, value: bytes, client: Hashable | None = None) -> list[Reply]:
        """Put back ``value`` at the FRONT of queue ``key``, charged to ``client`` (who gives it back).

        For drivers whose ``queue_pop`` reply was produced but could not be
        delivered (the waiting caller was cancelled at that instant): the
        value goes to the next waiter, or back to the head of the queue. No
        check is made here: a driver that takes it from a client checks
        :meth:`unpop_refusal` first.
        """
        waiting = self._queue_waiters.get(key)
        if waiting:
            _, w = next(iter(waiting.items()))
            del waiting[(w.client, w.request)]
            if not waiting:
                del self._queue_waiters[key]
            self._forget(w)
            return [Reply(w.client, w.request, value)]
        q = self._queues.get(key)
        if q is None:
            q = self._queues[key] = deque()
        q.appendleft(value)
        if self._ledger is not None:
            self._ledger.enqueue(client, key, value, front=True)
        if key in self._key_waiters:
            return self._wake(key, None)
        return []
