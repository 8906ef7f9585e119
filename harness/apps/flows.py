"""The test app of tests/system/test_workflows.py: workflow steps that keep a ledger in Redis.

Every run of a task adds one to ``<prefix>flows:runs`` field ``<task>:<job id>``; ``collect``
and ``report`` also keep their input in ``<prefix>flows:inputs`` (field ``<job id>``, JSON).

With ``FLOWS_KILL_AT=<n>`` in its environment a process SIGKILLs itself in the end hook of the
first member run at or after ``n`` members ended in the cluster (once per cluster, by
``<prefix>flows:killed``): after that run's workflow step was recorded and its dependents
enqueued, before its job's end is surely written (the completer batches ends).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

from worker import App, JobContext, JobOutcome

app = App("flows")


def _k(ctx: JobContext, name: str) -> str:
    return f"{ctx.context.settings.key_prefix}flows:{name}"


async def _ran(ctx: JobContext, task: str, value: Any = None) -> None:
    redis: Any = ctx.redis
    await redis.hincrby(_k(ctx, "runs"), f"{task}:{ctx.job_id}", 1)
    if value is not None:
        await redis.hset(_k(ctx, "inputs"), ctx.job_id, json.dumps(value))


@app.task
async def add(ctx: JobContext, *numbers: int) -> int:
    await _ran(ctx, "add")
    return sum(numbers)


@app.task
async def double(ctx: JobContext, x: int) -> int:
    await _ran(ctx, "double")
    return 2 * x


@app.task
async def square(ctx: JobContext, i: int) -> int:
    await _ran(ctx, "square")
    await asyncio.sleep(float(os.environ.get("FLOWS_MEMBER_S", "0")))
    return i * i


@app.task
async def collect(ctx: JobContext, values: list[int]) -> int:
    await _ran(ctx, "collect", values)
    return sum(v for v in values if v is not None)


@app.task
async def tally(ctx: JobContext, counts: dict[str, int], batch: str) -> str:
    await _ran(ctx, "tally", counts)
    return f"{batch}: {counts['done']} done, {counts['failed']} failed"


@app.task(parents="context")
async def report(ctx: JobContext, title: str) -> str:
    await _ran(ctx, "report", ctx.parents)
    return f"{title}: {ctx.parents}"


@app.task
async def boom(ctx: JobContext, *_: Any) -> None:
    await _ran(ctx, "boom")
    raise ValueError("boom")


@app.task
async def nap(ctx: JobContext, seconds: float, *_: Any) -> float:
    await _ran(ctx, "nap")
    await asyncio.sleep(seconds)
    return seconds


@app.on_job_end
async def kill_when_told(ctx: JobContext, outcome: JobOutcome) -> None:
    at = os.environ.get("FLOWS_KILL_AT")
    if at is None or outcome.task != "square" or outcome.status != "success":
        return
    ended = await ctx.redis.incr(_k(ctx, "ended"))
    if ended >= int(at) and await ctx.redis.set(_k(ctx, "killed"), os.getpid(), nx=True):
        os.kill(os.getpid(), signal.SIGKILL)
