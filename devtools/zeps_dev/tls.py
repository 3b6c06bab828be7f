"""Certificates for tests that run ZooKeeper over TLS, made with openssl as the chart's Secret holds
them (Helm's genCA and genSignedCert: RSA keys in PKCS#1, usable for serverAuth and clientAuth)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["CHART_NAMES", "certificates"]

#: the names the chart's certificate carries (each server under the ensemble's Service), and this
#: machine's loopback address, which local clients dial
CHART_NAMES = ("DNS:*.zeps-zookeeper.zeps.svc", "IP:127.0.0.1")


def certificates(folder: Path, ca: Path | None = None, *, names: tuple[str, ...] = CHART_NAMES) -> Path:
    """``folder`` (made) with ca.crt, tls.crt and tls.key: a certificate for ``names`` (subjectAltName
    entries), signed by the CA in ``ca`` (a folder with its ca.crt and ca.key) or by a new one, whose
    ca.key is left beside it for the next."""
    folder.mkdir(parents=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, capture_output=True, check=True, timeout=60)

    if ca is None:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
                "-subj", "/CN=zeps-zookeeper-ca")  # fmt: skip
    else:
        for name in ("ca.crt", "ca.key"):
            (folder / name).write_bytes((ca / name).read_bytes())
    openssl("genrsa", "-traditional", "-out", "tls.key", "2048")
    openssl("req", "-new", "-key", "tls.key", "-subj", "/CN=zeps-zookeeper", "-out", "tls.csr")
    (folder / "ext").write_text(f"subjectAltName={','.join(names)}\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "ext", "-out", "tls.crt")  # fmt: skip
    return folder
