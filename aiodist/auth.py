"""Mutual authentication of one connection by a shared secret (sans-IO).

Both ends prove that they know the job's secret without sending it, by a
challenge-response over fresh nonces from both sides. The messages are plain
dicts that the caller merges into the first frames of its own protocol (the
store's hello, a rank link's hello): this module does no I/O, reads no clock
and draws its nonces from what the caller passes in, so the simulator runs it
deterministically. Four messages::

    dialer                                        acceptor
      hello     {"nonce": Nd}              ->
                                           <-     challenge {"nonce": Na, "proof": P_acceptor}
      (checks P_acceptor; refuses an acceptor that cannot prove)
      answer    {"proof": P_dialer}        ->
                                                  (checks P_dialer)
                                           <-     welcome, or a refusal that says nothing more

    P_role = HMAC-SHA256(secret, transcript(role))

The transcript binds the protocol version, the purpose (``"store"``,
``"peer"``), the role (so a proof cannot be reflected back at its author),
both nonces (so it cannot be replayed on another connection) and a *binding*
that both ends know independently: for a rank link, the listening address the
dialer was told to dial and the identities it expects. A third party that
relays a handshake between two other connections, or that lured a dialer to
its own address, therefore fails even though it forwards every byte. Proofs
are compared with :func:`hmac.compare_digest`.

What this does not give: secrecy or integrity of the frames after the
handshake. A party that can *alter traffic on the path* of an already
authenticated connection (another machine's network) needs TLS; see
the README's Security section.

Where the secret comes from (:func:`resolve_secret`): an explicit ``secret=``
argument, else ``AIODIST_SECRET``, else the file named by
``AIODIST_SECRET_FILE``, else the user's own secret file (created on first
use, readable by its owner only), so that every process of one user on one
machine shares a secret with no configuration. ``secret=None`` (the CLI's
``--insecure``, or ``AIODIST_INSECURE=1``) switches authentication off with a
warning.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
import secrets as _secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, NoReturn

from .errors import AiodistError

log = logging.getLogger("aiodist.auth")

VERSION: Final = b"aiodist-auth/1"
NONCE_BYTES: Final = 32
PROOF_BYTES: Final = 32

SECRET_ENV: Final = "AIODIST_SECRET"
SECRET_FILE_ENV: Final = "AIODIST_SECRET_FILE"
INSECURE_ENV: Final = "AIODIST_INSECURE"

NONCE: Final = "nonce"
PROOF: Final = "proof"


class AuthenticationError(AiodistError):
    """The other end of a connection did not prove that it knows the job's secret.

    Raised on the side that found out; ``.peer`` names the other end as this
    side sees it, ``.reason`` is a stable code: ``"no_proof"`` (the other end
    runs without authentication), ``"bad_proof"`` (it proved a different
    secret, or something in between changed the handshake), ``"refused"``
    (the other end refused our proof; it says no more, on purpose),
    ``"insecure"`` (this side has no secret but the other end requires one).
    """

    def __init__(self, message: str, *, reason: str, peer: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.peer = peer


class SecretFileError(PermissionError, AiodistError):
    """A secret file cannot be used: missing, empty, or readable by other users.

    ``.path`` names the file.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class _FromEnvironment:
    """The default of every ``secret=`` option: resolve it from the environment."""

    _instance: _FromEnvironment | None = None

    def __new__(cls) -> _FromEnvironment:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "aiodist.auth.FROM_ENVIRONMENT"


FROM_ENVIRONMENT: Final = _FromEnvironment()
"""Sentinel default of ``secret=`` options: look the secret up (see :func:`resolve_secret`)."""


# --------------------------------------------------------------------- the secret


def new_secret() -> str:
    """A fresh random secret for one job (what ``aiodist run`` hands its ranks)."""
    return _secrets.token_hex(32)


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The secret kept in ``path``; refuses a file that anyone but its owner may read, write or run."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise SecretFileError(f"secret file {p!r} cannot be read: {e.strerror or e}", path=p) from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):  # (as ssh refuses a private key: the owner's alone)
        who = "every user" if st.st_mode & stat.S_IRWXO else "its group"
        raise SecretFileError(
            f"secret file {p!r} is readable or writable by {who} (mode {stat.S_IMODE(st.st_mode):o}); "
            f"make it private first: chmod 600 {p}",
            path=p,
        )
    with open(p, "rb") as f:
        data = f.read().strip()
    if not data:
        raise SecretFileError(f"secret file {p!r} is empty", path=p)
    return data


def user_secret_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the user's own secret lives: ``$XDG_CONFIG_HOME/aiodist/secret`` (``~/.config`` by default)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "aiodist" / "secret"


