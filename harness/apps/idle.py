"""An app with nothing to do until told: ``stamp(sent)`` records enqueue-to-start (seconds on
this host's clock) in ``<prefix>idle:starts``. No periodic job, so an idle fleet stays idle."""

from __future__ import annotations

import asyncio
import os
import time

from worker import App, JobContext

app = App("idle")


@app.task
async def stamp(ctx: JobContext, sent: float) -> None:
    prefix = os.environ["WORKER_KEY_PREFIX"]
    await ctx.redis.rpush(f"{prefix}idle:starts", time.time() - sent)


@app.task
async def nap(ctx: JobContext, sent: float, seconds: float) -> None:
    """Like ``stamp``, then holds its slot for ``seconds``."""
    prefix = os.environ["WORKER_KEY_PREFIX"]
    await ctx.redis.rpush(f"{prefix}idle:starts", time.time() - sent)
    await asyncio.sleep(seconds)
