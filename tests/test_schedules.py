"""Pure schedules, checked by simulating them on integers.

A rank's contribution is the weight ``1 << (8 * rank)``; summing weights
instead of taking set unions means that a contribution counted twice shows
up (as a 2 in its byte), not only one that is missing.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.collectives import schedules as S

PS = st.integers(min_value=1, max_value=70)


def w(r: int) -> int:
    return 1 << (8 * r)


def full(p: int) -> int:
    return sum(w(r) for r in range(p))


# ---------------------------------------------------------------- helpers


@given(n=st.integers(0, 10_000), k=st.integers(1, 100))
def test_partition_covers_nearly_equal_blocks(n: int, k: int) -> None:
    offs = S.partition(n, k)
    assert len(offs) == k + 1 and offs[0] == 0 and offs[-1] == n
    sizes = [offs[i + 1] - offs[i] for i in range(k)]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_log_helpers() -> None:
    assert [S.ceil_log2(p) for p in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert [S.pof2_floor(p) for p in (1, 2, 3, 4, 5, 8, 9, 70)] == [1, 2, 2, 4, 4, 8, 8, 64]


# ---------------------------------------------------------------- binomial


@settings(max_examples=150, deadline=None)
@given(p=PS, data=st.data())
def test_binomial_broadcast_reaches_everyone_in_ceil_lg_p_rounds(p: int, data: st.DataObject) -> None:
    root = data.draw(st.integers(0, p - 1))
    trees = [S.binomial_tree(p, r, root) for r in range(p)]
    assert trees[root].parent is None
    for r, t in enumerate(trees):
        for child, step in t.children:
            assert trees[child].parent == r and trees[child].parent_step == step
        if r != root:
            assert t.parent is not None and (r, t.parent_step) in trees[t.parent].children
    # synchronous rounds: each holder sends to its next child (largest subtree first)
    have = {root}
    nxt = [0] * p
    rounds = 0
    while len(have) < p:
        rounds += 1
        assert rounds <= 64
        for r in sorted(have):
            if nxt[r] < len(trees[r].children):
                have_next = trees[r].children[nxt[r]][0]
                assert have_next not in have
                nxt[r] += 1
                have = have | {have_next}
        # ranks that received this round only send from the next round on
    assert rounds == S.ceil_log2(p)


@settings(max_examples=150, deadline=None)
@given(p=PS, data=st.data())
def test_binomial_reduce_and_subtrees(p: int, data: st.DataObject) -> None:
    root = data.draw(st.integers(0, p - 1))
    trees = [S.binomial_tree(p, r, root) for r in range(p)]

    def total(r: int) -> int:
        return w(r) + sum(total(c) for c, _ in trees[r].children)

    assert total(root) == full(p)
    for r, t in enumerate(trees):
        v = (r - root) % p
        lo, hi = t.subtree
        assert lo == v and hi <= p
        covered = [v] + [x for a, b in t.child_subtrees for x in range(a, b)]
        assert sorted(covered) == list(range(lo, hi))
        for (c, _), sub in zip(t.children, t.child_subtrees):
            assert trees[c].subtree == sub


# ---------------------------------------------------------------- fold + recursive doubling


def _fold_in(p: int) -> list[int]:
    vals = [w(r) for r in range(p)]
    folds = [S.fold(p, r) for r in range(p)]
    p2 = S.pof2_floor(p)
    assert sum(f.role != "extra" for f in folds) == p2
    assert sorted(f.newrank for f in folds if f.newrank is not None) == list(range(p2))
    for r, f in enumerate(folds):
        if f.newrank is not None:
            assert f.real(f.newrank) == r
        if f.role == "extra":
            assert folds[f.partner].role == "absorber" and folds[f.partner].partner == r
            vals[f.partner] += vals[r]
    return vals


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_recursive_doubling_allreduce(p: int) -> None:
    vals = _fold_in(p)
    plans = [S.recursive_doubling(p, r) for r in range(p)]
    active = [r for r in range(p) if S.fold(p, r).role != "extra"]
    nsteps = {len(plans[r]) for r in active}
    assert nsteps == {S.ceil_log2(S.pof2_floor(p))}
    for k in range(nsteps.pop()):
        new = list(vals)
        for r in active:
            step, partner = plans[r][k]
            assert step == k and plans[partner][k] == (k, r)
            new[r] = vals[r] + vals[partner]
        vals = new
    for r in range(p):
        f = S.fold(p, r)
        if f.role == "extra":
            vals[r] = vals[f.partner]
    assert vals == [full(p)] * p


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_rabenseifner_halving_then_doubling(p: int) -> None:
    p2 = S.pof2_floor(p)
    folded = _fold_in(p)
    active = [r for r in range(p) if S.fold(p, r).role != "extra"]
    # blocks[r][b]: what rank r holds for block b
    blocks = {r: [folded[r]] * p2 for r in active}
    plans = {r: S.recursive_halving(p, r) for r in active}
    assert {len(v) for v in plans.values()} == {S.ceil_log2(p2)}
    for k in range(S.ceil_log2(p2)):
        new = {r: list(b) for r, b in blocks.items()}
        for r in active:
            me = plans[r][k]
            them = plans[me.partner][k]
            assert them.partner == r
            assert (them.send_lo, them.send_hi) == (me.keep_lo, me.keep_hi)
            for b in range(me.keep_lo, me.keep_hi):
                new[r][b] = blocks[r][b] + blocks[me.partner][b]
        blocks = new
    for r in active:
        assert blocks[r][S.fold(p, r).newrank] == full(p)
    for k in reversed(range(S.ceil_log2(p2))):
        new = {r: list(b) for r, b in blocks.items()}
        for r in active:
            me = plans[r][k]
            for b in range(me.send_lo, me.send_hi):
                new[r][b] = blocks[me.partner][b]
        blocks = new
    for r in active:
        assert blocks[r] == [full(p)] * p2


# ---------------------------------------------------------------- ring


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_ring_reduce_scatter_then_allgather(p: int) -> None:
    plans = [S.ring(p, r) for r in range(p)]
    blocks = [[w(r)] * p for r in range(p)]
    for r, plan in enumerate(plans):
        assert plans[plan.right].left == r
        assert len(plan.reduce_scatter) == len(plan.allgather) == p - 1
    for s in range(p - 1):
        new = [list(b) for b in blocks]
        for r, plan in enumerate(plans):
            sb, _ = plan.reduce_scatter[s]
            _, rb = plans[plan.right].reduce_scatter[s]
            assert rb == sb  # the receiver expects the block sent
            new[plan.right][rb] = blocks[plan.right][rb] + blocks[r][sb]
        blocks = new
    for r in range(p):
        assert blocks[r][r] == full(p)  # rank r owns block r
    for s in range(p - 1):
        new = [list(b) for b in blocks]
        for r, plan in enumerate(plans):
            sb, _ = plan.allgather[s]
            _, rb = plans[plan.right].allgather[s]
            assert rb == sb
            new[plan.right][rb] = blocks[r][sb]
        blocks = new
    assert blocks == [[full(p)] * p for _ in range(p)]


# ---------------------------------------------------------------- allgather


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_bruck_allgather(p: int) -> None:
    plans = [S.bruck_allgather(p, r) for r in range(p)]
    assert {len(pl) for pl in plans} == {S.ceil_log2(p)}
    rot: list[list[int | None]] = [[r] + [None] * (p - 1) for r in range(p)]
    for k in range(S.ceil_log2(p)):
        new = [list(x) for x in rot]
        for r in range(p):
            st_ = plans[r][k]
            them = plans[st_.dst][k]
            assert them.src == r and them.count == st_.count
            sent = rot[r][: st_.count]
            assert None not in sent
            new[st_.dst][them.offset : them.offset + them.count] = sent
        rot = new
    for r in range(p):
        assert [rot[r][i] for i in range(p)] == [(r + i) % p for i in range(p)]


@given(k=st.integers(0, 6))
def test_recursive_doubling_allgather(k: int) -> None:
    p = 1 << k
    plans = [S.recursive_doubling_allgather(p, r) for r in range(p)]
    have = [{r} for r in range(p)]
    for s in range(k):
        new = [set(h) for h in have]
        for r in range(p):
            st_ = plans[r][s]
            them = plans[st_.partner][s]
            assert them.partner == r
            assert set(range(st_.send_lo, st_.send_hi)) == have[r]
            assert (them.recv_lo, them.recv_hi) == (st_.send_lo, st_.send_hi)
            new[st_.partner] |= set(range(st_.send_lo, st_.send_hi))
        have = new
    assert have == [set(range(p))] * p


def test_recursive_doubling_allgather_refuses_non_power_of_two() -> None:
    import pytest

    with pytest.raises(ValueError):
        S.recursive_doubling_allgather(6, 0)


# ---------------------------------------------------------------- all-to-all, barrier


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_pairwise_alltoall_covers_every_pair_once(p: int) -> None:
    pairs = []
    plans = [S.pairwise_alltoall(p, r) for r in range(p)]
    for r in range(p):
        assert len(plans[r]) == p - 1
        for s, (dst, src) in enumerate(plans[r]):
            assert plans[dst][s][1] == r  # the destination receives from me at this step
            assert plans[src][s][0] == r
            pairs.append((r, dst))
    assert sorted(pairs) == sorted((i, j) for i in range(p) for j in range(p) if i != j)


@settings(max_examples=100, deadline=None)
@given(p=PS)
def test_dissemination_barrier_everyone_knows_everyone(p: int) -> None:
    plans = [S.dissemination(p, r) for r in range(p)]
    assert {len(pl) for pl in plans} == {S.ceil_log2(p)}
    know = [1 << r for r in range(p)]
    for k in range(S.ceil_log2(p)):
        new = list(know)
        for r in range(p):
            dst, src = plans[r][k]
            assert plans[dst][k][1] == r
            new[r] |= know[src]
        know = new
    assert know == [(1 << p) - 1] * p
