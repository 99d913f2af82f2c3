"""The sans-IO mutual authentication: proofs, refusals, reflection and relay, the secret's sources."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiodist import auth
from aiodist.auth import Acceptor, AuthenticationError, Dialer

SECRET = b"s" * 32


def pair(d_secret=SECRET, a_secret=SECRET, *, d_binding=b"B", a_binding=b"B", purpose="peer"):
    d = Dialer(d_secret, purpose=purpose, binding=d_binding, nonce=os.urandom(32), peer="acceptor")
    a = Acceptor(a_secret, purpose=purpose, binding=a_binding, nonce=os.urandom(32), peer="dialer")
    return d, a


def run(d, a):
    challenge = a.challenge(d.hello())
    answer = d.answer(challenge)
    a.verify(answer)


def test_same_secret_authenticates_both_sides():
    d, a = pair()
    run(d, a)
    assert d.authenticated and a.authenticated
    assert "done" in repr(d) and "hmac" in repr(a)


def test_the_secret_never_crosses_the_wire():
    d, a = pair()
    hello = d.hello()
    challenge = a.challenge(hello)
    answer = d.answer(challenge)
    for msg in (hello, challenge, answer):
        for v in msg.values():
            assert SECRET not in v


def test_dialer_refuses_an_acceptor_with_another_secret():
    d, a = pair(a_secret=b"other")
    challenge = a.challenge(d.hello())
    with pytest.raises(AuthenticationError) as e:
        d.answer(challenge)
    assert e.value.reason == "bad_proof"
    assert "other" not in str(e.value)


def test_acceptor_refuses_a_dialer_with_another_secret():
    # the dialer learns the acceptor is wrong first; force the acceptor's view with a forged answer
    d, a = pair()
    a.challenge(d.hello())
    with pytest.raises(AuthenticationError) as e:
        a.verify({"proof": b"\0" * 32})
    assert e.value.reason == "bad_proof"


def test_reflection_of_the_acceptors_proof_fails():
    d, a = pair()
    challenge = a.challenge(d.hello())
    with pytest.raises(AuthenticationError):
        a.verify({"proof": challenge["proof"]})


def test_a_relay_between_different_bindings_fails():
    # an attacker lured the dialer to its own address and relays to the real acceptor:
    # both ends bind what they know (dialed address vs. own address), so the proofs differ
    d, a = pair(d_binding=auth.binding("127.0.0.1:6666", 1, 0), a_binding=auth.binding("127.0.0.1:5555", 1, 0))
    challenge = a.challenge(d.hello())
    with pytest.raises(AuthenticationError):
        d.answer(challenge)


def test_purpose_is_bound():
    d = Dialer(SECRET, purpose="store", binding=b"", nonce=os.urandom(32))
    a = Acceptor(SECRET, purpose="peer", binding=b"", nonce=os.urandom(32))
    with pytest.raises(AuthenticationError):
        d.answer(a.challenge(d.hello()))


def test_insecure_both_sides_is_allowed_but_not_authenticated():
    d, a = pair(None, None)
    run(d, a)
    assert not d.authenticated and not a.authenticated


def test_insecure_dialer_is_refused_by_a_secure_acceptor():
    d, a = pair(d_secret=None)
    with pytest.raises(AuthenticationError) as e:
        a.challenge(d.hello())
    assert e.value.reason == "no_proof"


def test_secure_dialer_refuses_an_insecure_acceptor():
    d, a = pair(a_secret=None)
    with pytest.raises(AuthenticationError) as e:
        d.answer(a.challenge(d.hello()))
    assert e.value.reason == "no_proof"


def test_insecure_dialer_meeting_a_secure_acceptor_says_so():
    d = Dialer(None, purpose="peer", binding=b"", nonce=b"")
    d.hello()
    with pytest.raises(AuthenticationError) as e:
        d.answer({"nonce": os.urandom(32), "proof": os.urandom(32)})
    assert e.value.reason == "insecure"


def test_out_of_order_calls_are_programming_errors():
    d, a = pair()
    with pytest.raises(RuntimeError):
        d.answer({})
    with pytest.raises(RuntimeError):
        a.verify({})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["nonce", "proof", "x"]),
                       st.one_of(st.binary(max_size=40), st.integers(), st.none(), st.text(max_size=5))))
def test_garbage_never_authenticates(fields):
    d, a = pair()
    d.hello()
    with pytest.raises(AuthenticationError):
        d.answer(fields)
    d, a = pair()
    a.challenge(d.hello())
    with pytest.raises(AuthenticationError):
        a.verify(fields)


def test_resolve_secret_sources(tmp_path, monkeypatch, caplog):
    assert auth.resolve_secret(b"x", environ={}) == b"x"
    assert auth.resolve_secret("abc", environ={}) == b"abc"
    assert auth.resolve_secret(environ={"AIODIST_SECRET": "envsecret"}) == b"envsecret"
    f = tmp_path / "secret"
    f.write_bytes(b"filesecret\n")
    f.chmod(0o600)
    assert auth.resolve_secret(environ={"AIODIST_SECRET_FILE": str(f)}) == b"filesecret"
    f.chmod(0o644)
    with pytest.raises(auth.SecretFileError) as e:
        auth.resolve_secret(environ={"AIODIST_SECRET_FILE": str(f)})
    assert "chmod 600" in str(e.value) and "every user" in str(e.value)
    for mode in (0o640, 0o620, 0o660):  # (before: accepted; a group member could read or replace the secret)
        f.chmod(mode)
        with pytest.raises(auth.SecretFileError, match="readable or writable by its group"):
            auth.resolve_secret(environ={"AIODIST_SECRET_FILE": str(f)})
    f.chmod(0o400)
    assert auth.resolve_secret(environ={"AIODIST_SECRET_FILE": str(f)}) == b"filesecret"
    f.chmod(0o600)
    with caplog.at_level("WARNING"):
        monkeypatch.setattr(auth, "_warned_insecure", False)
        assert auth.resolve_secret(environ={"AIODIST_INSECURE": "1"}) is None
    assert "OFF" in caplog.text
    with pytest.raises(ValueError):
        auth.resolve_secret(b"")
    with pytest.raises(TypeError):
        auth.resolve_secret(123)


def test_user_secret_is_created_private_and_stable(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    s1 = auth.resolve_secret(environ=env)
    s2 = auth.resolve_secret(environ=env)
    assert s1 == s2 and len(s1) == 64
    path = auth.user_secret_path(env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["secret"]


def test_token_source_is_per_context():
    import contextvars

    from aiodist import context

    assert len(context.token_bytes(32)) == 32

    def seeded():
        context.set_token_source(lambda n: b"\1" * n)
        return context.token_bytes(4)

    assert contextvars.copy_context().run(seeded) == b"\1\1\1\1"
    assert context._entropy.get() is None  # outside: os.urandom


def test_the_records_that_hold_a_secret_never_show_it() -> None:
    """Before: repr() of these dataclasses printed the secret (a log line or a traceback's locals could show it)."""
    from aiodist.launch.elastic import _WorkersStore
    from aiodist.rendezvous import _StoreAccess

    for record in (_StoreAccess(b"TOPSECRET"), _WorkersStore("h", 1, b"TOPSECRET", None, True, 2)):
        assert "TOPSECRET" not in repr(record) and record.secret == b"TOPSECRET"
