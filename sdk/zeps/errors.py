"""The zeps error hierarchy: one root, :class:`ZepsError`, so callers can catch everything zeps raises.

Below it, errors are grouped by who has to act (the CLI's exit code in brackets, :func:`exit_code`):

* :class:`ConfigError` [3] — the settings are wrong; the message names the field and the fix.
* :class:`SetupError` [3] — a local tool or server (Java, Go, ZooKeeper, the test control plane) is
  missing or would not start; the message says what to install or where the log is.
* :class:`UnavailableError` [4] — a server (ZooKeeper, a broker) did not answer in time, went silent,
  or is not running: nothing is wrong with the request; try again once it serves.
* :class:`CoordinationError` [4] — ZooKeeper said no (a lost lock, a conflicting owner, the
  namespace's quota: :class:`QuotaExceededError`), or could not be reached in time
  (:class:`~zeps.coordination.admin.ZooKeeperUnavailableError` is both).
* :class:`ProtocolError` [4] — a ZEPS conversation broke; ``LocalProtocolError`` means we misused the
  protocol, ``RemoteProtocolError`` means the peer did (h11's split); ``PublishRefusedError``: the
  broker refused publishes (too large, journal full), ``ProducerError`` among them: it refused an
  idempotent producer's publishes (fenced, expired, out of sequence).
* :class:`DataLossError` [5] — data the request needs is gone (retention removed it): asking again
  does not help; ask for what still exists, or accept the loss where the API offers that.

Any other :class:`ZepsError` (a corrupt journal, envelope or batch file) exits with 4 as well.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CONFIG",
    "EXIT_DATA_LOSS",
    "EXIT_UNAVAILABLE",
    "ConfigError",
    "CoordinationError",
    "DataLossError",
    "LocalProtocolError",
    "MessageTooLargeError",
    "ProducerError",
    "ProtocolError",
    "PublishRefusedError",
    "QuotaExceededError",
    "RemoteProtocolError",
    "SetupError",
    "UnavailableError",
    "ZepsError",
    "exit_code",
]

EXIT_CONFIG, EXIT_UNAVAILABLE, EXIT_DATA_LOSS = 3, 4, 5


class ZepsError(Exception):
    """Root of every error zeps raises on purpose."""


class ConfigError(ZepsError, ValueError):
    """Invalid or missing settings; the message names the field and how to fix it."""


class SetupError(ZepsError, RuntimeError):
    """A local dependency (tool, binary, server) is missing or failed to start."""


class UnavailableError(ZepsError):
    """A server (ZooKeeper, a broker) did not answer in time, went silent, or is not running."""


class DataLossError(ZepsError):
    """Data the request needs was removed (by retention) before it was read."""


class CoordinationError(ZepsError):
    """ZooKeeper refused an operation or could not be reached within the bound."""


class QuotaExceededError(CoordinationError):
    """ZooKeeper refused a write: the nodes of this namespace are at their quota (the operator sets
    one per namespace: :mod:`zeps.coordination.quota`). Nothing was written; once the namespace holds
    less (a drained queue, consumers gone) the same write succeeds."""


class ProtocolError(ZepsError):
    """A ZEPS protocol conversation went wrong."""


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol (or the connection's state) does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow."""


class PublishRefusedError(ProtocolError):
    """The broker refused this client's publishes (the message says why and what to do): a message
    over the stream's size limit, or a full journal volume (attach again and resend: the client does
    that after raising this). Publishes it refused are not journaled and stay unconfirmed."""


class ProducerError(PublishRefusedError):
    """The broker refused this client's idempotent publishes (the message says why and what to do):
    fenced (a newer client claimed the producer name), unknown (it expired), out of sequence, or
    not supported by the broker. Publishes it refused are not journaled and stay unconfirmed."""


class MessageTooLargeError(ConfigError):
    """A message body is over the limit the client was given (the stream's ``maxMessageBytes``):
    nothing was sent. Split the message, or raise the stream's limit and the client's."""


def exit_code(exc: ZepsError) -> int:
    """The CLI's exit code for ``exc``: its category's, as listed in this module's docstring."""
    if isinstance(exc, (ConfigError, SetupError)):
        return EXIT_CONFIG
    if isinstance(exc, DataLossError):
        return EXIT_DATA_LOSS
    return EXIT_UNAVAILABLE
