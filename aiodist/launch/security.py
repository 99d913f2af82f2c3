"""The secret and store limits a launched job's ranks receive (``aiodist run``, ``aiodist.spawn``).

A job on one node gets a fresh random secret (``AIODIST_SECRET``) in every
rank's environment: its store and rank links accept only its own ranks, with
no configuration. ``--secret-file PATH`` (the same file on every node; it must
not be readable by other users) hands the ranks ``AIODIST_SECRET_FILE``
instead; ``--insecure`` hands them ``AIODIST_INSECURE=1`` (authentication off,
with a warning). A secret the caller's environment already names
(``AIODIST_SECRET``, ``AIODIST_SECRET_FILE``, ``AIODIST_INSECURE``) is kept.
A job on several nodes without any of these authenticates with the user's own
secret file (``~/.config/aiodist/secret``), which must then be the same on
every node (a shared home directory).

``--store-limits SPEC`` hands the ranks ``AIODIST_STORE_LIMITS``, which rank 0
applies to the store it starts (see :class:`aiodist.store.limits.StoreLimits`).
``--tls-cert/--tls-key/--tls-ca`` hand them ``AIODIST_TLS_CERT``/``_KEY``/``_CA``:
every store and rank connection of the job then runs over mutual TLS (see
:mod:`aiodist.tls`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from .. import auth, tls
from ..store.limits import LIMITS_ENV, StoreLimits

__all__ = ["add_security_options", "job_environment", "fresh_secret"]

_CHOICES = (auth.SECRET_ENV, auth.SECRET_FILE_ENV, auth.INSECURE_ENV)


def add_security_options(parser: argparse.ArgumentParser) -> None:
    """``--secret-file``, ``--insecure`` and ``--store-limits`` (one group of ``aiodist run``'s help)."""
    group = parser.add_argument_group("security and limits")
    choice = group.add_mutually_exclusive_group()
    choice.add_argument("--secret-file", dest="secret_file", metavar="PATH", default=None,
                        help="the job's secret, the same file on every node (readable by its owner only); "
                             "default on one node: a fresh secret for this job")
    choice.add_argument("--insecure", action="store_true",
                        help="no authentication of store and rank connections (debugging only)")
    group.add_argument("--store-limits", dest="store_limits", metavar="SPEC", default=None,
                       help="limits of the store rank 0 starts, e.g. max_connections=2000,max_client_bytes=256M "
                            "(see aiodist.store.limits.StoreLimits)")
    group.add_argument("--tls-cert", dest="tls_cert", metavar="PATH", default=None,
                       help="this node's certificate: every store and rank connection runs over mutual TLS "
                            "(with --tls-key and --tls-ca, the CA that signed every node's certificate)")
    group.add_argument("--tls-key", dest="tls_key", metavar="PATH", default=None, help="this node's private key")
    group.add_argument("--tls-ca", dest="tls_ca", metavar="PATH", default=None, help="the job's CA certificate")


def job_environment(
    base: Mapping[str, str],
    *,
    secret_file: str | None = None,
    insecure: bool = False,
    store_limits: str | None = None,
    single_node: bool = True,
    tls_files: tuple[str | None, str | None, str | None] = (None, None, None),
) -> dict[str, str]:
    """``base`` with the job's secret settings, store limits and TLS files (see the module doc).

    Raises :class:`~aiodist.auth.SecretFileError` for an unusable secret or
    key file and ValueError for a malformed limits spec or an incomplete TLS
    setup, before anything starts.
    """
    env = dict(base)
    if store_limits is not None:
        StoreLimits.parse(store_limits)  # refuse a bad spec here, not in rank 0
        env[LIMITS_ENV] = store_limits
    if any(tls_files):
        files = dict(zip((tls.CERT_ENV, tls.KEY_ENV, tls.CA_ENV), (os.path.abspath(f) if f else "" for f in tls_files)))
        tls.from_environment(files)  # refuse missing files, a readable key or a partial setup here
        env.update(files)
    if insecure:
        for name in _CHOICES:
            env.pop(name, None)
        env[auth.INSECURE_ENV] = "1"
        return env
    if secret_file is not None:
        path = os.path.abspath(secret_file)
        auth.read_secret_file(path)
        for name in _CHOICES:
            env.pop(name, None)
        env[auth.SECRET_FILE_ENV] = path
        return env
    if single_node:
        env.update(fresh_secret(env))
    return env


def fresh_secret(environ: Mapping[str, str]) -> dict[str, str]:
    """``{"AIODIST_SECRET": <new secret>}``, or nothing when ``environ`` already names a secret or opts out."""
    if any(environ.get(name) for name in _CHOICES):
        return {}
    return {auth.SECRET_ENV: auth.new_secret()}
