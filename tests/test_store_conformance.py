"""Store semantics, one suite run over every implementation.

Implementations: TCPStore against a real StoreServer on 127.0.0.1 (port 0),
MemoryStore, and PrefixStore over each. A fixture hands out *handles*: several
clients of the same store (separate TCP connections for TCPStore), so blocking
calls are woken by another client.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import aiodist
from aiodist.errors import (
    AiodistError,
    ConnectionClosedError,
    InvalidArgumentError,
    StoreError,
    StoreRequestError,
    StoreTimeoutError,
)
from aiodist.store import MemoryStore, PrefixStore, StoreServer, TCPStore
from aiodist.store.base import Store

MAX_VALUE = 1 << 20
MAX_KEY = 1024

Factory = Callable[[], Awaitable[Store]]


@pytest.fixture(params=["tcp", "memory", "prefix-tcp", "prefix-memory"])
async def handles(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    kind: str = request.param
    opened: list[Store] = []
    server: StoreServer | None = None
    if kind.endswith("tcp"):
        server = await StoreServer.start("127.0.0.1", 0, max_value_bytes=MAX_VALUE, max_key_bytes=MAX_KEY)
        port = server.port

        async def raw() -> Store:
            s = await TCPStore.connect("127.0.0.1", port, timeout=10.0)
            opened.append(s)
            return s

    else:
        mem = MemoryStore(timeout=10.0, max_value_bytes=MAX_VALUE, max_key_bytes=MAX_KEY)
        opened.append(mem)

        async def raw() -> Store:
            return mem

    if kind.startswith("prefix"):

        async def make() -> Store:
            return PrefixStore("job7", await raw())

    else:
        make = raw
    try:
        yield make
    finally:
        for s in opened:
            await s.close()
        if server is not None:
            await server.close()


async def soon(coro: Awaitable[object], via: Store) -> asyncio.Task[object]:
    """Start ``coro`` (a call on ``via``) and return once the store has registered it.

    A round trip on the same handle is the barrier: one TCP connection's
    requests are processed in order, so its reply means the call arrived.
    """
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0.01)  # the task runs and sends its request
    await via.check([])
    return task


# ------------------------------------------------------------ set / get


async def test_set_get_bytes_and_str(handles: Factory) -> None:
    s = await handles()
    await s.set("a", b"\x00\xffbin")
    await s.set("b", "héllo")
    await s.set("empty", b"")
    assert await s.get("a") == b"\x00\xffbin"
    assert await s.get("b") == "héllo".encode()
    assert await s.get("empty") == b""
    await s.set("a", b"again")
    assert await s.get("a") == b"again"
    await s.set("ключ/ü", b"unicode key")
    assert await s.get("ключ/ü") == b"unicode key"


async def test_large_values_roundtrip(handles: Factory) -> None:
    s = await handles()
    big = bytes(range(256)) * 2000  # 512 KB: travels as a payload, not in the header
    await s.set("big", big)
    assert await s.get("big") == big
    await s.multi_set(["b1", "b2"], [big, b"small"])
    assert await s.multi_get(["b1", "b2"]) == [big, b"small"]
    assert await s.compare_set("big", big, big[::-1]) == big[::-1]


async def test_get_blocks_until_another_client_sets(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.get("later", timeout=5), a)
    assert not task.done()
    await b.set("later", b"v")
    assert await asyncio.wait_for(task, 5) == b"v"


async def test_get_timeout_names_key_and_time_and_store_stays_usable(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(StoreTimeoutError) as info:
        await s.get("never", timeout=0.1)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, AiodistError) and isinstance(err, StoreError)
    assert err.keys[0].endswith("never") and err.timeout == pytest.approx(0.1)
    assert "never" in str(err) and "0.1" in str(err)
    await s.set("never", b"now")
    assert await s.get("never", timeout=1) == b"now"


async def test_timed_out_waiter_does_not_consume_later_value(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(StoreTimeoutError):
        await s.queue_pop("q", timeout=0.05)
    await s.queue_push("q", b"x")
    assert await s.queue_len("q") == 1
    assert await s.queue_pop("q", timeout=1) == b"x"


# ------------------------------------------------------------ add


async def test_add_counts_from_zero(handles: Factory) -> None:
    s = await handles()
    assert await s.add("c", 1) == 1
    assert await s.add("c", 41) == 42
    assert await s.add("c", -50) == -8
    assert await s.add("c", 0) == -8
    assert await s.get("c") == b"-8"
    await s.set("d", b"100")
    assert await s.add("d", 5) == 105


@pytest.mark.parametrize("value", [b"1" * 4301, b"-" + b"1" * 5000, b"9" * 21])
async def test_add_on_an_integer_of_thousands_of_digits_is_an_overflow_refusal_and_store_usable(
    handles: Factory, value: bytes
) -> None:
    # store audit s21, finding 4: past 4,300 digits int() raised ValueError: the server dropped the connection
    # with a traceback, and MemoryStore.add raised the bare ValueError.
    s = await handles()
    await s.set("n", value)
    with pytest.raises(StoreRequestError) as info:
        await s.add("n", 1)
    assert info.value.code == "overflow" and info.value.key.endswith("n") and "64 bits" in str(info.value)
    assert await s.get("n") == value
    await s.set("z", b"-" + b"0" * 5000 + b"7")  # leading zeros: still the integer -7
    assert await s.add("z", 10) == 3
    assert await s.add("fine", 2) == 2


async def test_add_on_non_integer_is_refused_and_store_usable(handles: Factory) -> None:
    s = await handles()
    await s.set("txt", b"hello")
    with pytest.raises(StoreRequestError) as info:
        await s.add("txt", 1)
    assert info.value.code == "not_integer" and info.value.key.endswith("txt")
    assert await s.get("txt") == b"hello"
    await s.set("float", b"1.5")
    with pytest.raises(StoreRequestError):
        await s.add("float", 1)
    assert await s.add("fine", 2) == 2


async def test_add_overflow_is_refused(handles: Factory) -> None:
    s = await handles()
    assert await s.add("big", 2**63 - 1) == 2**63 - 1
    with pytest.raises(StoreRequestError) as info:
        await s.add("big", 1)
    assert info.value.code == "overflow"
    assert await s.get("big") == b"%d" % (2**63 - 1)


async def test_an_add_amount_beyond_64_bits_is_refused_before_it_is_sent(handles: Factory) -> None:
    """Before: TCPStore raised "frame header is not serializable" and, a moment later, asyncio printed a
    StoreTimeoutError nobody retrieved (the request stayed pending with nobody waiting)."""
    s = await handles()
    for n in (2**64, 2**63, -(2**63) - 1):
        with pytest.raises(InvalidArgumentError, match="64 bits"):
            await s.add("c", n)
    assert await s.add("c", -(2**63)) == -(2**63)
    assert await s.check(["c"])


async def test_get_of_a_key_that_holds_a_queue_fails_at_once(handles: Factory) -> None:
    """check/wait count a queue as an existing key; get/multi_get used to wait for a value until their
    timeout (a wait-then-get stalled for the whole store timeout)."""
    s = await handles()
    await s.queue_push("q", b"item")
    assert await s.check(["q"])
    await s.set("v", b"1")
    for call in (lambda: s.get("q", timeout=30), lambda: s.multi_get(["v", "q"], timeout=30),
                 lambda: s.multi_get(["missing", "q"], timeout=30)):  # (re-audit s22, 6: waited its timeout)
        with pytest.raises(StoreRequestError) as info:
            await asyncio.wait_for(call(), 10)
        assert info.value.code == "holds_queue"
    assert await s.queue_pop("q") == b"item"  # (untouched)


async def test_add_wakes_a_waiting_get(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.get("cnt", timeout=5), a)
    await b.add("cnt", 3)
    assert await asyncio.wait_for(task, 5) == b"3"


# ------------------------------------------------------------ compare_set


async def test_compare_set_torch_semantics(handles: Factory) -> None:
    s = await handles()
    # missing key, non-empty expected: nothing stored, expected returned (torch)
    assert await s.compare_set("k", b"old", b"new") == b"old"
    assert not await s.check(["k"])
    # missing key, empty expected: desired stored
    assert await s.compare_set("k", b"", b"first") == b"first"
    assert await s.get("k") == b"first"
    # mismatch: unchanged, current value returned
    assert await s.compare_set("k", b"wrong", b"second") == b"first"
    assert await s.get("k") == b"first"
    # match: replaced
    assert await s.compare_set("k", "first", "second") == b"second"
    assert await s.get("k") == b"second"


async def test_compare_set_wakes_waiter(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.get("cas", timeout=5), a)
    await b.compare_set("cas", b"", b"won")
    assert await asyncio.wait_for(task, 5) == b"won"


async def test_compare_set_elects_exactly_one_leader(handles: Factory) -> None:
    clients = [await handles() for _ in range(4)]

    async def try_lead(i: int) -> bool:
        return await clients[i % 4].compare_set("leader", b"", b"%d" % i) == b"%d" % i

    wins = await asyncio.gather(*(try_lead(i) for i in range(20)))
    assert sum(wins) == 1


# ------------------------------------------------------------ wait / check / delete / num_keys


async def test_wait_for_several_keys(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.wait(["w1", "w2", "w3"], timeout=5), a)
    await b.set("w1", b"1")
    await b.multi_set(["w3"], [b"3"])
    await asyncio.sleep(0.02)
    assert not task.done()
    await b.append("w2", b"2")
    await asyncio.wait_for(task, 5)
    await a.wait([], timeout=0.1)  # nothing to wait for
    await a.wait(["w1"], timeout=0.1)  # already there


async def test_wait_timeout_names_keys(handles: Factory) -> None:
    s = await handles()
    await s.set("have", b"x")
    with pytest.raises(StoreTimeoutError) as info:
        await s.wait(["have", "missing"], timeout=0.1)
    assert [k.rsplit("/", 1)[-1] for k in info.value.keys] == ["have", "missing"]
    assert info.value.op == "wait"


async def test_a_timeout_of_several_keys_says_which_were_missing(handles: Factory) -> None:
    """Before (blind probe): "waiting for key(s) ['done/2', 'done/3', 'disp/exit']" though done/2 existed; past
    8 keys the missing ones could be cut off the message altogether."""
    s = await handles()
    await s.set("have", b"x")
    await s.queue_push("queued", b"x")  # (a non-empty queue exists, for wait)
    with pytest.raises(StoreTimeoutError) as info:
        await s.wait(["have", "gone", "queued", "late"], timeout=0.1)
    assert info.value.missing is not None
    assert [k.rsplit("/", 1)[-1] for k in info.value.missing] == ["gone", "late"]
    assert "missing [" in str(info.value) and "gone'" in str(info.value).rpartition("missing")[2]
    with pytest.raises(StoreTimeoutError) as info:
        await s.multi_get(["nokey", "have"], timeout=0.1)
    assert [k.rsplit("/", 1)[-1] for k in info.value.missing or []] == ["nokey"]
    many = [f"k{i}" for i in range(20)]
    await s.multi_set(many[:19], [b"v"] * 19)
    with pytest.raises(StoreTimeoutError) as info:
        await s.wait(many, timeout=0.1)
    assert [k.rsplit("/", 1)[-1] for k in info.value.missing or []] == ["k19"]
    with pytest.raises(StoreTimeoutError) as info:
        await s.get("alone", timeout=0.05)
    assert info.value.missing is None  # (one key: it is the one missing)


async def test_timeouts_in_torchs_form_a_timedelta_and_a_positional_wait_timeout(handles: Factory) -> None:
    # Before: TypeError for both (torch's ``store.wait(keys, timedelta(...))``).
    s = await handles()
    with pytest.raises(StoreTimeoutError) as info:
        await s.wait(["missing"], datetime.timedelta(milliseconds=100))
    assert info.value.op == "wait"
    with pytest.raises(StoreTimeoutError):
        await s.get("missing", timeout=datetime.timedelta(milliseconds=100))
    with pytest.raises(ValueError):
        await s.wait(["missing"], datetime.timedelta(seconds=-1))
    await s.set("k", b"v")
    assert await s.get("k", timeout=datetime.timedelta(seconds=5)) == b"v"


async def test_set_timeout_sets_the_default_of_blocking_calls_as_in_torch(handles: Factory) -> None:
    # Before: AttributeError (torch's ``store.set_timeout(timedelta(...))``).
    s = await handles()
    s.set_timeout(datetime.timedelta(milliseconds=100))
    assert s.timeout == pytest.approx(0.1)
    with pytest.raises(StoreTimeoutError) as info:
        await s.get("missing")
    assert info.value.timeout == pytest.approx(0.1)
    s.set_timeout(5)
    await s.set("k", b"v")
    assert await s.get("k") == b"v" and s.timeout == 5.0
    with pytest.raises(ValueError):
        s.set_timeout(-1)


async def test_an_infinite_timeout_waits_and_the_store_stays_usable(handles: Factory) -> None:
    # Before, over TCP: the client took math.inf, the server refused it as a malformed request and closed
    # the connection (every later call: StoreConnectionLost; one rank's call broke the whole job).
    s, other = await handles(), await handles()
    waiting = await soon(s.get("later", timeout=float("inf")), via=s)
    await other.set("later", b"x")
    assert await asyncio.wait_for(waiting, 5) == b"x"
    s.set_timeout(float("inf"))
    waiting = await soon(s.wait(["later2"]), via=s)
    await other.set("later2", b"y")
    await asyncio.wait_for(waiting, 5)
    assert await s.get("later2") == b"y"
    with pytest.raises(ValueError):
        await s.get("later", timeout=float("nan"))


async def test_wait_needs_keys_to_exist_together(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.wait(["x", "y"], timeout=5), a)
    await b.set("x", b"1")
    await b.delete_key("x")
    await b.set("y", b"2")
    await asyncio.sleep(0.05)
    assert not task.done()
    await b.set("x", b"again")
    await asyncio.wait_for(task, 5)


async def test_check(handles: Factory) -> None:
    s = await handles()
    assert await s.check([]) is True
    assert await s.check(["c1"]) is False
    await s.set("c1", b"")
    assert await s.check(["c1"]) is True
    assert await s.check(["c1", "c2"]) is False


async def test_delete_key(handles: Factory) -> None:
    a, b = await handles(), await handles()
    await a.set("del", b"x")
    assert await a.delete_key("del") is True
    assert await a.delete_key("del") is False
    assert await a.check(["del"]) is False
    task = await soon(a.get("del", timeout=5), a)
    assert not task.done()
    await b.set("del", b"back")
    assert await asyncio.wait_for(task, 5) == b"back"


async def test_num_keys_counts_keys_not_queues(handles: Factory) -> None:
    s = await handles()
    n0 = await s.num_keys()
    await s.set("n1", b"")
    await s.add("n2", 1)
    await s.set("n1", b"again")
    await s.queue_push("nq", b"x")
    assert await s.num_keys() == n0 + 2
    await s.delete_key("n2")
    assert await s.num_keys() == n0 + 1


# ------------------------------------------------------------ append / multi


async def test_append(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.get("log", timeout=5), a)
    await b.append("log", b"ab")
    assert await asyncio.wait_for(task, 5) == b"ab"
    await b.append("log", "cd")
    assert await a.get("log") == b"abcd"


async def test_multi_get_and_multi_set(handles: Factory) -> None:
    a, b = await handles(), await handles()
    await a.multi_set(["m1", "m2", "m3"], [b"1", "2", b"3"])
    assert await a.multi_get(["m3", "m1", "m2"]) == [b"3", b"1", b"2"]
    assert await a.multi_get([]) == []
    task = await soon(a.multi_get(["m1", "m4"], timeout=5), a)
    assert not task.done()
    await b.set("m4", b"4")
    assert await asyncio.wait_for(task, 5) == [b"1", b"4"]
    with pytest.raises(StoreTimeoutError):
        await a.multi_get(["m1", "nope"], timeout=0.05)


async def test_multi_set_wakes_waiters_on_each_key(handles: Factory) -> None:
    a, b, c = await handles(), await handles(), await handles()
    t1 = await soon(a.get("ms1", timeout=5), a)
    t2 = await soon(b.get("ms2", timeout=5), b)
    await c.multi_set(["ms1", "ms2"], [b"x", b"y"])
    assert await asyncio.wait_for(t1, 5) == b"x"
    assert await asyncio.wait_for(t2, 5) == b"y"


async def test_multi_set_length_mismatch(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(ValueError):
        await s.multi_set(["a", "b"], [b"1"])
    assert await s.check(["a"]) is False


# ------------------------------------------------------------ queues


async def test_queue_fifo_and_len(handles: Factory) -> None:
    s = await handles()
    assert await s.queue_len("q") == 0
    for i in range(5):
        await s.queue_push("q", b"%d" % i)
    assert await s.queue_len("q") == 5
    assert [await s.queue_pop("q") for _ in range(5)] == [b"0", b"1", b"2", b"3", b"4"]
    assert await s.queue_len("q") == 0


async def test_a_non_blocking_pop_takes_the_oldest_or_raises_queue_empty_at_once_as_torchs(handles: Factory) -> None:
    """torch's ``queue_pop(key, block=False)`` (positional too): QueueEmptyError, a store error, when empty.

    Before, ``queue_pop("q", False)`` was a TypeError (the timeout is keyword-only) and torch's error was missing.
    """
    a, b = await handles(), await handles()
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(aiodist.QueueEmptyError) as info:
        await a.queue_pop("nb", False)
    assert info.value.key == "nb" and isinstance(info.value, aiodist.DistStoreError)
    assert isinstance(info.value, RuntimeError) and "empty" in str(info.value)
    assert asyncio.get_running_loop().time() - t0 < 1.0  # (at once, not after the store's default timeout)
    await b.queue_push("nb", b"one")
    await b.queue_push("nb", b"two")
    assert await a.queue_pop("nb", False) == b"one"
    assert await a.queue_pop("nb", block=False) == b"two"
    with pytest.raises(aiodist.QueueEmptyError):
        await a.queue_pop("nb", block=False)
    with pytest.raises(aiodist.InvalidArgumentTypeError, match="keyword-only"):
        await a.queue_pop("nb", 5)  # type: ignore[arg-type]
    await b.queue_push("nb", b"three")  # (nothing lost or reordered by the refused calls)
    assert await a.queue_pop("nb") == b"three"
    assert await a.queue_len("nb") == 0


async def test_queue_push_wakes_exactly_one_waiter_in_fifo_order(handles: Factory) -> None:
    a, b, c = await handles(), await handles(), await handles()
    first = await soon(a.queue_pop("jobs", timeout=5), a)
    second = await soon(b.queue_pop("jobs", timeout=5), b)
    await c.queue_push("jobs", b"one")
    assert await asyncio.wait_for(first, 5) == b"one"
    await asyncio.sleep(0.05)
    assert not second.done()
    await c.queue_push("jobs", b"two")
    assert await asyncio.wait_for(second, 5) == b"two"
    assert await c.queue_len("jobs") == 0


async def test_cancelled_queue_pop_loses_nothing(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.queue_pop("cq", timeout=5), a)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.02)
    await b.queue_push("cq", b"kept")
    assert await a.queue_pop("cq", timeout=2) == b"kept"


async def test_wait_counts_a_nonempty_queue_and_delete_removes_it(handles: Factory) -> None:
    a, b = await handles(), await handles()
    task = await soon(a.wait(["wq"], timeout=5), a)
    await b.queue_push("wq", b"x")
    await asyncio.wait_for(task, 5)
    assert await a.check(["wq"]) is True
    assert await a.delete_key("wq") is True
    assert await a.queue_len("wq") == 0


async def test_queue_pop_timeout(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(StoreTimeoutError) as info:
        await s.queue_pop("empty", timeout=0.05)
    assert info.value.op == "queue_pop" and info.value.key.endswith("empty")


# ------------------------------------------------------------ bad arguments and limits


async def test_a_key_utf8_cannot_encode_is_refused_before_sending_and_the_store_stays_usable(handles: Factory) -> None:
    """Before, over TCP: 'TypeError: frame header is not serializable', the connection lost, and a 'Future
    exception was never retrieved' at exit; MemoryStore and the simulator took the key."""
    s = await handles()
    bad = "key\udc80"
    calls = [s.set(bad, b"x"), s.get(bad, timeout=0.1), s.add(bad, 1), s.compare_set(bad, b"", b"x"),
             s.check([bad]), s.wait(["ok", bad], timeout=0.1), s.multi_get([bad]), s.delete_key(bad)]
    for call in calls:
        with pytest.raises(ValueError, match="lone surrogate"):
            await call
    await s.set("ключ", b"v")  # (other text is fine)
    assert await s.get("ключ") == b"v"


