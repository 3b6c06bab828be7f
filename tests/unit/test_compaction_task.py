"""The broker's compaction thread (zeps.broker.compacting) with a real journal on real files: the loop
offers a pass when one is due, installs each segment the thread rewrote, and after a failed pass
(a full volume) keeps every segment as it was and offers the next a minute later."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from zeps.broker.compacting import RETRY_AFTER_S, CompactionTask
from zeps.journal import Journal, JournalConfig
from zeps_dev.process import wait_until

CONFIG = JournalConfig(cleanup="compact", fsync="never", segment_bytes=400)


def _journal(path: Path) -> Journal:
    journal = Journal(path, CONFIG, name="prices").open()
    for i in range(60):
        journal.append(f"key.{i % 3}", b"value-%02d" % i)
    return journal


def _bodies(journal: Journal) -> list[bytes]:
    out, sequence = [], 0
    while records := journal.read(sequence, max_records=100):
        out += [r.body for r in records]
        sequence = records[-1].sequence + 1
    return out


def test_the_loop_installs_what_the_thread_rewrote_and_offers_a_pass_only_when_one_is_due(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    task = CompactionTask("prices", CONFIG).start()
    try:
        task.turn(journal, now_ms=0)
        assert task.busy
        wait_until(lambda: task.turn(journal, now_ms=0) or (task.passes == 1 and not task.busy), timeout=10,
                   what="the pass's end")  # fmt: skip
        assert task.segments > 0 and task.removed > 0 and task.failures == 0
        active = journal.replica_position()[0]
        kept = 3 + (journal.next_sequence - active)  # each key's latest, then the active segment whole
        assert len(_bodies(journal)) == kept
        task.turn(journal, now_ms=0)
        assert not task.busy, "nothing changed: no pass is offered"
    finally:
        task.stop()


@pytest.mark.pure  # patches a function of zeps.journal.compaction, which may be compiled
def test_a_failed_pass_leaves_every_segment_and_the_next_comes_a_minute_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = _journal(tmp_path)
    before = _bodies(journal)

    def full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("zeps.journal.compaction.rewrite", full)
    task = CompactionTask("prices", CONFIG).start()
    try:
        now = time.monotonic()
        task.turn(journal, now_ms=0, now=now)
        wait_until(lambda: task.turn(journal, now_ms=0, now=now) or task.failures == 1, timeout=10,
                   what="the failed pass")  # fmt: skip
        assert not task.busy and _bodies(journal) == before
        task.turn(journal, now_ms=0, now=now + RETRY_AFTER_S - 1)
        assert not task.busy, "no pass before the retry time"
        monkeypatch.undo()
        task.turn(journal, now_ms=0, now=now + RETRY_AFTER_S)
        assert task.busy
    finally:
        task.stop()
