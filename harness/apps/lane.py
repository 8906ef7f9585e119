"""The duty lane's app: a slow user task, a tick every second and a poller whose items come
back every second, each duty recording how late it started (``<prefix>lane:tick``: ms from
the tick's instant; ``<prefix>lane:poll``: ms from its job's enqueue)."""

from __future__ import annotations

import asyncio
import os
import time

from worker import App, JobContext
from worker.bulk import JobSpec

app = App("lane")
PREFIX = os.environ.get("WORKER_KEY_PREFIX", "worker:")


@app.task(timeout_s=60)
async def busy(ctx: JobContext, seconds: float) -> None:
    """A user job holding its slot for ``seconds``."""
    await asyncio.sleep(seconds)


@app.periodic(every=1, catch_up="skip")
async def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    late = int(time.time() * 1000 - ctx.tick.timestamp() * 1000)
    await ctx.redis.rpush(PREFIX + "lane:tick", late)


@app.task
async def polled(ctx: JobContext, item: str) -> None:
    waited = int(time.time() * 1000 - ctx["enqueue_time"].timestamp() * 1000)
    await ctx.redis.rpush(PREFIX + "lane:poll", f"{item}:{waited}")
    await ctx.poller("lanepoll").schedule(item, delay=1.0)


app.poller("lanepoll", task="polled", interval_s=0.5)


@app.task
async def noop(ctx: JobContext, n: int) -> None:
    """A user job that does nothing (what ``fanout`` enqueues)."""


@app.task(timeout_s=300)
async def fanout(ctx: JobContext, n: int) -> None:
    """``ctx.enqueue_many`` of ``n`` unique-key jobs from a task; records the seconds until the
    ids were back and how many were written (``<prefix>lane:fanout``: ``<s>:<written>``)."""
    began = time.monotonic()
    ids = await ctx.enqueue_many(JobSpec("noop", (i,), unique_key=f"f{i}") for i in range(n))
    took = time.monotonic() - began
    await ctx.redis.set(PREFIX + "lane:fanout", f"{took:.3f}:{sum(1 for i in ids if i)}")
