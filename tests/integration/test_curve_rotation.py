"""CURVE keys rotated under running clients, on real sockets: the broker's certificate file and the
client's are changed in place, file by file, as the kubelet updates a mounted Secret (a new file
renamed over the old), in the order the operator's rotation writes them (:mod:`zeps_operator.curve`).

* The broker's key: clients are handed the coming key first (``server.next.key`` beside their
  certificate); the broker then serves the new key (it reads its certificate again every second and
  binds its endpoint again with it); the clients' files change to the new key, the old one kept as
  ``server.previous.key``, which goes last. An idempotent publisher and a subscriber run through it all:
  every publish confirmed, each read once, in order, and the publisher never saw an error.
* A replica set's key, changed on one replica at a time (the leader first, the worst order: its
  followers' peerings must find it with the coming key, which they are handed first as well): every
  replica stays in sync, and nothing is lost.
* A client's own key: the broker admits its old and new key for a while (a list in ``clients.json``),
  the client's certificate changes, then only the new key is admitted: the session on the old key is
  cut off and the client attaches again with the new one, losing nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth

from harness import ReplicaSet, ZooKeeperHarness, until, wait_until
from zeps.broker import BrokerConfig, BrokerServer, CurveConfig
from zeps.broker.certificates import Certificate, make_certificate
from zeps.client import AsyncStreamClient, BrokerUnavailableError, StreamClient
from zeps.journal import JournalConfig


def _put(path: Path, text: str) -> None:
    """Replace a file at once, as the kubelet updates a Secret volume (a new file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f".{path.name}.new")
    fresh.write_text(text)
    os.replace(fresh, path)


class Keys:
    """A broker's and a client's certificate files, as the operator's Secrets would hold them."""

    def __init__(self, root: Path) -> None:
        self.broker_dir, self.client_dir = root / "broker", root / "client"
        self.old, self.new = make_certificate("broker"), make_certificate("broker")
        self.client_old, self.client_new = make_certificate("teller"), make_certificate("teller")
        _put(self.broker_dir / "broker.key_secret", self.old.secret_text)
        self.admit(self.client_old)
        _put(self.client_dir / "client.key_secret", self.client_old.secret_text)
        _put(self.client_dir / "server.key", self.old.public_text)

    @property
    def certificate(self) -> Path:
        return self.client_dir / "client.key_secret"

    def admit(self, *clients: Certificate) -> None:
        keys = [c.public_key for c in clients]
        _put(self.broker_dir / "clients.json", json.dumps({"teller": keys[0] if len(keys) == 1 else keys}))

    def curve(self) -> CurveConfig:
        return CurveConfig(self.broker_dir / "broker.key_secret", self.broker_dir / "clients.json")


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[tuple[Keys, BrokerServer]]:
    keys = Keys(tmp_path / "keys")
    broker = BrokerServer(BrokerConfig(tmp_path / "data", ("prices",), journal=JournalConfig(fsync="group")),
                          curve=keys.curve()).start()  # fmt: skip
    try:
        yield keys, broker
    finally:
        broker.stop()


class Publisher(threading.Thread):
    """An idempotent publisher confirming every 5 publishes until stopped; what it confirmed."""

    def __init__(self, endpoint: str, certificate: Path, client: StreamClient | None = None) -> None:
        super().__init__(daemon=True)
        self.client = client or StreamClient(endpoint, "prices", curve_certificate=certificate, producer_id="teller",
                                             timeout=20)  # fmt: skip
        self.confirmed = 0
        self.error: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            with self.client:
                n = 0
                while not self.halt.is_set():
                    for _ in range(5):
                        n += 1
                        self.client.publish("k", str(n).encode())
                    self.client.flush()
                    self.confirmed = n
        except BaseException as exc:  # the test's assertion reports it
            self.error = exc

    def grows(self, by: int = 50) -> None:
        """Wait until ``by`` more publishes are confirmed (failing with the publisher's error, if any)."""
        target = self.confirmed + by
        wait_until(lambda: self.error is not None or self.confirmed >= target, timeout=30,
                   what=f"{by} more publishes confirmed")  # fmt: skip
        assert self.error is None, self.error

    def stop(self) -> int:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        return self.confirmed


