"""The test app of tests/duties/test_poll_outcomes.py: poll jobs that succeed, fail, retry, hang or
remove their item, each run recorded in Redis (``<prefix>pf:runs``: RPUSH JSON ``{item, job_id,
try, t}``), so a test sees which jobs carried an item and when.

- poller ``items`` (2 shards, 0.2 s interval, ``failure_delay_s`` = ``POLLFAIL_DELAY_S``) ->
  ``poll_item(item)``, by the item's name:
  ``ok-*`` succeeds and reschedules the item 1 s later; ``done-*`` succeeds and does not
  reschedule it (the app is done with it); ``fail-*`` raises ``ValueError``; ``slow-*`` sleeps
  ``POLLFAIL_SLOW_S`` (60 s: to be aborted, or to keep the only slot busy); ``gone-*``
  removes its item (``ctx.poller("items").remove``) and then raises.
- poller ``flaky`` (same timings) -> ``flaky_item(item)``: raises ``ConnectionError``, which the
  task retries (``retry_on``) up to ``max_tries=3``, 0.2 s apart; then it is dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from worker import App, JobContext

app = App("pollfail")

DELAY_S = float(os.environ.get("POLLFAIL_DELAY_S", "1"))
items = app.poller("items", task="poll_item", shards=2, interval_s=0.2, failure_delay_s=DELAY_S)
flaky = app.poller("flaky", task="flaky_item", interval_s=0.2, failure_delay_s=DELAY_S)


async def _record(ctx: JobContext, item: str) -> None:
    run = {"item": item, "job_id": ctx.job_id, "try": ctx.job_try, "t": time.time()}
    await ctx.redis.rpush(f"{ctx.context.settings.key_prefix}pf:runs", json.dumps(run))


@app.task
async def poll_item(ctx: JobContext, item: str) -> None:
    await _record(ctx, item)
    kind = item.partition("-")[0]
    if kind == "ok":
        await ctx.poller("items").schedule(item, delay=1)
    elif kind == "fail":
        raise ValueError(f"gateway refused {item}")
    elif kind == "slow":
        await asyncio.sleep(float(os.environ.get("POLLFAIL_SLOW_S", "60")))
    elif kind == "gone":
        await ctx.poller("items").remove(item)
        raise ValueError(f"{item} is gone for good")


@app.task(retry_on=(ConnectionError,), max_tries=3, retry_delay=0.2)
async def flaky_item(ctx: JobContext, item: str) -> None:
    await _record(ctx, item)
    raise ConnectionError(f"gateway unreachable for {item}")
