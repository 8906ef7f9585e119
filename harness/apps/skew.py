"""The test app of tests/system/test_clock_skew.py: what ran, and when by the MAIN server's clock.

Every record is on the server the workers use (no fault touches it), under
``<WORKER_KEY_PREFIX>skew:<name>``; times are that server's ``TIME`` in ms, read by the job.

- ``skew_tick`` (every 1 s, default catch-up: ``all``, limit 10): HINCRBY ``runs`` <tick ms> 1
  and HSETNX ``started`` <tick ms> <server ms when the run began>.
- poller ``skew`` -> ``skew_item(item)``: reschedules its item ``SKEW_DELAY_S`` (2) seconds on
  through ``ctx.poller`` and RPUSHes ``polls`` a JSON {pid, server_ms (before scheduling), score
  (the item's new due time)}.
"""

from __future__ import annotations

import json
import os

from worker import App, JobContext

app = App("skew")
DELAY_S = 2.0

app.poller("skew", task="skew_item", interval_s=0.2)


def _k(ctx: JobContext, name: str) -> str:
    return f"{ctx.context.settings.key_prefix}skew:{name}"


async def _server_ms(ctx: JobContext) -> int:
    sec, usec = await ctx.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


@app.periodic(every=1)
async def skew_tick(ctx: JobContext) -> None:
    now = await _server_ms(ctx)
    assert ctx.tick is not None
    tick = str(round(ctx.tick.timestamp() * 1000))
    await ctx.redis.hincrby(_k(ctx, "runs"), tick, 1)
    await ctx.redis.hsetnx(_k(ctx, "started"), tick, now)


@app.task
async def skew_item(ctx: JobContext, item: str) -> None:
    now = await _server_ms(ctx)
    bound = ctx.poller("skew")
    await bound.schedule(item, delay=DELAY_S)
    score = await ctx.redis.zscore(bound.shard_key(item), item)
    record = {"pid": os.getpid(), "server_ms": now, "score": score}
    await ctx.redis.rpush(_k(ctx, "polls"), json.dumps(record))