def _read_all(endpoint: str, certificate: Path, count: int) -> list[str]:
    with StreamClient(endpoint, "prices", curve_certificate=certificate, timeout=10) as reader:
        reader.start("", since="earliest")
        out: list[str] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            message = reader.receive(1)
            if message is not None:
                out.append(message.body.decode())
        return out


def test_the_brokers_key_rotated_under_a_publisher_loses_nothing(keyed: tuple[Keys, BrokerServer]) -> None:
    keys, broker = keyed
    publisher = Publisher(broker.endpoint, keys.certificate)
    publisher.start()
    publisher.grows()
    _put(keys.client_dir / "server.next.key", keys.new.public_text)  # 1: the clients learn the coming key
    publisher.grows()
    before = publisher.client.reconnects
    _put(keys.broker_dir / "broker.key_secret", keys.new.secret_text)  # 2: the broker serves it
    wait_until(lambda: broker.public_key == keys.new.public_key, timeout=10, what="the broker serving the new key")
    publisher.grows()  # through a connection made with the new key, found beside the certificate
    assert publisher.client.reconnects > before and publisher.client.server_public_key == keys.new.public_key
    _put(keys.client_dir / "server.key", keys.new.public_text)  # 3: the clients' files say so
    _put(keys.client_dir / "server.previous.key", keys.old.public_text)
    (keys.client_dir / "server.next.key").unlink()
    publisher.grows()
    (keys.client_dir / "server.previous.key").unlink()  # 4: the old key is gone
    publisher.grows()
    confirmed = publisher.stop()
    assert _read_all(broker.endpoint, keys.certificate, confirmed) == [str(n) for n in range(1, confirmed + 1)]

    stale = StreamClient(broker.endpoint, "prices", server_public_key=keys.old.public_key, timeout=2,
                         client_keys=(keys.client_old.public_key, _secret(keys.client_old)))  # fmt: skip
    with pytest.raises(BrokerUnavailableError, match="no broker answered"):  # it trusts the old key only
        stale.connect()
    stale.close()


def _secret(certificate: Certificate) -> str:
    return certificate.secret_text.split('secret-key = "', 1)[1].split('"', 1)[0]


def test_a_clients_own_key_rotated_under_it_loses_nothing(keyed: tuple[Keys, BrokerServer]) -> None:
    keys, broker = keyed
    publisher = Publisher(broker.endpoint, keys.certificate)
    publisher.start()
    publisher.grows()
    keys.admit(keys.client_old, keys.client_new)  # 1: both keys admitted
    _put(keys.certificate, keys.client_new.secret_text)  # 2: the client's certificate changes
    publisher.grows()
    keys.admit(keys.client_new)  # 3: the old key is revoked: the session on it is cut off
    wait_until(lambda: publisher.client.client_keys is not None and
               publisher.client.client_keys[0] == keys.client_new.public_key, timeout=15,
               what="the publisher on its new key")  # fmt: skip
    publisher.grows()
    confirmed = publisher.stop()
    assert _read_all(broker.endpoint, keys.certificate, confirmed) == [str(n) for n in range(1, confirmed + 1)]


def test_the_async_client_follows_the_brokers_key_rotation(keyed: tuple[Keys, BrokerServer]) -> None:
    keys, broker = keyed

    async def scenario() -> list[bytes]:
        async with AsyncStreamClient(broker.endpoint, "prices", curve_certificate=keys.certificate,
                                     producer_id="async", timeout=20) as client:  # fmt: skip
            await client.publish("k", b"before")
            await client.flush()
            _put(keys.client_dir / "server.next.key", keys.new.public_text)
            _put(keys.broker_dir / "broker.key_secret", keys.new.secret_text)
            await asyncio.to_thread(wait_until, lambda: broker.public_key == keys.new.public_key, timeout=10,
                                    what="the broker serving the new key")  # fmt: skip
            await client.publish("k", b"after")
            await client.flush()
            await client.start("", since="earliest")
            got = [await client.receive(5), await client.receive(5)]
            return [m.body for m in got if m is not None]

    assert asyncio.run(scenario()) == [b"before", b"after"]


