"""A test app for flow keys: ``per_key(n)`` (at most 2 at once per flow key), ``one_per_key(n)``
(at most 1 per flow key; the job ``n == 0`` holds its slot for a minute) and ``fair_step(n)``
(fair), each recording its run in ``<prefix>fair:runs`` (job id -> ``<flow key>|<start s>|<end
s>``; a start alone while it runs)."""

from __future__ import annotations

import asyncio
import time

from worker import App, JobContext

app = App("fairflow")


async def _ran(ctx: JobContext, key: str, step_s: float) -> None:
    runs = f"{ctx.context.keys.prefix}fair:runs"
    start = time.time()
    await ctx.redis.hset(runs, ctx.job_id, f"{key}|{start}")
    await asyncio.sleep(step_s)
    await ctx.redis.hset(runs, ctx.job_id, f"{key}|{start}|{time.time()}")


@app.task(max_concurrency_per_key=2, flow_key=lambda key, n: key)
async def per_key(ctx: JobContext, key: str, n: int) -> None:
    await _ran(ctx, key, 0.1)


@app.task(max_concurrency_per_key=1, flow_key=lambda key, n: key, timeout_s=120)
async def one_per_key(ctx: JobContext, key: str, n: int) -> None:
    await _ran(ctx, key, 60.0 if n == 0 else 0.01)


@app.task(fair=True, flow_key=lambda key, n: key)
async def fair_step(ctx: JobContext, key: str, n: int) -> None:
    await _ran(ctx, key, 0.01)
