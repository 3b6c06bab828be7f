"""The data-aware roll's decisions (zeps_operator.roll): which broker pod the operator restarts next,
and when a broker set may go down to fewer replicas."""

from __future__ import annotations

from zeps_operator.roll import RollPod, RollStep, ScaleDown, next_step, scale_down

ALL = frozenset({"s-0", "s-1", "s-2"})


def _pods(current: set[str] = frozenset(), unready: set[str] = frozenset(), stopping: set[str] = frozenset()
          ) -> list[RollPod]:  # fmt: skip
    return [RollPod(n, n in current, n not in unready, n in stopping) for n in ("s-0", "s-1", "s-2")]


def test_followers_go_first_the_leader_last_one_at_a_time() -> None:
    order = []
    current: set[str] = set()
    for _ in range(3):
        step = next_step(_pods(current), leader="s-1", isr=ALL, min_insync=2)
        assert step.delete is not None
        order.append(step.delete)
        assert next_step(_pods(current, stopping={step.delete}), leader="s-1", isr=ALL, min_insync=2).waiting
        current.add(step.delete)  # back, ready and in sync
    assert order == ["s-2", "s-0", "s-1"]
    assert next_step(_pods(current), leader="s-0", isr=ALL, min_insync=2).done


def test_a_restarted_replica_must_be_back_in_sync_not_only_ready() -> None:
    step = next_step(_pods({"s-2"}), leader="s-1", isr=frozenset({"s-0", "s-1"}), min_insync=2)
    assert step == RollStep(waiting="s-2 back in sync", pending=("s-1", "s-0"))
    step = next_step(_pods({"s-2"}, unready={"s-2"}), leader="s-1", isr=ALL, min_insync=2)
    assert step.waiting == "s-2 to be ready"


def test_a_restart_that_would_leave_fewer_than_min_in_sync_blocks_the_roll() -> None:
    """s-2 is out of sync and not restarted yet: it may go (it counts for nothing), but after it
    neither s-0 nor s-1 may, until s-2 is back in sync."""
    isr = frozenset({"s-0", "s-1"})
    assert next_step(_pods(), leader="s-1", isr=isr, min_insync=2).delete == "s-2"
    step = next_step(_pods({"s-2"}), leader="s-1", isr=isr, min_insync=2)
    assert step.waiting == "s-2 back in sync" and not step.blocked
    only_two = [RollPod("s-0", False, True, False), RollPod("s-1", False, True, False)]
    step = next_step(only_two, leader="s-1", isr=frozenset({"s-0", "s-1"}), min_insync=2)
    assert step.blocked and step.delete is None
    assert (
        step.waiting is not None
        and "restarting s-0 would leave 1 in sync (s-1), fewer than minInSync 2" in step.waiting
    )


def test_an_old_pod_that_is_not_ready_goes_first_and_a_stream_without_state_rolls_freely() -> None:
    step = next_step(_pods(unready={"s-0"}), leader="s-0", isr=ALL, min_insync=2)
    assert step.delete == "s-0"
    assert next_step(_pods(), leader=None, isr=None, min_insync=2).delete == "s-2"


def _configured(config: dict[str, str]) -> list[RollPod]:
    return [RollPod(n, True, True, False, c) for n, c in config.items()]


MEMBERS = ["s-0", "s-1", "s-2"]


def test_a_broker_set_goes_down_only_once_the_replicas_that_stay_are_in_sync_with_the_new_settings() -> None:
    """3 -> 1: the StatefulSet keeps 3 while s-0, the one that stays, is out of sync, or still runs
    the old minInSync (or has no pod); then 1. Growing, or the same, needs no wait."""
    new = _configured({"s-0": "new", "s-1": "new", "s-2": "old"})
    out = scale_down(3, 1, MEMBERS, new, isr=frozenset({"s-1", "s-2"}), config="new")
    assert out.replicas == 3 and out.waiting is not None and "s-0 not in sync" in out.waiting
    stale = scale_down(3, 1, MEMBERS, _configured({"s-0": "old", "s-1": "new", "s-2": "new"}), isr=ALL, config="new")
    assert stale.replicas == 3 and stale.waiting is not None and "s-0 restarting with the new settings" in stale.waiting
    missing = scale_down(3, 1, MEMBERS, _configured({"s-1": "new"}), isr=ALL, config="new")
    assert missing.replicas == 3  # no pod of s-0 at all: not known to run the new settings
    assert scale_down(3, 1, MEMBERS, new, isr=ALL, config="new") == ScaleDown(1)
    assert scale_down(3, 2, MEMBERS, new, isr=frozenset({"s-0", "s-1"}), config="new") == ScaleDown(2)  # s-2 leaves
    assert scale_down(3, 2, MEMBERS, new, isr=None, config="new").replicas == 3  # no state: nothing known yet
    assert scale_down(1, 3, MEMBERS[:1], [], isr=None, config="new") == ScaleDown(3)
    assert scale_down(3, 3, MEMBERS, [], isr=None, config="new") == ScaleDown(3)
