"""Moving a replica (zeps_operator.moving): each phase's decision as a pure function of what a pass
sees, and a whole move walked through, with the invariant checked at every step: the replicas in
sync other than the one being rebuilt never fall below minInSync once its volume is deleted."""

from __future__ import annotations

from dataclasses import replace

from zeps_operator.moving import MoveFacts, MoveStep, journal_claim, plan_move

MEMBERS = ["s-broker-0", "s-broker-1", "s-broker-2", "s-broker-3"]


def _facts(**changes: object) -> MoveFacts:
    base = MoveFacts(replicas=3, running=3, members=MEMBERS, isr=frozenset(MEMBERS[:3]), min_insync=2,
                     pod_exists=True, pod_ready=True, pod_stopping=False, claim_uid="old", claim_deleting=False,
                     extra_pod_exists=False)  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_replica_that_is_not_one_of_the_set_is_refused_and_nothing_changes() -> None:
    for asked in ("s-broker-3", "s-broker-9", "other-broker-0"):
        step = plan_move(asked, "", "", _facts())
        assert step.refused and step.surge == 0 and step.delete_claim is None and step.delete_pod is None, step
    assert "its replicas: s-broker-0, s-broker-1, s-broker-2" in plan_move("s-broker-9", "", "", _facts()).refused


def test_the_copy_comes_first_and_the_volume_goes_only_once_it_is_in_sync() -> None:
    step = plan_move("s-broker-1", "", "", _facts())
    assert (step.phase, step.surge, step.delete_claim) == ("adding", 1, None) and "s-broker-3" in step.waiting
    running = _facts(running=4, extra_pod_exists=True)
    assert plan_move("s-broker-1", "adding", "", running).delete_claim is None  # the copy not in sync yet
    # in sync, but without the moved replica fewer than minInSync would be: wait
    thin = replace(running, isr=frozenset({"s-broker-1", "s-broker-3"}))
    step = plan_move("s-broker-1", "adding", "", thin)
    assert step.delete_claim is None and "fewer than minInSync 2" in step.waiting, step
    ready = replace(running, isr=frozenset(MEMBERS))
    step = plan_move("s-broker-1", "adding", "", ready)
    assert step == MoveStep("rebuilding", surge=1, delete_claim=journal_claim("s-broker-1"), delete_pod="s-broker-1",
                            old_claim="old", waiting="s-broker-1 rebuilt on a new volume")  # fmt: skip


def test_a_pod_made_again_on_its_old_claim_is_deleted_again_and_a_new_claim_moves_on() -> None:
    during = _facts(running=4, isr=frozenset({"s-broker-0", "s-broker-2", "s-broker-3"}), extra_pod_exists=True)
    waiting = plan_move("s-broker-1", "rebuilding", "old", replace(during, pod_exists=False, claim_deleting=True))
    assert waiting.delete_pod is None and waiting.phase == "rebuilding"
    stuck = plan_move("s-broker-1", "rebuilding", "old", replace(during, claim_deleting=True, pod_ready=False))
    assert stuck.delete_pod == "s-broker-1" and stuck.delete_claim is None, stuck
    rebuilt = plan_move("s-broker-1", "rebuilding", "old", replace(during, claim_uid="new", pod_ready=False))
    assert (rebuilt.phase, rebuilt.surge, rebuilt.delete_pod) == ("settling", 1, None)


def test_the_extra_copy_goes_only_after_the_rebuilt_replica_is_in_sync_and_its_claim_last() -> None:
    during = _facts(running=4, claim_uid="new", extra_pod_exists=True)
    behind = replace(during, isr=frozenset({"s-broker-0", "s-broker-2", "s-broker-3"}))
    assert plan_move("s-broker-1", "settling", "old", behind).surge == 1
    caught_up = replace(during, isr=frozenset(MEMBERS))
    removing = MoveStep("removing", waiting="s-broker-3, the extra copy, to go")
    assert plan_move("s-broker-1", "settling", "old", caught_up) == removing
    assert not plan_move("s-broker-1", "removing", "old", caught_up).done  # the scale-down not done yet
    gone = replace(caught_up, running=3, extra_pod_exists=False)
    assert plan_move("s-broker-1", "removing", "old", gone) == MoveStep(
        "", delete_claim="journal-s-broker-3", done=True
    )


def test_a_whole_move_never_leaves_fewer_than_min_insync_beside_the_replica_rebuilt() -> None:
    """The operator's passes against a world that reacts as Kubernetes and the brokers would, between
    passes: a deleted claim goes once no pod uses it; a missing pod is made again by the StatefulSet
    (the first time while its old claim is still there, so it waits on that claim); a missing claim
    is made with the pod; a replica on a live claim is in sync one pass after it starts; the set runs
    what the step's surge says (the scale-down of the extra copy takes a pass)."""
    facts, phase, old = _facts(), "", ""
    claim, pod, raced, deleted = "old", "old", False, False  # the moved replica's claim and the claim its pod uses
    phases = []
    for _ in range(40):
        step = plan_move("s-broker-1", phase, old, facts)
        phases.append(step.phase)
        if step.done:
            break
        phase, old = step.phase, step.old_claim or old
        isr = set(facts.isr or ())
        if step.delete_claim:
            claim, deleted = claim + "-deleting", True
        if step.delete_pod:
            pod = ""
            isr.discard("s-broker-1")
        # the world, between passes
        if pod == "":
            if claim == "old-deleting":
                claim = "none"
            if claim == "none" and not raced:  # made again before the old claim was gone (once)
                claim, raced = "old-deleting", True
            elif claim == "none":
                claim = "new"
            pod = claim.removesuffix("-deleting")
        elif pod == "new":
            isr.add("s-broker-1")
        running = facts.replicas + step.surge if step.surge or phase != "removing" else facts.replicas
        if facts.running == 4:
            isr.add("s-broker-3")
        if running == 3:
            isr.discard("s-broker-3")
        facts = replace(facts, isr=frozenset(isr), running=running, extra_pod_exists=running == 4, pod_exists=pod != "",
                        pod_ready=pod == "new" or (pod == "old" and "s-broker-1" in isr),
                        claim_uid=None if claim == "none" else claim.removesuffix("-deleting"),
                        claim_deleting=claim.endswith("-deleting"))  # fmt: skip
        if deleted:
            assert len(facts.isr - {"s-broker-1"}) >= facts.min_insync, (phases, facts)  # type: ignore[operator]
    else:
        raise AssertionError(f"the move never ended: {phases}")
    assert raced, "the world never made the pod again on its old claim"
    assert [p for i, p in enumerate(phases) if p and p != phases[i - 1]] == ["adding", "rebuilding", "settling",
                                                                              "removing"], phases  # fmt: skip
