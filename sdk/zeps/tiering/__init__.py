"""Tiered storage: a stream's closed, committed journal runs copied to an object store (the batch
stores: S3, or a directory), listed in a manifest in ZooKeeper, and read back from there once local
retention has removed them. :mod:`~zeps.tiering.manifest` (the entries and what to do next, pure),
:mod:`~zeps.tiering.uploader` (the leader's uploads and deletions, fenced by its epoch),
:mod:`~zeps.tiering.reader` (reads of what the store holds, cached)."""

from zeps.tiering.manifest import ClosedSegment, State, TierEntry, tiered_to
from zeps.tiering.reader import TierReader
from zeps.tiering.uploader import FencedError, Manifest, StepResult, TierUploader, read_manifest

__all__ = [
    "ClosedSegment",
    "FencedError",
    "Manifest",
    "State",
    "StepResult",
    "TierEntry",
    "TierReader",
    "TierUploader",
    "read_manifest",
    "tiered_to",
]
