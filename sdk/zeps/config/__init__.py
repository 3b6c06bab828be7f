"""Where a handle's connection settings come from: explicit arguments, then the environment, then
the custom resource's status read through the Kubernetes API (:mod:`zeps.config.resolver`).

Environment variables (what a pod gets; the operator's status shows the same values):

======================================  ===============================================================
``ZEPS_ZOOKEEPER``                      ZooKeeper connect string, ``host:port[,host:port…]``
``ZEPS_CHROOT``                         the installation's root path (default ``/zeps``)
``ZEPS_NAMESPACE``                      the resources' namespace (default: ``POD_NAMESPACE``, the pod's
                                        own namespace, or ``default``)
``ZEPS_ZOOKEEPER_USER`` / ``_PASSWORD``   the namespace's ZooKeeper digest identity, when ACLs are on
``ZEPS_ZOOKEEPER_CA``                   the CA of the servers' TLS certificates (a PEM file, or the PEM
                                        itself): the client speaks TLS to ZooKeeper and trusts that CA
                                        alone (else the resource's status, ``zookeeperCA``)
``ZEPS_STREAM_<NAME>_ENDPOINT``         a stream's broker endpoint (``<NAME>`` upper-case, ``-`` → ``_``)
``ZEPS_STREAM_<NAME>_PUBLIC_KEY``       its CURVE public key, when CURVE is on (else the ``server.key``
                                        beside the client certificate, else the resource's status)
``ZEPS_STREAM_<NAME>_CURVE_CLIENT``     this client's CURVE certificate, ``client.key_secret`` of the
                                        Secret the operator made for it (``<stream>-curve-<client>``,
                                        mounted in the pod): a stream with CURVE admits listed clients only
``ZEPS_STREAM_<NAME>_MAX_MESSAGE_BYTES``  its message limit (else the resource's spec, else 1 MiB)
``ZEPS_STREAM_<NAME>_MULTICAST_KEY``    the file with its multicast key (a stream with CURVE signs its
                                        multicast messages): else ``multicast.key`` beside the client
                                        certificate (the same Secret)
``ZEPS_STREAM_<NAME>_MULTICAST``        its multicast output, ``transport://group:port`` (or the JSON of
                                       the broker's settings: ``{"transport": …, "rate_kbps": …}``)
======================================  ===============================================================
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from zeps.errors import ConfigError
from zeps.options import MulticastOptions
from zeps.paths import DEFAULT_CHROOT, chroot_of, validate_name
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from zeps.resources import PLURALS, Kind

__all__ = ["Resolved", "default_namespace", "read_ca", "require_queue_mode", "resolve"]

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Resolved(BaseModel):
    """Everything a handle needs, and nothing that needs Kubernetes: what Spark ships to executors."""

    model_config = ConfigDict(frozen=True)

    kind: Kind
    name: str
    namespace: str
    zookeeper: str = ""
    chroot: str = DEFAULT_CHROOT
    auth: tuple[str, str] | None = None
    #: the PEM of the CA of the ZooKeeper servers' TLS certificates ("": plain TCP); a public
    #: certificate, shipped to Spark's executors with the rest
    zookeeper_ca: str = ""
    endpoint: str = ""
    public_key: str = ""
    #: a stream's multicast output as receivers need it (the broker's member node, via the status)
    multicast: dict[str, Any] = {}
    #: a stream's client CURVE certificate (a path: the key itself is never in the settings, which Spark
    #: ships to executors in the plan; they mount the same Secret)
    curve_client: str = ""
    multicast_key: str = ""  #: a file with a signed stream's multicast key (a path, as curve_client)
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  #: a stream's message limit (its spec.maxMessageBytes)
    #: a partitioned stream's endpoint of each partition, partition 0 first (status.partitions, or
    #: ZEPS_STREAM_<NAME>_PARTITIONS); empty for a stream of one partition
    partitions: tuple[str, ...] = ()
    spec: dict[str, Any] = {}


def require_queue_mode(settings: Resolved, mode: Literal["work", "batches"]) -> None:
    """Refuse a Queue whose ``spec.mode`` is not ``mode`` (a spec read from the resource; settings given
    only by arguments or the environment carry no spec, and are taken as they are)."""
    actual = settings.spec.get("mode")
    if actual and actual != mode:
        use = {"work": "zeps.queue(name)", "batches": "zeps.batches(name) or the Spark source's queue option"}
        raise ConfigError(
            f"Queue {settings.namespace}/{settings.name} has spec.mode {actual!r}, not {mode!r}: "
            f"use {use.get(str(actual), 'a Queue of mode ' + repr(mode))}"
        )


def default_namespace(explicit: str | None) -> str:
    """The explicit namespace, else ZEPS_NAMESPACE, POD_NAMESPACE, the pod's own, or "default"."""
    if explicit:
        return explicit
    for var in ("ZEPS_NAMESPACE", "POD_NAMESPACE"):
        if os.environ.get(var):
            return os.environ[var]
    if _SA_NAMESPACE.exists():
        return _SA_NAMESPACE.read_text().strip()
    return "default"


