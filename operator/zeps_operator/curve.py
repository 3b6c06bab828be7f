"""The CURVE keys of a namespace's ZepsStreams: what the operator makes, where it keeps them, who gets them.

One Secret per namespace, named :data:`CURVE_SECRET`, holds every key pair the operator made there
(the operator's RBAC lets it read and update Secrets of that name only, and make new ones it cannot
read back: it never reads a Secret it did not make). Its data keys, per stream ``<s>``:

==================================  ================================================================
``<s>.broker.key_secret``           the broker's certificate (both keys); its pod mounts this item
``<s>.broker.key``                  the broker's public certificate (``server.key`` for clients)
``<s>.clients.json``                ``{"client": "public key"}`` of ``spec.curveClients`` now: the
                                    broker's ZAP handler admits these keys and no other; its pod
                                    mounts this item and reads it again when it changes
``<s>.client.<c>.key_secret``       client ``<c>``'s certificate, kept so that a client taken off
                                    the list and put back gets the same key (and its Secret stays
                                    right)
==================================  ================================================================

Each listed client also gets a Secret of its own, ``<s>-curve-<c>``, for its pods to mount:
``client.key_secret`` (its certificate) and ``server.key`` (the broker's public certificate: clients
take the broker's key from there, the operator's word, not from ZooKeeper). The operator makes it
once and never reads it. A key pair, once made, is never replaced behind its users' backs.

Everything here is pure: :func:`plan_keys` decides, the handlers read and write through the adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zeps.broker.certificates import Certificate, public_key_of

__all__ = [
    "CURVE_SECRET",
    "StreamKeys",
    "broker_volume",
    "client_secret",
    "client_secret_name",
    "forget_keys",
    "plan_keys",
]

#: the one Secret per namespace that holds the CURVE keys the operator made there
CURVE_SECRET = "zeps-curve"
BROKER_CERT, BROKER_PUBLIC, CLIENTS = "broker.key_secret", "broker.key", "clients.json"


def _key(stream: str, item: str) -> str:
    return f"{stream}.{item}"


def _client_key(stream: str, client: str) -> str:
    return f"{stream}.client.{client}.key_secret"


@dataclass(frozen=True)
class StreamKeys:
    """What a stream's CURVE needs: the Secret's data with its keys in place, and the clients' Secrets."""

    data: dict[str, str]  #: the whole of the namespace's Secret's data after the change
    changed: bool  #: whether ``data`` differs from what the Secret held
    public_key: str  #: the broker's public key
    server_public: str  #: the broker's public certificate (a client Secret's ``server.key``)
    clients: dict[str, str]  #: each listed client's certificate text (secret), for its own Secret


def plan_keys(
    data: Mapping[str, str], stream: str, clients: Sequence[str], *, make: Callable[[str], Certificate]
) -> StreamKeys:
    """The namespace Secret's data with ``stream``'s keys made where missing (``make``) and its list
    of admitted clients set to ``clients``; keys already there are kept as they are."""
    out = dict(data)
    if _key(stream, BROKER_CERT) not in out:
        broker = make("broker")
        out[_key(stream, BROKER_CERT)], out[_key(stream, BROKER_PUBLIC)] = broker.secret_text, broker.public_text
    certificates: dict[str, str] = {}
    for client in clients:
        if _client_key(stream, client) not in out:
            out[_client_key(stream, client)] = make(client).secret_text
        certificates[client] = out[_client_key(stream, client)]
    admitted = {client: public_key_of(text) for client, text in sorted(certificates.items())}
    out[_key(stream, CLIENTS)] = json.dumps(admitted, sort_keys=True)
    server_public = out[_key(stream, BROKER_PUBLIC)]
    return StreamKeys(out, out != dict(data), public_key_of(server_public), server_public, certificates)


def forget_keys(data: Mapping[str, str], stream: str) -> dict[str, str]:
    """The namespace Secret's data without ``stream``'s keys (the stream is deleted, policy Delete)."""
    return {k: v for k, v in data.items() if not k.startswith(f"{stream}.")}


def broker_volume(stream: str) -> dict[str, Any]:
    """The broker pod's volume: its own certificate and its list of clients, from the namespace Secret."""
    items = [{"key": _key(stream, BROKER_CERT), "path": BROKER_CERT}, {"key": _key(stream, CLIENTS), "path": CLIENTS}]
    return {"name": "curve", "secret": {"secretName": CURVE_SECRET, "items": items, "defaultMode": 0o440}}


def client_secret_name(stream: str, client: str) -> str:
    return f"{stream}-curve-{client}"


def client_secret(
    namespace: str, stream: str, client: str, keys: StreamKeys, labels: Mapping[str, str]
) -> dict[str, Any]:
    """Client ``client``'s own Secret: its certificate and the broker's public one, for its pods to mount."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": client_secret_name(stream, client),
            "namespace": namespace,
            "labels": {**labels, "zeps.dev/curve-client": client},
            "annotations": {"zeps.dev/broker-public-key": keys.public_key},
        },
        "stringData": {"client.key_secret": keys.clients[client], "server.key": keys.server_public},
    }
