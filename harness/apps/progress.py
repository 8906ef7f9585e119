"""The test app of tests/system/test_progress_processes.py: progress, staleness and
dependency checks,
each switched by a key in the main Redis (``<prefix>progress:<switch>``) so a test flips them
while the process runs.

- ``stall`` per_process service (``sla_s`` 1.5): calls ``ctx.alive()`` every 0.1 s, except
  while ``stall`` exists.
- ``boxes`` per_key service over keys ``k1``, ``k2`` (``sla_s`` 1.5), an async generator: yields
  (progress) every 0.1 s, except while ``stall:<key>`` exists.
- ``flaky`` periodic (every 1 s, ``max_staleness`` 2 s): raises ``ValueError`` while ``fail``
  exists.
- ``dependency`` health check (timeout 0.5 s, every 0.2 s): raises ``ConnectionError`` while
  ``down`` exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from worker import App, Context, JobContext

app = App("progress")


def _switch(ctx: Context, name: str) -> str:
    return f"{ctx.settings.key_prefix}progress:{name}"


@app.service(cardinality="per_process", sla_s=1.5)
async def stall(ctx: Context, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if not await ctx.redis.exists(_switch(ctx, "stall")):
            ctx.alive()
        await ctx.clock.wait(stop, 0.1)


@app.service(cardinality="per_key", keys=["k1", "k2"], sla_s=1.5)
async def boxes(ctx: Context, stop: asyncio.Event, key: str) -> AsyncIterator[None]:
    while not stop.is_set():
        if not await ctx.redis.exists(_switch(ctx, f"stall:{key}")):
            yield
        await ctx.clock.wait(stop, 0.1)


@app.periodic(every=1, max_staleness=2)
async def flaky(ctx: JobContext) -> None:
    if await ctx.redis.exists(_switch(ctx.context, "fail")):
        raise ValueError("flaky failed on purpose")


@app.health_check(timeout_s=0.5, interval_s=0.2)
async def dependency(ctx: Context) -> None:
    if await ctx.redis.exists(_switch(ctx, "down")):
        raise ConnectionError("the dependency is down (test switch)")
