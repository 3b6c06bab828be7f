"""A stream that never held data (the replication state's ``data``): an empty replica loses nothing
by leading it and stays in its in-sync set, and its leader records ``data`` before it first counts a
record committed. ZooKeeper is a dict here (:class:`electionzk.Nodes`);
the deterministic simulation runs the same rules under faults (seeds 20464 and 32596 left such a
stream with no replica that might lead, before ``data``)."""

from __future__ import annotations

from electionzk import PATHS, Nodes
from zeps.replication.election import Election, ReplicaEvent, ReplicationState
from zeps.replication.isr import Leadership


def _machine(nodes: Nodes, name: str, *, empty: bool) -> tuple[Election, list[ReplicaEvent]]:
    events: list[ReplicaEvent] = []
    machine = Election(PATHS, name, "run1", events.append, empty=lambda: empty)
    nodes.run(machine.start())
    return machine, events


def test_a_new_stream_s_first_leader_writes_a_state_without_data() -> None:
    nodes = Nodes()
    _, events = _machine(nodes, "r0", empty=True)
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader, state.data) == (1, "r0", False)
    assert events[-1] == ReplicaEvent("lead", 1, "r0", frozenset({"r0"}), data=False)


def test_an_empty_replica_of_a_stream_without_data_stays_in_sync_and_may_lead() -> None:
    """Every replica restarted empty (nothing was ever committed): the first in line leads."""
    nodes = Nodes()
    nodes.data[PATHS.replication_state] = (ReplicationState(3, "r0", frozenset({"r0"}), data=False).encode(), 0)
    _, events = _machine(nodes, "r1", empty=True)  # not even in the set: nothing committed, nothing to lose
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader, state.isr, state.data) == (4, "r1", {"r1"}, False)
    assert events[-1].kind == "lead"


def test_an_empty_replica_of_a_stream_with_data_leaves_the_set_and_may_not_lead() -> None:
    nodes = Nodes()
    nodes.data[PATHS.replication_state] = (ReplicationState(3, "r0", frozenset({"r0", "r1"})).encode(), 0)
    _, events = _machine(nodes, "r1", empty=True)
    state = nodes.state()
    assert state is not None and (state.epoch, state.isr, state.data) == (3, {"r0"}, True)
    assert not any(e.kind == "lead" for e in events)


def test_mark_data_is_conditional_on_the_epoch_and_reported() -> None:
    nodes = Nodes()
    machine, events = _machine(nodes, "r0", empty=True)
    nodes.run(machine.mark_data(2))  # not its epoch: nothing
    state = nodes.state()
    assert state is not None and not state.data
    nodes.run(machine.mark_data(1))
    state = nodes.state()
    assert state is not None and state.data and state.isr == {"r0"}
    assert events[-1] == ReplicaEvent("isr", 1, "r0", frozenset({"r0"}), data=True)
    nodes.run(machine.write_isr(1, frozenset({"r0", "r1"})))  # an in-sync set written later keeps it
    state = nodes.state()
    assert state is not None and state.data and state.isr == {"r0", "r1"}


def test_a_state_without_data_counts_as_holding_data_and_a_bad_one_is_refused() -> None:
    old = b'{"version": 1, "epoch": 2, "leader": "r0", "isr": ["r0", "r1"]}'
    state = ReplicationState.decode(old)
    assert state is not None and state.data
    assert ReplicationState.decode(b'{"version": 1, "epoch": 2, "leader": "r0", "isr": [], "data": "no"}') is None


def test_a_leader_commits_nothing_until_zookeeper_holds_data_and_asks_for_it_once_a_retry() -> None:
    leader = Leadership.begin("a", 1, frozenset({"a", "b"}), min_insync=2, commit=0, log_end=0, now=0.0, data=False,
                              retry_s=2.0)  # fmt: skip
    assert not leader.data_wanted(0, now=0.0)  # nothing to commit yet: nothing to ask
    leader.fetched("b", 10, 10, now=0.5)
    assert leader.advance(10) == 0
    assert leader.data_wanted(10, now=0.5)
    assert not leader.data_wanted(10, now=1.5)  # asked: not again before retry_s
    assert leader.data_wanted(10, now=2.6)  # no answer: asked again
    leader.data = True  # ZooKeeper holds it (the core sets it from the ``isr`` event)
    assert leader.advance(10) == 10
    assert not leader.data_wanted(20, now=9.0)
