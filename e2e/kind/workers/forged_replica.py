"""Fetch as replica REPLICA from the leader at ENDPOINT of stream STREAM (epoch EPOCH), over CURVE
with an admitted client's certificate (CLIENT, and the broker's public certificate SERVER): what a
client, or any pod holding a listed key, would try in order to count as an in-sync replica. Prints
one JSON line: the leader's answer (its refusal code, or the command it sent). Runs in the zeps image."""

import json
import sys

import zmq
import zmq.auth

from zeps.protocol import Attach, AttachOk, InvalidCode, Refusal, ReplicaFetch, decode, encode


def main() -> None:
    endpoint, stream, epoch, replica, client, server = sys.argv[1:7]
    public, secret = zmq.auth.load_certificate(client)
    server_key, _ = zmq.auth.load_certificate(server)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret or b"")
    sock.connect(endpoint)
    sock.send(encode(Attach(stream=stream, version=8)))
    if not sock.poll(30_000):
        print(json.dumps({"answer": "none to ATTACH"}), flush=True)
        sys.exit(1)
    attached = decode(sock.recv())
    if attached != AttachOk():
        print(json.dumps({"answer": f"ATTACH refused: {attached!r}"}), flush=True)
        sys.exit(1)
    sock.send(encode(ReplicaFetch(epoch=int(epoch), replica=replica, base=1, offset=0, last=0, durable=10**9)))
    if not sock.poll(30_000):
        print(json.dumps({"answer": "none to REPLICA-FETCH"}), flush=True)
        sys.exit(1)
    answer = decode(sock.recv())
    refused = Refusal(answer.code).name if isinstance(answer, InvalidCode) else None
    print(json.dumps({"answer": type(answer).__name__, "refused": refused}), flush=True)
    sock.close()
    ctx.term()


if __name__ == "__main__":
    main()
