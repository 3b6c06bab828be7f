"""What a Topic's parts see of it: its subscriptions, its cleaner and its background publisher take
this view, never the :class:`~zeps.coordination.topic.Topic` class, so none of them imports the
module that assembles them."""

from __future__ import annotations

from typing import Any, Protocol

from kazoo.client import KazooClient

from zeps.errors import CoordinationError
from zeps.options import TopicOptions
from zeps.paths import TopicPaths

__all__ = ["QueueFullError", "TopicView"]


class QueueFullError(CoordinationError):
    """A subscriber queue is at ``max_queue_depth`` and the policy is ``fail`` (or ``block`` timed out)."""


class TopicView(Protocol):
    """One topic's handle, as its parts use it."""

    name: str
    namespace: str
    client: KazooClient
    paths: TopicPaths
    options: TopicOptions
    acl: list[Any] | None

    def ensure(self) -> None:
        """Create the topic's paths if they are not there yet."""
