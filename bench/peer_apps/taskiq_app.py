"""taskiq + taskiq-redis in its own venv (see _child.py): ``RedisStreamBroker`` (streams, acks).

The worker is taskiq's ``Receiver`` built as ``taskiq worker`` builds it with its defaults
(max_async_tasks 100, max_prefetch 0, ack when saved, a thread pool for sync tasks), in one
process (the CLI's default is 2 worker processes). No result backend is configured, which is
taskiq's default: results are not stored. Defaults otherwise: JSON messages, XREADGROUP of 100,
and after every read an XAUTOCLAIM of idle entries under a lock.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _child import Tally, main
from taskiq.acks import AcknowledgeType
from taskiq.receiver import Receiver
from taskiq_redis import RedisStreamBroker

CHUNK = 1000


def make(url: str, worker: bool) -> tuple[RedisStreamBroker, Any]:
    broker = RedisStreamBroker(url)
    broker.is_worker_process = worker  # as the CLI does, before tasks are declared

    @broker.task(task_name="noop")
    async def noop(i: int) -> None:
        Tally.ran += 1

    return broker, noop


async def fill(url: str, n: int) -> None:
    broker, noop = make(url, worker=False)
    await broker.startup()
    try:
        for lo in range(0, n, CHUNK):
            await asyncio.gather(*(noop.kiq(i) for i in range(lo, min(n, lo + CHUNK))))
    finally:
        await broker.shutdown()


async def prepare(url: str) -> Callable[[], Awaitable[None]]:
    broker, _ = make(url, worker=True)
    # startup creates the consumer group at "$" (new entries only): it must exist before
    # the parent fills the stream
    await broker.startup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def run() -> None:
        with ThreadPoolExecutor() as pool:
            receiver = Receiver(
                broker=broker,
                executor=pool,
                validate_params=True,
                max_async_tasks=100,
                max_prefetch=0,
                propagate_exceptions=True,
                run_startup=False,
                ack_type=AcknowledgeType.WHEN_SAVED,
            )
            try:
                await receiver.listen(stop)
            finally:
                await broker.shutdown()

    return run


if __name__ == "__main__":
    main(["taskiq", "taskiq-redis", "redis", "hiredis", "uvloop"], fill, prepare)
