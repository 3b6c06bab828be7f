"""A replica's controlled shutdown in the election machine (zeps.replication.election.Election.resign):
which replica leaves the line, which leader hands over and which stays, which follower leaves the
in-sync set. ZooKeeper is a dict here (the machine speaks in operations, not in sockets); the
machine runs on a real ZooKeeper in tests/integration/test_replication_roll.py and under seeded
faults in tests/simulation (the ``stop`` fault)."""

from __future__ import annotations

from electionzk import PATHS, Nodes
from zeps.replication.election import Election, ReplicaEvent, ReplicationState


def _line(nodes: Nodes, *names: str) -> dict[str, tuple[Election, list[ReplicaEvent]]]:
    """Replicas ``names`` in line in that order; the first leads epoch 1 with all of them in sync."""
    out: dict[str, tuple[Election, list[ReplicaEvent]]] = {}
    for name in names:
        events: list[ReplicaEvent] = []
        machine = Election(PATHS, name, "run1", events.append)
        nodes.run(machine.start())
        out[name] = (machine, events)
    leader = out[names[0]][0]
    nodes.data[PATHS.replication_state] = (ReplicationState(leader.led, names[0], frozenset(names)).encode(), 1)
    return out


def test_a_leader_resigns_only_with_an_in_sync_replica_in_line_and_the_next_takes_the_next_epoch() -> None:
    nodes = Nodes()
    line = _line(nodes, "a", "b", "c")
    a, a_events = line["a"]
    assert a.led == 1
    nodes.run(a.resign(2))
    assert a_events[-1] == ReplicaEvent("resigned", 1)
    assert not any(p.rsplit("/", 1)[1].startswith("a~") for p in nodes.data if p.startswith(PATHS.election + "/"))
    b, b_events = line["b"]
    nodes.run(b.watched("predecessor"))  # its watch fires: it is first now, and in sync
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader) == (2, "b") and "a" not in state.isr
    assert b_events[-1].kind == "lead"
    nodes.run(a.watched("state"))  # the old leader follows the new epoch, and never takes a place again
    assert a_events[-1] == ReplicaEvent("follow", 2, "b", state.isr) and a.node is None
    nodes.run(a.timer("check"))
    assert a.node is None


def test_a_leader_alone_in_line_or_with_only_replicas_out_of_sync_behind_it_stays() -> None:
    nodes = Nodes()
    line = _line(nodes, "a", "b")
    nodes.data[PATHS.replication_state] = (ReplicationState(1, "a", frozenset({"a"})).encode(), 2)  # b out of sync
    a, events = line["a"]
    nodes.run(a.resign(1))
    assert events[-1] == ReplicaEvent("stays", 1) and a.node is not None and a.led == 1


def test_a_follower_leaves_the_line_and_the_in_sync_set_only_if_enough_stay_in_it() -> None:
    nodes = Nodes()
    line = _line(nodes, "a", "b", "c")
    b, events = line["b"]
    nodes.run(b.resign(2))  # three in sync, two needed: it may leave the set
    state = nodes.state()
    assert events[-1] == ReplicaEvent("resigned", 0) and state is not None and state.isr == {"a", "c"}
    c, _ = line["c"]
    nodes.run(c.resign(2))  # two in sync, two needed: it stays in the set (its leader finds it lagging)
    state = nodes.state()
    assert state is not None and state.isr == {"a", "c"} and c.node is None


def test_a_replica_without_a_session_resigns_at_once() -> None:
    nodes = Nodes()
    line = _line(nodes, "a", "b")
    b, events = line["b"]
    nodes.run(b.session("lost"))
    nodes.run(b.resign(1))
    assert events[-1] == ReplicaEvent("resigned", 0)
    nodes.run(b.session("connected"))  # a new session: it takes no place in line
    assert b.node is None
