"""The store's blocked requests in the pure state machine: what one client may keep blocked (``max_waiter_bytes``), and how a waiter on many keys is woken."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.store.state import WAITER_QUOTA_EXCEEDED, Reply, StoreState
from aiodist.store.waiters import KEY_OVERHEAD, WAITER_OVERHEAD, waiter_cost

ONE = waiter_cost(("k0",))  # a blocked get on a two-character key


def refused(replies: list[Reply]) -> str | None:
    assert len(replies) == 1, replies
    return replies[0].failure.code if replies[0].failure is not None else None


def test_the_cost_of_a_waiter_is_its_keys_plus_overheads() -> None:
    assert ONE == WAITER_OVERHEAD + KEY_OVERHEAD + 2
    assert waiter_cost(["a", "bcd"]) == WAITER_OVERHEAD + 2 * KEY_OVERHEAD + 4


def test_a_client_parks_up_to_its_limit_then_is_refused_at_once() -> None:
    s = StoreState(max_waiter_bytes=3 * ONE)
    for i in range(3):
        assert s.get("a", i, f"k{i}") == []
    assert s.waiter_count("a") == 3 and s.waiter_bytes("a") == 3 * ONE
    r = s.get("a", 3, "k3")
    assert refused(r) == WAITER_QUOTA_EXCEEDED and r[0].request == 3
    f = r[0].failure
    assert f is not None and f.limit == "max_waiter_bytes" and f.maximum == 3 * ONE and f.key == "k3"
    assert "max_waiter_bytes" in f.message and str(3 * ONE) in f.message and "raise" in f.message
    assert s.waiter_count("a") == 3 and s.waiter_bytes("a") == 3 * ONE  # nothing parked, nothing charged
    assert s.set("b", 9, "k3", b"v") == [Reply("b", 9, None)]  # wakes nobody: the refused get is not waiting
    # every blocking op is charged the same way
    assert refused(s.wait("a", 4, ["x"])) == WAITER_QUOTA_EXCEEDED
    assert refused(s.multi_get("a", 5, ["x", "y"])) == WAITER_QUOTA_EXCEEDED
    assert refused(s.queue_pop("a", 6, "q")) == WAITER_QUOTA_EXCEEDED
    # what completes at once costs nothing, even over the limit
    assert s.get("a", 7, "k3") == [Reply("a", 7, b"v")]
    assert s.wait("a", 8, ["k3"]) == [Reply("a", 8, None)]
    # another client has its own budget
    assert s.get("b", 1, "k0") == [] and s.waiter_bytes("b") == ONE
    assert s.waiter_bytes() == 4 * ONE


def test_one_request_over_the_limit_alone_is_refused() -> None:
    keys = [f"{i}.{j}" for i in range(10) for j in range(100)]
    s = StoreState(max_waiter_bytes=waiter_cost(keys) - 1)
    r = s.wait("a", 1, keys)
    assert refused(r) == WAITER_QUOTA_EXCEEDED and r[0].failure is not None and r[0].failure.key is None
    assert "1000 keys" in r[0].failure.message
    assert s.waiter_count() == 0 and s.waiter_bytes() == 0
    assert refused(s.multi_get("a", 2, keys)) == WAITER_QUOTA_EXCEEDED
    assert s.multi_get("a", 3, keys[1:]) == []  # one key fewer fits


def test_the_budget_comes_back_when_a_waiter_completes() -> None:
    s = StoreState(max_waiter_bytes=2 * ONE)
    assert s.get("a", 1, "k1") == [] and s.wait("a", 2, ["k2"]) == []
    assert refused(s.get("a", 3, "k3")) == WAITER_QUOTA_EXCEEDED
    assert s.set("b", 1, "k1", b"v") == [Reply("b", 1, None), Reply("a", 1, b"v")]
    assert s.waiter_bytes("a") == ONE
    assert s.get("a", 3, "k3") == []  # room again
    assert s.set("b", 2, "k2", b"v")[1] == Reply("a", 2, None)
    assert s.set("b", 3, "k3", b"v")[1] == Reply("a", 3, b"v")
    assert s.waiter_bytes() == 0 and s.waiter_count() == 0


def test_the_budget_comes_back_when_a_pop_is_served_by_a_push_or_an_unpop() -> None:
    s = StoreState(max_waiter_bytes=waiter_cost(("q",)))
    assert s.queue_pop("a", 1, "q") == []
    assert refused(s.queue_pop("a", 2, "q")) == WAITER_QUOTA_EXCEEDED
    assert s.queue_push("b", 1, "q", b"x")[1] == Reply("a", 1, b"x")
    assert s.waiter_bytes("a") == 0
    assert s.queue_pop("a", 2, "q") == []
    assert s.queue_unpop("q", b"y") == [Reply("a", 2, b"y")]
    assert s.waiter_bytes("a") == 0 and s.queue_pop("a", 3, "q") == []


def test_the_budget_comes_back_when_a_waiter_times_out_or_is_cancelled() -> None:
    s = StoreState(max_waiter_bytes=2 * ONE)
    assert s.get("a", 1, "k1") == [] and s.multi_get("a", 2, ["k2"]) == []
    assert refused(s.get("a", 3, "k3")) == WAITER_QUOTA_EXCEEDED
    assert s.cancel("a", 1)  # what the server does when a request's timeout fires
    assert s.waiter_bytes("a") == ONE
    assert s.get("a", 3, "k3") == []
    assert not s.cancel("a", 1)  # cancelling again gives nothing back twice
    assert s.waiter_bytes("a") == 2 * ONE
    assert s.cancel("a", 2) and s.cancel("a", 3)
    assert s.waiter_bytes() == 0 and s.waiter_count() == 0


def test_the_budget_comes_back_when_the_client_leaves() -> None:
    s = StoreState(max_waiter_bytes=2 * ONE)
    assert s.get("a", 1, "k1") == [] and s.wait("a", 2, ["k2"]) == []
    assert refused(s.get("a", 3, "k3")) == WAITER_QUOTA_EXCEEDED
    assert s.get("b", 1, "k1") == []
    assert s.drop_client("a") == 2
    assert s.waiter_bytes("a") == 0 and s.waiter_bytes() == ONE  # b's waiter stays charged to b
    assert s.set("c", 1, "k1", b"v") == [Reply("c", 1, None), Reply("b", 1, b"v")]
    assert s.waiter_bytes() == 0 and s._waiter_bytes == {} and s._by_client == {}


def test_a_refused_request_id_is_free_and_a_duplicate_is_still_a_duplicate() -> None:
    s = StoreState(max_waiter_bytes=ONE)
    assert s.get("a", 1, "k1") == []
    assert refused(s.get("a", 1, "k2")) == "duplicate_request"
    assert refused(s.get("a", 2, "k2")) == WAITER_QUOTA_EXCEEDED
    assert s.cancel("a", 1) and not s.cancel("a", 2)
    assert s.get("a", 2, "k2") == []  # the refused id was never parked


def test_without_a_limit_nothing_is_charged() -> None:
    s = StoreState()
    for i in range(100):
        assert s.wait("a", i, [f"{i}.{j}" for j in range(100)]) == []
    assert s.waiter_count("a") == 100 and s.waiter_bytes() == 0


_ops = st.lists(
    st.tuples(
        st.sampled_from(["get", "wait", "multi_get", "pop", "set", "push", "unpop", "delete", "cancel", "drop"]),
        st.sampled_from(["a", "b"]),
        st.lists(st.sampled_from(["k1", "k2", "k3", "q"]), min_size=1, max_size=4),
        st.integers(0, 60),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_charge_always_equals_what_is_parked_and_stays_within_the_limit(ops: list) -> None:
    limit = 4 * ONE
    s = StoreState(max_waiter_bytes=limit)
    for i, (op, client, keys, n) in enumerate(ops):
        if op == "get":
            out = s.get(client, i, keys[0])
        elif op == "wait":
            out = s.wait(client, i, keys)
        elif op == "multi_get":
            out = s.multi_get(client, i, keys)
        elif op == "pop":
            out = s.queue_pop(client, i, keys[0])
        elif op == "set":
            out = s.set(client, i, keys[0], b"v")
        elif op == "push":
            out = s.queue_push(client, i, keys[0], b"p")
        elif op == "unpop":
            out = s.queue_unpop(keys[0], b"u")
        elif op == "delete":
            out = s.delete_key(client, i, keys[0])
        elif op == "cancel":
            s.cancel(client, n)
            out = []
        else:
            s.drop_client(client)
            out = []
        for r in out:  # a refusal comes only from a limit, a get of a queue's key or a duplicate id (unique here)
            assert r.failure is None or r.failure.code in (WAITER_QUOTA_EXCEEDED, "holds_queue")
        for c in "ab":
            parked = s._by_client.get(c, {})
            assert s.waiter_bytes(c) == sum(waiter_cost(w.keys) for w in parked.values())
            assert s.waiter_bytes(c) <= limit


class _CountingDict(dict):
    """The store's key table, counting the membership tests made on it."""

    tests = 0

    def __contains__(self, key: object) -> bool:
        _CountingDict.tests += 1
        return super().__contains__(key)


