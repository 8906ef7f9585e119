"""The test app of tests/system/test_failover.py and bench/failover.py: it records what it did in a
LEDGER ON A SERVER THAT IS NEVER FAULTED (``FAILOVER_LEDGER_URL``), so a primary failover of
the worker's own Redis cannot take the evidence with it. Every ledger key is
``<WORKER_KEY_PREFIX>ledger:<name>``.

- ``tick`` (every 1 s, catch-up ``all``): HINCRBY ``ticks`` <tick ms> 1; HSETNX ``tick-at``
  <tick ms> <wall time of the first run>; RPUSH ``tick-runs`` {tick, job id, try, pid, time} (the
  evidence when a tick runs twice: the same job twice, or two jobs).
- poller ``items`` (``handle_item``): HINCRBY ``items`` <item> 1 and ``item-jobs`` <job id> 1.
- ``record(n)``: HINCRBY ``jobs`` <job id> 1 (a client enqueues these during the faults).
- initializer ``seed`` (``FAILOVER_INIT_ITEMS`` items in batches of ``FAILOVER_INIT_BATCH``,
  ``FAILOVER_INIT_SLEEP_S`` per batch) into poller ``seeds`` (never due): HINCRBY
  ``init-batches`` <cursor> 1 per batch produced.
- ``guard`` singleton service: RPUSH ``intervals`` {id, pid, start}, HSET ``alive`` id <time>
  every 50 ms, HSET ``end`` id <time> on exit: two intervals that overlap are two leaders
  acting at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping

import redis.asyncio as aioredis

from worker import App, Context, JobContext

app = App("failover")

items = app.poller("items", task="handle_item", shards=2, batch_size=50, interval_s=0.1)
seeds = app.poller("seeds", task="handle_item", shards=2)

_ledger: aioredis.Redis | None = None


def ledger() -> aioredis.Redis:
    """This process's client on the ledger server (created on first use)."""
    global _ledger
    if _ledger is None:
        _ledger = aioredis.Redis.from_url(
            os.environ["FAILOVER_LEDGER_URL"],
            socket_timeout=10,
            socket_connect_timeout=5,
            max_connections=2**31,  # uncapped, as in redis-py 5 (6+ caps at 100)
        )
    return _ledger


def _k(ctx: Context | JobContext, name: str) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return f"{context.settings.key_prefix}ledger:{name}"


@app.periodic(every=1, catch_up="all", catch_up_limit=100)
async def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    tick_ms = str(int(ctx.tick.timestamp() * 1000))
    async with ledger().pipeline(transaction=False) as pipe:
        pipe.hincrby(_k(ctx, "ticks"), tick_ms, 1)
        pipe.hsetnx(_k(ctx, "tick-at"), tick_ms, repr(time.time()))
        pipe.rpush(
            _k(ctx, "tick-runs"),
            json.dumps(
                {
                    "tick": tick_ms,
                    "job": ctx.job_id,
                    "try": ctx.get("job_try"),
                    "pid": os.getpid(),
                    "at": time.time(),
                }
            ),
        )
        await pipe.execute()


@app.task
async def handle_item(ctx: JobContext, item: str) -> None:
    async with ledger().pipeline(transaction=False) as pipe:
        pipe.hincrby(_k(ctx, "items"), item, 1)
        pipe.hincrby(_k(ctx, "item-jobs"), ctx.job_id, 1)
        await pipe.execute()


@app.task
async def record(ctx: JobContext, n: int) -> None:
    await ledger().hincrby(_k(ctx, "jobs"), ctx.job_id, 1)


@app.initializer(version=os.environ.get("FAILOVER_INIT_VERSION", "v1"), poller="seeds")
async def seed(ctx: Context, cursor: str | None) -> AsyncIterator[tuple[str, Mapping[str, float]]]:
    total = int(os.environ.get("FAILOVER_INIT_ITEMS", "0"))
    batch = int(os.environ.get("FAILOVER_INIT_BATCH", "100"))
    pause = float(os.environ.get("FAILOVER_INIT_SLEEP_S", "0"))
    start = int(cursor) if cursor else 0
    for first in range(start, total, batch):
        if pause:
            await asyncio.sleep(pause)
        last = min(first + batch, total)
        await ledger().hincrby(_k(ctx, "init-batches"), str(last), 1)
        yield str(last), {f"seed-{n:07d}": 4_000_000_000.0 for n in range(first, last)}


@app.service(cardinality="singleton")
async def guard(ctx: Context, stop: asyncio.Event) -> None:
    led = ledger()
    rid = uuid.uuid4().hex[:12]
    await led.rpush(
        _k(ctx, "intervals"),
        json.dumps(
            {"id": rid, "pid": os.getpid(), "start": time.time(), "epoch": ctx.leader_epoch()}
        ),
    )
    try:
        while not stop.is_set():
            await led.hset(_k(ctx, "alive"), rid, repr(time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(led.hset(_k(ctx, "end"), rid, repr(time.time())))
