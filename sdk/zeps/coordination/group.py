"""Group membership with a manifest: who is alive, who should be, and who is rogue.

Layout (see :class:`zeps.paths.GroupPaths`)::

    <members>/<member-id>   ephemeral; data = JSON metadata of the member (endpoint, pod, …)
    <manifest>              persistent; data = {"version": 1, "members": [ids that should exist]}

* :meth:`Group.join` creates the member node and keeps it: after a session expiry (kazoo LOST) the
  node is re-created with the same id and metadata as soon as a new session exists; while the
  connection is SUSPENDED the membership reports itself paused. If another live session still
  holds the id (a crashed process whose session has not timed out yet), join waits for that node
  to vanish, up to ``takeover_timeout``.
* :meth:`Group.watch` reports joined / left / changed members and, when a manifest exists, the
  rogue members (alive, not in the manifest) and the missing ones (in the manifest, not alive),
  through callbacks and warning logs ("sound the alarm"). :meth:`Group.status` answers the same
  question once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import WatchedEvent, ZnodeStat

from zeps import _json as bounded_json
from zeps.coordination._util import zookeeper_errors
from zeps.errors import CoordinationError
from zeps.paths import GroupPaths, validate_member_id

__all__ = ["Group", "GroupStatus", "GroupWatch", "Member", "Membership"]

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Member:
    """A live member: its id, its metadata, and the ZooKeeper session that holds it."""

    id: str
    metadata: Mapping[str, Any]
    session_id: int


@dataclass(frozen=True)
class GroupStatus:
    """Alive members compared with the manifest (``manifest`` is None when there is none)."""

    alive: frozenset[str]
    manifest: frozenset[str] | None

    @property
    def rogue(self) -> frozenset[str]:
        """Alive but not in the manifest: something runs that should not."""
        return frozenset() if self.manifest is None else self.alive - self.manifest

    @property
    def missing(self) -> frozenset[str]:
        """In the manifest but not alive: something should run and does not."""
        return frozenset() if self.manifest is None else self.manifest - self.alive


def _encode(metadata: Mapping[str, Any]) -> bytes:
    return json.dumps(dict(metadata), sort_keys=True, separators=(",", ":")).encode()


def _decode(data: bytes) -> dict[str, Any]:
    try:
        value = bounded_json.loads(data) if data else {}
    except ValueError:
        return {"raw": data.decode("utf-8", "replace")}
    return value if isinstance(value, dict) else {"value": value}


class Group:
    """One group over a kazoo client. No I/O happens until a method is called."""

    def __init__(self, client: KazooClient, paths: GroupPaths, *, acl: list[Any] | None = None) -> None:
        self.client = client
        self.paths = paths
        self.acl = acl

    # -- membership ---------------------------------------------------------------------------
    @zookeeper_errors
    def join(
        self,
        member_id: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        takeover_timeout: float = 60.0,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> Membership:
        """Join as ``member_id`` and stay joined (across session expiry) until :meth:`Membership.leave`.
        If a rejoin after a session expiry fails (another live session holds the id past
        ``takeover_timeout``, ZooKeeper refuses), the membership is over: :attr:`Membership.failure`
        says why and ``on_failure`` is called with it (on kazoo's thread), so that the member stops
        acting as one (a broker stops serving)."""
        membership = Membership(self, validate_member_id(member_id), dict(metadata or {}), takeover_timeout,
                                on_failure)  # fmt: skip
        membership._start()
        return membership

    @zookeeper_errors
    def members(self) -> dict[str, Member]:
        """The live members and their metadata, read now."""
        members: dict[str, Member] = self.client.retry(self._read_members)
        return members

    def _read_members(self) -> dict[str, Member]:
        try:
            names = self.client.get_children(self.paths.members)
        except NoNodeError:
            return {}
        pending = [(name, self.client.get_async(f"{self.paths.members}/{name}")) for name in names]
        out: dict[str, Member] = {}
        for name, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                continue  # left between the listing and the read
            out[name] = Member(name, _decode(data), stat.ephemeralOwner)
        return out

    # -- manifest -----------------------------------------------------------------------------
    @zookeeper_errors
    def set_manifest(self, member_ids: Iterable[str]) -> None:
        """Record the members that should exist (replaces the previous manifest)."""
        ids = sorted({validate_member_id(m) for m in member_ids})
        data = _encode({"version": MANIFEST_VERSION, "members": ids})
        path = self._manifest_path()

        def write() -> None:
            try:
                self.client.set(path, data)
            except NoNodeError:
                try:
                    self.client.create(path, data, makepath=True, acl=self.acl)
                except NodeExistsError:
                    self.client.set(path, data)

        self.client.retry(write)

    @zookeeper_errors
    def manifest(self) -> frozenset[str] | None:
        """The members that should exist, or None when no manifest was written."""
        try:
            data, _ = self.client.retry(self.client.get, self._manifest_path())
        except NoNodeError:
            return None
        return _parse_manifest(data)

    def status(self) -> GroupStatus:
        return GroupStatus(alive=frozenset(self.members()), manifest=self.manifest())

    def _manifest_path(self) -> str:
        if self.paths.manifest is None:
            raise CoordinationError(f"group {self.paths.members} has no manifest path")
        return self.paths.manifest

    # -- watching -----------------------------------------------------------------------------
    def watch(
        self,
        *,
        on_joined: Callable[[Member], None] | None = None,
        on_left: Callable[[str], None] | None = None,
        on_changed: Callable[[Member], None] | None = None,
        on_status: Callable[[GroupStatus], None] | None = None,
    ) -> GroupWatch:
        """Call back on membership changes until :meth:`GroupWatch.stop`. Callbacks run on kazoo's
        event thread: keep them short."""
        watch = GroupWatch(self, on_joined, on_left, on_changed, on_status)
        watch._start()
        return watch


def _parse_manifest(data: bytes) -> frozenset[str]:
    value = _decode(data)
    members = value.get("members", [])
    if not isinstance(members, list):
        raise CoordinationError("group manifest is malformed: 'members' must be a list of ids")
    return frozenset(str(m) for m in members)


class Membership:
    """This process's membership in a group, kept alive across session expiry."""

    def __init__(
        self,
        group: Group,
        member_id: str,
        metadata: dict[str, Any],
        takeover_timeout: float,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.group = group
        self.member_id = member_id
        self.path = group.paths.member(member_id)
        self._metadata = metadata
        self._takeover_timeout = takeover_timeout
        self._joined = threading.Event()
        self._left = False
        self._lost = False
        self._lock = threading.Lock()
        #: why a rejoin failed: the membership is over (logged, and given to ``on_failure``)
        self.failure: BaseException | None = None
        self._on_failure = on_failure

    @property
    def client(self) -> KazooClient:
        return self.group.client

    @property
    def joined(self) -> bool:
        """True while the member node is known to exist and the connection is up."""
        return self._joined.is_set()

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._metadata)

    def wait_joined(self, timeout: float | None = None) -> bool:
        return self._joined.wait(timeout)

    def _start(self) -> None:
        self.client.add_listener(self._on_state)
        try:
            self._create_node()
        except BaseException:
            self.client.remove_listener(self._on_state)
            raise
        self._joined.set()

    def _create_node(self) -> None:
        """Create the ephemeral node, or adopt it if our session already owns it (a retried create)."""
        deadline = time.monotonic() + self._takeover_timeout
        data = _encode(self._metadata)
        while True:
            try:
                self.client.retry(
                    self.client.create, self.path, data, ephemeral=True, makepath=True, acl=self.group.acl
                )
                return
            except NodeExistsError:
                pass
            gone = threading.Event()
            try:
                _, stat = self.client.retry(self.client.get, self.path, watch=lambda _e, gone=gone: gone.set())
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.retry(self.client.set, self.path, data)
                return
            remaining = deadline - time.monotonic()
            log.info(
                "member %s is still held by session 0x%x; waiting for it to expire",
                self.path,
                stat.ephemeralOwner,
            )
            if remaining <= 0 or not gone.wait(remaining):
                raise CoordinationError(
                    f"member id {self.member_id!r} is held by another live session (0x{stat.ephemeralOwner:x}) "
                    f"at {self.path}; another process uses this id, or a crashed one has not timed out within "
                    f"{self._takeover_timeout:.0f}s"
                )

    def _on_state(self, state: str) -> bool:
        if self._left:
            return True  # remove the listener
        if state == KazooState.SUSPENDED:
            self._joined.clear()
        elif state == KazooState.LOST:
            self._joined.clear()
            self._lost = True
        elif state == KazooState.CONNECTED:
            if self._lost:
                self._lost = False
                self.client.handler.spawn(self._rejoin)
            else:
                self._joined.set()  # same session: the node is still there
        return False

    def _rejoin(self) -> None:
        with self._lock:
            if self._left:
                return
            try:
                self._create_node()
            except Exception as exc:  # this runs on a background thread: kept, logged, and handed on
                self.failure = exc
                log.error("could not rejoin %s after session expiry: %s", self.path, exc)
                if self._on_failure is not None:
                    self._on_failure(exc)
                return
            log.info("rejoined %s after session expiry", self.path)
            self._joined.set()

    def update(self, metadata: Mapping[str, Any]) -> None:
        """Replace this member's metadata (watchers see a change); kept here once ZooKeeper has it."""
        with self._lock:
            data = dict(metadata)
            self.client.retry(self.client.set, self.path, _encode(data))
            self._metadata = data

    def leave(self) -> None:
        """Delete the member node; the membership is over (no rejoin)."""
        with self._lock:
            if self._left:
                return
            self._left = True
            self._joined.clear()
            self.client.remove_listener(self._on_state)
            if self.client.connected:
                try:
                    _, stat = self.client.retry(self.client.get, self.path)
                    if stat.ephemeralOwner == self.client.client_id[0]:
                        self.client.retry(self.client.delete, self.path, version=stat.version)
                except NoNodeError:
                    pass

    def __enter__(self) -> Membership:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave()


class GroupWatch:
    """Watches one group's members (and manifest); see :meth:`Group.watch`."""

    def __init__(
        self,
        group: Group,
        on_joined: Callable[[Member], None] | None,
        on_left: Callable[[str], None] | None,
        on_changed: Callable[[Member], None] | None,
        on_status: Callable[[GroupStatus], None] | None,
    ) -> None:
        self.group = group
        self._on_joined = on_joined
        self._on_left = on_left
        self._on_changed = on_changed
        self._on_status = on_status
        self._known: dict[str, Member] = {}
        self._manifest: frozenset[str] | None = None
        self._stopped = False
        self._lock = threading.RLock()
        self._last_status: GroupStatus | None = None
        self._session_lost = False

    @property
    def client(self) -> KazooClient:
        return self.group.client

    def _start(self) -> None:
        self.client.add_listener(self._on_state)
        self.client.retry(self.client.ensure_path, self.group.paths.members)
        if self.group.paths.manifest is not None:
            self.client.DataWatch(self.group.paths.manifest, self._manifest_changed)
        self.client.ChildrenWatch(self.group.paths.members, self._children_changed)

    def stop(self) -> None:
        """Stop calling back (kazoo drops its watchers on their next event)."""
        self._stopped = True
        self.client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost = True  # one-shot data watches died with the session: re-arm them

    def status(self) -> GroupStatus:
        with self._lock:
            return GroupStatus(alive=frozenset(self._known), manifest=self._manifest)

    def _manifest_changed(self, data: bytes | None, _stat: ZnodeStat | None) -> bool | None:
        if self._stopped:
            return False
        with self._lock:
            try:
                self._manifest = None if data is None else _parse_manifest(data)
            except CoordinationError as exc:
                log.error("%s: %s", self.group.paths.manifest, exc)
                self._manifest = frozenset()
            self._report_status()
        return None

    def _children_changed(self, children: list[str]) -> bool | None:
        if self._stopped:
            return False
        with self._lock:
            current = set(children)
            if self._session_lost:
                self._session_lost = False
                for name in sorted(current & set(self._known)):
                    member = self._read(name)
                    if member is not None and member.metadata != self._known[name].metadata:
                        self._known[name] = member
                        if self._on_changed:
                            self._on_changed(member)
            for gone in sorted(set(self._known) - current):
                del self._known[gone]
                if self._on_left:
                    self._on_left(gone)
            for name in sorted(current - set(self._known)):
                member = self._read(name)
                if member is None:
                    continue
                self._known[name] = member
                if self._on_joined:
                    self._on_joined(member)
            self._report_status()
        return None

    def _read(self, name: str) -> Member | None:
        """Read a member and arm a one-shot watch for its metadata changes."""
        path = f"{self.group.paths.members}/{name}"
        try:
            data, stat = self.client.retry(self.client.get, path, watch=self._data_changed)
        except NoNodeError:
            return None
        return Member(name, _decode(data), stat.ephemeralOwner)

    def _data_changed(self, event: WatchedEvent) -> None:
        if self._stopped or event.type != "CHANGED":
            return  # DELETED is reported by the children watch
        name = event.path.rsplit("/", 1)[1]

        def reread() -> None:
            member = self._read(name)
            with self._lock:
                if member is None or name not in self._known:
                    return
                self._known[name] = member
                if self._on_changed:
                    self._on_changed(member)

        self.client.handler.spawn(reread)

    def _report_status(self) -> None:
        status = GroupStatus(alive=frozenset(self._known), manifest=self._manifest)
        if status == self._last_status:
            return
        self._last_status = status
        if status.rogue:
            log.warning("group %s: rogue members (alive, not in the manifest): %s",
                        self.group.paths.members, ", ".join(sorted(status.rogue)))  # fmt: skip
        if status.missing:
            log.warning("group %s: missing members (in the manifest, not alive): %s",
                        self.group.paths.members, ", ".join(sorted(status.missing)))  # fmt: skip
        if self._on_status:
            self._on_status(status)
