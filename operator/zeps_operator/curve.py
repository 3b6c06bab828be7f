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
``<s>.broker.next.key_secret``      during a key rotation (below): the broker's coming certificate,
``<s>.broker.next.key``             and its public one (replica pods mount it: their peering with a
                                    leader that changed keys first tries it)
``<s>.broker.previous.key``         after the switch: the public certificate the broker served before
==================================  ================================================================

Each listed client also gets a Secret of its own, ``<s>-curve-<c>``, for its pods to mount:
``client.key_secret`` (its certificate), ``server.key`` (the broker's public certificate: clients
take the broker's key from there, the operator's word, not from ZooKeeper) and, with a multicast
output, ``multicast.key``. The operator makes it
once and never reads it. A key pair, once made, is never replaced behind its users' backs.

**Rotation** (the annotation :data:`ROTATE`; :func:`rotation_data` and :func:`client_rotation`): a
stream's broker key changes without cutting its clients off, in three phases a window apart
(:data:`ROTATION_WINDOW`, the kubelet's time to bring a changed Secret into the pods):

1. ``distributing``: a new key pair is made; each client's Secret gets ``server.next.key`` and each
   replica pod ``broker.next.key``, so that all trust the coming key before any broker serves it;
2. ``switched``: the broker's certificate is the new one (brokers read it every second and serve it);
   clients' ``server.key`` says the new key and ``server.previous.key`` the old (a client whose
   broker has not changed yet still reaches it); clients and peerings that fail a handshake try the
   next key they trust (:class:`zeps.client._transport.CurveTrust`);
3. ``done``: the old key is forgotten.

A client's own key rotates as clients are added and removed: admit the new name, then drop the old.

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
    "ROTATE",
    "ROTATION_PHASES",
    "ROTATION_WINDOW",
    "StreamKeys",
    "broker_volume",
    "client_rotation",
    "client_secret",
    "client_secret_name",
    "forget_keys",
    "plan_keys",
    "replicas_volume",
    "rotation_data",
]

#: the one Secret per namespace that holds the CURVE keys the operator made there
CURVE_SECRET = "zeps-curve"
BROKER_CERT, BROKER_PUBLIC, CLIENTS, MULTICAST_KEY = "broker.key_secret", "broker.key", "clients.json", "multicast.key"
REPLICAS = "replicas.json"
NEXT_CERT, NEXT_PUBLIC, PREVIOUS_PUBLIC = "broker.next.key_secret", "broker.next.key", "broker.previous.key"
#: annotate a CURVE ZepsStream with a new value to rotate its broker's key (see the module's text)
ROTATE = "zeps.dev/rotate-curve-key"
#: seconds between two phases of a rotation (an annotation of the same name sets another, at least 1)
ROTATION_WINDOW = 90
ROTATION_PHASES = ("distributing", "switched", "done")
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
    allows), so that scaling changes no pod template, and the coming broker key of a rotation.
    Optional: items not made yet are left out (the operator makes a replica's certificate before its
    pod; a rotation's key exists during it only); the broker names a missing certificate."""
    items = [
        {"key": _key(stream, REPLICAS), "path": REPLICAS},
        *({"key": _key(stream, _replica_item(m)), "path": _replica_item(m)} for m in members),
        {"key": _key(stream, NEXT_PUBLIC), "path": NEXT_PUBLIC},  # during a rotation only
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


def rotation_data(data: Mapping[str, str], stream: str, phase: str, *, make: Callable[[str], Certificate]
                  ) -> dict[str, str]:  # fmt: skip
    """The namespace Secret's data as rotation ``phase`` of ``stream``'s broker key wants it (each
    step is done once: the Secret says how far it went)."""
    out = dict(data)
    if phase == "distributing" and _key(stream, NEXT_CERT) not in out:
        coming = make("broker")
        out[_key(stream, NEXT_CERT)], out[_key(stream, NEXT_PUBLIC)] = coming.secret_text, coming.public_text
    elif phase == "switched" and _key(stream, NEXT_CERT) in out:
        out[_key(stream, PREVIOUS_PUBLIC)] = out[_key(stream, BROKER_PUBLIC)]
        out[_key(stream, BROKER_CERT)] = out.pop(_key(stream, NEXT_CERT))
        out[_key(stream, BROKER_PUBLIC)] = out.pop(_key(stream, NEXT_PUBLIC))
    elif phase == "done":
        out.pop(_key(stream, PREVIOUS_PUBLIC), None)
    return out


def client_rotation(data: Mapping[str, str], stream: str, phase: str) -> dict[str, str | None]:
    """What each client's Secret of ``stream`` holds in rotation ``phase``, from the namespace Secret's
    data (``rotation_data``'s): the broker keys it trusts, beside its certificate (None: removed)."""
    if phase == "distributing":
        return {"server.next.key": data[_key(stream, NEXT_PUBLIC)]}
    if phase == "switched":
        return {"server.key": data[_key(stream, BROKER_PUBLIC)], "server.next.key": None,
                "server.previous.key": data.get(_key(stream, PREVIOUS_PUBLIC))}  # fmt: skip
    return {"server.previous.key": None}
