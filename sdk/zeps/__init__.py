"""zeps: ZooKeeper-coordinated messaging for Kubernetes.

The facade: everything a user needs is named in ``__all__``; every other module is private
unless its own docstring says otherwise (``zeps.coordination.testing``).
"""

# ruff: noqa: E402 — the compiled hot path is activated before any module it may replace is imported
from zeps._compiled import activate_from_environment as _activate_compiled

_activate_compiled()  # first: the compiled hot path, if ZEPS_COMPILED names a build of these sources

from importlib.metadata import version as _version

from zeps.coordination import (
    AckUncertainError,
    Group,
    GroupStatus,
    LockLostError,
    Member,
    Membership,
    Message,
    NoSubscribersError,
    QueueFullError,
    Subscription,
    Topic,
    TopicCleaner,
)
from zeps.envelope import Envelope
from zeps.errors import (
    ConfigError,
    CoordinationError,
    LocalProtocolError,
    MessageTooLargeError,
    ProducerError,
    ProtocolError,
    PublishRefusedError,
    RemoteProtocolError,
    SetupError,
    ZepsError,
)
from zeps.handles import batches, queue, stream, topic
from zeps.options import TopicOptions

__version__ = _version("zeps")  # one source of truth: pyproject.toml

__all__ = [
    "AckUncertainError",
    "ConfigError",
    "CoordinationError",
    "Envelope",
    "Group",
    "GroupStatus",
    "LocalProtocolError",
    "LockLostError",
    "Member",
    "Membership",
    "Message",
    "MessageTooLargeError",
    "NoSubscribersError",
    "ProducerError",
    "ProtocolError",
    "PublishRefusedError",
    "QueueFullError",
    "RemoteProtocolError",
    "SetupError",
    "Subscription",
    "Topic",
    "TopicCleaner",
    "TopicOptions",
    "ZepsError",
    "__version__",
    "batches",
    "queue",
    "stream",
    "topic",
]
