"""The ZEPS conversation as a state machine: which command may go which way in which state.

The rules are a table (:data:`RULES`), not code: ``(role, state, direction, command) -> next
state``. A :class:`Connection` checks every command sent (LocalProtocolError: we misused the
protocol) and received (RemoteProtocolError: the peer broke it), and tracks the negotiated version.

States: ``AWAIT_ATTACH`` (nothing said yet), ``ATTACHING`` (client sent ATTACH, awaiting the
answer), ``ATTACHED``, ``DETACHING`` (client sent DETACH), ``CLOSED``.
"""

from __future__ import annotations

from typing import Literal

from zeps.errors import LocalProtocolError, RemoteProtocolError
from zeps.protocol.codec import decode, encode
from zeps.protocol.commands import (
    Attach,
    AttachOk,
    Command,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverRun,
    DeliverTs,
    Detach,
    DetachOk,
    Fetch,
    FetchEnd,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    ReplicaData,
    ReplicaEpoch,
    ReplicaEpochEnd,
    ReplicaFetch,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
)

__all__ = ["CLIENT_VERSION", "FOLLOWER_READS_VERSION", "RULES", "SUPPORTED_VERSIONS", "Connection", "Role", "State"]

Role = Literal["client", "broker"]
State = Literal["AWAIT_ATTACH", "ATTACHING", "ATTACHED", "DETACHING", "CLOSED"]
Direction = Literal["send", "receive"]
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8)
CLIENT_VERSION = 7  #: what clients attach with (8 adds replication between brokers)
#: what a client reading from a replicated stream's followers attaches with: a follower serves a
#: version 8 peer reads (SUBSCRIBE, FETCH) and sends one of an older version to the leader
FOLLOWER_READS_VERSION = 8

# What the client may do; the broker's view mirrors it (its "receive" is the client's "send").
_CLIENT: dict[tuple[State, Direction, type[Command]], State] = {
    ("AWAIT_ATTACH", "send", Attach): "ATTACHING",
    ("ATTACHING", "receive", AttachOk): "ATTACHED",
    ("ATTACHING", "receive", Invalid): "CLOSED",
    ("ATTACHING", "receive", InvalidCode): "CLOSED",
    ("ATTACHED", "send", Subscribe): "ATTACHED",
    ("ATTACHED", "send", SubscribeTime): "ATTACHED",
    ("ATTACHED", "receive", SubscribeOk): "ATTACHED",
    ("ATTACHED", "send", Credit): "ATTACHED",
    ("ATTACHED", "send", Publish): "ATTACHED",
    ("ATTACHED", "send", PublishBatch): "ATTACHED",
    ("ATTACHED", "send", Produce): "ATTACHED",
    ("ATTACHED", "receive", ProduceOk): "ATTACHED",
    ("ATTACHED", "send", PublishSeq): "ATTACHED",
    ("ATTACHED", "send", PublishBatchSeq): "ATTACHED",
    ("ATTACHED", "send", Fetch): "ATTACHED",
    ("ATTACHED", "receive", FetchEnd): "ATTACHED",
    ("ATTACHED", "receive", Deliver): "ATTACHED",
    ("ATTACHED", "receive", DeliverTs): "ATTACHED",
    ("ATTACHED", "receive", DeliverBatch): "ATTACHED",
    ("ATTACHED", "receive", DeliverRun): "ATTACHED",
    ("ATTACHED", "send", Ping): "ATTACHED",
    ("ATTACHED", "receive", PingOk): "ATTACHED",
    ("ATTACHED", "receive", Ping): "ATTACHED",  # heartbeats go both ways
    ("ATTACHED", "send", PingOk): "ATTACHED",
    ("ATTACHED", "receive", Invalid): "ATTACHED",  # e.g. a refused subscription; the peering lives on
    ("ATTACHED", "receive", InvalidCode): "ATTACHED",
    ("ATTACHED", "send", Detach): "DETACHING",
    ("ATTACHED", "receive", Detach): "CLOSED",  # close-stream = C:DETACH / S:DETACH
    ("ATTACHED", "send", ReplicaFetch): "ATTACHED",  # version 8: a follower broker is the client
    ("ATTACHED", "send", ReplicaEpoch): "ATTACHED",
    ("ATTACHED", "receive", ReplicaData): "ATTACHED",
    ("ATTACHED", "receive", ReplicaEpochEnd): "ATTACHED",
    ("DETACHING", "receive", DetachOk): "CLOSED",
    ("DETACHING", "receive", Deliver): "DETACHING",  # in flight before the broker saw DETACH
    ("DETACHING", "receive", DeliverTs): "DETACHING",
    ("DETACHING", "receive", DeliverBatch): "DETACHING",
    ("DETACHING", "receive", DeliverRun): "DETACHING",
    ("DETACHING", "receive", ProduceOk): "DETACHING",
    ("DETACHING", "receive", FetchEnd): "DETACHING",
    ("DETACHING", "receive", Ping): "DETACHING",
    ("DETACHING", "receive", PingOk): "DETACHING",
    ("DETACHING", "receive", Invalid): "DETACHING",
    ("DETACHING", "receive", InvalidCode): "DETACHING",
}
_FLIP: dict[Direction, Direction] = {"send": "receive", "receive": "send"}
_BROKER = {(state, _FLIP[d], cmd): nxt for (state, d, cmd), nxt in _CLIENT.items()}
_BROKER[("ATTACHED", "receive", Detach)] = "CLOSED"  # the broker answers DETACH-OK and forgets the peer
_BROKER[("ATTACHED", "send", DetachOk)] = "CLOSED"
_BROKER[("CLOSED", "send", DetachOk)] = "CLOSED"
_BROKER[("AWAIT_ATTACH", "receive", Attach)] = "ATTACHING"
_BROKER[("ATTACHING", "send", AttachOk)] = "ATTACHED"
_BROKER[("ATTACHING", "send", Invalid)] = "CLOSED"
_BROKER[("ATTACHED", "send", Invalid)] = "ATTACHED"
_BROKER[("ATTACHING", "send", InvalidCode)] = "CLOSED"
_BROKER[("ATTACHED", "send", InvalidCode)] = "ATTACHED"
#: (role, state, direction, command class) -> next state; anything absent is a protocol error
RULES: dict[tuple[Role, State, Direction, type[Command]], State] = {
    **{("client", s, d, c): n for (s, d, c), n in _CLIENT.items()},
    **{("broker", s, d, c): n for (s, d, c), n in _BROKER.items()},
}
_SINCE_VERSION: dict[type[Command], int] = {
    SubscribeTime: 2, DeliverTs: 2, PublishBatch: 3, DeliverBatch: 3, DeliverRun: 4, InvalidCode: 5,
    Produce: 6, ProduceOk: 6, PublishSeq: 6, PublishBatchSeq: 6, Fetch: 7, FetchEnd: 7,
    ReplicaFetch: 8, ReplicaData: 8, ReplicaEpoch: 8, ReplicaEpochEnd: 8,
}  # fmt: skip


