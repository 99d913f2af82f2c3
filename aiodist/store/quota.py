"""Who stored how much in the store: the ledger behind the per-client and total quotas (pure).

Every stored entry (a key with its value, one value in a queue) is charged to
the client that wrote it, :func:`entry_cost` bytes (:data:`ENTRY_BYTES` plus
the key's characters plus the value's bytes), until it is overwritten, deleted
or popped. The fixed part is what the server spends to keep an entry beyond
its bytes (a dict or queue slot, the objects' headers, this ledger's record):
without it, empty values cost nothing against a quota, and a client could fill
the server's memory with millions of them. Overwriting another
client's entry moves the charge to the writer. A client that disconnects
leaves its entries behind: they stay in the total but no longer count against
any one client. :class:`StoreState` asks :meth:`Ledger.refusal` before it
writes and tells the ledger what it wrote and removed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Final

QUOTA_EXCEEDED: Final = "quota_exceeded"

ENTRY_BYTES: Final = 128
"""Bytes charged per stored entry beyond its key and value (measured: ~80 per queued value, ~130 per key)."""


def entry_cost(key: str, nbytes: int) -> int:
    """What an entry of ``key`` holding ``nbytes`` value bytes is charged."""
    return ENTRY_BYTES + len(key) + nbytes


class Ledger:
    """Bytes stored per client and in total, against ``max_client`` / ``max_total`` (``None``: no limit)."""

    __slots__ = ("max_client", "max_total", "total", "_by_client", "_owner", "_queue_owners")

    def __init__(self, *, max_client: int | None, max_total: int | None) -> None:
        self.max_client = max_client
        self.max_total = max_total
        self.total = 0
        self._by_client: dict[Hashable, int] = {}
        self._owner: dict[str, Hashable] = {}  # key -> client charged for it (plain keys only)
        self._queue_owners: dict[str, deque[Hashable | None]] = {}  # key -> pusher of each queued value, in order

    def __repr__(self) -> str:
        return f"<Ledger total={self.total} clients={len(self._by_client)} max_client={self.max_client} max_total={self.max_total}>"

    def used_by(self, client: Hashable) -> int:
        """Bytes charged to ``client``."""
        return self._by_client.get(client, 0)

    def refusal(self, client: Hashable, adding: int, removing: int, removing_own: int) -> str | None:
        """Why writing ``adding`` bytes while freeing ``removing`` (``removing_own`` of them ``client``'s) is refused, or None.

        Only growth is refused: a write that does not increase a figure passes
        even when that figure is over its quota.
        """
        if self.max_total is not None and adding > removing:
            total = self.total + adding - removing
            if total > self.max_total:
                return (
                    f"the store would hold {total} bytes of keys and values, over its total quota of "
                    f"{self.max_total} bytes (max_total_bytes)"
                )
        if self.max_client is not None and adding > removing_own:
            mine = self._by_client.get(client, 0) + adding - removing_own
            if mine > self.max_client:
                return (
                    f"this connection would have {mine} bytes of keys and values stored, over its quota of "
                    f"{self.max_client} bytes (max_client_bytes)"
                )
        return None

    def charge(self, client: Hashable | None, nbytes: int) -> None:
        """Add ``nbytes`` to the total and, unless ``client`` is None, to ``client``'s share."""
        self.total += nbytes
        if client is not None:
            self._by_client[client] = self._by_client.get(client, 0) + nbytes

    def release(self, owner: Hashable | None, nbytes: int) -> None:
        """Take ``nbytes`` off the total and off ``owner``'s share (if it is still counted)."""
        self.total -= nbytes
        if owner is None:
            return
        left = self._by_client.get(owner)
        if left is not None:
            left -= nbytes
            if left > 0:
                self._by_client[owner] = left
            else:
                del self._by_client[owner]

    # ------------------------------------------------------------ plain keys

    def write(self, client: Hashable, key: str, old: bytes | bytearray | None, new_len: int) -> str | None:
        """Charge ``client`` for ``key`` now holding ``new_len`` bytes instead of ``old``; the refusal (nothing charged) if over a quota.

        (:meth:`refusal` and :meth:`_move` inlined: this runs for every write.)
        """
        adding = ENTRY_BYTES + len(key) + new_len
        by_client = self._by_client
        if old is None:
            freed = own = 0
            owner = None
        else:
            freed = ENTRY_BYTES + len(key) + len(old)
            owner = self._owner.get(key)
            # (an entry of a client that was forgotten no longer counts in its share)
            own = min(freed, by_client.get(client, 0)) if owner == client else 0
        total = self.total + adding - freed
        mine = by_client.get(client, 0) + adding - own
        if (adding > freed and self.max_total is not None and total > self.max_total) or (
            adding > own and self.max_client is not None and mine > self.max_client
        ):
            return self.refusal(client, adding, freed, own)
        self.total = total
        by_client[client] = mine
        if owner is not None and owner != client:
            left = by_client.get(owner)
            if left is not None:
                if left > freed:
                    by_client[owner] = left - freed
                else:
                    del by_client[owner]
        if owner != client:
            self._owner[key] = client
        return None

    def write_many(
        self, client: Hashable, keys: Sequence[str], values: Sequence[bytes], lookup: Callable[[str], bytes | bytearray | None]
    ) -> str | None:
        """All-or-nothing :meth:`write` of ``keys[i] = values[i]`` (``lookup``: current values).

        A key given twice is counted twice in the check (conservative).
        """
        adding = freed = freed_own = 0
        seen: dict[str, None] = {}
        for key, value in zip(keys, values):
            adding += entry_cost(key, len(value))
            old = lookup(key)
            if old is not None and key not in seen:
                seen[key] = None
                n = entry_cost(key, len(old))
                freed += n
                if self._owner.get(key) == client:
                    freed_own += n
        why = self.refusal(client, adding, freed, min(freed_own, self._by_client.get(client, 0)))
        if why is None:
            written: dict[str, bytes] = {}
            for key, value in zip(keys, values):  # in order, as the writes themselves
                self._move(client, key, written[key] if key in written else lookup(key), len(value))
                written[key] = value
        return why

    def _move(self, client: Hashable, key: str, old: bytes | bytearray | None, new_len: int) -> None:
        if old is not None:
            self.release(self._owner.get(key), entry_cost(key, len(old)))
        self.charge(client, entry_cost(key, new_len))
        self._owner[key] = client

    def delete(self, key: str, old: bytes | bytearray) -> None:
        """``key``, holding ``old``, was deleted."""
        self.release(self._owner.pop(key, None), entry_cost(key, len(old)))

    # ------------------------------------------------------------ queues

    def enqueue(self, client: Hashable | None, key: str, value: bytes, *, front: bool = False) -> None:
        """``value`` joined queue ``key`` (at its ``front``: a value given back), charged to ``client``."""
        self.charge(client, entry_cost(key, len(value)))
        owners = self._queue_owners.get(key)
        if owners is None:
            owners = self._queue_owners[key] = deque()
        if front:
            owners.appendleft(client)
        else:
            owners.append(client)

    def dequeue(self, key: str, value: bytes) -> None:
        """The value at the front of queue ``key`` left it."""
        owners = self._queue_owners[key]
        self.release(owners.popleft(), entry_cost(key, len(value)))
        if not owners:
            del self._queue_owners[key]

    def drop_queue(self, key: str, values: Iterable[bytes]) -> None:
        """Queue ``key`` (holding ``values``) was deleted."""
        owners = self._queue_owners.pop(key, deque())
        for value, owner in zip(values, owners):
            self.release(owner, entry_cost(key, len(value)))

    # ------------------------------------------------------------ clients

    def forget_client(self, client: Hashable) -> None:
        """``client`` is gone: its entries stay in the total but count against nobody."""
        self._by_client.pop(client, None)
