"""A member of consumer group GROUP of the partitioned ZepsStream NAME, in a pod of a Deployment: the
member is the pod's name (``zeps.stream(NAME).consumer_group(GROUP)``), its partitions are handed
over through ZooKeeper as members come and go.

Its handler is idempotent, as the README asks of a handler that must take effect once: the effect of
message (partition p, sequence s, body b) is the ZooKeeper node ``EFFECTS/<p>-<s>-<b>``, created
once; a node already there means the message was processed before (a member died after processing
it and before committing), and that is recorded as ``AGAIN/<p>-<s>-<b>`` instead (what the group
processed twice: none when members only leave cleanly). Both parents must exist.

On SIGTERM (the pod deleted) the member finishes the batch in hand and then leaves the group: the
``with`` block commits what it processed and gives its partitions up, so the next owner starts right
after. Prints ``{"processed": n, "partitions": [...]}`` after each batch. Runs in the zeps image."""

import faulthandler
import json
import signal
import sys
import time

from kazoo.exceptions import NodeExistsError

import zeps
from zeps.config import resolve
from zeps.coordination import connect

stopping = False


def stop(_signum: int, _frame: object) -> None:
    global stopping  # noqa: PLW0603 — the loop's one flag
    stopping = True


def main() -> None:
    name, group, effects, again = sys.argv[1:5]
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 1`: every thread's stack, to the log
    signal.signal(signal.SIGTERM, stop)
    settings = resolve("ZepsStream", name, needs=("zookeeper",))
    store = connect(settings.zookeeper, auth=settings.auth, ca=settings.zookeeper_ca)
    processed = 0
    with zeps.stream(name).consumer_group(group) as consumer:
        while not stopping:
            batch = consumer.receive_many(0.5, max_messages=50)
            pending = [(m, store.create_async(f"{effects}/{m.partition}-{m.sequence}-{m.body.decode()}"))
                       for m in batch]  # fmt: skip
            for m, result in pending:
                try:
                    result.get(timeout=30)
                except NodeExistsError:
                    store.create(f"{again}/{m.partition}-{m.sequence}-{m.body.decode()}-", sequence=True)
            processed += len(batch)
            if batch:
                print(json.dumps({"processed": processed, "partitions": consumer.assigned, "t": time.time()}),
                      flush=True)  # fmt: skip
                time.sleep(0.1)  # the work: a backlog stays for the hand-over to take
    store.stop()
    store.close()


if __name__ == "__main__":
    main()
