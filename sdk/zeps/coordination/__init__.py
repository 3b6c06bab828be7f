"""ZooKeeper recipes (kazoo): the only package in zeps that imports kazoo.

Recipes land here issue by issue: groups with manifests (seed 002), topics (seed 000), work and
batch queues (seeds 001 and 003). :func:`connect` is the one place a kazoo client is made.
"""

from zeps.coordination.client import connect

__all__ = ["connect"]
