"""A data-aware roll of a replicated stream's broker pods: which pod to restart next, or why none yet.

A replicated stream's StatefulSet updates its pods ``OnDelete``: a new template (image, resources,
settings) changes nothing until the operator deletes a pod, one at a time, in the order this module
decides (Strimzi's KafkaRoller and RabbitMQ's ``await_online_quorum_plus_one`` are the models):

* a pod that is stopping: wait for it (one pod at a time);
* a pod of the old template that is not ready serves nothing: it goes first;
* a pod of the new template that is not back in the in-sync set yet: wait for it (a restarted
  replica is Ready long before it has caught up);
* then the old pods, followers first and the leader last (its broker hands the lead over as it
  stops: :meth:`zeps.broker.server.BrokerServer.hand_over`), never one whose restart would leave
  fewer than ``minInSync`` replicas in sync: that blocks the roll, said in status, until another
  replica is back in sync.

Pure: the handlers read the pods, the StatefulSet and the replication state, and delete the pod named.

**Scaling down** (:func:`scale_down`) is guarded the same way: the StatefulSet keeps its replicas
until every replica that stays (the lowest ordinals) is in the in-sync set and runs the settings
wanted now (a lower ``minInSync`` first reaches them through the roll, while every replica runs);
only then are the highest ordinals removed, each stopping leader handing its lead to one that stays.
So no record only the removed replicas held is lost, and the replicas left never wait for
``minInSync`` replicas that are gone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CONFIG_ANNOTATION", "RollPod", "RollStep", "ScaleDown", "next_step", "scale_down"]


#: the digest of a broker's settings (its ConfigMap) on its pod template: a change of them restarts it
CONFIG_ANNOTATION = "zeps.dev/config-digest"


@dataclass(frozen=True)
class RollPod:
    name: str
    current: bool  #: of the StatefulSet's update revision (its template now)
    ready: bool
    stopping: bool  #: deletion asked (it has a deletionTimestamp)
    config: str = ""  #: the digest of the settings it started with (its zeps.dev/config-digest)
    node: str = ""  #: the node it was placed on ("" while not scheduled)
    uid: str = ""  #: this pod's (a pod made again under the same name has another)


@dataclass(frozen=True)
class RollStep:
    """``delete``: the pod to restart now; else ``waiting`` (for what, or why blocked) or done."""

    delete: str | None = None
    waiting: str | None = None
    blocked: bool = False  #: waiting because a restart would leave fewer than minInSync in sync
    pending: tuple[str, ...] = ()  #: the pods of the old template still

    @property
    def done(self) -> bool:
        return self.delete is None and self.waiting is None


def _ordinal(name: str) -> int:
    match = re.search(r"-(\d+)$", name)
    return int(match.group(1)) if match else -1


def next_step(pods: Sequence[RollPod], *, leader: str | None, isr: frozenset[str] | None, min_insync: int) -> RollStep:
    """What to do now for ``pods`` (``leader`` and ``isr``: the replication state, None without one)."""
    old = tuple(sorted((p.name for p in pods if not p.current), key=_ordinal, reverse=True))
    if not old:
        return RollStep()
    stopping = [p.name for p in pods if p.stopping]
    if stopping:
        return RollStep(waiting=f"{', '.join(sorted(stopping))} stopping", pending=old)
    unready_old = [p.name for p in pods if not p.current and not p.ready]
    if unready_old:
        return RollStep(delete=sorted(unready_old, key=_ordinal, reverse=True)[0], pending=old)
    unready = [p.name for p in pods if not p.ready]
    if unready:
        return RollStep(waiting=f"{', '.join(sorted(unready))} to be ready", pending=old)
    if isr is None:  # no replication state yet (a new stream): nothing to protect
        return RollStep(delete=old[0], pending=old)
    behind = sorted(p.name for p in pods if p.current and p.name not in isr)
    if behind:
        return RollStep(waiting=f"{', '.join(behind)} back in sync", pending=old)
    candidates = [name for name in old if name != leader] + [name for name in old if name == leader]
    refused = []
    for name in candidates:
        left = isr - {name}
        if name in isr and len(left) < min_insync:
            refused.append(f"restarting {name} would leave {len(left)} in sync ({', '.join(sorted(left)) or 'none'}), "
                           f"fewer than minInSync {min_insync}")  # fmt: skip
            continue
        return RollStep(delete=name, pending=old)
    return RollStep(waiting=refused[0] + ": waiting for another replica to be back in sync", blocked=True, pending=old)


@dataclass(frozen=True)
class ScaleDown:
    """The replicas a broker set runs now, and (while that is more than wanted) what it waits for."""

    replicas: int
    waiting: str | None = None


def scale_down(running: int, wanted: int, members: Sequence[str], pods: Sequence[RollPod], *,
               isr: frozenset[str] | None, config: str) -> ScaleDown:  # fmt: skip
    """Whether a broker set running ``running`` replicas (``members``, by ordinal) may go down to
    ``wanted``: once every replica that stays is in sync (``isr``) and runs the settings ``config``
    (the digest its pods' template has now). Growing, or staying, needs no wait."""
    if wanted >= running:
        return ScaleDown(wanted)
    staying = list(members[:wanted])
    if isr is None:
        return ScaleDown(running, f"scaling down to {wanted}: no replication state yet")
    out = [m for m in staying if m not in isr]
    if out:
        return ScaleDown(running, f"scaling down to {wanted}: {', '.join(out)} not in sync (the replicas that stay "
                         "must hold every record first)")  # fmt: skip
    runs = {p.name: p for p in pods}
    stale = [m for m in staying if m not in runs or runs[m].config != config]
    if stale:
        return ScaleDown(running, f"scaling down to {wanted}: {', '.join(stale)} restarting with the new settings "
                         "(minInSync) first")  # fmt: skip
    return ScaleDown(wanted)
