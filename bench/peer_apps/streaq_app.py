"""streaq in its own venv (see _child.py): ``Worker(concurrency=100)``, its other defaults.

Defaults: pickle payloads, prefetch = concurrency, results kept 5 minutes (a result key per task
plus an index entry), finished stream entries XACKed and XDELed, a pub/sub message per task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from _child import Tally, main
from streaq import Worker

CHUNK = 1000


def make(url: str) -> tuple[Worker[Any], Any]:
    worker: Worker[Any] = Worker(redis_url=url, concurrency=100)

    @worker.task()
    async def noop(i: int) -> None:
        Tally.ran += 1

    return worker, noop


async def fill(url: str, n: int) -> None:
    worker, noop = make(url)
    async with worker:
        for lo in range(0, n, CHUNK):
            await worker.enqueue_many([noop.enqueue(i) for i in range(lo, min(n, lo + CHUNK))])


async def prepare(url: str) -> Callable[[], Awaitable[None]]:
    worker, _ = make(url)
    return worker.run_async  # connects, loads its Lua library, creates the group, runs


if __name__ == "__main__":
    main(["streaq", "coredis", "anyio", "uvloop"], fill, prepare)
