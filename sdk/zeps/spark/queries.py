"""Starting a streaming query past Spark's fixed wait for a new Python process.

Spark plans a Python data source (``zeps`` among them) in a new Python process on the driver, and
waits a fixed 10 seconds for that process to connect back (``PythonWorkerFactory.createSimpleWorker``
in Spark 4; no setting changes it). On a loaded machine, a process that must first read pyspark and
pyarrow from disk can take longer: the query then fails while it initializes its sources, with
"Python worker failed to connect back", before it has read or committed anything. Starting it again
(from the same checkpoint, if it has one) is then safe, and that is what :func:`start_query` does.

    query = start_query(lambda: df.writeStream.format("memory").queryName("q").start())
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: What Spark says when the planning process did not connect back in time (Spark 4's message).
WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"

#: Status messages of a query still initializing, or ending (Spark's StreamExecution.runStream)
_NOT_SETTLED = ("Initializing", "Terminated", "Stopped")


def start_query(start: Callable[[], Any], *, attempts: int = 3, timeout: float = 300.0, poll: float = 0.05) -> Any:
    """``start()`` a streaming query and return it once its sources are initialized.

    A query that fails while initializing because Spark's planning process did not connect back in
    time is started again, ``attempts`` times in all; any other failure is raised as Spark raised
    it. ``timeout`` bounds each attempt's initialization (the query is stopped, then TimeoutError).
    A query that ends by itself during initialization without an error is returned as it is.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be 1 or more, not {attempts}")
    for attempt in range(1, attempts + 1):
        query = start()
        deadline = time.monotonic() + timeout
        # Spark's status while a query starts: "Initializing StreamExecution", then "Initializing
        # sources" while it plans its sources. A query that fails or is stopped says "Terminated with
        # exception: ..." or "Stopped" a moment before it stops being active: wait for that too, so
        # its error is seen. Any other message means the sources are planned.
        while query.isActive and str(query.status["message"]).startswith(_NOT_SETTLED):
            if time.monotonic() > deadline:
                query.stop()
                raise TimeoutError(f"the streaming query did not initialize its sources in {timeout:g} s")
            time.sleep(poll)
        error = None if query.isActive else query.exception()
        if error is None:
            return query
        if WORKER_DID_NOT_CONNECT not in str(error) or attempt == attempts:
            raise error
        log.warning(
            "the streaming query failed to start (%s: Spark's planning process did not connect back in "
            "its fixed 10 s); starting it again (attempt %d of %d)", WORKER_DID_NOT_CONNECT, attempt + 1, attempts
        )  # fmt: skip
    raise AssertionError("unreachable: the last attempt returns or raises")