async def test_wrong_types_raise_type_error_before_sending(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(TypeError):
        await s.set(1, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.set("k", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.set("k", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.add("k", "1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.add("k", 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.wait("abc")  # a str is not a list of keys
    with pytest.raises(TypeError):
        await s.multi_get([1])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        await s.queue_push("k", [1])  # type: ignore[arg-type]
    assert await s.check(["k"]) is False


async def test_a_bytes_key_is_the_str_it_encodes_as_in_torch(handles: Factory) -> None:
    """Before: TypeError 'store keys must be str, not bytes' (torch's stores take bytes keys)."""
    s = await handles()
    assert s.has_extended_api() is True
    await s.set(b"k\xc3\xa9", b"v")
    assert await s.get("ké") == b"v" and await s.get(b"k\xc3\xa9") == b"v"
    assert await s.add(b"n", 2) == 2 and await s.add("n", 1) == 3
    assert await s.multi_get([b"k\xc3\xa9", "n"]) == [b"v", b"3"]
    assert await s.check([b"n"]) is True
    await s.wait([b"n"], timeout=1)
    with pytest.raises(ValueError, match="must be UTF-8"):
        await s.set(b"\xff", b"x")
    assert await s.delete_key(b"n") is True and await s.check(["n"]) is False


async def test_key_and_value_limits(handles: Factory) -> None:
    s = await handles()
    with pytest.raises(StoreRequestError) as info:
        await s.set("k" * (MAX_KEY + 1), b"x")
    assert info.value.code == "key_too_large"
    with pytest.raises(StoreRequestError) as info:
        await s.set("v", b"x" * (MAX_VALUE + 1))
    assert info.value.code == "value_too_large"
    await s.set("v", b"x" * (MAX_VALUE - 10))
    with pytest.raises(StoreRequestError) as info:
        await s.append("v", b"y" * 20)
    assert info.value.code == "value_too_large"
    assert len(await s.get("v")) == MAX_VALUE - 10
    await s.set("ok", b"fine")
    assert await s.get("ok") == b"fine"


async def test_closed_store_refuses_calls(handles: Factory) -> None:
    s = await handles()
    await s.set("a", b"1")
    base = s.store if isinstance(s, PrefixStore) else s
    await base.close()
    with pytest.raises(ConnectionClosedError):
        await s.get("a")
    with pytest.raises(ConnectionClosedError):
        await s.set("a", b"2")


async def test_close_fails_pending_waits(handles: Factory) -> None:
    s = await handles()
    base = s.store if isinstance(s, PrefixStore) else s
    task = await soon(s.get("forever", timeout=30), s)
    await base.close()
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(task, 2)
