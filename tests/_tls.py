"""Certificates for the TLS tests, made by the ``openssl`` command: a CA, a server certificate
for 127.0.0.1 and localhost and a client certificate signed by it, a server certificate for another
name, and a second CA that signed none of them (the "wrong CA").  Keys are P-256 in PKCS#8 PEM (what Apache RocketMQ's Netty reads).

    certs = make_certs(tmp_path)
    certs.ca, certs.server_cert, certs.server_key, certs.client_cert, certs.client_key, certs.other_ca
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["Certs", "make_certs"]

DAYS = "2"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    elsewhere_cert: Path  # signed by ``ca`` for the name elsewhere.invalid only
    elsewhere_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _key(path: Path) -> Path:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
    return path


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    key = _key(d / f"{name}.key")
    cert = d / f"{name}.pem"
    _openssl("req", "-x509", "-new", "-key", key, "-out", cert, "-days", DAYS, "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    return cert, key


def _leaf(d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key = _key(d / f"{name}.key")
    csr = d / f"{name}.csr"
    cert = d / f"{name}.pem"
    extfile = d / f"{name}.ext"
    extfile.write_text(ext)
    _openssl("req", "-new", "-key", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", DAYS, "-extfile", extfile)  # fmt: skip
    return cert, key


def make_certs(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "rmq-test-ca")
    other = _ca(d, "rmq-other-ca")
    server = _leaf(d, "server", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                    "extendedKeyUsage=serverAuth\n")  # fmt: skip
    client = _leaf(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    elsewhere = _leaf(d, "elsewhere", ca, "subjectAltName=DNS:elsewhere.invalid\n"
                                          "extendedKeyUsage=serverAuth\n")  # fmt: skip
    return Certs(ca[0], server[0], server[1], client[0], client[1], other[0], *elsewhere)
