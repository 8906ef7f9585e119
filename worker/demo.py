"""The demo app (the embedded default): a small model of seed 002's SIM-card polling system.

- ``load_cards`` (initializer, once per cluster per version) loads ``DEMO_CARDS`` cards into
  the ``cards`` poller's shard queues, due over the next ``DEMO_POLL_EVERY_S`` seconds.
- The leader's poller dispatches due cards to ``poll_card``, which simulates a gateway call
  and reschedules the card: each card is polled about every ``DEMO_POLL_EVERY_S`` seconds.
- Periodic jobs: ``order_expire`` (every minute), ``alert_check`` (every 30 s),
  ``package_activation_check`` (every 10 s, enqueueing ``activate_package`` with unique keys),
  ``daily_traffic_flush`` and daily/monthly usage resets under a distributed mutex, and
  ``demo_report`` (every 10 s), which logs what the cluster did.
- ``mailbox_idle``, a singleton service, stands in for seed 001's IMAP IDLE listener: a
  blocking wait run in a thread so it never stalls the event loop.

Everything it counts goes to the Redis hash ``<prefix>demo:stats``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Mapping

import structlog

from worker import App, Context, JobContext

log = structlog.get_logger("worker.demo")

CARDS = int(os.environ.get("DEMO_CARDS", "3000"))
POLL_EVERY_S = float(os.environ.get("DEMO_POLL_EVERY_S", "30"))
BATCH = 500

app = App("demo")
cards = app.poller("cards", task="poll_card", shards=4, batch_size=500, interval_s=0.5)


def _stats(ctx: Context | JobContext) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return f"{context.keys.prefix}demo:stats"


@app.initializer(version="cards-v1", poller="cards")
async def load_cards(
    ctx: Context, cursor: str | None
) -> AsyncIterator[tuple[str, Mapping[str, float]]]:
    """Yield the card table in batches after ``cursor`` (here: generated ids)."""
    start = int(cursor) if cursor else 0
    now = time.time()
    for first in range(start, CARDS, BATCH):
        last = min(first + BATCH, CARDS)
        batch = {f"card-{n:06d}": now + random.uniform(0, POLL_EVERY_S) for n in range(first, last)}
        yield str(last), batch


@app.task(timeout_s=10)
async def poll_card(ctx: JobContext, card_id: str) -> None:
    """Simulated gateway call for one card, then reschedule it."""
    await asyncio.sleep(random.uniform(0.002, 0.02))
    await ctx.redis.hincrby(_stats(ctx), "cards_polled", 1)
    await ctx.poller("cards").schedule(card_id, delay=POLL_EVERY_S)


@app.task
async def activate_package(ctx: JobContext, package_id: int) -> None:
    await ctx.redis.hincrby(_stats(ctx), "packages_activated", 1)


@app.periodic(cron="* * * * *")
async def order_expire(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_stats(ctx), "order_expire_runs", 1)


@app.periodic(every=30)
async def alert_check(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_stats(ctx), "alert_check_runs", 1)


@app.periodic(every=10)
async def package_activation_check(ctx: JobContext) -> None:
    """Find packages to activate; a unique key per package means one job even if found twice."""
    for package_id in random.sample(range(100), 3):
        await ctx.enqueue("activate_package", package_id, unique_key=f"activate:{package_id}")


@app.periodic(cron="0 3 * * *", tz="Asia/Shanghai")
async def daily_traffic_flush(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_stats(ctx), "traffic_flushes", 1)


async def _reset(ctx: JobContext, period: str) -> None:
    tick = ctx.tick
    stamp = tick.strftime("%Y-%m-%d") if tick else "manual"
    async with ctx.mutex(f"usage-reset:{period}:{stamp}", ttl=600) as acquired:
        if acquired and await ctx.once(f"usage-reset:{period}:{stamp}", ttl=40 * 86400):
            await ctx.redis.hincrby(_stats(ctx), f"{period}_resets", 1)


@app.periodic(cron="0 0 * * *", tz="Asia/Shanghai")
async def daily_usage_reset(ctx: JobContext) -> None:
    await _reset(ctx, "daily")


@app.periodic(cron="0 0 1 * *", tz="Asia/Shanghai")
async def monthly_usage_reset(ctx: JobContext) -> None:
    await _reset(ctx, "monthly")


@app.periodic(every=10)
async def demo_report(ctx: JobContext) -> None:
    raw = await ctx.redis.hgetall(_stats(ctx))
    stats = {k.decode(): int(v) for k, v in raw.items()}
    depth = await ctx.redis.zcard(ctx.context.keys.queue)
    log.info("demo report", queue_depth=depth, **stats)


def _idle_blocking(timeout_s: float) -> bool:
    """Stand-in for imaplib's blocking IDLE: wait for 'mail' up to ``timeout_s``."""
    time.sleep(timeout_s)
    return random.random() < 0.2


@app.service(cardinality="singleton")
async def mailbox_idle(ctx: Context, stop: asyncio.Event) -> None:
    """One listener cluster-wide; the blocking call runs in a thread (seed 001 §10)."""
    while not stop.is_set():
        if await asyncio.to_thread(_idle_blocking, 1.0):
            await ctx.redis.hincrby(_stats(ctx), "mails_seen", 1)