@pytest.mark.parametrize("op", ["wait", "multi_get"])
def test_a_waiter_on_many_keys_written_one_by_one_costs_linear_work_and_completes_only_when_all_exist(op: str) -> None:
    # store audit s21, finding 5: each write re-scanned the waiter's keys from the first one (quadratic:
    # a wait on 20,000 keys written in order stalled the server's loop for 10 s).
    k = 2000
    keys = [f"k{i}" for i in range(k)]
    s = StoreState()
    s._values = _CountingDict()
    _CountingDict.tests = 0
    assert getattr(s, op)("a", 1, keys) == []
    for i, key in enumerate(keys[:-1]):
        assert s.set("b", i, key, b"v") == [Reply("b", i, None)]
    assert s.delete_key("b", 10_000, keys[0]) == [Reply("b", 10_000, True)]  # gone again before the last one comes
    assert s.set("b", 10_001, keys[-1], b"v") == [Reply("b", 10_001, None)]
    assert s.waiter_count() == 1
    out = s.set("b", 10_002, keys[0], b"w")
    assert out[0] == Reply("b", 10_002, None) and out[1].request == 1 and len(out) == 2
    assert out[1].value == (None if op == "wait" else [b"w"] + [b"v"] * (k - 1))
    assert _CountingDict.tests < 10 * k  # (quadratic: about k * k / 2)


def test_a_waiter_resumes_where_it_stopped_but_rechecks_what_it_passed() -> None:
    s = StoreState()
    assert s.wait("a", 1, ["x", "y", "x", "z"]) == []
    s.set("b", 1, "x", b"1")
    s.set("b", 2, "y", b"1")
    s.queue_push("b", 3, "z", b"q")  # (a non-empty queue counts for wait)
    assert s.waiter_count() == 0
    assert s.wait("a", 2, ["x", "y", "w"]) == []
    s.delete_key("b", 4, "y")
    assert s.set("b", 5, "w", b"1") == [Reply("b", 5, None)]  # y was deleted after it was passed
    assert s.set("b", 6, "y", b"2") == [Reply("b", 6, None), Reply("a", 2, None)]
