"""docket (``pydocket``) in its own venv (see _child.py): a ``Worker(concurrency=100)`` on a
``Docket`` named ``bench``.

Defaults otherwise: tasks travel in a Redis stream (``bench:stream``) read by a consumer group,
each run leased (redelivered after 5 min), its state kept in a runs hash for 15 minutes, the
entry XACKed and XDELed when it ends; the worker reads up to 1,000 entries a round.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from _child import Tally, main
from docket import Docket, Worker

NAME = "bench"


async def noop(i: int) -> None:
    Tally.ran += 1


async def fill(url: str, n: int) -> None:
    """Enqueue n jobs; print the loop's time and CPU as JSON."""
    async with Docket(name=NAME, url=url) as docket:
        docket.register(noop)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(n):  # one at a time: gathered, its connection pool runs out (100)
            await docket.add(noop)(i)
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(json.dumps({"secs": secs, "cpu": cpu}), flush=True)


async def prepare(url: str) -> Callable[[], Awaitable[None]]:
    docket = Docket(name=NAME, url=url)
    await docket.__aenter__()
    docket.register(noop)
    worker = Worker(docket, concurrency=100)

    async def run() -> None:  # what `docket worker` does: the worker's context, run forever
        try:
            async with worker:
                await worker.run_forever()
        finally:
            await docket.__aexit__(None, None, None)

    return run


if __name__ == "__main__":
    main(["pydocket", "redis", "uvloop"], fill, prepare)
