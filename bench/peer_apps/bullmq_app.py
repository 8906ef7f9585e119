"""BullMQ for Python (``bullmq``) in its own venv (see _child.py): a ``Worker`` on queue
``bench`` with ``concurrency`` 100 (its docs' knob for I/O-bound jobs; the default is 1).

Defaults otherwise: BullMQ's Lua scripts (shared with its Node.js version); a job is a hash
moved from the ``wait`` list to ``active`` under a 30 s lock (renewed every 15 s), then to the
``completed`` set with its return value (kept: no ``removeOnComplete`` by default); an event
per state change in the ``events`` stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _child import Tally, main
from bullmq import Queue, Worker

NAME = "bench"
CHUNK = 1000


async def noop(job: Any, token: str) -> None:
    Tally.ran += 1


async def fill(url: str, n: int) -> None:
    """Enqueue n jobs (``addBulk``, CHUNK at a time); print the loop's time and CPU as JSON."""
    queue = Queue(NAME, {"connection": url})
    try:
        cpu0, t0 = time.process_time(), time.perf_counter()
        for lo in range(0, n, CHUNK):
            await queue.addBulk(
                [{"name": "noop", "data": {"i": i}} for i in range(lo, min(n, lo + CHUNK))]
            )
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(json.dumps({"secs": secs, "cpu": cpu}), flush=True)
    finally:
        await queue.close()


async def prepare(url: str) -> Callable[[], Awaitable[None]]:
    worker = Worker(NAME, noop, {"connection": url, "concurrency": 100, "autorun": False})

    async def run() -> None:
        try:
            await worker.run()
        finally:
            await worker.close()

    return run


if __name__ == "__main__":
    main(["bullmq", "redis", "uvloop"], fill, prepare)