def _env_auth() -> tuple[str, str] | None:
    user, password = os.environ.get("ZEPS_ZOOKEEPER_USER", ""), os.environ.get("ZEPS_ZOOKEEPER_PASSWORD", "")
    if bool(user) != bool(password):
        raise ConfigError("set both ZEPS_ZOOKEEPER_USER and ZEPS_ZOOKEEPER_PASSWORD, or neither")
    return (user, password) if user else None


def read_ca(value: str, *, source: str) -> str:
    """The PEM of a ZooKeeper CA given as ``value`` (by ``source``, named in errors): the PEM itself, or
    the path of a file holding it; "" stays "" (plain TCP)."""
    if not value or value.lstrip().startswith("-----BEGIN"):
        return value.strip()
    try:
        pem = Path(value).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}={value!r}: cannot read it ({exc}); give the path of the servers' ca.crt, "
                          "or its PEM") from None  # fmt: skip
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(f"{source}={value!r}: the file holds no PEM certificate; give the servers' ca.crt")
    return pem.strip()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    if not value.isdigit():
        raise ConfigError(f"{name}={value!r}: a number of bytes, e.g. 1048576")
    return int(value)


def _env_partitions(name: str) -> tuple[str, ...]:
    """``ZEPS_STREAM_<NAME>_PARTITIONS``: each partition's broker endpoint, comma-separated, partition 0 first."""
    value = os.environ.get(name, "")
    endpoints = tuple(e.strip() for e in value.split(",")) if value else ()
    if any(not e.startswith(("tcp://", "ipc://")) for e in endpoints):
        raise ConfigError(f"{name}={value!r}: give each partition's endpoint, comma-separated, partition 0 first "
                          "(tcp://host:port,tcp://host:port,...)")  # fmt: skip
    return endpoints


def _env_multicast(value: str) -> dict[str, Any]:
    """``ZEPS_STREAM_<NAME>_MULTICAST``: a URL or the JSON of the broker's multicast settings, checked."""
    if not value:
        return {}
    if not value.lstrip().startswith("{"):
        return MulticastOptions.from_url(value).model_dump(exclude={"interface"})
    try:
        return MulticastOptions.make(**json.loads(value)).model_dump(exclude={"interface"})
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"ZEPS_STREAM_<NAME>_MULTICAST: {exc}; give transport://group:port") from None