def stays_attached(role: Role, direction: Direction, command: type[Command]) -> int | None:
    """The protocol version from which an attached ``role`` may ``direction`` (send or receive)
    ``command`` and stay attached (a hot path may then skip :meth:`Connection.receive` or
    :meth:`Connection.sent` for it, and the objects they take); None if it may not."""
    if RULES.get((role, "ATTACHED", direction, command)) != "ATTACHED":
        return None
    return _SINCE_VERSION.get(command, 0)


class Connection:
    """One side of one ZEPS peering. Holds no socket: frames in, commands out, and back."""

    def __init__(self, role: Role) -> None:
        self.role: Role = role
        self.state: State = "AWAIT_ATTACH"
        self.version = 0  # set by ATTACH
        self.stream = ""

    def _step(self, direction: Direction, command: Command) -> None:
        nxt = RULES.get((self.role, self.state, direction, type(command)))
        error = LocalProtocolError if direction == "send" else RemoteProtocolError
        if nxt is None:
            raise error(f"{command.NAME} is not allowed when {self.state.lower().replace('_', ' ')}")
        needs = _SINCE_VERSION.get(type(command), 0)
        if self.version < needs:
            attached = f"this peering attached with version {self.version}"
            raise error(f"{command.NAME} needs protocol version {needs} ({attached})")
        if isinstance(command, Attach):
            if command.protocol != "ZEPS":
                raise error(f"ATTACH protocol must be 'ZEPS', not {command.protocol!r}")
            if command.version not in SUPPORTED_VERSIONS:
                supported = ", ".join(map(str, SUPPORTED_VERSIONS))
                raise error(f"ATTACH version {command.version} is not supported (use one of {supported})")
            self.version, self.stream = command.version, command.stream
        self.state = nxt

    def send(self, command: Command) -> bytes:
        """Check that we may send ``command`` now, and return its frame."""
        frame = encode(command)
        self._step("send", command)
        return frame

    def sent(self, command: Command) -> None:
        """Check and record a command whose frame a fast encoder made (the state machine still rules)."""
        self._step("send", command)

    def receive(self, frame: bytes) -> Command:
        """Decode a frame from the peer and check it may come now."""
        command = decode(frame)
        self._step("receive", command)
        return command
