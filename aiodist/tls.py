"""TLS for links that cross machines: the contexts a rank needs, and mutual certificate checks.

A rank both listens (its store server, its peer listener) and dials (the
store, its peers), and Python's :mod:`ssl` wants a server-side and a
client-side context for that. :class:`TLS` holds the pair; every ``ssl=``
option of aiodist takes a :class:`TLS`, or one :class:`ssl.SSLContext` where
only one side is needed (``StoreServer.start``: the server side,
``TCPStore.connect``: the client side). :meth:`TLS.mutual` builds the usual
setup from files: this node's certificate and key, and the CA that signed
every node's certificate; both ends require and check the other's
certificate.

The same setup can come from the environment (:func:`from_environment`:
``AIODIST_TLS_CERT``, ``AIODIST_TLS_KEY``, ``AIODIST_TLS_CA``, which
``aiodist run --tls-cert/--tls-key/--tls-ca`` sets for every rank), so an
unchanged program runs over TLS across machines.

TLS protects the frames on the path (secrecy and integrity); the shared
secret (:mod:`aiodist.auth`) still authenticates every connection on top of
it. See the README's Security section.
"""

from __future__ import annotations

import os
import ssl as _ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

CERT_ENV: Final = "AIODIST_TLS_CERT"
KEY_ENV: Final = "AIODIST_TLS_KEY"
CA_ENV: Final = "AIODIST_TLS_CA"


@dataclass(frozen=True)
class TLS:
    """The server-side and client-side contexts of one rank."""

    server: _ssl.SSLContext
    client: _ssl.SSLContext

    @classmethod
    def mutual(
        cls,
        *,
        cert: str | os.PathLike[str],
        key: str | os.PathLike[str],
        ca: str | os.PathLike[str],
        check_hostname: bool = False,
    ) -> TLS:
        """Mutual TLS: present ``cert``/``key``, require a certificate signed by ``ca`` from the other end.

        ``check_hostname`` (off by default) also requires the server's
        certificate to name the address dialed; the job's own CA is what
        vouches for a node, and ranks dial the addresses published in the store.
        """
        server = _ssl.SSLContext(_ssl.PROTOCOL_TLS_SERVER)
        server.verify_mode = _ssl.CERT_REQUIRED
        client = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = check_hostname
        client.verify_mode = _ssl.CERT_REQUIRED
        for ctx in (server, client):
            ctx.minimum_version = _ssl.TLSVersion.TLSv1_2
            ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
            ctx.load_verify_locations(os.fspath(ca))
        return cls(server=server, client=client)


def server_side(ssl: Any) -> _ssl.SSLContext | None:
    """The context for accepting connections, from an ``ssl=`` option (None: plain TCP)."""
    return _side(ssl, "server")


def client_side(ssl: Any) -> _ssl.SSLContext | None:
    """The context for dialing, from an ``ssl=`` option (None: plain TCP)."""
    return _side(ssl, "client")


def _side(ssl: Any, side: str) -> _ssl.SSLContext | None:
    if ssl is None or isinstance(ssl, _ssl.SSLContext):
        return ssl
    if isinstance(ssl, TLS):
        return ssl.server if side == "server" else ssl.client
    raise TypeError(f"ssl must be an ssl.SSLContext or an aiodist.tls.TLS, not {type(ssl).__name__}")


def from_environment(environ: Mapping[str, str] | None = None) -> TLS | None:
    """:meth:`TLS.mutual` from ``AIODIST_TLS_CERT``/``_KEY``/``_CA`` (the rank's environment when omitted); None if unset.

    Raises ValueError when only some of the three are set, and
    :class:`~aiodist.auth.SecretFileError` for a key file other users may read.
    """
    if environ is None:
        from .context import rank_environ

        environ = rank_environ()
    paths = [environ.get(name) or "" for name in (CERT_ENV, KEY_ENV, CA_ENV)]
    if not any(paths):
        return None
    if not all(paths):
        raise ValueError(f"TLS needs all of {CERT_ENV}, {KEY_ENV} and {CA_ENV} (or none of them)")
    check_private(paths[1])
    return TLS.mutual(cert=paths[0], key=paths[1], ca=paths[2])


def check_private(key: str | os.PathLike[str]) -> None:
    """Refuse a private key file that other users may read or write (SecretFileError, as for secret files)."""
    from .auth import SecretFileError

    p = os.fspath(key)
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        raise SecretFileError(f"TLS key {p!r} cannot be read: {e.strerror or e}", path=p) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise SecretFileError(f"TLS key {p!r} is readable or writable by every user; make it private: chmod 600 {p}",
                              path=p)
