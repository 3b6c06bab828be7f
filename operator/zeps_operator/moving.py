"""Moving a replica of a replicated stream to another node, its copy rebuilt there, never fewer copies
in between: add a copy first, wait for it in sync, then rebuild the one moved, then remove the extra.

Asked by annotating the ZepsStream with the pod to move (``zeps.dev/move-replica: prices-broker-1``);
the node it leaves should be cordoned first (the scheduler then places the new copy elsewhere). The
phases, each a pass of the operator (Strimzi's and Kafka's reassignments add the new replica before
they drop the old one, for the same reason):

1. ``adding``: the broker set runs one replica more than ``spec.replicas`` (the next ordinal), which
   copies the stream from the leader; wait until it is in the in-sync set, and until the in-sync set
   without the replica moved still holds ``minInSync``.
2. ``rebuilding``: the moved replica's journal claim is deleted, then its pod (a leader hands its lead
   over as it stops); the StatefulSet makes both again, the claim bound where the scheduler places
   the pod. A pod made again before the old claim was gone waits on that claim forever: it is deleted
   once more.
3. ``settling``: wait for the rebuilt replica to be back in the in-sync set (all of the stream copied).
4. ``removing``: the set goes back to ``spec.replicas``, through the guarded scale-down
   (:func:`zeps_operator.roll.scale_down`: the replicas that stay must be in sync first), and the
   extra replica's claim is deleted once its pod is gone. Then the move is done: the annotation is
   removed, an event says where the replica went.

Pure: the handlers read the pods, claims and replication state, and do what the step says.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MOVE_ANNOTATION", "MoveFacts", "MoveStep", "journal_claim", "plan_move"]

#: annotate a replicated ZepsStream with one of its broker pods to move that replica (see above)
MOVE_ANNOTATION = "zeps.dev/move-replica"

PHASES = ("adding", "rebuilding", "settling", "removing")


def journal_claim(pod: str) -> str:
    """The journal claim of a broker pod of a StatefulSet (its claim template is named ``journal``)."""
    return f"journal-{pod}"


@dataclass(frozen=True)
class MoveFacts:
    """What a pass of the move sees: the set's replicas wanted and running, its members by ordinal (as
    many as it runs), the in-sync set (None without replication state), the moved pod's node and
    whether it exists, is ready, stopping, or waits for its claim; the moved claim's uid (None: gone)
    and whether it is being deleted; whether the extra replica's pod still exists."""

    replicas: int
    running: int
    members: Sequence[str]
    isr: frozenset[str] | None
    min_insync: int
    pod_exists: bool
    pod_ready: bool
    pod_stopping: bool
    claim_uid: str | None
    claim_deleting: bool
    extra_pod_exists: bool


@dataclass(frozen=True)
class MoveStep:
    """``phase`` after this pass ("" once done or refused); ``surge``: replicas the set runs beyond
    ``spec.replicas`` now (1 from adding to settling); ``delete_claim`` / ``delete_pod``: what to
    delete now; ``old_claim``: the uid of the claim being replaced (kept in status across passes);
    ``waiting``: what it waits for; ``refused``: why the move is not made (the annotation stays, the
    condition says so); ``done``: it completed in this pass."""

    phase: str
    surge: int = 0
    delete_claim: str | None = None
    delete_pod: str | None = None
    old_claim: str = ""
    waiting: str = ""
    refused: str = ""
    done: bool = False


def plan_move(asked: str, phase: str, old_claim: str, facts: MoveFacts) -> MoveStep:
    """The next step of moving replica ``asked`` (a pod name), in ``phase`` ("" when not begun), the
    claim being replaced ``old_claim`` (its uid, once deleted)."""
    members, wanted = list(facts.members), facts.replicas
    if phase not in ("", *PHASES):
        phase = ""
    if asked not in members[:wanted]:
        listed = ", ".join(members[:wanted]) or "none yet"
        return MoveStep("", refused=f"{asked!r} is not a replica of this broker set (its replicas: {listed})")
    extra = f"{asked.rsplit('-', 1)[0]}-{wanted}"
    isr = facts.isr
    if phase in ("", "adding"):
        if isr is None:
            return MoveStep("adding", surge=1, waiting="the replication state")
        if extra not in isr:
            return MoveStep("adding", surge=1, waiting=f"{extra}, the extra copy, to catch up")
        left = isr - {asked}
        if len(left) < facts.min_insync:
            return MoveStep("adding", surge=1, waiting=f"{len(left)} in sync without {asked}, fewer than minInSync "
                            f"{facts.min_insync}")  # fmt: skip
        if facts.claim_uid is None:
            return MoveStep("adding", surge=1, waiting=f"{journal_claim(asked)} to exist")
        return MoveStep("rebuilding", surge=1, delete_claim=journal_claim(asked), delete_pod=asked,
                        old_claim=facts.claim_uid, waiting=f"{asked} rebuilt on a new volume")  # fmt: skip
    if phase == "rebuilding":
        if facts.claim_uid is not None and facts.claim_uid != old_claim and not facts.claim_deleting:
            return MoveStep("settling", surge=1, old_claim=old_claim, waiting=f"{asked} to copy the stream")
        if facts.pod_exists and not facts.pod_stopping and facts.claim_uid == old_claim:
            # made again while the old claim was still there: it would wait on that claim for good
            return MoveStep("rebuilding", surge=1, delete_pod=asked, old_claim=old_claim,
                            waiting=f"{asked} made again after its old volume is gone")  # fmt: skip
        return MoveStep("rebuilding", surge=1, old_claim=old_claim, waiting=f"{asked} rebuilt on a new volume")
    if phase == "settling":
        if isr is None or asked not in isr or not facts.pod_ready:
            return MoveStep("settling", surge=1, old_claim=old_claim, waiting=f"{asked} to copy the stream")
        return MoveStep("removing", waiting=f"{extra}, the extra copy, to go")
    # removing: the guarded scale-down takes the set back to spec.replicas
    if facts.running > wanted or facts.extra_pod_exists:
        return MoveStep("removing", waiting=f"{extra}, the extra copy, to go")
    return MoveStep("", delete_claim=journal_claim(extra), done=True)
