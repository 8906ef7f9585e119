"""The test app of tests/system/test_abort_processes.py: tasks that make an abort hard to honour.

Each task records, in ``<prefix>aborts:started`` (field ``<job id>:<pid>``) that it started
in that process, and in ``<prefix>aborts:finished`` (field ``<job id>``) that it ran to its
last line. Every task catches the first :class:`asyncio.CancelledError` and goes on:

- ``in_redis(seconds)``: loops on Redis commands (``ctx.redis``) for ``seconds``;
- ``sleeper(seconds)``: loops on short sleeps for ``seconds``;
- ``deaf(seconds)``: catches every cancellation, and returns after ``seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from worker import App, JobContext

app = App("aborts")


def _k(ctx: JobContext, name: str) -> str:
    return f"{ctx.context.settings.key_prefix}aborts:{name}"


async def _started(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_k(ctx, "started"), f"{ctx.job_id}:{os.getpid()}", 1)


async def _finished(ctx: JobContext) -> str:
    await ctx.redis.hincrby(_k(ctx, "finished"), ctx.job_id, 1)
    return "ran to the end"


@app.task
async def in_redis(ctx: JobContext, seconds: float) -> str:
    await _started(ctx)
    until, swallowed = time.monotonic() + seconds, False
    while time.monotonic() < until:
        try:
            await ctx.redis.incr(_k(ctx, "calls"))
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True  # as a cancellation landing inside a redis-py command can be
    return await _finished(ctx)


@app.task
async def sleeper(ctx: JobContext, seconds: float) -> str:
    await _started(ctx)
    until, swallowed = time.monotonic() + seconds, False
    while time.monotonic() < until:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True
    return await _finished(ctx)


@app.task
async def deaf(ctx: JobContext, seconds: float) -> str:
    await _started(ctx)
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
    return await _finished(ctx)


@app.task
async def enqueues_big(ctx: JobContext, size: int) -> str:
    """``ctx.enqueue`` of a job carrying ``size`` bytes: what happened, as text."""
    try:
        jid = await ctx.enqueue("take", blob=b"x" * size)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"enqueued {jid}"


@app.task
async def take(ctx: JobContext, *args: object, **kwargs: object) -> str:
    """Takes any arguments and returns."""
    return "taken"
