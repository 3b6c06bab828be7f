"""The preferred leader (zeps.replication.election, Kafka's preferred-leader election): replicas that
stand before the preferred one in line step aside once it is in sync, a leader last, handing it the
next epoch; nobody moves while it is out of sync or out of line; a lead that nobody took is kept.
ZooKeeper is a dict here (watches and timers are fired by hand); the simulation runs the same rules
under seeded faults (``Options.preferred``) and tests/integration/test_replication_roll.py on real
brokers."""

from __future__ import annotations

from typing import Any

from electionzk import PATHS, Nodes
from zeps.replication import election as zk
from zeps.replication.election import PREFER_CHECKS, Election, ReplicaEvent, ReplicationState, election_replica

Line = dict[str, tuple[Election, list[ReplicaEvent]]]


def _line(nodes: Nodes, *names: str, preferred: str = "a", isr: frozenset[str] | None = None,
          caught_up: bool = True) -> Line:  # fmt: skip
    """Replicas ``names`` in line in that order, each preferring ``preferred``; the first leads epoch 1
    with ``isr`` (all of them by default) in sync; ``caught_up``: what its broker says of followers."""
    out: Line = {}
    for name in names:
        events: list[ReplicaEvent] = []
        machine = Election(PATHS, name, "run1", events.append, preferred=preferred, caught_up=lambda _: caught_up)
        nodes.run(machine.start())
        out[name] = (machine, events)
    leader = out[names[0]][0]
    assert leader.led == 1
    nodes.data[PATHS.replication_state] = (ReplicationState(1, names[0], isr or frozenset(names)).encode(), 1)
    return out


def _order(nodes: Nodes) -> list[str]:
    prefix = PATHS.election + "/"
    children = [p[len(prefix) :] for p in nodes.data if p.startswith(prefix)]
    return [election_replica(n) for n in sorted(children, key=lambda n: int(n.rsplit("-", 1)[1]))]


def _look(nodes: Nodes, machine: Election, times: int = PREFER_CHECKS) -> None:
    for _ in range(times):
        nodes.run(machine.timer("prefer"))


def test_a_leader_gives_the_lead_to_the_preferred_replica_next_in_line_which_takes_the_next_epoch() -> None:
    nodes = Nodes()
    line = _line(nodes, "b", "a", "c")
    b, b_events = line["b"]
    _look(nodes, b, PREFER_CHECKS - 1)
    assert b_events[-1].kind == "lead" and _order(nodes) == ["b", "a", "c"]  # a replica just back gets a while
    _look(nodes, b, 1)
    assert b_events[-1] == ReplicaEvent("give-way", 1) and b.giving_way  # its broker confirms nothing more
    assert _order(nodes) == ["a", "c", "b"]
    a, a_events = line["a"]
    nodes.run(a.watched("predecessor"))  # its watch fires: first, in sync: it takes the next epoch
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader) == (2, "a")
    assert a_events[-1].kind == "lead"
    nodes.run(b.watched("state"))
    assert b_events[-1] == ReplicaEvent("follow", 2, "a", state.isr) and not b.giving_way and b.led == 0
    _look(nodes, a, 5)  # the preferred replica itself never steps aside
    assert _order(nodes) == ["a", "c", "b"] and a.led == 2


def test_a_follower_before_the_preferred_replica_steps_behind_it_first_then_the_leader_gives_way() -> None:
    nodes = Nodes()
    line = _line(nodes, "b", "c", "a")
    b, b_events = line["b"]
    c, c_events = line["c"]
    _look(nodes, b, 3)  # c stands between: the leader waits
    assert b_events[-1].kind == "lead" and _order(nodes) == ["b", "c", "a"]
    _look(nodes, c)
    assert _order(nodes) == ["b", "a", "c"] and not any(e.kind == "give-way" for e in c_events)
    _look(nodes, b)
    assert b_events[-1] == ReplicaEvent("give-way", 1) and _order(nodes) == ["a", "c", "b"]


def test_nobody_steps_aside_while_the_preferred_replica_is_out_of_sync_or_out_of_line() -> None:
    nodes = Nodes()
    line = _line(nodes, "b", "a", "c", isr=frozenset({"b", "c"}))
    b, b_events = line["b"]
    _look(nodes, b, 4)
    assert b_events[-1].kind == "lead" and _order(nodes) == ["b", "a", "c"]
    a, _ = line["a"]
    nodes.run(a.stop())  # in sync, but stopping: not in line
    nodes.data[PATHS.replication_state] = (ReplicationState(1, "b", frozenset({"a", "b", "c"})).encode(), 2)
    _look(nodes, b, 4)
    assert b_events[-1].kind == "lead" and _order(nodes) == ["b", "c"]


def test_a_leader_keeps_the_lead_while_the_preferred_replica_lags_though_listed_in_sync() -> None:
    """A follower whose volume is full stays in the in-sync set until it lags long enough, and could
    not write the epoch it would lead: chaos found a leader giving way to one (its broker then failed)."""
    nodes = Nodes()
    line = _line(nodes, "b", "a", caught_up=False)
    b, b_events = line["b"]
    _look(nodes, b, 4)
    assert b_events[-1].kind == "lead" and not b.giving_way and _order(nodes) == ["b", "a"]


def test_a_lead_given_way_that_nobody_takes_is_kept_in_the_same_epoch() -> None:
    nodes = Nodes()
    line = _line(nodes, "b", "a")
    b, b_events = line["b"]
    _look(nodes, b)
    assert b_events[-1] == ReplicaEvent("give-way", 1) and _order(nodes) == ["a", "b"]
    a, _ = line["a"]
    nodes.run(a.stop())  # gone before its watch fired
    nodes.run(b.watched("predecessor"))
    assert b_events[-1] == ReplicaEvent("kept", 1) and not b.giving_way and b.led == 1
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader) == (1, "b")


