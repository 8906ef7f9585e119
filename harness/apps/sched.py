"""A test app for run-time schedules: ``stamp(tag)`` records each run in Redis,
HINCRBY ``<prefix>ledger:sched:<tag>`` <tick ms> 1 (the tick from the job id
``<prefix>schedule:<name>:<tick ms>``), so a tick run twice shows as 2 and a lost one as absent."""

from __future__ import annotations

from worker import App, JobContext

app = App("sched")


@app.task
async def stamp(ctx: JobContext, tag: str) -> None:
    tick = ctx.job_id.rpartition(":")[2]
    key = f"{ctx.context.keys.prefix}ledger:sched:{tag}"
    await ctx.redis.hincrby(key, tick, 1)  # type: ignore[misc]
