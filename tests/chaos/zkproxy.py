"""A TCP proxy between one ZooKeeper client and the server that can misbehave the two ways a network
does to ZooKeeper's clients (on 127.0.0.1 only):

* **cut**: the client is cut off: its connections are closed, and new ones are accepted and held
  without a byte forwarded, until :meth:`ZkProxy.heal` (its session expires on the server if that
  lasts longer than the session timeout);
* **drop-after-apply**: the next ``count`` writes (create, delete, setData, multi…) reach the server
  and are applied, but their answers never reach the client: the connection closes instead, so the
  client sees a lost connection for an operation that happened (kazoo's ``ConnectionLoss``).

The ZooKeeper wire protocol is read just enough for that: after the connect handshake (one frame
each way), a request is ``length, xid, type, …`` and an answer ``length, xid, zxid, error, …``; an
answer is matched to its request by ``xid``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field

__all__ = ["ZkProxy"]

_WRITES = {1, 2, 5, 7, 13, 14, 15, 16, 19, 20, 21}  # create, delete, setData, setACL, check, multi, create2, …
_HEAD = struct.Struct("!i")


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    server: socket.socket | None
    from_client: bytearray = field(default_factory=bytearray)
    from_server: bytearray = field(default_factory=bytearray)
    handshaken_client: bool = False
    handshaken_server: bool = False
    writes: set[int] = field(default_factory=set)  # xids of writes whose answers are to be dropped


class ZkProxy:
    """Listens on 127.0.0.1 (``address``) and forwards to ``upstream`` ("host:port")."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._pairs: set[_Pair] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._drop_writes = 0
        self.dropped = 0  #: answers to applied writes dropped so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zk-proxy", daemon=True)

    def start(self) -> ZkProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for pair in list(self._pairs):
                self._close(pair)
        self._listener.close()
        self._selector.close()

    # -- faults ------------------------------------------------------------------------------
    def cut(self) -> None:
        with self._lock:
            self._cut = True
            for pair in list(self._pairs):
                self._close(pair)

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            self._drop_writes = 0
            for pair in [p for p in self._pairs if p.server is None]:  # held while cut: the client dials again
                self._close(pair)

    def drop_after_apply(self, count: int) -> None:
        with self._lock:
            self._drop_writes = count

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.1):
                with self._lock:
                    if key.data is None:
                        self._accept()
                    else:
                        pair, side = key.data
                        if pair in self._pairs:
                            self._pump(pair, side)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        server = None
        if not self._cut:
            try:
                server = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                return
            server.setblocking(False)
        client.setblocking(False)
        pair = _Pair(client, server)
        self._pairs.add(pair)
        self._selector.register(client, selectors.EVENT_READ, (pair, "client"))
        if server is not None:
            self._selector.register(server, selectors.EVENT_READ, (pair, "server"))

    def _pump(self, pair: _Pair, side: str) -> None:
        sock = pair.client if side == "client" else pair.server
        assert sock is not None
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._close(pair)
            return
        if pair.server is None:
            return  # held while cut: read and forgotten
        if side == "client":
            pair.from_client += data
            self._client_frames(pair)
        else:
            pair.from_server += data
            self._server_frames(pair)

    def _client_frames(self, pair: _Pair) -> None:
        buf = pair.from_client
        while len(buf) >= 4 and len(buf) >= 4 + (size := _HEAD.unpack_from(buf)[0]):
            frame = bytes(buf[: 4 + size])
            del buf[: 4 + size]
            if not pair.handshaken_client:
                pair.handshaken_client = True
            elif size >= 8:
                xid, kind = struct.unpack_from("!ii", frame, 4)
                if kind in _WRITES and self._drop_writes > 0:
                    self._drop_writes -= 1
                    pair.writes.add(xid)
            if not self._send(pair, pair.server, frame):
                return

    def _server_frames(self, pair: _Pair) -> None:
        buf = pair.from_server
        while len(buf) >= 4 and len(buf) >= 4 + (size := _HEAD.unpack_from(buf)[0]):
            frame = bytes(buf[: 4 + size])
            del buf[: 4 + size]
            if not pair.handshaken_server:
                pair.handshaken_server = True
            elif size >= 4 and _HEAD.unpack_from(frame, 4)[0] in pair.writes:
                self.dropped += 1
                self._close(pair)  # applied on the server; the client never hears it
                return
            if not self._send(pair, pair.client, frame):
                return

    def _send(self, pair: _Pair, sock: socket.socket | None, frame: bytes) -> bool:
        try:
            assert sock is not None
            sock.setblocking(True)
            sock.sendall(frame)
            sock.setblocking(False)
        except OSError:
            self._close(pair)
            return False
        return True

    def _close(self, pair: _Pair) -> None:
        self._pairs.discard(pair)
        for sock in (pair.client, pair.server):
            if sock is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
                sock.close()
