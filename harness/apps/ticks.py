"""An app whose only work is a tick every second (a duty job: the leader enqueues it into the
duty lane), recording how late each started (``<prefix>ticks:late``, ms from its instant)."""

from __future__ import annotations

import os
import time

from worker import App, JobContext

app = App("ticks")


@app.periodic(every=1, catch_up="skip")
async def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    late = int(time.time() * 1000 - ctx.tick.timestamp() * 1000)
    await ctx.redis.rpush(os.environ["WORKER_KEY_PREFIX"] + "ticks:late", late)
