"""An attacker on a multicast segment (the network lab's host): for ``--seconds``, sends runs of
records to the group with the sequences a receiver expects next (1, 2, …), key ``eu.fr``, body
``b"forged"``, each once unsigned and once with a MAC of a key of its own; then prints how many."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import zmq
from workload import Pace

from zeps import _netif
from zeps._records import encode_record
from zeps.client.multicast import multicast_options
from zeps.protocol import multicast


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--multicast", required=True, help="the group's options, as JSON")
    p.add_argument("--stream", default="prices")
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    options = multicast_options(json.loads(args.multicast))
    ctx: zmq.Context[Any] = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.connect(_netif.endpoint(options.transport, options.group, options.port, _netif.resolve(None, options.group)))
    own_key, sent, sequence = b"not-the-stream-key-0123456789", 0, 1
    deadline, pace = time.monotonic() + args.seconds, Pace(200)  # runs a second
    while time.monotonic() < deadline:
        record = encode_record(sequence, int(time.time() * 1000), b"eu.fr", b"forged")
        message = multicast.encode_run(args.stream, record, (0).to_bytes(4, "big"))
        pub.send_multipart(message)  # unsigned
        pub.send_multipart(multicast.sign(message, own_key))  # signed with a key of its own
        sent, sequence = sent + 2, sequence + 1
        if sent == 100:
            print(json.dumps({"forging": sent}), flush=True)
        pace.step()
    pub.close(linger=1000)
    ctx.term()
    print(json.dumps({"forged_sent": sent}), flush=True)


if __name__ == "__main__":
    main()
