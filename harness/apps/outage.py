"""The test app of tests/system/test_poll_failover.py and tests/system/test_refused_writes.py:
poll jobs that are mid-flight when Redis goes away or refuses writes. It records what it did in
a LEDGER ON A SERVER THAT IS NEVER FAULTED (``OUTAGE_LEDGER_URL``); every ledger key is
``<WORKER_KEY_PREFIX>outage:<name>``.

- poller ``items`` (2 shards, 0.2 s interval, the default ``failure_delay_s``: 60 s) ->
  ``poll_item(item)``: RPUSH ``starts`` ``[item, wall time]``; sleep ``OUTAGE_WORK_S`` (1 s:
  the window in which an outage finds it mid-flight); reschedule the item
  ``OUTAGE_EVERY_S`` (1 s) on through ``ctx.poller("items").schedule`` (the framework's own
  call); HINCRBY ``scheduled`` <item> 1.
- ``tick`` (every 1 s, ``OUTAGE_TICKS=1``): HINCRBY ``ticks`` <tick ms> 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from harness.clients import ledger_client
from worker import App, JobContext

app = App("outage")

WORK_S = float(os.environ.get("OUTAGE_WORK_S", "1"))
EVERY_S = float(os.environ.get("OUTAGE_EVERY_S", "1"))
items = app.poller("items", task="poll_item", shards=2, interval_s=0.2)


ledger = ledger_client("OUTAGE_LEDGER_URL")


def _k(ctx: JobContext, name: str) -> str:
    return f"{ctx.context.settings.key_prefix}outage:{name}"


@app.task
async def poll_item(ctx: JobContext, item: str) -> None:
    await ledger().rpush(_k(ctx, "starts"), json.dumps([item, time.time()]))
    await asyncio.sleep(WORK_S)
    await ctx.poller("items").schedule(item, delay=EVERY_S)
    await ledger().hincrby(_k(ctx, "scheduled"), item, 1)


if os.environ.get("OUTAGE_TICKS") == "1":

    @app.periodic(every=1)
    async def tick(ctx: JobContext) -> None:
        assert ctx.tick is not None
        await ledger().hincrby(_k(ctx, "ticks"), str(int(ctx.tick.timestamp() * 1000)), 1)
