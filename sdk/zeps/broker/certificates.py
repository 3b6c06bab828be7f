"""CURVE certificates as text: what the operator puts in Secrets and the broker and clients read
back with ``zmq.auth.load_certificate``. No sockets: the operator imports this, never the broker's
network layer."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import NamedTuple

import zmq.auth

from zeps.errors import ConfigError

__all__ = ["Certificate", "make_certificate", "public_key_of"]

_PUBLIC = re.compile(r'^\s*public-key\s*=\s*"([^"]{40})"\s*$', re.MULTILINE)


class Certificate(NamedTuple):
    """A CURVE key pair: its public key (Z85), and the texts of its two zmq certificate files."""

    public_key: str
    secret_text: str  #: ``<name>.key_secret``: both keys (for the side that owns the pair)
    public_text: str  #: ``<name>.key``: the public key only (for the other side)


def make_certificate(name: str) -> Certificate:
    """A new key pair, as the files ``zmq.auth.create_certificates`` writes."""
    with tempfile.TemporaryDirectory() as tmp:
        public_file, secret_file = zmq.auth.create_certificates(tmp, name)
        public, _ = zmq.auth.load_certificate(public_file)
        return Certificate(public.decode(), Path(secret_file).read_text(), Path(public_file).read_text())


def public_key_of(text: str) -> str:
    """The public key a certificate's text holds (ConfigError if it holds none)."""
    match = _PUBLIC.search(text)
    if match is None:
        raise ConfigError("not a zmq certificate: it has no public-key line")
    return match.group(1)
