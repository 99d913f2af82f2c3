"""The keyed routing tables' per-operation book, alone: buffered messages, their budgets, leftovers, other calls."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.comm.admission import Budgets
from aiodist.comm.op_book import OpBook
from aiodist.comm.receives import Buffered


def buffered(src: int, seq: int, sig: str | None, nbytes: int = 1) -> tuple[tuple[Any, Any, int], Buffered]:
    header: dict[str, Any] = {"t": "m", "g": 0, "k": [seq, "x"]}
    if sig is not None:
        header["o"] = sig
    return (0, (seq, "x"), src), Buffered(src, header, memoryview(bytes(nbytes)), nbytes)


def test_put_charges_unless_charged_already_and_pop_refunds() -> None:
    budgets = Budgets()
    book = OpBook(budgets)
    slot1, a1 = buffered(1, 0, "all_reduce", 5)
    slot2, a2 = buffered(2, 0, "all_reduce", 7)
    book.put(slot1, a1, charged=False)
    assert budgets.of(1) == (1, 5)
    budgets.charge(2, 7)  # (charged when it was routed)
    book.put(slot2, a2, charged=True)
    assert budgets.of(2) == (1, 7)
    assert book.pop(slot1) is a1 and book.pop(slot1) is None
    assert budgets.of(1) == (0, 0)
    book.discard_source(2)
    assert budgets.of(2) == (0, 0) and not book.arrived


def test_a_second_message_at_a_slot_replaces_the_first_and_refunds_it() -> None:
    budgets = Budgets()
    book = OpBook(budgets)
    slot, a = buffered(1, 0, None, 3)
    _, b = buffered(1, 0, None, 4)
    book.put(slot, a, charged=False)
    book.put(slot, b, charged=False)
    assert book.arrived[slot] is b and budgets.of(1) == (1, 4)


def test_other_call_is_the_lowest_source_still_buffered_with_another_signature() -> None:
    book = OpBook(Budgets())
    for src, sig in [(3, "broadcast"), (1, "all_reduce"), (2, "broadcast"), (4, None)]:
        book.put(*buffered(src, 5, sig), charged=False)
    assert book.other_call(0, 5, "all_reduce", None) == (2, "broadcast")
    assert book.other_call(0, 5, "all_reduce", {3: 0}) == (3, "broadcast")  # only ``sources`` count
    assert book.other_call(0, 5, "all_reduce", range(1, 2)) is None
    assert book.other_call(0, 5, "broadcast", None) == (1, "all_reduce")
    assert book.other_call(0, 6, "x", None) is None and book.other_call(1, 5, "x", None) is None
    book.pop((0, (5, "x"), 2))  # taken by a receive: no longer evidence
    assert book.other_call(0, 5, "all_reduce", None) == (3, "broadcast")


def test_settle_forgets_the_operation_and_drops_what_nobody_took() -> None:
    budgets = Budgets()
    book = OpBook(budgets)
    book.calls[(0, 5)] = "all_reduce"
    book.calls[(0, 6)] = "all_reduce"
    book.put(*buffered(1, 5, "all_reduce", 2), charged=False)
    book.put(*buffered(2, 5, "broadcast", 3), charged=False)
    book.put(*buffered(2, 6, "all_reduce", 4), charged=False)
    assert book.settle(0, 5, "all_reduce", None) == (2, "broadcast")
    assert budgets.of(1) == (0, 0) and budgets.of(2) == (1, 4)
    assert (0, 5) not in book.seqs and (0, 5) not in book.calls
    assert list(book.arrived) == [(0, (6, "x"), 2)] and (0, 6) in book.calls
    assert book.settle(0, 7, "all_reduce", None) is None  # nothing came for it: nothing to do


def test_forget_below_goes_no_further_than_the_floor_and_only_in_its_group() -> None:
    budgets = Budgets()
    book = OpBook(budgets)
    for seq in range(6):
        book.calls[(0, seq)] = "x"
        book.put(*buffered(1, seq, "x"), charged=False)
    book.calls[(1, 0)] = "x"
    book.calls[(0, "named")] = "x"  # (not a sequence number: never below a floor)
    book.forget_below(0, 4)
    assert sorted(book.seqs) == [(0, 4), (0, 5)]
    assert set(book.calls) == {(0, 4), (0, 5), (0, "named"), (1, 0)}
    assert budgets.of(1) == (2, 2)
    book.forget_group(0)
    assert not book.arrived and not book.seqs and list(book.calls) == [(1, 0)] and budgets.of(1) == (0, 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.sampled_from(["a", "b", None])), max_size=30))
def test_budgets_always_count_exactly_what_is_buffered(arrivals: list[tuple[int, int, str | None]]) -> None:
    """Whatever arrives and whatever is settled, retired or taken, each peer is charged for what stays, no more."""
    budgets = Budgets()
    book = OpBook(budgets)
    for i, (src, seq, sig) in enumerate(arrivals):
        slot, a = buffered(src, seq, sig, nbytes=src + 1)
        if i % 5 == 4:
            book.settle(0, seq, "a", None)
        elif i % 7 == 6:
            book.forget_below(0, seq)
        elif i % 3 == 2:
            book.pop(slot)
        else:
            book.put(slot, a, charged=False)
        for s in range(4):
            mine = [b for b in book.arrived.values() if b.src == s]
            assert budgets.of(s) == (len(mine), sum(b.nbytes for b in mine))
        for slot in book.arrived:  # every buffered message is filed under its operation
            assert slot in book.seqs[(0, slot[1][0])].slots
