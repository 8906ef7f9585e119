"""The app ``python -m bench lane`` runs (imported as ``lane_app``, from ``bench/`` on the
path, so a run ``--against`` another checkout loads that checkout's ``worker`` with it).

- ``busy(seconds)``: a user job holding its slot;
- ``tick``, ``every=1``: records how late it started (ms from its instant) in
  ``bench:lane:tick``;
- poller ``lanepoll`` dispatching ``polled(item)``: records how long the job waited in its
  queue (ms from its enqueue) in ``bench:lane:poll`` and puts its item back, due 1 s on;
- ``fanout(n)``: ``ctx.enqueue_many`` of ``n`` unique-key ``noop`` jobs from a task; records
  the seconds until the ids were back in ``bench:lane:fanout``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from worker import App, JobContext
from worker.bulk import JobSpec

app = App("bench-lane")


@app.task(timeout_s=600)
async def busy(ctx: JobContext, seconds: float) -> None:
    await asyncio.sleep(seconds)


@app.task
async def noop(ctx: JobContext, *args: Any) -> None:
    return None


@app.periodic(every=1, catch_up="skip")
async def tick(ctx: JobContext) -> None:
    assert ctx.tick is not None
    late = int(time.time() * 1000 - ctx.tick.timestamp() * 1000)
    await ctx.redis.rpush("bench:lane:tick", f"{int(time.time() * 1000)}:{late}")


@app.task
async def polled(ctx: JobContext, item: str) -> None:
    waited = int(time.time() * 1000 - ctx["enqueue_time"].timestamp() * 1000)
    await ctx.redis.rpush("bench:lane:poll", f"{item}:{waited}")
    await ctx.poller("lanepoll").schedule(item, delay=1.0)


@app.task(timeout_s=3600)
async def fanout(ctx: JobContext, n: int) -> None:
    started = time.monotonic()
    ids = await ctx.enqueue_many(JobSpec("noop", (i,), unique_key=f"f{i}") for i in range(n))
    took = time.monotonic() - started
    await ctx.redis.set("bench:lane:fanout", f"{took:.2f}:{sum(1 for i in ids if i)}")


app.poller("lanepoll", task="polled", interval_s=0.5)
