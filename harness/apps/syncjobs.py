"""The test app of tests/system/test_sync_processes.py: plain ``def`` tasks and a plain ``def``
periodic job, each recording what it saw in ``<prefix>sync:<kind>`` (a JSON line per run)
through ``ctx.sync`` (the event loop's Redis, called from the job's thread)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from worker import App, JobContext

app = App("syncjobs")


def record(ctx: JobContext, kind: str, **fields: Any) -> None:
    key = f"{ctx.context.settings.key_prefix}sync:{kind}"
    ctx.sync.run(ctx.redis.rpush(key, json.dumps(fields)))


@app.task
def block(ctx: JobContext, i: int, seconds: float) -> int:
    start = time.time()
    time.sleep(seconds)  # blocks its thread, not the event loop
    record(ctx, "block", i=i, start=start, end=time.time(), thread=threading.current_thread().name)
    return i


@app.task(timeout_s=0.5)
def overrun(ctx: JobContext, i: int, seconds: float) -> None:
    time.sleep(seconds)  # past its timeout: the run ends at 0.5 s, the thread runs on
    cancelled, claimed = ctx.sync.cancelled, ctx.sync.still_claimed()
    record(ctx, "overrun", i=i, end=time.time(), cancelled=cancelled, claimed=claimed)


@app.task
async def ping(ctx: JobContext, i: int) -> None:
    await ctx.redis.rpush(
        f"{ctx.context.settings.key_prefix}sync:ping", json.dumps({"i": i, "at": time.time()})
    )


@app.periodic(every=1)
def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    record(ctx, "tick", tick=ctx.tick.timestamp(), thread=threading.current_thread().name)
