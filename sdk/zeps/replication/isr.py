"""The leader's view of a replicated stream: the in-sync set and the commit point (no sockets, no
ZooKeeper: it takes ``now`` and the followers' fetches, and says what to write).

The design is Kafka's (in-sync replicas, a high watermark, leader epochs) with the refinements its
bugs taught (KIP-101 and KIP-279: epochs instead of the high watermark to cut a returning replica's
log, in :mod:`zeps.replication.follower`; KIP-497: the in-sync set changes in ZooKeeper first, and
a joining replica counts at once while a leaving one counts until the write succeeded).

* **Commit**: the last sequence every replica of the in-sync set holds durably, if the set has at
  least ``min_insync`` members and the leadership is not fenced. While a change of the set is being
  written, the commit point counts the *larger* of the two sets (the written one and the one
  asked for): a replica on its way in counts at once, one on its way out until ZooKeeper says it
  is out. So whatever ZooKeeper holds at any moment, every member it lists holds everything committed,
  and the next leader (always a member) holds it too.
* **A new leader's commit** starts from its checkpoint (:mod:`zeps.journal.checkpoint`), never from
  its journal's end: records it holds beyond that (its own tail from before a restart, what it
  copied ahead of the old leader's commit point) count as committed only once the in-sync set holds
  them in the new epoch. The followers of the set count as holding nothing until they fetch in
  this epoch, after their copy was cut to the leader's history. This is Raft's rule, that entries
  of earlier terms are committed only through the current term, in Kafka's terms.
* **Data first**: on a stream that never held data (the state's ``data`` is false) nothing is counted
  committed until ZooKeeper holds ``data`` (:meth:`Leadership.data_wanted` asks for it, once there is
  something to commit): until then an empty replica may lead, since it loses nothing
  (:mod:`zeps.replication.election`).
* **Lag**: a follower is *caught up* when a fetch shows it holds what the leader held durably at its
  previous fetch (Kafka's lastCaughtUpTime). A member that has not been caught up for ``lag_s``
  leaves the set, however often it fetches: a slow replica must not hold every confirmation back.
* **Joining**: a follower enters the set once it is caught up and holds everything up to the
  leader's log end at election (its *epoch start*, KAFKA-7128): the commit point a new leader starts
  from may lag what an earlier leader confirmed, and a replica admitted against it could be elected
  without records that were confirmed.
* **Writes to ZooKeeper** (:attr:`Leadership.wanted`) are asked again after ``retry_s`` when no answer
  came (a write that failed, or whose answer was lost): ZooKeeper's holding is reconciled, the write
  itself is conditional on the leader's epoch (:mod:`zeps.replication.election`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Follower", "Leadership"]

NEVER = float("-inf")


@dataclass
class Follower:
    durable: int = 0  #: its last durable sequence, as its last fetch in this epoch said
    seen: float = NEVER  #: when it last fetched
    caught_up: float = NEVER  #: when it last held everything the leader held at its previous fetch
    target: int = 0  #: the leader's durable tail at its previous fetch
    fetched: bool = False  #: it fetched in this epoch (before that it counts as holding nothing)


@dataclass(eq=False)
class Leadership:
    """The leader's view of its stream's replication (single-threaded, in the broker loop)."""

    me: str
    epoch: int
    isr: frozenset[str]  #: the in-sync set as ZooKeeper holds it
    min_insync: int
    lag_s: float = 10.0  #: a member that has not caught up for this long leaves the in-sync set
    heartbeat_s: float = 0.5  #: a fetch waits at most this long for data
    retry_s: float = 2.0  #: an in-sync set asked of ZooKeeper and not confirmed is asked again after this
    commit: int = 0  #: the last sequence confirmed
    epoch_start: int = 0  #: the leader's log end at election: a joining follower must hold this much
    fenced: bool = False  #: the adapter's ZooKeeper session is suspended: nothing more is confirmed
    data: bool = True  #: ZooKeeper's state says the stream may hold data; until it does, nothing is committed
    data_asked: float = NEVER  #: when ``data`` was last asked of ZooKeeper
    followers: dict[str, Follower] = field(default_factory=dict)
    pending_isr: frozenset[str] | None = None  #: the set last asked of ZooKeeper, not confirmed yet
    pending_since: float = NEVER
    #: every replica of the sets asked since ZooKeeper last confirmed one: a write whose answer was
    #: lost may have been applied, so each of them counts for the commit point until then
    asked: frozenset[str] = frozenset()

    @classmethod
    def begin(cls, me: str, epoch: int, isr: frozenset[str], *, min_insync: int, commit: int, log_end: int,
              now: float, data: bool = True, **tuning: float) -> Leadership:  # fmt: skip
        """A new leader of ``epoch`` whose checkpoint says ``commit`` and whose journal ends at
        ``log_end`` (``data``: the state's): the other members of the set count as caught up until
        ``lag_s`` passes, and as holding nothing until they fetch."""
        leadership = cls(me, epoch, isr | {me}, min_insync, commit=commit, epoch_start=log_end, data=data,
                         **tuning)  # type: ignore[arg-type]  # fmt: skip
        for replica in isr - {me}:
            leadership.followers[replica] = Follower(caught_up=now)
        return leadership

    # -- what the followers say ------------------------------------------------------------
    def fetched(self, replica: str, durable: int, leader_durable: int, now: float) -> None:
        """``replica`` fetched, holding ``durable`` durably; the leader holds ``leader_durable``."""
        f = self.followers.get(replica)
        if f is None:
            f = self.followers[replica] = Follower()
        if f.fetched and durable < f.durable:  # it lost what it held (a new volume): out at once
            f.caught_up = NEVER
        elif durable >= leader_durable:
            f.caught_up = now
        elif f.fetched and durable >= f.target:  # it holds what we held when it last asked
            f.caught_up = max(f.caught_up, f.seen)
        f.durable, f.seen, f.target, f.fetched = durable, now, leader_durable, True

    # -- the commit point ------------------------------------------------------------------
    @property
    def counted(self) -> frozenset[str]:
        """The replicas the commit point waits for: the set ZooKeeper holds, and every replica of the
        sets asked of it since it last confirmed one."""
        return self.isr | self.asked

    def advance(self, leader_durable: int) -> int:
        """The commit point now (it never goes back): the lowest durable tail of the counted replicas,
        if the set ZooKeeper holds is large enough and the leadership is not fenced."""
        if self.fenced or not self.data or len(self.isr) < self.min_insync:
            return self.commit
        low = leader_durable
        for replica in self.counted:
            if replica == self.me:
                continue
            f = self.followers.get(replica)
            if f is None or not f.fetched:
                return self.commit
            low = min(low, f.durable)
        self.commit = max(self.commit, low)
        return self.commit

    def data_wanted(self, leader_durable: int, now: float) -> bool:
        """Whether to ask ZooKeeper now to record that the stream holds data: not recorded yet, records
        to commit, and not asked within ``retry_s``."""
        if self.data or leader_durable <= self.commit or now - self.data_asked < self.retry_s:
            return False
        self.data_asked = now
        return True

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < self.min_insync

    # -- the in-sync set -------------------------------------------------------------------
    def wanted(self, leader_durable: int, now: float) -> frozenset[str] | None:
        """The in-sync set as it should be now, if that differs from ZooKeeper's and is not being
        written already (or was asked ``retry_s`` ago with no answer): members caught up within
        ``lag_s``; other followers caught up within it that hold the commit point and the epoch start."""
        isr = {self.me}
        floor = max(self.commit, self.epoch_start)
        for replica, f in self.followers.items():
            recent = now - f.caught_up < self.lag_s
            if recent and (replica in self.isr or (f.fetched and f.durable >= floor)):
                isr.add(replica)
        wanted = frozenset(isr)
        if wanted == self.isr and not self.asked:
            return None
        if wanted == self.pending_isr and now - self.pending_since < self.retry_s:
            return None
        self.pending_isr, self.pending_since = wanted, now
        self.asked |= wanted
        return wanted

    def isr_written(self, isr: frozenset[str]) -> None:
        """ZooKeeper holds ``isr`` now (the adapter wrote it, or read it back, in this leader's epoch).
        A member gone from it that this leader did not ask to drop left by itself (it is stopping, or
        lost its journal): it comes back only once a later fetch shows it caught up."""
        for replica in self.isr - isr - {self.me}:
            f = self.followers.get(replica)
            if f is not None and (self.pending_isr is None or replica in self.pending_isr):
                f.caught_up = NEVER
        self.isr = isr | {self.me}
        if self.pending_isr is not None and self.isr == self.pending_isr:
            self.pending_isr, self.asked = None, frozenset()

    def lag(self, leader_durable: int) -> dict[str, int]:
        """Records each follower lacks of the leader's durable tail."""
        return {name: max(0, leader_durable - f.durable) for name, f in sorted(self.followers.items())}

    def fetching(self, now: float) -> list[str]:
        """The followers that fetched within ``lag_s`` (the others are down, or cut off)."""
        return sorted(name for name, f in self.followers.items() if now - f.seen < self.lag_s)
