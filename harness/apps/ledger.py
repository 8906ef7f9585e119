"""A test app that records what it did in Redis ledgers, so tests assert on data, not logs.

- ``tick`` (every 1 s): HINCRBY ``<prefix>ledger:ticks`` <tick ms> 1, so a tick executed twice
  shows as 2 and a missing tick as absent.
- poller ``items`` -> ``handle_item``: HINCRBY ``<prefix>ledger:items`` <item> 1; reschedules
  the item after ``LEDGER_RESCHEDULE_S`` when set.
- initializer ``seed`` (version ``LEDGER_INIT_VERSION``): ``LEDGER_INIT_ITEMS`` items in batches
  of ``LEDGER_INIT_BATCH``, sleeping ``LEDGER_INIT_SLEEP_S`` per batch, recording each batch it
  *produced* in ``<prefix>ledger:init-batches`` (HINCRBY cursor 1).
- ``slow_job(seconds)``: sleeps, then records its run count per job id.
- ``fails_once(key)``: raises on its first run per key, succeeds on the next.
- ``halfway(key)``: reports progress 0.25 then 0.75 ("three quarters") 0.6 s later, waits
  0.6 s more and records its run in ``<prefix>ledger:halfway``.
- ``crashy`` service (per_process, only when ``LEDGER_CRASHY=1``): raises at once, always.
- ``stubborn`` service (singleton, only when ``LEDGER_STUBBORN=1``): ignores stop and cancellation.
- ``mailbox`` per_key service (keys from ``LEDGER_MAILBOXES``): flags two loops on one key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping

from worker import App, Context, JobContext

app = App("ledger")

items = app.poller("items", task="handle_item", shards=3, batch_size=200, interval_s=0.2)


def _k(ctx: Context | JobContext, name: str) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return f"{context.settings.key_prefix}ledger:{name}"


@app.periodic(every=1, catch_up="all", catch_up_limit=100)
async def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    await ctx.redis.hincrby(_k(ctx, "ticks"), str(int(ctx.tick.timestamp() * 1000)), 1)


@app.task
async def handle_item(ctx: JobContext, item: str) -> None:
    await ctx.redis.hincrby(_k(ctx, "items"), item, 1)
    again = float(os.environ.get("LEDGER_RESCHEDULE_S", "0"))
    if again:
        await ctx.poller("items").schedule(item, delay=again)


@app.task
async def slow_job(ctx: JobContext, seconds: float) -> str:
    await ctx.redis.hincrby(_k(ctx, "slow-started"), ctx.job_id, 1)
    await asyncio.sleep(seconds)
    await ctx.redis.hincrby(_k(ctx, "slow-done"), ctx.job_id, 1)
    return "done"


@app.task
async def record(ctx: JobContext, key: str) -> None:
    await ctx.redis.hincrby(_k(ctx, "records"), key, 1)


@app.task
async def fail(ctx: JobContext, key: str) -> None:
    await ctx.redis.hincrby(_k(ctx, "failed"), key, 1)
    raise ValueError(f"fails on purpose: {key}")


@app.task
async def fails_once(ctx: JobContext, key: str) -> str:
    """Fails on its first run per ``key`` (no retry_on: the job fails), succeeds after."""
    runs = await ctx.redis.hincrby(_k(ctx, "fails-once"), key, 1)
    if runs == 1:
        raise ValueError(f"first run of {key} fails on purpose")
    return f"ran {runs} times"


@app.task
async def halfway(ctx: JobContext, key: str) -> None:
    await ctx.progress(0.25)
    await asyncio.sleep(0.6)
    await ctx.progress(0.75, "three quarters")
    await asyncio.sleep(0.6)
    await ctx.redis.hincrby(_k(ctx, "halfway"), key, 1)


@app.initializer(version=os.environ.get("LEDGER_INIT_VERSION", "v1"), poller="items")
async def seed(ctx: Context, cursor: str | None) -> AsyncIterator[tuple[str, Mapping[str, float]]]:
    total = int(os.environ.get("LEDGER_INIT_ITEMS", "0"))
    batch = int(os.environ.get("LEDGER_INIT_BATCH", "100"))
    pause = float(os.environ.get("LEDGER_INIT_SLEEP_S", "0"))
    start = int(cursor) if cursor else 0
    for first in range(start, total, batch):
        if pause:
            await asyncio.sleep(pause)
        last = min(first + batch, total)
        await ctx.redis.hincrby(_k(ctx, "init-batches"), str(last), 1)
        # due far in the future: the test counts items in the shard queues
        yield str(last), {f"seed-{n:07d}": 4_000_000_000.0 for n in range(first, last)}


if os.environ.get("LEDGER_CRASHY") == "1":

    @app.service(cardinality="per_process")
    async def crashy(ctx: Context, stop: asyncio.Event) -> None:
        await ctx.redis.incr(_k(ctx, "crashy-starts"))
        raise RuntimeError("crashy service always fails")


if os.environ.get("LEDGER_STUBBORN") == "1":

    @app.service(cardinality="singleton")
    async def stubborn(ctx: Context, stop: asyncio.Event) -> None:
        """A singleton that ignores both its stop event and cancellation (a buggy user loop)."""
        await ctx.redis.incr(_k(ctx, "stubborn-starts"))
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue


if os.environ.get("LEDGER_MAILBOXES"):

    @app.service(
        cardinality="per_key",
        keys=lambda ctx: os.environ["LEDGER_MAILBOXES"].split(","),
    )
    async def mailbox(ctx: Context, stop: asyncio.Event, key: str) -> None:
        """Claims an owner marker for its key (short TTL, refreshed while running): finding
        the marker taken at start means two loops ran the same key at once."""
        marker = _k(ctx, f"mailbox-owner:{key}")
        if not await ctx.redis.set(marker, os.getpid(), nx=True, px=1500):
            await ctx.redis.hincrby(_k(ctx, "mailbox-overlaps"), key, 1)
        await ctx.redis.hincrby(_k(ctx, "mailbox-starts"), key, 1)
        try:
            while not stop.is_set():
                await ctx.redis.set(marker, os.getpid(), px=1500)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.3)
        finally:
            if await ctx.redis.get(marker) == str(os.getpid()).encode():
                await ctx.redis.delete(marker)


@app.task(max_concurrency=1)
async def exclusive(ctx: JobContext, name: str, seconds: float) -> None:
    """At most one at a time cluster-wide: records start/end times to check it."""
    await ctx.redis.hset(_k(ctx, "exclusive-start"), name, time.time())
    await asyncio.sleep(seconds)
    await ctx.redis.hset(_k(ctx, "exclusive-end"), name, time.time())
