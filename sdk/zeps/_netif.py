"""Network interfaces and ZeroMQ endpoints for the multicast output (broker and receivers alike).

libzmq 4.3.4 names the local interface differently per transport: OpenPGM (``pgm://``, ``epgm://``)
takes an IPv4 address (a name such as ``eth0`` is refused with EINVAL), NORM takes an interface name.
Users give either; :func:`resolve` finds both. Unset, the interface is the one this host's route to
the group goes out of (a connected UDP socket tells which: nothing is sent).

No ZeroMQ here: the adapters pass ``zmq.has`` to :func:`require_transport`.
"""

from __future__ import annotations

import fcntl
import secrets
import socket
import struct
from collections.abc import Callable

from zeps.errors import ConfigError

__all__ = ["Interface", "endpoint", "require_transport", "resolve"]

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


class Interface:
    """A local interface: its name and its IPv4 address."""

    __slots__ = ("address", "name")

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address

    def __repr__(self) -> str:
        return f"Interface({self.name!r}, {self.address!r})"


def _address_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no such interface, or no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def _interfaces() -> list[Interface]:
    found = []
    for _, name in socket.if_nameindex():
        address = _address_of(name)
        if address is not None:
            found.append(Interface(name, address))
    return found


def resolve(interface: str | None, group: str) -> Interface:
    """The local interface named ``interface`` (a name or one of its IPv4 addresses), or with None
    the one this host's route to ``group`` uses; ConfigError naming the interfaces there are."""
    interfaces = _interfaces()
    if interface is None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((group, 9))  # routing only: a UDP connect sends nothing
                interface = str(s.getsockname()[0])
            except OSError as exc:
                raise ConfigError(
                    f"no route to multicast group {group} ({exc.strerror}): add one (ip route add 224.0.0.0/4 dev "
                    "IFACE) or name the interface (interface=...)"
                ) from None
    for candidate in interfaces:
        if interface in (candidate.name, candidate.address):
            return candidate
    known = ", ".join(f"{i.name} ({i.address})" for i in interfaces) or "none with an IPv4 address"
    raise ConfigError(f"interface {interface!r} is not an interface of this host with an IPv4 address: {known}")


def endpoint(transport: str, group: str, port: int, interface: Interface) -> str:
    """The ZeroMQ endpoint of ``transport`` (norm, pgm, epgm) for ``group``:``port`` on ``interface``.
    A NORM endpoint carries a random node id: NORM tells its members apart by it, and the default
    (the host's address) would be the same for every receiver on one host. ``group`` is a checked
    multicast address (:class:`zeps.options.MulticastOptions` validates it)."""
    if transport == "norm":
        return f"norm://{1 + secrets.randbelow(0x7FFFFFFE)},{interface.name};{group}:{port}"  # atoi() in libzmq: int
    if transport in ("pgm", "epgm"):
        return f"{transport}://{interface.address};{group}:{port}"
    raise ConfigError(f"multicast transport {transport!r} is not one of norm, pgm, epgm")


def require_transport(transport: str, has: Callable[[str], bool], libzmq_version: str) -> None:
    """ConfigError naming the fix when this libzmq was built without ``transport`` (``has`` is
    ``zmq.has``: the pyzmq wheels from PyPI bundle a libzmq without PGM and NORM)."""
    capability = "norm" if transport == "norm" else "pgm"
    if not has(capability):
        raise ConfigError(
            f"multicast over {transport} needs a libzmq built with {capability.upper()}, and this pyzmq's libzmq "
            f"{libzmq_version} has none (zmq.has({capability!r}) is False; the pyzmq wheels from PyPI bundle such a "
            "libzmq). Build pyzmq against Debian's libzmq, which has PGM and NORM: apt-get install libzmq3-dev, then "
            "pip install --no-binary pyzmq pyzmq (make setup does both)"
        )