def user_secret(environ: Mapping[str, str] | None = None) -> bytes:
    """The user's own secret, created on first use (mode 600, in a mode-700 folder).

    Creation is atomic (a private temporary file linked into place), so two
    processes starting at once agree on one secret.
    """
    path = user_secret_path(environ)
    try:
        return read_secret_file(path)
    except SecretFileError:
        if path.exists():
            raise
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".secret.{os.getpid()}.{_secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, new_secret().encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process made it first: theirs wins
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return read_secret_file(path)


_warned_insecure = False


def _warn_insecure(where: str) -> None:
    global _warned_insecure
    if not _warned_insecure:
        _warned_insecure = True
        log.warning(
            "aiodist: authentication is OFF (%s): any process that can reach this job's ports can read, "
            "change and inject its data. Use it only for debugging.",
            where,
        )


def _as_bytes(secret: bytes | bytearray | memoryview | str) -> bytes:
    data = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not data:
        raise ValueError("an empty secret authenticates nothing; pass secret=None to switch authentication off")
    return data


def resolve_secret(secret: Any = FROM_ENVIRONMENT, *, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret to authenticate with, or ``None`` when authentication is off.

    ``secret`` given as bytes or str is used as it is; ``None`` switches
    authentication off (with a warning, once per process). The default looks
    in ``environ`` (the calling rank's environment when omitted):
    ``AIODIST_SECRET``, then ``AIODIST_SECRET_FILE``, then
    ``AIODIST_INSECURE=1`` (off), then the user's own secret file.
    """
    if secret is None:
        _warn_insecure("secret=None")
        return None
    if secret is not FROM_ENVIRONMENT:
        if not isinstance(secret, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"secret must be bytes, str or None, not {type(secret).__name__}")
        return _as_bytes(secret)
    if environ is None:
        from .context import rank_environ

        environ = rank_environ()
    value = environ.get(SECRET_ENV)
    if value:
        return _as_bytes(value)
    path = environ.get(SECRET_FILE_ENV)
    if path:
        return read_secret_file(path)
    if environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        _warn_insecure(f"{INSECURE_ENV}=1")
        return None
    return user_secret(environ)


# --------------------------------------------------------------------- the handshake


def _part(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


_PREFIXES: dict[tuple[str, str], bytes] = {}


def _prefix(purpose: str, role: str) -> bytes:
    """The constant head of a transcript (version, purpose, role), made once per process for each pair."""
    head = _PREFIXES.get((purpose, role))
    if head is None:
        head = _part(VERSION) + _part(purpose.encode()) + _part(role.encode())
        if len(_PREFIXES) < 64:  # (the purposes are the code's few constants: a bound all the same)
            _PREFIXES[(purpose, role)] = head
    return head


def _tail(dialer_nonce: bytes, acceptor_nonce: bytes, binding: bytes) -> bytes:
    """The part of a transcript that is the connection's own (both nonces, the binding)."""
    return b"".join((len(dialer_nonce).to_bytes(4, "big"), dialer_nonce, len(acceptor_nonce).to_bytes(4, "big"),
                     acceptor_nonce, len(binding).to_bytes(4, "big"), binding))


def transcript(*, purpose: str, role: str, dialer_nonce: bytes, acceptor_nonce: bytes, binding: bytes) -> bytes:
    """The bytes a proof signs: every part length-prefixed, so no two part lists collide."""
    return _prefix(purpose, role) + _tail(dialer_nonce, acceptor_nonce, binding)


def proof(secret: bytes, **parts: Any) -> bytes:
    """HMAC-SHA256 of :func:`transcript` under ``secret``."""
    return hmac.digest(secret, transcript(**parts), "sha256")


def _nonce_of(fields: Mapping[str, Any], what: str) -> bytes | None:
    n = fields.get(NONCE)
    if n is None:
        return None
    if not isinstance(n, (bytes, bytearray)) or len(n) != NONCE_BYTES:
        raise AuthenticationError(f"malformed {what}", reason="bad_proof")
    return bytes(n)


def _proof_of(fields: Mapping[str, Any]) -> bytes | None:
    p = fields.get(PROOF)
    if p is None:
        return None
    if not isinstance(p, (bytes, bytearray)) or len(p) != PROOF_BYTES:
        return b""  # never equal to a real proof
    return bytes(p)


class AuthState(enum.Enum):
    START = "start"
    WAITING = "waiting"  # our message is out, the other end's is due
    DONE = "done"
    FAILED = "failed"


class _Side:
    role = ""
    other_role = ""
    other = ""

    def __init__(
        self, secret: bytes | None, *, purpose: str, binding: bytes, nonce: bytes, peer: str | None = None
    ) -> None:
        if secret is not None and len(nonce) != NONCE_BYTES:
            raise ValueError(f"a nonce is {NONCE_BYTES} random bytes")
        self.secret = secret
        self.purpose = purpose
        self.binding = binding
        self.nonce = nonce
        self.peer = peer
        self.state = AuthState.START
        self._dialer_nonce = b""
        self._acceptor_nonce = b""
        self._tail = b""  # (the transcript's own part, once both nonces are known: both proofs share it)

    def __repr__(self) -> str:
        mode = "insecure" if self.secret is None else "hmac-sha256"
        return f"<{type(self).__name__} {self.purpose} {mode} state={self.state.value} peer={self.peer}>"

    @property
    def authenticated(self) -> bool:
        """True once the other end proved the secret (never when this side is insecure)."""
        return self.state is AuthState.DONE and self.secret is not None

    def _proof(self, role: str) -> bytes:
        """:func:`proof` for ``role`` (the same bytes, from the parts made once per process and connection)."""
        assert self.secret is not None
        if not self._tail:
            self._tail = _tail(self._dialer_nonce, self._acceptor_nonce, self.binding)
        return hmac.digest(self.secret, _prefix(self.purpose, role) + self._tail, "sha256")

    def _check(self, got: bytes | None) -> None:
        if got is None:
            self._fail("no_proof", f"{self.other} did not authenticate (it may run without a secret)")
        if not hmac.compare_digest(got, self._proof(self.other_role)):
            self._fail("bad_proof", f"{self.other} did not prove the job's secret (a different secret, or an impostor: "
                       "a stranger at that address, or a rewritten address)")

    def _fail(self, reason: str, message: str) -> NoReturn:
        self.state = AuthState.FAILED
        where = f" at {self.peer}" if self.peer else ""
        raise AuthenticationError(f"{self.purpose} connection{where}: {message}", reason=reason, peer=self.peer)

    def _expect(self, state: AuthState, what: str) -> None:
        if self.state is not state:
            raise RuntimeError(f"{what} in state {self.state.value}")


class Dialer(_Side):
    """The side that opened the connection.

    ``hello()`` gives the fields for the first frame; ``answer(challenge)``
    checks the acceptor's proof (raising :class:`AuthenticationError`) and
    gives the fields of the answer frame.
    """

    role = "dialer"
    other_role = "acceptor"
    other = "the listening side"

    def hello(self) -> dict[str, Any]:
        self._expect(AuthState.START, "hello")
        self.state = AuthState.WAITING
        if self.secret is None:
            return {}
        self._dialer_nonce = self.nonce
        return {NONCE: self.nonce}

    def answer(self, challenge: Mapping[str, Any]) -> dict[str, Any]:
        self._expect(AuthState.WAITING, "answer")
        if self.secret is None:
            if challenge.get(PROOF) is not None:
                self._fail("insecure", "the listening side requires authentication but this side has no secret")
            self.state = AuthState.DONE
            return {}
        nonce = _nonce_of(challenge, "challenge")
        if nonce is None:
            self._fail("no_proof", f"{self.other} did not authenticate (it may run without a secret)")
        assert nonce is not None
        self._acceptor_nonce = nonce
        self._check(_proof_of(challenge))
        self.state = AuthState.DONE
        ours = self._proof(self.role)
        self._tail = b""  # (no proof after this one)
        return {PROOF: ours}

    def refused(self) -> AuthenticationError:
        """The error to raise when the acceptor refused our answer (it says why to nobody)."""
        self.state = AuthState.FAILED
        where = f" at {self.peer}" if self.peer else ""
        return AuthenticationError(
            f"{self.purpose} connection{where}: the listening side refused this side's proof "
            "(a different secret, or authentication switched off on one side)",
            reason="refused",
            peer=self.peer,
        )


class Acceptor(_Side):
    """The side that accepted the connection.

    ``challenge(hello)`` gives the fields of the challenge frame (raising
    :class:`AuthenticationError` for a hello without authentication when a
    secret is set); ``verify(answer)`` checks the dialer's proof.
    """

    role = "acceptor"
    other_role = "dialer"
    other = "the dialing side"

    def challenge(self, hello: Mapping[str, Any]) -> dict[str, Any]:
        self._expect(AuthState.START, "challenge")
        if self.secret is None:
            self.state = AuthState.WAITING
            return {}  # a dialer with a secret finds out that we cannot prove anything
        nonce = _nonce_of(hello, "hello")
        if nonce is None:
            self._fail("no_proof", f"{self.other} did not authenticate (it may run without a secret)")
        assert nonce is not None
        self._dialer_nonce = nonce
        self._acceptor_nonce = self.nonce
        self.state = AuthState.WAITING
        return {NONCE: self.nonce, PROOF: self._proof(self.role)}

    def verify(self, answer: Mapping[str, Any]) -> None:
        self._expect(AuthState.WAITING, "verify")
        if self.secret is None:
            self.state = AuthState.DONE
            return
        self._check(_proof_of(answer))
        self.state = AuthState.DONE
        self._tail = b""  # (no proof after this one)


def binding(*parts: str | int | bytes) -> bytes:
    """Pack what both ends know independently (addresses, ranks, job) into a transcript binding."""
    out: list[bytes] = []
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out += (len(b).to_bytes(4, "big"), b)
    return b"".join(out)
