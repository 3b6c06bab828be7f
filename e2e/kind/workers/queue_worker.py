"""A long-lived Queue worker for the kind fault tests: one SDK handle, so one ZooKeeper session for the
process's whole life (what a ZooKeeper leader change or a pod kill tests), printing JSON lines.

    python queue_worker.py QUEUE PAUSE

PAUSE seconds of "work" per item; a negative PAUSE takes one item and holds it (a worker stuck mid-item,
until its pod is killed). Each item prints {"took": body, "attempt": n} and, once acknowledged,
{"acked": body}; an acknowledgement refused because the lock was lost prints {"lost": body} (the item
is then someone else's to redo); one whose session expired while it was in flight, the item being gone,
prints {"gone": body} (this ack or another worker's removed it: nothing to redo, not claimed); any other
zeps error prints {"error": ...} and the loop goes on.
"""

import faulthandler
import json
import signal
import sys
import time

import zeps


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 1`: every thread's stack, to the log
    queue = zeps.queue(sys.argv[1])
    pause = float(sys.argv[2])
    while True:
        try:
            item = queue.take(timeout=30)
            if item is None:
                continue
            body = item.body.decode()
            say(took=body, attempt=item.attempt)
            if pause < 0:
                while True:  # a worker that hangs holding its item, until the test kills it
                    signal.pause()  # (a stack dump's SIGUSR1 included)
            time.sleep(pause)  # the work
            try:
                item.ack()
            except zeps.AckUncertainError:  # done, by this ack or by another worker's
                say(gone=body)
                continue
            except zeps.LockLostError:  # the item is already back in the queue
                say(lost=body)
                continue
            say(acked=body)
        except zeps.ZepsError as exc:
            say(error=f"{type(exc).__name__}: {exc}")
            time.sleep(1)  # ZooKeeper away: try again in a second (the workload's retry)


if __name__ == "__main__":
    main()
