"""``zeps-broker --tier-store``'s flags, checked together: what needs what, and the local retention
within the total; and ``--cleanup``'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from zeps.broker.main import parse_args, settings, tiering
from zeps.broker.tiering import Tiering
from zeps.errors import ConfigError, ZepsError


def test_tiering_flags_are_checked_together_and_name_the_fix(tmp_path: Path) -> None:
    """--tier-store's flags: the local retention is part of the total, the rest needs --tier-store and
    ZooKeeper; a tiered journal keeps the local retention (unset: the total), the store the total."""
    base = ["--stream", "orders", "--data-dir", str(tmp_path), "--zookeeper", "zk:2181", "--member", "orders-0"]
    tiered = ["--tier-store", "s3://b/p", "--retention-ms", "1000", "--local-retention-ms", "10"]
    args = parse_args([*base, *tiered])
    config, _curve, _registration = settings(args)
    assert config.journal.retention_ms == 10
    unset = settings(parse_args([*base, "--tier-store", "s3://b/p", "--retention-bytes", str(1 << 30)]))[0]
    assert unset.journal.retention_bytes == 1 << 30, "an unset local retention is the total"
    assert tiering(args) == Tiering("s3://b/p", retention_ms=1000)
    for argv, says in (
        ([*base, "--local-retention-bytes", "5"], "--local-retention-bytes without --tier-store"),
        ([*base, "--tier-store-endpoint", "http://s3"], "--tier-store-endpoint without --tier-store"),
        ([*base, "--tier-store", "s3://b/p", "--retention-ms", "10", "--local-retention-ms", "11"],
         "--local-retention-ms=11: must be at least 0 and at most --retention-ms=10"),
        (["--stream", "orders", "--data-dir", str(tmp_path), "--tier-store", "s3://b/p"], "needs --zookeeper"),
    ):  # fmt: skip
        try:
            tiering(parse_args(argv))
        except ConfigError as exc:
            assert says in str(exc), exc
        else:
            raise AssertionError(f"{argv} was accepted")


def test_compaction_flags_reach_the_journal_and_bad_values_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--cleanup and its companions (or their ZEPS_BROKER_* variables) become the journal's settings;
    a ratio outside 0..1 is refused naming it."""
    base = ["--stream", "prices", "--data-dir", str(tmp_path)]
    flags = ["--cleanup", "compact", "--tombstone-retention-ms", "5000", "--min-cleanable-ratio", "0.2",
             "--compaction-bytes-per-s", "1000000"]  # fmt: skip
    journal = settings(parse_args([*base, *flags]))[0].journal
    assert (journal.cleanup, journal.tombstone_retention_ms, journal.min_cleanable_ratio,
            journal.compaction_bytes_per_s) == ("compact", 5000, 0.2, 1_000_000)  # fmt: skip
    assert journal.compacts and not journal.deletes
    assert settings(parse_args(base))[0].journal.cleanup == "delete"
    monkeypatch.setenv("ZEPS_BROKER_CLEANUP", "delete,compact")
    both = settings(parse_args(base))[0].journal
    assert both.compacts and both.deletes
    with pytest.raises(ZepsError, match=r"min_cleanable_ratio=1\.5 must be within 0\.\.1"):
        settings(parse_args([*base, "--min-cleanable-ratio", "1.5"]))
