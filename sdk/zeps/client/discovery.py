"""Finding a stream's broker in ZooKeeper: the group its brokers join (``streams/<name>/brokers``).

What a member node says is only as trustworthy as who may write it (see :func:`discover`)."""

from __future__ import annotations

from typing import Any

from zeps.client._transport import BrokerUnavailableError

__all__ = ["broker_metadata", "discover", "read_broker_metadata"]


def broker_metadata(client: Any, namespace: str, stream: str, *, chroot: str = "/zeps") -> dict[str, Any]:
    """What the live broker of ``stream`` publishes in its ZooKeeper group (``client``, a started
    kazoo client): ``endpoint`` and ``curvePublicKey`` when it joins; ``lastSequence``,
    ``journalBytes``, ``subscriptionCount`` and the furthest-behind ``subscriptions`` every second."""
    from zeps.coordination import Group  # noqa: PLC0415 — ZooKeeper only for discovery
    from zeps.paths import StreamPaths  # noqa: PLC0415

    group = Group(client, StreamPaths.of(namespace, stream, chroot=chroot).brokers)
    manifest = group.status().manifest
    usable = [m for name, m in sorted(group.members().items()) if manifest is None or name in manifest]
    if not usable:
        raise BrokerUnavailableError(f"no live broker is registered for stream {namespace}/{stream}")
    return dict(usable[0].metadata)


def read_broker_metadata(
    zookeeper: str, namespace: str, stream: str, *, chroot: str = "/zeps", auth: tuple[str, str] | None = None
) -> dict[str, Any]:
    """:func:`broker_metadata` through a ZooKeeper session of its own, closed before returning."""
    from zeps.coordination import connect  # noqa: PLC0415 — ZooKeeper only for discovery

    client = connect(zookeeper, auth=auth)
    try:
        return broker_metadata(client, namespace, stream, chroot=chroot)
    finally:
        client.stop()
        client.close()


def discover(
    zookeeper: str, namespace: str, stream: str, *, chroot: str = "/zeps", auth: tuple[str, str] | None = None
) -> tuple[str, str]:
    """The (endpoint, CURVE public key) of the live broker of ``stream``, from its ZooKeeper group
    (``auth``: the namespace's ZooKeeper identity, where ACLs are on). What a member node says is only
    as trustworthy as who may write it: with the namespace's ACL, its brokers; without, anyone. So
    take the broker's key from a source of your own (the Secret the operator made, the resource's
    status) when it matters: a forged node's endpoint then fails the CURVE handshake."""
    meta = read_broker_metadata(zookeeper, namespace, stream, chroot=chroot, auth=auth)
    return str(meta["endpoint"]), str(meta.get("curvePublicKey", ""))
