"""Settings resolution without a cluster: arguments and environment; handles pickle as settings."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

import zeps
from zeps.config import resolve
from zeps.errors import ConfigError
from zeps.options import TopicOptions


def test_environment_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPS_ZOOKEEPER", "zk-0:2181,zk-1:2181")
    monkeypatch.setenv("ZEPS_NAMESPACE", "shop")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_USER", "shop")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_PASSWORD", "pw")
    settings = resolve("Topic", "cache")
    assert (settings.zookeeper, settings.namespace, settings.chroot, settings.auth) == (
        "zk-0:2181,zk-1:2181",
        "shop",
        "/zeps",
        ("shop", "pw"),
    )
    explicit = resolve("Topic", "cache", namespace="other", zookeeper="local:2181", chroot="/z")
    assert (explicit.zookeeper, explicit.namespace, explicit.chroot) == ("local:2181", "other", "/z")
    monkeypatch.setenv("ZEPS_STREAM_EU_PRICES_ENDPOINT", "tcp://broker:5555")
    assert resolve("ZepsStream", "eu-prices").endpoint == "tcp://broker:5555"
    # what must be found is the caller's: `zeps stream lag` needs ZooKeeper, not the endpoint
    assert resolve("ZepsStream", "us-prices", needs=("zookeeper",)).zookeeper == "zk-0:2181,zk-1:2181"


def test_the_zookeeper_ca_is_a_pem_file_or_the_pem(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    (tmp_path / "ca.crt").write_text(pem + "\n")
    (tmp_path / "key.pem").write_text("-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n")
    monkeypatch.setenv("ZEPS_ZOOKEEPER", "zk:2281")
    assert resolve("Topic", "cache").zookeeper_ca == ""  # none: plain TCP
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tmp_path / "ca.crt"))
    assert resolve("Topic", "cache").zookeeper_ca == pem
    assert resolve("Topic", "cache", zookeeper_ca=pem + "\n").zookeeper_ca == pem  # an argument wins
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tmp_path / "key.pem"))
    with pytest.raises(ConfigError, match=r"ZEPS_ZOOKEEPER_CA=.*key\.pem.*holds no PEM certificate"):
        resolve("Topic", "cache")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tmp_path))
    with pytest.raises(ConfigError, match=r"cannot read it .*give the path of the servers' ca\.crt"):
        resolve("Topic", "cache")


def test_half_an_identity_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPS_ZOOKEEPER", "zk:2181")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_USER", "shop")
    with pytest.raises(ConfigError, match="set both ZEPS_ZOOKEEPER_USER and ZEPS_ZOOKEEPER_PASSWORD"):
        resolve("Topic", "cache")


def test_without_settings_or_cluster_access_the_error_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for var in ("ZEPS_ZOOKEEPER", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"no Kubernetes access .* set KUBECONFIG, or pass the settings"):
        resolve("Topic", "cache", namespace="shop")
    with pytest.raises(ConfigError, match="'Bad_Name' is not a valid name"):
        resolve("Topic", "Bad_Name")


def test_spec_fields_become_options() -> None:
    options = TopicOptions.from_spec({"maxQueueDepth": 7, "fullQueuePolicy": "fail", "deletionPolicy": "Delete"})
    assert (options.max_queue_depth, options.full_queue_policy) == (7, "fail")


def test_handles_pickle_as_their_settings() -> None:
    handle = zeps.topic("cache", namespace="shop", zookeeper="zk:2181")
    copy = pickle.loads(pickle.dumps(handle))
    assert copy.settings == handle.settings and repr(copy) == "TopicHandle(shop/cache)"
    assert len(pickle.dumps(handle)) < 1000, "no client or thread travels with it"


def test_import_zeps_does_not_import_kubernetes() -> None:
    code = "import sys, zeps; assert 'kubernetes' not in sys.modules, 'kubernetes imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_tests_fixtures_load_without_the_extras() -> None:
    """conftest.py (the shared stack) and tests/conftest.py import kubernetes and PySpark only in the
    fixtures that use them: the unit tests run on an install without the extras."""
    tests = Path(__file__).resolve().parents[1]
    files = [str(tests.parent / "conftest.py"), str(tests / "conftest.py")]
    code = (
        f"import runpy, sys; sys.path[:0] = [{str(tests)!r}]; "
        f"[runpy.run_path(p) for p in {files!r}]; "
        "loaded = {'kubernetes', 'pyspark'} & {m.split('.')[0] for m in sys.modules}; "
        "assert not loaded, f'conftest imported {loaded}'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_stream_s_multicast_output_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPS_STREAM_PRICES_ENDPOINT", "tcp://broker:5555")
    monkeypatch.setenv("ZEPS_STREAM_PRICES_MULTICAST", "epgm://239.192.0.1:5601")
    assert resolve("ZepsStream", "prices").multicast == {
        "transport": "epgm", "group": "239.192.0.1", "port": 5601, "rate_kbps": None, "recovery_ms": None,
        "heartbeat_ms": 100,
    }  # fmt: skip
    monkeypatch.setenv("ZEPS_STREAM_PRICES_MULTICAST", '{"transport": "pgm", "group": "239.1.1.1", "port": 6000, '
                       '"rate_kbps": 5000}')  # fmt: skip
    assert resolve("ZepsStream", "prices").multicast["rate_kbps"] == 5000
    for bad, problem in (("epgm:239.1.1.1", "is not transport://group:port"), ('{"transport": 1', "not JSON|Expecting"),
                         ("norm://10.0.0.1:6000", "group")):  # fmt: skip
        monkeypatch.setenv("ZEPS_STREAM_PRICES_MULTICAST", bad)
        with pytest.raises(ConfigError, match=problem):
            resolve("ZepsStream", "prices")


def test_a_curve_client_takes_its_keys_from_its_secret_and_the_broker_key_beside_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A pod mounts its client Secret (client.key_secret, server.key, multicast.key) and names the
    certificate: the broker's key comes from the same Secret, not from the status or ZooKeeper."""
    import zmq.auth  # noqa: PLC0415

    from zeps.client._transport import curve_keys, multicast_key  # noqa: PLC0415

    server_public, _ = zmq.auth.create_certificates(str(tmp_path), "server")
    _, client_secret = zmq.auth.create_certificates(str(tmp_path), "client")
    Path(server_public).rename(tmp_path / "server.key")
    (tmp_path / "multicast.key").write_text("ab" * 32)
    monkeypatch.setenv("ZEPS_STREAM_PRICES_ENDPOINT", "tcp://broker:5555")
    monkeypatch.setenv("ZEPS_STREAM_PRICES_CURVE_CLIENT", client_secret)
    monkeypatch.setenv("ZEPS_STREAM_PRICES_MAX_MESSAGE_BYTES", "4096")
    s = resolve("ZepsStream", "prices", namespace="shop", public_key="what-the-status-says")
    server, client = curve_keys(s)
    assert server == zmq.auth.load_certificate(str(tmp_path / "server.key"))[0].decode()
    assert client is not None and client[0] == zmq.auth.load_certificate(client_secret)[0].decode()
    assert multicast_key(s) == bytes.fromhex("ab" * 32) and s.max_message_bytes == 4096

    monkeypatch.setenv("ZEPS_STREAM_PRICES_CURVE_CLIENT", str(tmp_path / "client.key"))  # the public half
    with pytest.raises(ConfigError, match=r"holds no secret key: name client\.key_secret"):
        curve_keys(resolve("ZepsStream", "prices", namespace="shop"))
    monkeypatch.setenv("ZEPS_STREAM_PRICES_CURVE_CLIENT", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="not a readable zmq certificate"):
        curve_keys(resolve("ZepsStream", "prices", namespace="shop"))
    monkeypatch.setenv("ZEPS_STREAM_PRICES_MAX_MESSAGE_BYTES", "1MB")
    with pytest.raises(ConfigError, match="ZEPS_STREAM_PRICES_MAX_MESSAGE_BYTES='1MB': a number of bytes"):
        resolve("ZepsStream", "prices", namespace="shop")


def test_a_message_over_the_client_s_limit_is_refused_before_anything_is_sent() -> None:
    from zeps.client.session import ClientSession  # noqa: PLC0415
    from zeps.errors import MessageTooLargeError  # noqa: PLC0415

    session = ClientSession("prices", max_message_bytes=1000, credit_window=4096)
    with pytest.raises(MessageTooLargeError, match="1001 bytes is over max_message_bytes=1000"):
        session.publish("k", bytes(1001))
    with pytest.raises(MessageTooLargeError):
        session.publish_many([("k", b"fine"), ("k", bytes(1001))])
    assert session.unconfirmed == 0, "nothing of a refused batch waits to be sent"
    with pytest.raises(ConfigError, match="credit_window=2000: must be between max_message_bytes"):
        ClientSession("prices", max_message_bytes=1000, credit_window=2000)
