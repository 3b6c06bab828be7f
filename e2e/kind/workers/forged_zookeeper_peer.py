"""Pose as ZooKeeper server SID to each server at HOST:PORT (its election port, 3888 in the chart):
the handshake a server of the ensemble opens with (ZooKeeper's quorum protocol, version 2: the
sender's id and address), then a vote for itself, as a server looking for a leader sends. A server
that takes the stranger for a peer answers with its own vote; one that asks its peers to prove
they know the quorum's password (SASL) closes the connection. Prints one JSON line per server:
``{"server": HOST:PORT, "answer": "vote" | "closed" | "silent" | "unreachable"}``. Standard library
only: runs on this machine (the integration test) and in the zeps image (kind).

usage: forged_zookeeper_peer.py SID HOST:PORT [HOST:PORT ...]"""

import json
import socket
import struct
import sys

PROTOCOL_VERSION_V2 = -65535  #: QuorumCnxManager's initial message, with the sender's address
LOOKING = 0


def pose(sid: int, host: str, port: int) -> str:
    try:
        conn = socket.create_connection((host, port), timeout=10)
    except OSError:
        return "unreachable"
    with conn:
        address = f"{socket.gethostname()}:3888".encode()
        # a notification of 40 bytes (state, proposed leader, zxid, election epoch, peer epoch, and a
        # version the receiver reads as the format before dynamic reconfiguration)
        vote = struct.pack("!iqqqqi", LOOKING, sid, 0, 1, 0, 0)
        try:
            conn.sendall(struct.pack("!qqi", PROTOCOL_VERSION_V2, sid, len(address)) + address)
            conn.sendall(struct.pack("!i", len(vote)) + vote)
            answer = conn.recv(4096)
        except TimeoutError:
            return "silent"
        except (ConnectionResetError, BrokenPipeError):  # cut off while still sending, or after
            return "closed"
        return "vote" if answer else "closed"


def main() -> None:
    sid = int(sys.argv[1])
    for server in sys.argv[2:]:
        host, port = server.rsplit(":", 1)
        print(json.dumps({"server": server, "answer": pose(sid, host, int(port))}), flush=True)


if __name__ == "__main__":
    main()
