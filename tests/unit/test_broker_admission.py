"""The broker's connection budget (zeps.broker.admission) on its own: the count from the monitor's
events, and the gatekeeper's answer to ZAP requests. The requests are made here, not by ZeroMQ, and
its replies are captured instead of sent (``Captured``), except in the last test, where ZeroMQ asks
on real loopback connections; a real broker refusing real connections is
tests/integration/test_hostile_peers.py."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from zeps.broker.admission import ZAP_DOMAIN, ConnectionCount, Gatekeeper
from zeps_dev.process import wait_until

REPLICA = bytes(range(32))  # a CURVE public key, as ZAP carries it (32 bytes)
STRANGER = bytes(range(1, 33))


class Captured(Gatekeeper):
    """A gatekeeper whose replies are kept (status, text) instead of sent to ZeroMQ."""

    def __init__(self, count: ConnectionCount) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        super().__init__(self.ctx, count, exempt=lambda key: key == REPLICA, refused=lambda: None)
        self.replies: list[tuple[bytes, bytes]] = []

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes, *_: Any, **__: Any) -> None:
        self.replies.append((status_code, status_text))

    def ask(self, mechanism: bytes, *credentials: bytes) -> tuple[bytes, bytes]:
        request = [b"1.0", b"1", ZAP_DOMAIN.encode(), b"127.0.0.1", b"", mechanism, *credentials]
        asyncio.run(self.handle_zap_message(request))
        return self.replies[-1]


def _count(open_: int, budget: int) -> ConnectionCount:
    count = ConnectionCount(budget)
    for fd in range(open_):
        count.seen(zmq.EVENT_ACCEPTED, 100 + fd)
    return count


def test_the_count_follows_accepted_and_disconnected_connections_by_descriptor() -> None:
    count = _count(3, budget=3)
    assert count.open == 3 and not count.full()
    count.seen(zmq.EVENT_ACCEPTED, 200)
    assert count.full()  # the fourth, just arrived, is one too many
    count.seen(zmq.EVENT_DISCONNECTED, 200)
    count.seen(zmq.EVENT_DISCONNECTED, 200)  # reported twice: counted once
    count.seen(zmq.EVENT_DISCONNECTED, 999)  # never seen: nothing to forget
    assert count.open == 3 and not count.full()
    assert not _count(10_000, budget=0).full()  # 0: no budget


def test_past_the_budget_a_handshake_is_refused_with_500_unless_a_replicas_key_makes_it() -> None:
    gate = Captured(_count(5, budget=4))
    try:
        gate.configure_curve(domain=ZAP_DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
        status, text = gate.ask(b"NULL")
        assert status == b"500" and b"connection budget full (4)" in text
        assert gate.ask(b"CURVE", STRANGER)[0] == b"500"
        assert gate.ask(b"CURVE", REPLICA)[0] == b"200"  # a replica gets in: the budget cannot cut it off
        assert gate.count.refused == 2
        gate.count.seen(zmq.EVENT_DISCONNECTED, 100)
        assert gate.ask(b"NULL")[0] == b"200"  # room again
        assert gate.ask(b"CURVE", STRANGER)[0] == b"200"  # pyzmq's checks decide (any key, here)
    finally:
        gate.ctx.term()


def _handshake(ctx: zmq.Context[Any], port: int) -> int:
    """Connect a DEALER to ``port`` and return how its first handshake ended: 0 if it succeeded, else the
    ZAP status of the refusal (500: the budget)."""
    dealer = ctx.socket(zmq.DEALER)
    monitor = dealer.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        assert monitor.poll(20_000), "no handshake ended within 20 s"
        event = recv_monitor_message(monitor)
        return 0 if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED else int(event["value"])
    finally:
        dealer.disable_monitor()
        monitor.close(linger=0)
        dealer.close(linger=0)


def test_the_gatekeeper_reads_the_count_itself_and_refuses_the_connection_past_the_budget_at_once() -> None:
    """Real sockets on loopback: a ROUTER with the gatekeeper and the connection monitor, and no broker
    loop reading the monitor (one that has not turned yet: busy, or on a machine with no core free).
    Two silent TCP connections fill a budget of 2, and a third connection's handshake is refused with
    500 at once. Read by the broker's loop alone, the count had not seen the third and let it in.
    Once the silent ones close, a handshake succeeds again."""
    ctx: zmq.Context[Any] = zmq.Context()
    count = ConnectionCount(2)
    gate = Gatekeeper(ctx, count, exempt=lambda key: False, refused=lambda: None)
    gate.start()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    count.watch(router)
    silent: list[socket.socket] = []
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        assert _handshake(ctx, port) == 500
        assert count.refused >= 1
        for conn in silent:
            conn.close()

        def forgotten() -> bool:
            count.read()
            return count.open == 0

        wait_until(forgotten, timeout=20, what="the closed connections forgotten")
        assert _handshake(ctx, port) == 0
    finally:
        for conn in silent:
            conn.close()
        count.unwatch(router)
        router.close(linger=0)
        gate.stop()
        ctx.term()