def test_a_broker_whose_new_certificate_cannot_be_read_keeps_serving_its_key(
    keyed: tuple[Keys, BrokerServer], caplog: pytest.LogCaptureFixture
) -> None:
    keys, broker = keyed
    _put(keys.broker_dir / "broker.key_secret", "not a certificate")
    wait_until(lambda: "could not be read" in caplog.text, timeout=10, what="the broker reading the bad certificate")
    assert broker.public_key == keys.old.public_key and broker.wait(0) is False
    with StreamClient(broker.endpoint, "prices", curve_certificate=keys.certificate, timeout=5) as client:
        client.publish("k", b"served")
        client.flush()
    assert zmq.auth.load_certificate(str(keys.client_dir / "server.key"))[0].decode() == broker.public_key


def test_a_replica_sets_key_rotated_one_replica_at_a_time_keeps_it_in_sync(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    keys = Keys(tmp_path / "keys")
    replicas = ReplicaSet(zookeeper, tmp_path / "brokers")
    shared = tmp_path / "keys" / "shared"
    listed = {}
    for name in replicas.names:
        certificate = make_certificate(f"replica.{name}")
        _put(shared / f"replica.{name}.key_secret", certificate.secret_text)
        listed[name] = certificate.public_key
        _put(tmp_path / "keys" / name / "broker.key_secret", keys.old.secret_text)  # each its own copy
        replicas.extra_for[name] = ["--curve-secret-key", str(tmp_path / "keys" / name / "broker.key_secret")]
    _put(shared / "replicas.json", json.dumps(listed))
    replicas.extra = ["--curve-clients", str(keys.broker_dir / "clients.json"), "--curve-replicas",
                      str(shared / "replicas.json")]  # fmt: skip
    try:
        leader = replicas.start_in_sync()
        client = replicas.client(curve_certificate=keys.certificate, producer_id="teller", timeout=30)
        publisher = Publisher("", keys.certificate, client)
        publisher.start()
        publisher.grows()
        # 1: the coming key (each replica reads it within a second; one that has not yet when its leader
        # switches fails a handshake or two more, then tries it)
        for folder in (keys.client_dir, *(tmp_path / "keys" / n for n in replicas.names)):
            _put(folder / ("server.next.key" if folder == keys.client_dir else "broker.next.key"), keys.new.public_text)

        def serves(name: str) -> str:  # the key a replica serves, as its facts in ZooKeeper say
            return str(json.loads(replicas.zk.get(replicas.paths.brokers.member(name))[0])["curvePublicKey"])

        for name in [leader, *(n for n in replicas.names if n != leader)]:  # 2: the leader first
            _put(tmp_path / "keys" / name / "broker.key_secret", keys.new.secret_text)
            until(lambda name=name: serves(name) == keys.new.public_key, f"{name} serving the new key", timeout=10)
            publisher.grows()
            until(lambda: len(replicas.state().isr) == 3, f"all three in sync after {name}'s key changed", timeout=30)
        _put(keys.client_dir / "server.key", keys.new.public_text)  # 3: the files say the new key only
        for folder in (keys.client_dir, *(tmp_path / "keys" / n for n in replicas.names)):
            (folder / ("server.next.key" if folder == keys.client_dir else "broker.next.key")).unlink()
        publisher.grows()
        confirmed = publisher.stop()
        until(lambda: len(replicas.state().isr) == 3, "all three in sync at the end", timeout=30)
    finally:
        replicas.stop()
    for name in replicas.names:
        assert [b.decode() for _, b in replicas.journal(name)] == [str(n) for n in range(1, confirmed + 1)], name
