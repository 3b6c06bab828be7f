"""ZooKeeper recipes (kazoo): the only package in zeps that imports kazoo.

* :mod:`~zeps.coordination.group` — group membership with a manifest;
* :mod:`~zeps.coordination.topic` — broadcast Topic: the handle and its publisher; its
  :mod:`~zeps.coordination.subscription` and its elected :mod:`~zeps.coordination.cleaner` beside it;
* :func:`connect` — the one place a kazoo client is made.
"""

from zeps.coordination.client import close_shared, connect, digest_acl, shared_client
from zeps.coordination.group import Group, GroupStatus, GroupWatch, Member, Membership
from zeps.coordination.queue import AckUncertainError, LockLostError
from zeps.coordination.topic import (
    Message,
    NoSubscribersError,
    QueueFullError,
    Subscription,
    Topic,
    TopicCleaner,
)

__all__ = [
    "AckUncertainError",
    "Group",
    "GroupStatus",
    "GroupWatch",
    "LockLostError",
    "Member",
    "Membership",
    "Message",
    "NoSubscribersError",
    "QueueFullError",
    "Subscription",
    "Topic",
    "TopicCleaner",
    "close_shared",
    "connect",
    "digest_acl",
    "shared_client",
]
