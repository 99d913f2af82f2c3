"""Certificates made by the tests with the ``openssl`` command: a CA of the test's own and nodes it signs."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Node:
    cert: Path
    key: Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL or "openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class CA:
    """A throwaway certificate authority in ``folder``; :meth:`node` issues a certificate for 127.0.0.1."""

    def __init__(self, folder: Path, name: str = "ca") -> None:
        if OPENSSL is None:
            pytest.skip("the openssl command is needed to make the test's certificates")
        self.folder = folder
        self.name = name
        self.cert = folder / f"{name}.pem"
        self.key = folder / f"{name}.key"
        _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", self.key.name, "-out", self.cert.name, "-days", "2", "-subj", f"/CN=aiodist test {name}",
             cwd=folder)

    def node(self, name: str) -> Node:
        key, csr, cert = (self.folder / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = self.folder / f"{name}.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
        _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key.name,
             "-out", csr.name, "-subj", f"/CN={name}", cwd=self.folder)
        _run("x509", "-req", "-in", csr.name, "-CA", self.cert.name, "-CAkey", self.key.name, "-CAcreateserial",
             "-out", cert.name, "-days", "2", "-extfile", ext.name, cwd=self.folder)
        key.chmod(0o600)
        return Node(cert, key)
