"""Group membership with a manifest against a real ZooKeeper server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import WorkerProcess, ZooKeeperHarness, until
from zeps.coordination import Group, GroupStatus, Member
from zeps.errors import CoordinationError
from zeps.paths import GroupPaths


def _group(zookeeper: ZooKeeperHarness, **kwargs: object) -> Group:
    paths = GroupPaths(f"{zookeeper.root}/brokers", f"{zookeeper.root}/manifest")
    return Group(zookeeper.client(**kwargs), paths)  # type: ignore[arg-type]


def test_join_update_leave_and_list(zookeeper: ZooKeeperHarness) -> None:
    group = _group(zookeeper)
    with group.join("broker-0", {"endpoint": "tcp://10.0.0.1:5555"}) as me:
        assert me.joined
        members = _group(zookeeper).members()
        assert list(members) == ["broker-0"]
        assert members["broker-0"].metadata == {"endpoint": "tcp://10.0.0.1:5555"}
        assert members["broker-0"].session_id == group.client.client_id[0]
        me.update({"endpoint": "tcp://10.0.0.2:5555"})
        assert group.members()["broker-0"].metadata["endpoint"] == "tcp://10.0.0.2:5555"
    assert group.members() == {}


def test_watch_reports_joined_changed_and_left(zookeeper: ZooKeeperHarness) -> None:
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def record(kind: str) -> Callable[[Member | str], None]:
        def callback(what: Member | str) -> None:
            with lock:
                events.append((kind, what if isinstance(what, str) else what.id))

        return callback

    watcher = _group(zookeeper)
    watch = watcher.watch(on_joined=record("joined"), on_left=record("left"), on_changed=record("changed"))
    other = _group(zookeeper)
    member = other.join("m1", {"v": 1})
    until(lambda: ("joined", "m1") in events, "joined")
    member.update({"v": 2})
    until(lambda: ("changed", "m1") in events, "changed")
    member.leave()
    until(lambda: ("left", "m1") in events, "left")
    assert events == [("joined", "m1"), ("changed", "m1"), ("left", "m1")]
    watch.stop()


def test_rejoins_with_the_same_identity_after_session_expiry(zookeeper: ZooKeeperHarness) -> None:
    group = _group(zookeeper)
    observer = _group(zookeeper)
    member = group.join("phoenix", {"pod": "p-1"})
    first_session = observer.members()["phoenix"].session_id
    zookeeper.expire_session(group.client)
    until(lambda: member.joined, "the member to rejoin")
    again = observer.members()["phoenix"]
    assert again.session_id != first_session and again.session_id == group.client.client_id[0]
    assert again.metadata == {"pod": "p-1"}
    assert member.failure is None


def test_watch_keeps_working_after_its_own_session_expires(zookeeper: ZooKeeperHarness) -> None:
    watcher = _group(zookeeper)
    joined: list[str] = []
    watcher.watch(on_joined=lambda m: joined.append(m.id))
    zookeeper.expire_session(watcher.client)
    _group(zookeeper).join("late")
    until(lambda: joined == ["late"], "a join seen after the watcher's session expired")


def test_join_waits_for_a_crashed_holder_then_takes_over(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    members = f"{zookeeper.root}/brokers"
    holder = WorkerProcess(
        tmp_path, "group_member.py", "holder",
        ["--hosts", zookeeper.connect_string, "--members", members, "--member", "only-one", "--session-timeout", "2"],
    ).start()  # fmt: skip
    holder.kill()  # kill -9: its session lives on until the 2 s timeout

    heir = Group(zookeeper.client(), GroupPaths(members))
    member = heir.join("only-one", takeover_timeout=20)
    assert member.joined
    assert heir.members()["only-one"].session_id == heir.client.client_id[0]


def test_join_refuses_an_id_held_by_a_live_session(zookeeper: ZooKeeperHarness) -> None:
    _group(zookeeper).join("taken")
    with pytest.raises(CoordinationError, match="held by another live session"):
        _group(zookeeper).join("taken", takeover_timeout=0.5)


def test_rogue_and_missing_members_are_reported(zookeeper: ZooKeeperHarness, caplog: pytest.LogCaptureFixture) -> None:
    admin = _group(zookeeper)
    admin.set_manifest(["broker-a", "broker-b"])
    statuses: list[GroupStatus] = []
    caplog.set_level(logging.WARNING, logger="zeps.coordination.group")
    watch = _group(zookeeper).watch(on_status=statuses.append)

    _group(zookeeper).join("broker-a")
    rogue = _group(zookeeper).join("broker-x")
    until(lambda: bool(statuses) and statuses[-1].alive == {"broker-a", "broker-x"}, "both members seen")
    latest = statuses[-1]
    assert latest.rogue == {"broker-x"} and latest.missing == {"broker-b"}
    assert admin.status() == GroupStatus(
        alive=frozenset({"broker-a", "broker-x"}), manifest=frozenset({"broker-a", "broker-b"})
    )
    assert "rogue members (alive, not in the manifest): broker-x" in caplog.text
    assert "missing members (in the manifest, not alive): broker-b" in caplog.text

    # the manifest changes: broker-x becomes legitimate
    admin.set_manifest(["broker-a", "broker-x"])
    until(lambda: statuses[-1].rogue == frozenset() and statuses[-1].missing == frozenset(), "a clean status")
    rogue.leave()
    until(lambda: statuses[-1].missing == {"broker-x"}, "the leaver reported missing")
    assert watch.status().missing == {"broker-x"}


def test_no_manifest_means_nobody_is_rogue(zookeeper: ZooKeeperHarness) -> None:
    group = _group(zookeeper)
    group.join("anyone")
    status = group.status()
    assert status.manifest is None and status.rogue == frozenset() and status.missing == frozenset()
