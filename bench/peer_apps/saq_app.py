"""saq in its own venv (see _child.py): ``Worker(concurrency=100)`` on a ``RedisQueue``.

Defaults otherwise: JSON payloads, job ttl 600 s (the finished job and its result stay in Redis
for 10 minutes), timeout 10 s, 1 try; every concurrency slot blocks in its own BLMOVE.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _child import Tally, main
from saq import Queue, Worker

CHUNK = 1000


async def noop(ctx: dict[str, Any], *, i: int) -> None:
    Tally.ran += 1


async def fill(url: str, n: int) -> None:
    """Enqueue n jobs (gathered CHUNK at a time); print the loop's time and CPU as JSON."""
    queue = Queue.from_url(url)
    await queue.connect()
    try:
        await queue.count("incomplete")  # warm: the connection (ours is warmed too)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for lo in range(0, n, CHUNK):
            jobs = [queue.enqueue("noop", i=i) for i in range(lo, min(n, lo + CHUNK))]
            if not all(await asyncio.gather(*jobs)):
                raise RuntimeError("saq refused a job")
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(json.dumps({"secs": secs, "cpu": cpu}), flush=True)
    finally:
        await queue.disconnect()


async def prepare(url: str) -> Callable[[], Awaitable[None]]:
    queue = Queue.from_url(url)
    await queue.connect()
    worker = Worker(queue, functions=[("noop", noop)], concurrency=100)

    async def run() -> None:  # what saq's CLI does: connect, start, disconnect
        try:
            await worker.start()
        finally:
            await queue.disconnect()

    return run


if __name__ == "__main__":
    main(["saq", "redis", "hiredis", "uvloop"], fill, prepare)
