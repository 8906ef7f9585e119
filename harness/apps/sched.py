"""A test app for run-time schedules: ``stamp(tag)`` records each run in Redis,
HINCRBY ``<prefix>ledger:sched:<tag>`` <tick ms> 1 (the run's ``ctx.tick``, which a run-time
schedule's job learns from its id ``<prefix>schedule:<name>:<tick ms>``), so a tick run twice
shows as 2 and a lost one as absent."""

from __future__ import annotations

from worker import App, JobContext

app = App("sched")


@app.task
async def stamp(ctx: JobContext, tag: str) -> None:
    assert ctx.tick is not None, "a run-time schedule's run knows its tick"
    tick = str(round(ctx.tick.timestamp() * 1000))
    key = f"{ctx.context.keys.prefix}ledger:sched:{tag}"
    await ctx.redis.hincrby(key, tick, 1)  # type: ignore[misc]
