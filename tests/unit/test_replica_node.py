"""A replica's state machine (zeps.broker.replica.ReplicaNode) over a real broker core and journal:
what the election's news, the leader's frames and the session's connection do, without sockets."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.broker.replica import (
    RETRY_FOLLOW_S,
    RETRY_FULL_S,
    Close,
    Connect,
    ReplicaNode,
    ReplicaSettings,
    Send,
    StepAside,
    WriteIsr,
)
from zeps.journal import JournalConfig, JournalWriteError
from zeps.replication.election import ReplicaEvent

ISR = frozenset({"a", "b", "c"})


def _node(tmp_path: Path) -> ReplicaNode:
    core = BrokerCore(BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(fsync="always"), replicated=True))
    return ReplicaNode(core.open(), "prices", "a", ReplicaSettings(2, lag_s=2.0, leader_silence_s=1.0))


def _leadership(node: ReplicaNode):  # type: ignore[no-untyped-def]
    leader = node.core.streams["prices"].leader
    assert leader is not None
    return leader


def test_a_suspended_session_fences_at_once_and_only_its_own_resumption_lifts_the_fence(tmp_path: Path) -> None:
    """The session's news comes from its own thread, in order; the fence follows the latest of it,
    whatever the loop saw in between (before, a RESUMED queued for the loop could lift a fence that a
    later SUSPENDED had set: the leader confirmed while cut off)."""
    node = _node(tmp_path)
    node.event(ReplicaEvent("lead", 1, "a", ISR), now=0.0)
    node.turn(0.0)
    assert not _leadership(node).fenced
    node.connection("suspended")
    assert _leadership(node).fenced  # at once, before the loop's next turn
    node.connection("connected")
    node.connection("suspended")  # dropped again before the loop ran
    node.turn(0.1)
    assert _leadership(node).fenced
    node.connection("connected")
    node.turn(0.2)
    assert not _leadership(node).fenced


def test_a_leadership_whose_session_expired_never_confirms_again(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.event(ReplicaEvent("lead", 1, "a", ISR), now=0.0)
    node.connection("suspended")
    node.connection("lost")
    node.connection("connected")  # a new session: the old leadership is still the core's until LOST is handled
    node.turn(0.1)
    assert _leadership(node).fenced
    node.event(ReplicaEvent("lost"), now=0.2)
    assert node.core.streams["prices"].leader is None
    node.event(ReplicaEvent("lead", 2, "a", ISR), now=0.3)  # elected again with the new session
    node.turn(0.3)
    assert not _leadership(node).fenced


def test_following_reaches_the_leader_then_attaches_and_a_silent_leader_is_followed_again(tmp_path: Path) -> None:
    node = _node(tmp_path)
    assert node.event(ReplicaEvent("follow", 3, "b", ISR), now=0.0) == [Connect(3, "b")]
    attach = node.linked(3, "b", now=0.01)
    assert len(attach) == 1 and isinstance(attach[0], Send)
    assert node.turn(0.5) == []
    assert node.turn(1.2) == [Close()]  # silent for more than leader_silence_s
    assert node.turn(1.4) == []
    assert node.turn(1.6) == [Connect(3, "b")]  # tried again
    assert node.unreachable(3, "b", now=1.7) == [Close()]  # not registered yet: again 0.3 s later
    assert node.turn(2.1) == [Connect(3, "b")]
    assert node.linked(2, "b", now=2.2) == [Close()]  # an answer for an older follow


def test_the_leader_asks_for_its_in_sync_set_every_check(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.event(ReplicaEvent("lead", 1, "a", ISR), now=0.0)
    assert node.turn(0.0) == []
    assert node.turn(3.0) == [WriteIsr(1, frozenset({"a"}))]  # b and c never fetched: out after lag_s
    assert node.turn(3.05) == []  # not before isr_check_s
    assert node.turn(3.2) == []  # being written
    node.event(ReplicaEvent("isr", 1, "a", frozenset({"a"})), now=3.3)
    assert _leadership(node).isr == frozenset({"a"})


def test_a_full_volume_keeps_a_follower_up_and_trying_again_and_a_broken_disk_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's error is put in the copy's place here (a real full volume, a tmpfs filled up,
    is tests/integration/test_replication_disk.py's): ENOSPC ends the peering without acknowledging
    anything and tries again after RETRY_FULL_S, the broker up; EIO is fatal (the broker exits)."""
    node = _node(tmp_path)
    node.event(ReplicaEvent("follow", 3, "b", ISR), now=0.0)
    node.linked(3, "b", now=0.01)

    def failing(code: int) -> None:
        def receive(_frame: bytes) -> list[bytes]:
            raise JournalWriteError("prices", OSError(code, os.strerror(code)))

        assert node.peering is not None and node.peering.copy is not None
        monkeypatch.setattr(node.peering.copy, "receive", receive)

    failing(errno.ENOSPC)
    assert node.frames([b"replica-data"], now=0.1) == []  # nothing acknowledged
    assert node.full_since == 0.1
    assert node.turn(0.2) == [Close()]
    assert node.turn(0.2 + RETRY_FOLLOW_S + 0.01) == []  # not as soon as another failed peering
    assert node.turn(0.2 + RETRY_FULL_S) == [Connect(3, "b")]
    node.linked(3, "b", now=2.3)
    failing(errno.EIO)
    with pytest.raises(JournalWriteError, match="errno 5"):
        node.frames([b"replica-data"], now=2.4)


