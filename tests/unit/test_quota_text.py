"""The text of a ZooKeeper quota node (:mod:`zeps.coordination.quota`): hard limits only, -1 for
none, as ZooKeeper's ``StatsTrack`` reads it (the real server's reading: tests/integration/test_quota.py)."""

from __future__ import annotations

from zeps.coordination.quota import Quota


def test_a_quota_is_written_as_hard_limits_with_minus_one_for_none() -> None:
    assert Quota(100, 0).encode() == b"count=-1,bytes=-1,countHardLimit=100,byteHardLimit=-1"
    assert Quota(0, 4096).encode() == b"count=-1,bytes=-1,countHardLimit=-1,byteHardLimit=4096"
    assert Quota().unlimited and not Quota(1, 0).unlimited
