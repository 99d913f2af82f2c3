"""The handshake of a rank link without sockets: mutual proof, relays, refusals that reveal nothing, fuzz."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist.auth import AuthenticationError
from aiodist.comm import frames as F
from aiodist.comm.handshake import AcceptHandshake, DialHandshake, Outcome, Phase, Verdict, link_binding
from aiodist.errors import ProtocolError

SECRET = b"s" * 32
ADDR = b"127.0.0.1|5555"


def dialer(secret: bytes | None = SECRET, *, job: str = "job", rank: int = 1, world: int = 4, peer_rank: int = 0,
           address: bytes = ADDR) -> DialHandshake:
    return DialHandshake(secret, job=job, rank=rank, world=world, peer_rank=peer_rank, address=address,
                         nonce=os.urandom(32))


def acceptor(secret: bytes | None = SECRET, *, job: str = "job", rank: int = 0, world: int = 4,
             address: bytes = ADDR) -> AcceptHandshake:
    return AcceptHandshake(secret, job=job, rank=rank, world=world, address=address, nonce=os.urandom(32))


def shake(d: DialHandshake, a: AcceptHandshake) -> tuple[int, Any]:
    """Run both sides up to the acceptor's verdict; (the dialer's rank as the acceptor proved it, the answer)."""
    reply = a.on_hello(d.hello())
    answer = d.on_reply(reply)
    assert isinstance(answer, dict)
    return a.on_answer(answer), answer


@pytest.mark.parametrize("secret", [SECRET, None])
def test_both_sides_authenticate_and_the_dialer_reads_the_verdict(secret: bytes | None) -> None:
    d, a = dialer(secret), acceptor(secret)
    rank, _ = shake(d, a)
    assert rank == 1 and a.phase is Phase.DONE and d.phase is Phase.AUTHENTICATING
    assert d.on_verdict(F.welcome()) == Outcome(Verdict.WELCOME)
    assert "done" in repr(d) and "1->0" in repr(d) and "done" in repr(a)


def test_a_relay_between_the_dialer_and_the_real_rank_fails_at_the_dialer() -> None:
    """The store's address of rank 0 was rewritten to an attacker's, who relays every frame to rank 0."""
    d = dialer(address=b"127.0.0.1|6666")  # the attacker's address, as the dialer found it in the store
    a = acceptor(address=ADDR)  # the real rank binds the address it published
    with pytest.raises(AuthenticationError) as e:
        d.on_reply(a.on_hello(d.hello()))
    assert e.value.reason == "bad_proof" and d.phase is Phase.FAILED


def test_proofs_are_bound_to_both_ranks() -> None:
    d = dialer(peer_rank=2)  # it believes it dials rank 2 (a stale or swapped address), rank 0 answers
    hello = d.hello()
    hello[F.TO] = 0  # (something in between rewrote what the dialer meant to reach)
    with pytest.raises(AuthenticationError):
        d.on_reply(acceptor().on_hello(hello))


def test_the_binding_covers_the_address_the_job_and_both_ranks() -> None:
    bindings = {
        link_binding(ADDR, "job", 1, 0),
        link_binding(b"127.0.0.1|5556", "job", 1, 0),
        link_binding(ADDR, "job2", 1, 0),
        link_binding(ADDR, "job", 0, 1),
        link_binding(ADDR, "job", 1, 2),
    }
    assert len(bindings) == 5


def test_the_acceptor_refuses_a_forged_or_reflected_answer_without_saying_why() -> None:
    d, a = dialer(), acceptor()
    challenge = a.on_hello(d.hello())
    with pytest.raises(AuthenticationError):
        a.on_answer(F.answer({"proof": challenge["proof"]}))  # its own proof reflected
    assert a.phase is Phase.FAILED
    d2, a2 = dialer(), acceptor()
    a2.on_hello(d2.hello())
    with pytest.raises(AuthenticationError):
        a2.on_answer({F.KIND: F.WELCOME})


def test_a_dialer_with_another_secret_finds_out_first() -> None:
    d, a = dialer(b"x" * 32), acceptor()
    with pytest.raises(AuthenticationError) as e:
        d.on_reply(a.on_hello(d.hello()))
    assert e.value.reason == "bad_proof"


def test_authentication_on_one_side_only_fails_on_both() -> None:
    d, a = dialer(None), acceptor(SECRET)
    reply = a.on_hello(d.hello())  # no nonce: refused, saying nothing
    assert reply == F.refused() and a.phase is Phase.FAILED and "authenticate" in (a.problem or "")
    with pytest.raises(AuthenticationError) as e:
        d.on_reply(reply)
    assert e.value.reason == "refused"
    d, a = dialer(SECRET), acceptor(None)
    with pytest.raises(AuthenticationError) as e:
        d.on_reply(a.on_hello(d.hello()))
    assert e.value.reason == "no_proof"


@pytest.mark.parametrize(
    ("kw", "words", "secret_words"),
    [
        ({"job": "stale-job"}, "stale-job", "job"),
        ({"world": 9}, "world size 9", "4"),
        ({"rank": 7, "world": 4}, "rank 7", None),
        ({"rank": 0}, "connected to itself", None),
    ],
)
def test_refusals_before_authentication_say_only_what_the_dialer_sent(kw: dict[str, Any], words: str,
                                                                      secret_words: str | None) -> None:
    d = dialer(**kw)
    a = AcceptHandshake(SECRET, job="the-real-job-id", rank=0, world=4, address=ADDR, nonce=os.urandom(32))
    if "job" not in kw:
        d = DialHandshake(SECRET, job="the-real-job-id", rank=kw.get("rank", 1), world=kw.get("world", 4),
                          peer_rank=0, address=ADDR, nonce=os.urandom(32))
    reply = a.on_hello(d.hello())
    assert reply[F.KIND] == F.REFUSED and words in reply[F.REASON]
    if "job" in kw:
        assert "the-real-job-id" not in reply[F.REASON]  # the real job id is never revealed
    if "world" in kw and "rank" not in kw:
        assert "4" not in reply[F.REASON]  # nor the real world size
    outcome = d.on_reply(reply)  # (the dialer shows the reason as unproven: anything on the path could say it)
    assert outcome == Outcome(Verdict.REFUSED, f"{reply[F.REASON]} (said before it proved the job's secret)")


def test_a_refusal_before_authentication_is_shown_as_unproven_and_cut_short() -> None:
    """A man in the middle (or a squatter) can answer a hello with any refusal: its text is labelled and bounded."""
    d = dialer()
    d.hello()
    outcome = d.on_reply(F.refused("FORGED: run `rm -rf ~` " + "x" * 100_000))
    assert outcome.verdict is Verdict.REFUSED and outcome.reason is not None
    assert outcome.reason.endswith("(said before it proved the job's secret)") and len(outcome.reason) < 400


def test_a_condemnation_is_believed_only_after_the_acceptor_proved_itself() -> None:
    d = dialer()
    d.hello()
    early = d.on_reply(F.refused("no", "you were declared failed"))
    assert isinstance(early, Outcome) and early.condemned is None
    d, a = dialer(), acceptor()
    shake(d, a)
    late = d.on_verdict(F.refused("no", "you were declared failed"))
    assert late.condemned == "you were declared failed"


def test_frames_out_of_order_are_errors() -> None:
    d = dialer()
    with pytest.raises(RuntimeError):
        d.on_reply(F.welcome())
    d.hello()
    with pytest.raises(ProtocolError):
        d.on_reply(F.welcome())  # a welcome before any proof
    a = acceptor()
    with pytest.raises(RuntimeError):
        a.on_answer(F.answer({}))


_values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.binary(max_size=40),
                    st.lists(st.integers(), max_size=3))
_headers = st.dictionaries(st.sampled_from([F.KIND, F.JOB, F.RANK, F.WORLD, F.REASON, F.CONDEMNED, F.AUTH_NONCE,
                                            F.AUTH_PROOF, "x"]), _values, max_size=6)
_kinds = st.sampled_from([F.HELLO, F.CHALLENGE, F.ANSWER, F.WELCOME, F.DUP, F.REFUSED, "junk"])


@settings(max_examples=300, deadline=None)
@given(hello=_headers, answer=_headers, kind=_kinds, kind2=_kinds)
def test_fuzzed_frames_never_break_either_side(hello: dict[str, Any], answer: dict[str, Any], kind: str,
                                                kind2: str) -> None:
    """Whatever the other end sends, each side ends in an outcome or an AuthenticationError/ProtocolError."""
    a = acceptor()
    hello = {**hello, F.KIND: kind}
    reply = a.on_hello(hello)
    assert reply[F.KIND] in (F.CHALLENGE, F.REFUSED)
    if a.phase is Phase.AUTHENTICATING:
        with pytest.raises(AuthenticationError):
            a.on_answer({**answer, F.KIND: kind2})  # nobody forges a proof by chance
    d = dialer()
    d.hello()
    try:
        step = d.on_reply({**answer, F.KIND: kind})
    except (AuthenticationError, ProtocolError):
        return
    assert isinstance(step, Outcome) and step.verdict is Verdict.REFUSED


@pytest.mark.parametrize("secret", [SECRET, None])
def test_a_stale_address_is_refused_even_without_authentication(secret: bytes | None) -> None:
    """The dialer names the rank it means to reach; another rank listening there now refuses."""
    d = dialer(secret, peer_rank=2)
    reply = acceptor(secret, rank=0).on_hello(d.hello())
    assert reply[F.KIND] == F.REFUSED and "not rank 2" in reply[F.REASON]
