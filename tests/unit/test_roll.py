"""The data-aware roll's decisions (zeps_operator.roll): which broker pod the operator restarts next."""

from __future__ import annotations

from zeps_operator.roll import RollPod, RollStep, next_step

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
