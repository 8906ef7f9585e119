"""A test app for queue pauses: ``step(n)`` on queue ``a`` and ``b_step(n)`` on queue ``b``
each record their start (``<prefix>flow:started``: job id -> ``<queue>|<epoch s>``), then sleep
``FLOW_STEP_S`` (0.05 s)."""

from __future__ import annotations

import asyncio
import os
import time

from worker import App, JobContext

app = App("flow", queues=("a", "b"))
STEP_S = float(os.environ.get("FLOW_STEP_S", "0.05"))


async def _ran(ctx: JobContext, queue: str) -> None:
    key = f"{ctx.context.keys.prefix}flow:started"
    await ctx.redis.hset(key, ctx.job_id, f"{queue}|{time.time()}")
    await asyncio.sleep(STEP_S)


@app.task(queue="a")
async def step(ctx: JobContext, n: int) -> None:
    await _ran(ctx, "a")


@app.task(queue="b")
async def b_step(ctx: JobContext, n: int) -> None:
    await _ran(ctx, "b")