def resolve(
    kind: Kind,
    name: str,
    *,
    namespace: str | None = None,
    zookeeper: str | None = None,
    chroot: str | None = None,
    auth: tuple[str, str] | None = None,
    zookeeper_ca: str | None = None,
    endpoint: str | None = None,
    public_key: str | None = None,
    multicast: dict[str, Any] | None = None,
    curve_client: str | None = None,
    max_message_bytes: int | None = None,
    needs: tuple[Literal["zookeeper", "endpoint", "multicast"], ...] | None = None,
) -> Resolved:
    """Settings for one resource: explicit arguments, then environment, then the resource's status.

    ``needs`` names the settings that must be found (the status is read only when one is missing);
    by default what the kind's handle needs: a stream's broker endpoint, else a ZooKeeper connect string.
    ``zookeeper_ca`` is the CA of the servers' TLS certificates, its PEM or a file's path.
    """
    validate_name(kind.lower(), name)
    ns = validate_name("namespace", default_namespace(namespace))
    env_key = name.upper().replace("-", "_")
    found: dict[str, Any] = {
        "zookeeper": zookeeper or os.environ.get("ZEPS_ZOOKEEPER", ""),
        "chroot": chroot or os.environ.get("ZEPS_CHROOT", ""),
        "auth": auth or _env_auth(),
        "zookeeper_ca": read_ca(zookeeper_ca, source="zookeeper_ca")
        if zookeeper_ca
        else read_ca(os.environ.get("ZEPS_ZOOKEEPER_CA", ""), source="ZEPS_ZOOKEEPER_CA"),
        "endpoint": endpoint or os.environ.get(f"ZEPS_STREAM_{env_key}_ENDPOINT", ""),
        "public_key": public_key or os.environ.get(f"ZEPS_STREAM_{env_key}_PUBLIC_KEY", ""),
        "multicast": multicast or _env_multicast(os.environ.get(f"ZEPS_STREAM_{env_key}_MULTICAST", "")),
        "curve_client": curve_client or os.environ.get(f"ZEPS_STREAM_{env_key}_CURVE_CLIENT", ""),
        "multicast_key": os.environ.get(f"ZEPS_STREAM_{env_key}_MULTICAST_KEY", ""),
        "max_message_bytes": max_message_bytes or _env_int(f"ZEPS_STREAM_{env_key}_MAX_MESSAGE_BYTES"),
        "partitions": _env_partitions(f"ZEPS_STREAM_{env_key}_PARTITIONS"),
        "spec": {},
    }
    needed = needs or (("endpoint",) if kind == "ZepsStream" else ("zookeeper",))
    if not all(found[k] for k in needed):
        from zeps.config.resolver import read_resource  # noqa: PLC0415 — Kubernetes only when needed

        resource = read_resource(PLURALS[kind], kind, name, ns)
        status, spec = resource.get("status") or {}, resource.get("spec") or {}
        found["spec"] = spec
        if not found["zookeeper"]:  # the status's connect string and its CA go together
            found["zookeeper"] = status.get("zookeeper", "")
            found["zookeeper_ca"] = found["zookeeper_ca"] or str(status.get("zookeeperCA") or "")
        found["endpoint"] = found["endpoint"] or status.get("endpoint", "")
        found["public_key"] = found["public_key"] or status.get("curvePublicKey", "")
        found["multicast"] = found["multicast"] or status.get("multicast") or {}
        found["max_message_bytes"] = found["max_message_bytes"] or spec.get("maxMessageBytes")
        listed = status.get("partitions")
        if not found["partitions"] and isinstance(listed, list) and len(listed) > 1:
            found["partitions"] = tuple(str(p.get("endpoint", "")) for p in listed if isinstance(p, dict))
        if not found["chroot"]:
            found["chroot"] = chroot_of(kind, ns, name, status.get("path", "")) or ""
    found["chroot"] = found["chroot"] or DEFAULT_CHROOT
    found["max_message_bytes"] = found["max_message_bytes"] or DEFAULT_MAX_MESSAGE_BYTES
    if not all(found[k] for k in needed):
        what = " and ".join({"endpoint": "broker endpoint", "zookeeper": "ZooKeeper connect string",
                             "multicast": "multicast output (spec.multicast)"}[k]
                            for k in needed if not found[k])  # fmt: skip
        raise ConfigError(f"{kind} {ns}/{name}: no {what} in arguments, environment or the resource's status")
    return Resolved(kind=kind, name=name, namespace=ns, **found)
