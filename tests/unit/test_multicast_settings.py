"""Multicast settings fail early and say the fix: the options model (one source for the CRD, the
broker's flags and the SDK), the broker's flags, and a pyzmq whose libzmq lacks the transport."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from zeps import _netif
from zeps.broker.main import multicast_options, parse_args
from zeps.errors import ConfigError
from zeps.options import MulticastOptions


def test_a_url_gives_the_options_and_back() -> None:
    options = MulticastOptions.from_url("epgm://239.192.0.1:5601", rate_kbps=5000)
    assert (options.transport, options.group, options.port, options.rate_kbps) == ("epgm", "239.192.0.1", 5601, 5000)
    assert options.url == "epgm://239.192.0.1:5601"


@pytest.mark.parametrize(
    ("url", "settings", "problem"),
    [
        ("epgm:239.192.0.1", {}, "is not transport://group:port"),
        ("udp://239.192.0.1:5601", {}, "transport: Input should be 'norm', 'pgm' or 'epgm'"),
        ("epgm://10.0.0.1:5601", {}, "group: String should match pattern"),
        ("epgm://239.300.0.1:5601", {}, "is not an IPv4 multicast address"),
        ("epgm://239.192.0.1:80", {}, "port: Input should be greater than or equal to 1024"),
        ("norm://239.192.0.1:5601", {"rate_kbps": 1000}, "rate_kbps and recovery_ms are for pgm/epgm"),
    ],
)
def test_bad_settings_name_the_field_and_the_rule(url: str, settings: dict[str, int], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        MulticastOptions.from_url(url, **settings)


def test_the_broker_flags_give_the_same_options_and_refuse_tuning_without_a_group() -> None:
    args = parse_args(["--stream", "s", "--data-dir", "/tmp/x", "--multicast", "pgm://239.192.0.1:5601",
                       "--multicast-rate", "20000", "--multicast-heartbeat", "250"])  # fmt: skip
    assert multicast_options(args) == MulticastOptions.make(
        transport="pgm", group="239.192.0.1", port=5601, rate_kbps=20000, heartbeat_ms=250
    )
    assert multicast_options(parse_args(["--stream", "s", "--data-dir", "/tmp/x"])) is None
    with pytest.raises(ConfigError, match="--multicast-rate without --multicast"):
        multicast_options(parse_args(["--stream", "s", "--data-dir", "/tmp/x", "--multicast-rate", "5"]))


def test_a_libzmq_without_the_transport_is_refused_with_the_fix() -> None:
    """``zmq.has`` stands in for a pyzmq from PyPI (its bundled libzmq has neither PGM nor NORM): the
    one installed here is built against Debian's libzmq, which has both."""
    assert zmq.has("pgm") and zmq.has("norm"), "make setup builds pyzmq against Debian's libzmq"
    for transport in ("norm", "pgm", "epgm"):
        with pytest.raises(ConfigError, match=r"apt-get install libzmq3-dev, then pip install --no-binary pyzmq"):
            _netif.require_transport(transport, lambda capability: False, "4.3.5")
        _netif.require_transport(transport, zmq.has, zmq.zmq_version())


def test_an_unknown_interface_is_named_with_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match=r"'nope0' is not an interface of this host .*lo \(127\.0\.0\.1\)"):
        _netif.resolve("nope0", "239.192.0.1")
    assert _netif.resolve("lo", "239.192.0.1").address == "127.0.0.1"
    assert _netif.resolve("127.0.0.1", "239.192.0.1").name == "lo"


def test_a_signed_streams_receiver_without_its_key_fails_closed(tmp_path: Path) -> None:
    """A stream with CURVE signs its multicast messages; a receiver whose key file is missing used to
    take every message unsigned (anyone on the group could send one): now it is refused, naming the fix."""
    from zeps.client._transport import multicast_key  # noqa: PLC0415
    from zeps.config import Resolved  # noqa: PLC0415
    from zeps.errors import ConfigError  # noqa: PLC0415

    curve = Resolved(kind="ZepsStream", name="prices", namespace="shop", public_key="x" * 40)
    with pytest.raises(ConfigError, match="multicast messages are signed, but no multicast key was found"):
        multicast_key(curve)
    (tmp_path / "multicast.key").write_text("00ff" * 8)
    assert multicast_key(curve.model_copy(update={"multicast_key": str(tmp_path / "multicast.key")})) == bytes.fromhex(
        "00ff" * 8
    )
    assert multicast_key(Resolved(kind="ZepsStream", name="prices", namespace="shop")) is None  # nothing signed