def test_a_resigning_leader_confirms_nothing_until_it_stays_and_is_done_once_another_leads_the_next_epoch(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    node.event(ReplicaEvent("lead", 4, "a", ISR), now=0.0)
    node.turn(0.0)
    node.resign()  # from the stopping thread: fenced at once
    assert _leadership(node).fenced and not node.handed_over
    node.event(ReplicaEvent("stays", 4), now=0.1)  # no replica in sync to take over: it leads on
    node.turn(0.1)
    assert not _leadership(node).fenced and node.handed_over

    node = _node(tmp_path / "again")
    node.event(ReplicaEvent("lead", 4, "a", ISR), now=0.0)
    node.resign()
    node.event(ReplicaEvent("resigned", 4), now=0.1)
    assert not node.handed_over  # out of line; nobody leads epoch 5 yet
    assert node.event(ReplicaEvent("follow", 5, "b", ISR - {"a"}), now=0.2) == []  # it fetches no more
    assert node.handed_over and node.core.streams["prices"].leader is None


def test_a_resigning_follower_stops_fetching_before_it_leaves_the_line(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node.event(ReplicaEvent("follow", 3, "b", ISR), now=0.0)
    node.linked(3, "b", now=0.01)
    node.resign()
    assert not node.peered_off
    assert node.turn(0.02) == [Close()]
    assert node.peered_off and node.turn(2.0) == []  # never followed again
    node.event(ReplicaEvent("resigned", 0), now=2.1)
    assert node.handed_over


def test_a_leader_giving_way_to_the_preferred_replica_confirms_nothing_until_it_follows_or_keeps_the_lead(
    tmp_path: Path,
) -> None:
    node = _node(tmp_path)
    node.event(ReplicaEvent("lead", 4, "a", ISR), now=0.0)
    node.turn(0.0)
    node.event(ReplicaEvent("give-way", 4), now=0.1)
    node.turn(0.1)  # the fence holds across turns (a turn recomputes it)
    assert _leadership(node).fenced and node.giving_way == 4
    node.event(ReplicaEvent("kept", 4), now=0.2)  # nobody took it: it confirms again
    node.turn(0.2)
    assert not _leadership(node).fenced and node.giving_way == 0
    node.event(ReplicaEvent("give-way", 4), now=0.3)
    actions = node.event(ReplicaEvent("follow", 5, "b", ISR), now=0.4)
    assert actions == [Connect(5, "b")] and node.core.streams["prices"].leader is None and node.giving_way == 0
    node.event(ReplicaEvent("lead", 6, "a", ISR), now=0.5)  # elected again later: a leadership unfenced
    node.turn(0.5)
    assert not _leadership(node).fenced


def test_a_lead_the_journal_cannot_begin_for_lack_of_space_steps_aside_and_is_tried_again_if_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch history's write fails (ENOSPC put in its place; a real full volume is
    tests/integration/test_replication_disk.py's): the broker stays up leading nothing and asks to step
    aside; told ``kept`` (no one else may lead), it tries again after RETRY_FULL_S, and leads once
    there is space, with the in-sync set ZooKeeper holds by then. Before, the error ended the broker's
    loop while its election node stood first in line (a chaos round that never settled)."""
    import zeps.journal.epochs as epochs_module  # noqa: PLC0415

    node = _node(tmp_path)
    real = epochs_module.replace_file

    def full(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(epochs_module, "replace_file", full)
    assert node.event(ReplicaEvent("lead", 4, "a", ISR), now=0.0) == [StepAside(4)]
    assert node.core.streams["prices"].leader is None and node.core.streams["prices"].journal.epochs.latest == 0
    assert node.event(ReplicaEvent("isr", 4, "a", frozenset({"a", "b"})), now=0.1) == []
    assert node.event(ReplicaEvent("kept", 4), now=0.2) == []
    assert node.turn(0.2 + RETRY_FULL_S - 0.01) == []
    assert node.turn(0.2 + RETRY_FULL_S) == [StepAside(4)]  # still full: aside again
    assert node.turn(5.0) == []  # and nothing more until the election says kept again
    node.event(ReplicaEvent("kept", 4), now=5.0)
    monkeypatch.setattr(epochs_module, "replace_file", real)
    assert node.turn(5.0 + RETRY_FULL_S) == []
    leadership = _leadership(node)
    assert (leadership.epoch, leadership.isr, leadership.fenced) == (4, frozenset({"a", "b"}), False)
    assert node.core.streams["prices"].journal.epochs.latest == 4


def test_a_lead_the_journal_cannot_begin_is_forgotten_once_another_replica_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zeps.journal.epochs as epochs_module  # noqa: PLC0415

    node = _node(tmp_path)

    def broken(_path: Path, _data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(epochs_module, "replace_file", broken)
    assert node.event(ReplicaEvent("lead", 4, "a", ISR), now=0.0) == [StepAside(4)]
    assert node.event(ReplicaEvent("follow", 5, "b", ISR), now=0.5) == [Connect(5, "b")]
    assert node.unled is None and node.turn(10.0) == []

    def eio(_path: Path, _data: bytes) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(epochs_module, "replace_file", eio)
    with pytest.raises(JournalWriteError, match="errno 5"):  # a broken disk: fatal, as for an append
        node.event(ReplicaEvent("lead", 6, "a", ISR), now=11.0)
