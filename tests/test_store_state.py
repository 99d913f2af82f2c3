"""The pure store state machine, driven synchronously (no sockets, no loop)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.store.state import Reply, StoreState


def ok(replies: list[Reply], value: object = None) -> None:
    assert len(replies) == 1 and replies[0].failure is None, replies
    assert replies[0].value == value


def test_set_get_and_reply_addressing() -> None:
    s = StoreState()
    assert s.set("A", 1, "k", b"v") == [Reply("A", 1, None)]
    assert s.get("B", 7, "k") == [Reply("B", 7, b"v")]


def test_get_waiter_is_completed_by_set_of_another_client() -> None:
    s = StoreState()
    assert s.get("A", 1, "k") == []
    assert s.waiter_count("A") == 1
    out = s.set("B", 5, "k", b"v")
    assert out == [Reply("B", 5, None), Reply("A", 1, b"v")]
    assert s.waiter_count() == 0


@pytest.mark.parametrize(
    "write",
    [
        lambda s: s.add("W", 9, "k", 2),
        lambda s: s.append("W", 9, "k", b"2"),
        lambda s: s.compare_set("W", 9, "k", b"", b"2"),
        lambda s: s.multi_set("W", 9, ["z", "k"], [b"0", b"2"]),
    ],
    ids=["add", "append", "compare_set", "multi_set"],
)
def test_every_write_wakes_get_waiters(write) -> None:
    s = StoreState()
    s.get("A", 1, "k")
    s.get("B", 1, "k")
    out = write(s)
    assert [(r.client, r.request, r.value) for r in out[1:]] == [("A", 1, b"2"), ("B", 1, b"2")]


def test_failed_compare_set_wakes_nobody() -> None:
    s = StoreState()
    s.get("A", 1, "k")
    assert s.compare_set("W", 1, "k", b"x", b"y") == [Reply("W", 1, b"x")]
    assert s.waiter_count("A") == 1


def test_wait_on_several_keys_with_deletion_in_between() -> None:
    s = StoreState()
    assert s.wait("A", 1, ["x", "y"]) == []
    s.set("W", 1, "x", b"")
    s.delete_key("W", 2, "x")
    assert s.set("W", 3, "y", b"") == [Reply("W", 3, None)]  # x is gone again
    assert s.set("W", 4, "x", b"") == [Reply("W", 4, None), Reply("A", 1, None)]


def test_multi_get_waiter() -> None:
    s = StoreState()
    s.set("W", 0, "a", b"1")
    assert s.multi_get("A", 1, ["a", "b"]) == []
    assert s.set("W", 1, "b", b"2")[1] == Reply("A", 1, [b"1", b"2"])


def test_queue_push_wakes_exactly_one_waiter_fifo() -> None:
    s = StoreState()
    for c in ("A", "B", "C"):
        assert s.queue_pop(c, 1, "q") == []
    out = s.queue_push("P", 1, "q", b"x")
    assert out == [Reply("P", 1, None), Reply("A", 1, b"x")]
    out = s.queue_push("P", 2, "q", b"y")
    assert out[1] == Reply("B", 1, b"y")
    assert s.waiter_count() == 1
    assert s.queue_len("P", 3, "q")[0].value == 0


def test_cancel_and_drop_client_remove_waiters() -> None:
    s = StoreState()
    s.queue_pop("A", 1, "q")
    s.queue_pop("B", 1, "q")
    s.get("A", 2, "k")
    s.wait("A", 3, ["k", "j"])
    assert s.cancel("A", 1) is True
    assert s.cancel("A", 1) is False
    assert s.cancel("nobody", 1) is False
    assert s.drop_client("A") == 2
    assert s.set("W", 1, "k", b"v") == [Reply("W", 1, None)]
    assert s.queue_push("W", 2, "q", b"x")[1] == Reply("B", 1, b"x")
    assert s.waiter_count() == 0


def test_duplicate_waiting_request_id_is_refused() -> None:
    s = StoreState()
    s.get("A", 1, "k")
    (r,) = s.get("A", 1, "j")
    assert r.failure is not None and r.failure.code == "duplicate_request"


def test_queue_unpop_goes_to_front_or_next_waiter() -> None:
    s = StoreState()
    s.queue_push("P", 1, "q", b"2")
    assert s.queue_unpop("q", b"1") == []
    assert s.queue_pop("A", 1, "q")[0].value == b"1"
    assert s.queue_pop("A", 2, "q")[0].value == b"2"
    s.queue_pop("B", 1, "q")
    assert s.queue_unpop("q", b"back") == [Reply("B", 1, b"back")]


def test_add_rules() -> None:
    s = StoreState()
    ok(s.add("A", 1, "c", 5), 5)
    ok(s.add("A", 2, "c", -7), -2)
    assert s.peek("c") == b"-2"
    for bad in (b"x", b"1.0", b"", b" 1", b"1_000", b"0x10"):
        s.set("A", 3, "b", bad)
        (r,) = s.add("A", 4, "b", 1)
        assert r.failure is not None and r.failure.code == "not_integer", bad
        assert s.peek("b") == bad
    s.set("A", 5, "p", b"+7")
    ok(s.add("A", 6, "p", 1), 8)
    (r,) = s.add("A", 7, "p", 2**63)
    assert r.failure is not None and r.failure.code == "overflow"


def test_limits_leave_state_unchanged() -> None:
    s = StoreState(max_key_bytes=8, max_value_bytes=4)
    (r,) = s.set("A", 1, "k" * 9, b"")
    assert r.failure is not None and r.failure.code == "key_too_large"
    (r,) = s.set("A", 1, "é" * 5, b"")  # 10 UTF-8 bytes
    assert r.failure is not None and r.failure.code == "key_too_large"
    ok(s.set("A", 1, "é" * 4, b""))
    (r,) = s.set("A", 2, "k", b"12345")
    assert r.failure is not None and r.failure.code == "value_too_large"
    ok(s.set("A", 3, "k", b"1234"))
    (r,) = s.append("A", 4, "k", b"5")
    assert r.failure is not None and r.failure.code == "value_too_large"
    (r,) = s.multi_set("A", 5, ["m", "n"], [b"1", b"12345"])
    assert r.failure is not None
    assert s.peek("m") is None and s.peek("k") == b"1234"
    (r,) = s.get("A", 6, "x" * 9)
    assert r.failure is not None and s.waiter_count() == 0


def test_delete_and_num_keys() -> None:
    s = StoreState()
    s.set("A", 1, "a", b"")
    s.queue_push("A", 2, "q", b"x")
    assert s.num_keys("A", 3)[0].value == 1
    assert s.check("A", 4, ["a", "q"])[0].value is True
    assert s.delete_key("A", 5, "q")[0].value is True
    assert s.check("A", 6, ["q"])[0].value is False
    assert s.delete_key("A", 7, "nope")[0].value is False


# ------------------------------------------------------------ model-based (hypothesis)

KEYS = st.sampled_from(["a", "b", "c"])
VALUES = st.sampled_from([b"", b"0", b"7", b"-3", b"x", b"long value"])
OPS = st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("add"), KEYS, st.integers(-5, 5)),
    st.tuples(st.just("compare_set"), KEYS, VALUES, VALUES),
    st.tuples(st.just("append"), KEYS, VALUES),
    st.tuples(st.just("delete_key"), KEYS),
    st.tuples(st.just("queue_push"), KEYS, VALUES),
    st.tuples(st.just("queue_pop"), KEYS),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("wait"), st.lists(KEYS, max_size=3)),
    st.tuples(st.just("cancel"), st.integers(0, 40)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_against_a_simple_model(ops: list[tuple]) -> None:
    """Non-blocking results match a dict/deque model; every blocked request is
    answered exactly once, by the write that satisfies it, with the right value."""
    s = StoreState()
    values: dict[str, bytes] = {}
    queues: dict[str, deque[bytes]] = {}
    blocked: dict[int, tuple] = {}  # request -> op
    answered: set[int] = set()

    def exists(k: str) -> bool:
        return k in values or bool(queues.get(k))

    def settle(replies: list[Reply], rid: int) -> None:
        """Check replies to blocked requests against the model, oldest first."""
        for r in replies:
            assert r.request not in answered
            answered.add(r.request)
            if r.request == rid:
                continue
            op = blocked.pop(r.request)
            if op[0] == "get":
                assert r.value == values[op[1]]
            elif op[0] == "wait":
                assert all(exists(k) for k in op[1])
            elif op[0] == "queue_pop":
                assert r.value is not None

    for rid, op in enumerate(ops):
        name = op[0]
        if name == "set":
            out = s.set("C", rid, op[1], op[2])
            values[op[1]] = op[2]
            settle(out, rid)
        elif name == "add":
            out = s.add("C", rid, op[1], op[2])
            old = values.get(op[1], b"0")
            try:
                expect = int(old) + op[2] if old.lstrip(b"-").isdigit() else None
            except ValueError:
                expect = None
            if expect is None:
                assert out[0].failure is not None and out[0].failure.code == "not_integer"
            else:
                assert out[0].value == expect
                values[op[1]] = b"%d" % expect
            settle(out, rid)
        elif name == "compare_set":
            _, k, exp, des = op
            out = s.compare_set("C", rid, k, exp, des)
            cur = values.get(k)
            if cur is None:
                expect = des if exp == b"" else exp
                if exp == b"":
                    values[k] = des
            else:
                if cur == exp:
                    values[k] = des
                expect = values[k]
            assert out[0].value == expect
            settle(out, rid)
        elif name == "append":
            out = s.append("C", rid, op[1], op[2])
            values[op[1]] = values.get(op[1], b"") + op[2]
            settle(out, rid)
        elif name == "delete_key":
            out = s.delete_key("C", rid, op[1])
            had = op[1] in values or bool(queues.get(op[1]))
            values.pop(op[1], None)
            queues.pop(op[1], None)
            assert out[0].value == had
            settle(out, rid)
        elif name == "queue_push":
            pops = [r for r, o in blocked.items() if o[0] == "queue_pop" and o[1] == op[1]]
            out = s.queue_push("C", rid, op[1], op[2])
            if pops:  # handed to the oldest waiting pop on this key, and only to it
                assert len(out) == 2 and out[1].request == min(pops) and out[1].value == op[2]
            else:
                queues.setdefault(op[1], deque()).append(op[2])
            settle(out, rid)
        elif name == "queue_pop":
            out = s.queue_pop("C", rid, op[1])
            q = queues.get(op[1])
            if q:
                assert out[0].value == q.popleft()
            else:
                assert out == []
                blocked[rid] = op
            settle(out, rid)
        elif name == "get":
            out = s.get("C", rid, op[1])
            if op[1] in values:
                assert out[0].value == values[op[1]]
                settle(out, rid)
            elif queues.get(op[1]):  # a key that holds a queue and no value: refused at once
                assert len(out) == 1 and out[0].failure is not None and out[0].failure.code == "holds_queue"
            else:
                assert out == []
                blocked[rid] = op
        elif name == "wait":
            out = s.wait("C", rid, op[1])
            if all(exists(k) for k in op[1]):
                assert out == [Reply("C", rid, None)]
                settle(out, rid)
            else:
                assert out == []
                blocked[rid] = op
        elif name == "cancel":
            assert s.cancel("C", op[1]) == (op[1] in blocked)
            blocked.pop(op[1], None)
        # no blocked request is satisfiable and forgotten
        for r, o in blocked.items():
            if o[0] == "get":
                assert o[1] not in values
            elif o[0] == "wait":
                assert not all(exists(k) for k in o[1])
            elif o[0] == "queue_pop":
                assert not queues.get(o[1])
        assert s.waiter_count() == len(blocked)
        assert len(s) == len(values)
    assert s.drop_client("C") == len(blocked)
    assert s.waiter_count() == 0


def test_multi_get_refuses_a_reply_over_two_max_values_now_or_when_woken() -> None:
    # store audit s21, finding 2 (repeated keys multiplied a value into a reply of any size)
    s = StoreState(max_value_bytes=10)
    s.set("A", 1, "k", b"x" * 10)
    assert s.multi_get("A", 2, ["k", "k"]) == [Reply("A", 2, [b"x" * 10] * 2)]
    [r] = s.multi_get("A", 3, ["k"] * 3)
    assert r.value is None and r.failure is not None and r.failure.code == "request_too_large"
    assert (r.failure.limit, r.failure.maximum) == ("max_value_bytes", 10)
    assert s.multi_get("A", 4, ["k", "k", "later"]) == []
    out = s.set("B", 1, "later", b"y")
    assert out[0] == Reply("B", 1, None) and out[1].request == 4 and out[1].failure is not None
    assert out[1].failure.code == "request_too_large" and s.waiter_count() == 0


def test_a_multi_get_repeating_an_appended_key_copies_it_once_and_checks_the_total_before_any_copy() -> None:
    # store re-audit s22, finding 1: each repeat of a key append had left as a bytearray was copied to bytes of
    # its own, all of them held, before the size check (a 58-byte request took 770 MiB of server memory).
    s = StoreState(max_value_bytes=1 << 20)
    s.set("A", 1, "k", b"x" * 1000)
    s.append("A", 2, "k", b"y")
    [r] = s.multi_get("A", 3, ["k"] * 5)
    assert r.failure is None and len({id(v) for v in r.value}) == 1 and r.value[0] == b"x" * 1000 + b"y"
    s.append("A", 4, "k", b"z")
    [r] = s.multi_get("A", 5, ["k"] * 3000)  # (3 MB: over 2 x max_value_bytes)
    assert r.failure is not None and r.failure.code == "request_too_large"
    assert type(s._values["k"]) is bytearray  # (refused before anything was copied)


def test_add_refuses_a_value_longer_than_any_integer_without_reading_it() -> None:
    # store re-audit s22, finding 2: add scanned a 64 MiB value of digits on every call (40 ms each, the
    # server stalled) before refusing it; a value of leading zeros up to 64 KiB still counts.
    s = StoreState()
    s.set("A", 1, "big", b"1" * ((1 << 16) + 1))
    [r] = s.add("A", 2, "big", 1)
    assert r.failure is not None and r.failure.code == "overflow" and "at most 65536 characters" in r.failure.message
    s.set("A", 3, "z", b"-" + b"0" * 60000 + b"7")
    assert s.add("A", 4, "z", 10)[0].value == 3


def test_append_grows_the_value_in_place_and_replies_never_share_the_growing_buffer() -> None:
    # store audit s21, finding 6: each append copied the whole value (old + value): quadratic for many appends.
    s = StoreState(max_value_bytes=1000)
    s.append("A", 1, "k", b"ab")
    s.append("A", 2, "k", b"cd")
    grown = s._values["k"]
    for i in range(3, 100):
        assert s.append("A", i, "k", b"e") == [Reply("A", i, None)]
        assert s._values["k"] is grown  # the same buffer: no copy of what was there
    [r] = s.get("A", 100, "k")
    assert type(r.value) is bytes and r.value == b"abcd" + b"e" * 97
    s.append("A", 101, "k", b"f")
    assert r.value == b"abcd" + b"e" * 97  # a reply made before is not changed by a later append
    assert s.multi_get("A", 102, ["k", "k"]) == [Reply("A", 102, [r.value + b"f"] * 2)]
    assert type(s.multi_get("A", 103, ["k"])[0].value[0]) is bytes
    assert s.append("A", 104, "k", b"x" * 900)[0].failure.code == "value_too_large"  # the limit counts the sum
    assert s.peek("k") == r.value + b"f"
    s.set("A", 105, "n", b"4")
    s.append("A", 106, "n", b"2")
    assert s.add("A", 107, "n", 1) == [Reply("A", 107, 43)]
    assert s.compare_set("A", 108, "n", b"x", b"y") == [Reply("A", 108, b"43")]
    assert s.wait("A", 109, ["w"]) == [] and s.get("B", 1, "w") == []
    s.append("A", 110, "w", b"1")
    out = s.append("A", 111, "w", b"2")  # (no waiter left: the first append woke both)
    assert out == [Reply("A", 111, None)] and s.get("B", 2, "w") == [Reply("B", 2, b"12")]
