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
``<s>.multicast.key``               with a multicast output: the key its messages are signed with
                                    (hex; :mod:`zeps.protocol.multicast`), for the broker and clients
``<s>.replicas.json``               a replicated (or partitioned) stream's ``{"replica": "public
                                    key"}``: a leader takes each replica's fetches from that key only
``<s>.replica.<r>.key_secret``      replica ``<r>``'s own certificate, which it peers with (its
                                    leader serves it as the stream's server key, which all share)
==================================  ================================================================

Each listed client also gets a Secret of its own, ``<s>-curve-<c>``, for its pods to mount:
``client.key_secret`` (its certificate), ``server.key`` (the broker's public certificate: clients
take the broker's key from there, the operator's word, not from ZooKeeper) and, with a multicast
output, ``multicast.key``. The operator makes it
once and never reads it. A key pair, once made, is never replaced behind its users' backs.

Everything here is pure: :func:`plan_keys` decides, the handlers read and write through the adapter.
"""

from __future__ import annotations

import json
import secrets
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
    "replicas_volume",
]

#: the one Secret per namespace that holds the CURVE keys the operator made there
CURVE_SECRET = "zeps-curve"
BROKER_CERT, BROKER_PUBLIC, CLIENTS, MULTICAST_KEY = "broker.key_secret", "broker.key", "clients.json", "multicast.key"
REPLICAS = "replicas.json"
#: where a replica's pod finds the replicas' keys and its own certificate (--curve-replicas)
REPLICAS_DIR = "/etc/zeps/curve-replicas"


def _key(stream: str, item: str) -> str:
    return f"{stream}.{item}"


def _client_key(stream: str, client: str) -> str:
    return f"{stream}.client.{client}.key_secret"


def _replica_item(member: str) -> str:
    return f"replica.{member}.key_secret"


@dataclass(frozen=True)
class StreamKeys:
    """What a stream's CURVE needs: the Secret's data with its keys in place, and the clients' Secrets."""

    data: dict[str, str]  #: the whole of the namespace's Secret's data after the change
    changed: bool  #: whether ``data`` differs from what the Secret held
    public_key: str  #: the broker's public key
    server_public: str  #: the broker's public certificate (a client Secret's ``server.key``)
    clients: dict[str, str]  #: each listed client's certificate text (secret), for its own Secret
    multicast_key: str = ""  #: the multicast output's signing key (hex), when the stream has one


def plan_keys(
    data: Mapping[str, str],
    stream: str,
    clients: Sequence[str],
    *,
    make: Callable[[str], Certificate],
    multicast: bool = False,
    replicas: Sequence[str] = (),
) -> StreamKeys:
    """The namespace Secret's data with ``stream``'s keys made where missing (``make``) and its list
    of admitted clients set to ``clients``; keys already there are kept as they are. ``multicast``:
    the stream has a multicast output, whose messages get signed (a key made once, too). ``replicas``:
    the replicas its manifests name (every partition's), each given a certificate of its own and
    listed in ``<s>.replicas.json`` (a replica off the list is refused, its certificate kept)."""
    out = dict(data)
    if multicast and _key(stream, MULTICAST_KEY) not in out:
        out[_key(stream, MULTICAST_KEY)] = secrets.token_hex(32)
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
    if replicas:
        peers: dict[str, str] = {}
        for member in replicas:
            if _key(stream, _replica_item(member)) not in out:
                out[_key(stream, _replica_item(member))] = make(member).secret_text
            peers[member] = public_key_of(out[_key(stream, _replica_item(member))])
        out[_key(stream, REPLICAS)] = json.dumps(peers, sort_keys=True)
    server_public = out[_key(stream, BROKER_PUBLIC)]
    return StreamKeys(out, out != dict(data), public_key_of(server_public), server_public, certificates,
                      out.get(_key(stream, MULTICAST_KEY), "") if multicast else "")  # fmt: skip


def forget_keys(data: Mapping[str, str], stream: str) -> dict[str, str]:
    """The namespace Secret's data without ``stream``'s keys (the stream is deleted, policy Delete)."""
    return {k: v for k, v in data.items() if not k.startswith(f"{stream}.")}


def broker_volume(stream: str, *, multicast: bool = False) -> dict[str, Any]:
    """The broker pod's volume: its own certificate, its list of clients and (``multicast``) its
    multicast key, from the namespace Secret."""
    items = [{"key": _key(stream, item), "path": item}
             for item in (BROKER_CERT, CLIENTS, *((MULTICAST_KEY,) if multicast else ()))]  # fmt: skip
    return {"name": "curve", "secret": {"secretName": CURVE_SECRET, "items": items, "defaultMode": 0o440}}


def replicas_volume(stream: str, members: Sequence[str]) -> dict[str, Any]:
    """A replica pod's second volume (at :data:`REPLICAS_DIR`): the replicas' keys and the
    certificates of ``members``, every replica its StatefulSet may run (indices up to the most a spec
    allows), so that scaling changes no pod template. Optional: items of replicas not made yet are
    left out (the operator makes a replica's certificate before its pod); the broker names a missing one."""
    items = [
        {"key": _key(stream, REPLICAS), "path": REPLICAS},
        *({"key": _key(stream, _replica_item(m)), "path": _replica_item(m)} for m in members),
    ]
    return {
        "name": "curve-replicas",
        "secret": {"secretName": CURVE_SECRET, "items": items, "defaultMode": 0o440, "optional": True},
    }


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
        "stringData": {
            "client.key_secret": keys.clients[client],
            "server.key": keys.server_public,
            **({MULTICAST_KEY: keys.multicast_key} if keys.multicast_key else {}),
        },
    }
