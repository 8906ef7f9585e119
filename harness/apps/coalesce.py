"""A test app for deadlines and coalesced enqueues: every run appends ``start|<key>|<arg>|<job
id>|<epoch s>`` and ``end|...`` to ``<prefix>co:log`` around a sleep of ``CO_STEP_S`` (0.05 s);
every end hook records ``<job id> -> <status>`` in ``<prefix>co:ends``."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from worker import App, JobContext, JobOutcome

app = App("coalesce")
STEP_S = float(os.environ.get("CO_STEP_S", "0.05"))


async def _run(ctx: JobContext, key: str, arg: Any) -> None:
    log = f"{ctx.context.keys.prefix}co:log"
    await ctx.redis.rpush(log, f"start|{key}|{arg}|{ctx.job_id}|{time.time()}")
    await asyncio.sleep(STEP_S)
    await ctx.redis.rpush(log, f"end|{key}|{arg}|{ctx.job_id}|{time.time()}")


@app.task
async def note(ctx: JobContext, key: str, arg: Any) -> None:
    await _run(ctx, key, arg)


@app.task(expires_in=1.0)
async def brief(ctx: JobContext, key: str, arg: Any) -> None:
    await _run(ctx, key, arg)


@app.task(flow_key=lambda key, arg: key, coalesce="keep_last")
async def latest(ctx: JobContext, key: str, arg: Any) -> None:
    await _run(ctx, key, arg)


@app.on_job_end
async def ended(ctx: JobContext, outcome: JobOutcome) -> None:
    key = f"{ctx.context.keys.prefix}co:ends"
    await ctx.redis.hset(key, outcome.job_id, outcome.status)