class _LosesOneDelete(Nodes):
    """A ZooKeeper whose answer to the first Delete is lost after it was applied (or before)."""

    def __init__(self, *, applied: bool) -> None:
        super().__init__()
        self.applied, self.armed = applied, False

    def _execute(self, op: zk.Op) -> Any:
        if self.armed and isinstance(op, zk.Delete):
            self.armed = False
            if self.applied:
                super()._execute(op)
            raise zk.ConnectionLossError(op.path)
        return super()._execute(op)


def test_a_give_way_whose_delete_answer_was_lost_leaves_its_old_place_all_the_same() -> None:
    """Its new place is made first; an old one still standing after a lost answer is a leftover, which
    the look that follows deletes (else it would stand before the preferred replica for ever)."""
    for applied in (True, False):
        nodes = _LosesOneDelete(applied=applied)
        line = _line(nodes, "b", "a")
        b, b_events = line["b"]
        nodes.armed = True
        _look(nodes, b)
        assert _order(nodes) == ["a", "b"]  # one place each: never a second node of b's
        assert b_events[-1] == ReplicaEvent("give-way", 1) and b.giving_way  # the preferred one's watch elects it


class _LosesOneCreate(Nodes):
    """A ZooKeeper whose answer to the first sequential Create is lost after it was applied."""

    armed = False

    def _execute(self, op: zk.Op) -> Any:
        if self.armed and isinstance(op, zk.Create) and op.sequence:
            self.armed = False
            super()._execute(op)
            raise zk.ConnectionLossError(op.path)
        return super()._execute(op)


def test_a_step_aside_whose_new_place_was_made_unseen_keeps_one_place_and_leads_on() -> None:
    nodes = _LosesOneCreate()
    line = _line(nodes, "b", "a")
    b, b_events = line["b"]
    nodes.armed = True
    _look(nodes, b)
    assert _order(nodes) == ["b", "a"]  # the leftover at the back deleted; nothing reported: it never left
    assert b_events[-1].kind == "lead" and not b.giving_way and b.led == 1
    _look(nodes, b)  # the next looks give the lead away
    assert b_events[-1] == ReplicaEvent("give-way", 1) and _order(nodes) == ["a", "b"]


def test_a_leader_that_gave_way_stays_in_sync_so_the_next_failover_has_a_replica_to_elect() -> None:
    """b gives the lead to a, in sync, and stays listed in sync (in line, it holds everything committed):
    a killed before b fetched from it still leaves b eligible. Dropped, as a dead leader is, b would be
    first in line and ineligible, and the stream without a leader (a cluster test's failure fits it)."""
    nodes = Nodes()
    line = _line(nodes, "b", "a", isr=frozenset({"a", "b"}))
    b, b_events = line["b"]
    a, _ = line["a"]
    _look(nodes, b)
    nodes.run(a.watched("predecessor"))
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader, state.isr) == (2, "a", frozenset({"a", "b"}))
    nodes.run(b.watched("state"))
    assert b_events[-1] == ReplicaEvent("follow", 2, "a", frozenset({"a", "b"}))
    nodes.run(a.session("lost"))  # a dies: its session's end takes its place in line
    del nodes.data[next(p for p in nodes.data if "/election/a~" in p)]
    nodes.run(b.watched("predecessor"))
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader, state.isr) == (3, "b", frozenset({"b"}))
    assert b_events[-1] == ReplicaEvent("lead", 3, "b", frozenset({"b"}))


def test_a_replica_that_is_the_preferred_one_or_names_none_never_looks() -> None:
    nodes = Nodes()
    events: list[ReplicaEvent] = []
    mine = Election(PATHS, "a", "run1", events.append, preferred="a")
    none = Election(PATHS, "b", "run1", events.append)
    assert mine.preferred is None and none.preferred is None
    ops: list[zk.Op] = []
    zk.drive(mine.start(), lambda op: ops.append(op) or nodes._execute(op))
    assert not any(isinstance(op, zk.Schedule) and op.name == "prefer" for op in ops)


def test_a_replica_elected_that_cannot_lead_steps_aside_in_sync_and_the_next_takes_the_lead() -> None:
    """Its broker could not begin the epoch (a full volume, ``StepAside``): to the back of the line, still
    listed in sync (it holds everything committed and confirmed nothing in the epoch), and the next in
    line takes the next epoch; it then follows."""
    nodes = Nodes()
    line = _line(nodes, "b", "a", preferred="z")
    b, b_events = line["b"]
    a, a_events = line["a"]
    nodes.run(b.step_aside(1))
    assert _order(nodes) == ["a", "b"] and b.giving_way
    nodes.run(a.watched("predecessor"))
    state = nodes.state()
    assert state is not None and (state.epoch, state.leader, state.isr) == (2, "a", frozenset({"a", "b"}))
    assert a_events[-1].kind == "lead"
    nodes.run(b.watched("state"))
    assert b_events[-1] == ReplicaEvent("follow", 2, "a", frozenset({"a", "b"})) and b.led == 0
    nodes.run(b.step_aside(1))  # an old epoch's: nothing
    assert _order(nodes) == ["a", "b"]


def test_a_replica_that_cannot_lead_and_stands_alone_in_line_is_told_kept_so_its_broker_tries_again() -> None:
    nodes = Nodes()
    line = _line(nodes, "b", preferred="z")
    b, b_events = line["b"]
    nodes.run(b.step_aside(1))
    assert b_events[-1] == ReplicaEvent("kept", 1) and not b.giving_way and b.led == 1 and _order(nodes) == ["b"]
