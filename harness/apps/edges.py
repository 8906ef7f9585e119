"""The test app of tests/system/test_edges.py: it records what it did in a LEDGER ON A
SECOND SERVER.

The ledger lives on the server named by ``EDGE_LEDGER_URL``, which the tests never fault, so a
record written before a crash, a pause or a data loss of the main server is still there to be
counted afterwards. Each process creates its ledger client lazily (one per process and event
loop). Every ledger key is ``<WORKER_KEY_PREFIX>edge:<name>``.

- ``guard`` singleton service (``EDGE_SINGLETON=1``): one interval record per run
  (RPUSH ``intervals`` {id, pid, start}; HSET ``alive`` id <time> every 50 ms; HSET ``end`` id
  <time> on exit) and, every 50 ms, a fenced write of ``<epoch>:<pid>:<time ms>`` to the MAIN
  server's ``<prefix>edge:marks`` through ``ctx.fenced_pipeline()``; refusals
  (``LeadershipLost``) count in ``fenced-refused``, writes skipped because ``ctx.is_leading()``
  answered False in ``not-leading``, a framework without that API in ``api-missing``.
- ``edge_tick`` (``EDGE_TICKS=1``, every 1 s): HINCRBY ``ticks`` <tick ms> 1.
- ``edge_job(seconds)``: HINCRBY ``job-start`` / ``job-end`` <job id> 1, around the sleep, and
  ``job-retried`` <job id> 1 when arq runs it again (``job_try`` > 1).
- ``claimed_job(seconds)``: HINCRBY ``claim-start`` and, after the sleep, ``claim-woke``
  <job id>|<pid> 1; then ``claim-end`` <job id>|<pid> only if ``await ctx.still_claimed()`` (a
  framework without that API counts as "claimed": the job does not check); returns the pid.
- ``edge_record(*args, **kwargs)``: HINCRBY ``records`` <job id> 1 (its arguments are ignored).
- ``crashy`` per_process service (``EDGE_CRASHY=1``): INCR ``crashy-starts``, then raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

from harness.clients import ledger_client
from worker import App, Context, JobContext, LeadershipLost

app = App("edges")


ledger = ledger_client("EDGE_LEDGER_URL")


def _k(ctx: Context | JobContext, name: str) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return f"{context.settings.key_prefix}edge:{name}"


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# -- scenario 1: a singleton that records its run interval and fenced writes -----------------

if os.environ.get("EDGE_SINGLETON") == "1":

    @app.service(cardinality="singleton")
    async def guard(ctx: Context, stop: asyncio.Event) -> None:
        led = ledger()
        pid = os.getpid()
        rid = uuid.uuid4().hex[:12]
        marks = f"{ctx.settings.key_prefix}edge:marks"
        await led.rpush(
            _k(ctx, "intervals"), json.dumps({"id": rid, "pid": pid, "start": time.time()})
        )
        try:
            while not stop.is_set():
                await led.hset(_k(ctx, "alive"), rid, repr(time.time()))
                await _fenced_mark(ctx, led, marks, rid, pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.05)
        finally:
            ended = time.time()
            with contextlib.suppress(Exception):
                await asyncio.shield(led.hset(_k(ctx, "end"), rid, repr(ended)))


async def _fenced_mark(ctx: Context, led: aioredis.Redis, marks: str, rid: str, pid: int) -> None:
    is_leading = getattr(ctx, "is_leading", None)
    leader_epoch = getattr(ctx, "leader_epoch", None)
    fenced_pipeline = getattr(ctx, "fenced_pipeline", None)
    if is_leading is None or leader_epoch is None or fenced_pipeline is None:
        await led.hincrby(_k(ctx, "api-missing"), rid, 1)
        return
    if not is_leading():
        await led.hincrby(_k(ctx, "not-leading"), rid, 1)
        return
    epoch = await _maybe_await(leader_epoch())
    try:
        async with fenced_pipeline() as pipe:
            pipe.rpush(marks, f"{epoch}:{pid}:{int(time.time() * 1000)}")
            await pipe.execute()
    except LeadershipLost:
        await led.hincrby(_k(ctx, "fenced-refused"), rid, 1)
    else:
        await led.hincrby(_k(ctx, "fenced-ok"), rid, 1)


# -- scenario 2: a periodic job that records each tick it executed ---------------------------

if os.environ.get("EDGE_TICKS") == "1":

    @app.periodic(every=1)
    async def edge_tick(ctx: JobContext) -> None:
        assert ctx.tick is not None
        await ledger().hincrby(_k(ctx, "ticks"), str(int(ctx.tick.timestamp() * 1000)), 1)


# -- scenarios 3-5: tasks ---------------------------------------------------------------------


@app.task
async def edge_job(ctx: JobContext, seconds: float) -> None:
    led = ledger()
    await led.hincrby(_k(ctx, "job-start"), ctx.job_id, 1)
    if ctx.job_try > 1:
        await led.hincrby(_k(ctx, "job-retried"), ctx.job_id, 1)
    await asyncio.sleep(seconds)
    await led.hincrby(_k(ctx, "job-end"), ctx.job_id, 1)


@app.task
async def claimed_job(ctx: JobContext, seconds: float) -> int:
    led = ledger()
    pid = os.getpid()
    field = f"{ctx.job_id}|{pid}"
    await led.hincrby(_k(ctx, "claim-start"), field, 1)
    await asyncio.sleep(seconds)
    await led.hincrby(_k(ctx, "claim-woke"), field, 1)
    still_claimed = getattr(ctx, "still_claimed", None)
    if still_claimed is None:
        await led.hincrby(_k(ctx, "api-missing"), field, 1)
        claimed = True  # a job that cannot ask behaves as if it still owned the job
    else:
        claimed = bool(await still_claimed())
    if claimed:
        await led.hincrby(_k(ctx, "claim-end"), field, 1)
    else:
        await led.hincrby(_k(ctx, "claim-disowned"), field, 1)
    return pid


@app.task
async def edge_record(ctx: JobContext, *args: Any, **kwargs: Any) -> None:
    await ledger().hincrby(_k(ctx, "records"), ctx.job_id, 1)


# -- scenario 5: a service that crashes in a loop ---------------------------------------------

if os.environ.get("EDGE_CRASHY") == "1":

    @app.service(cardinality="per_process")
    async def crashy(ctx: Context, stop: asyncio.Event) -> None:
        await ledger().incr(_k(ctx, "crashy-starts"))
        raise RuntimeError("crashy service always fails")
