"""The zeps error hierarchy: one root, :class:`ZepsError`, so callers can catch everything zeps raises.

Below it, errors are grouped by who has to act:

* :class:`ConfigError` — the settings are wrong; the message names the field and the fix.
* :class:`SetupError` — a local tool or server (Java, Go, ZooKeeper, the test control plane) is
  missing or would not start; the message says what to install or where the log is.
* :class:`CoordinationError` — ZooKeeper said no, or could not be reached in time.
* :class:`ProtocolError` — a ZEPS conversation broke; ``LocalProtocolError`` means we misused the
  protocol, ``RemoteProtocolError`` means the peer did (h11's split).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CoordinationError",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "SetupError",
    "ZepsError",
]


class ZepsError(Exception):
    """Root of every error zeps raises on purpose."""


class ConfigError(ZepsError, ValueError):
    """Invalid or missing settings; the message names the field and how to fix it."""


class SetupError(ZepsError, RuntimeError):
    """A local dependency (tool, binary, server) is missing or failed to start."""


class CoordinationError(ZepsError):
    """ZooKeeper refused an operation or could not be reached within the bound."""


class ProtocolError(ZepsError):
    """A ZEPS protocol conversation went wrong."""


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol (or the connection's state) does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""
