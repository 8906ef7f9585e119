"""The demo app (the embedded default): a small model of a SIM-card polling system.

Its worker (one process: a task consumer, a polling-config manager, an initializer, a
polling scheduler and a cron scheduler), duty by duty:

- **Polling-config manager** (every process): per-card-type poll intervals live in the hash
  ``<prefix>demo:poll-config`` (created with ``DEMO_POLL_EVERY_S`` for every type). Each
  process loads them at start into ``ctx.state["poll_config"]``. ``set_poll_interval(type,
  seconds)`` (a task) changes one interval, bumps the version and broadcasts the whole config
  on topic ``poll-config``; every process, whatever its role, applies it to its in-memory copy
  (``apply_poll_config``, newer versions only) and records the version it applied in
  ``<prefix>demo:config-applied``.
- **Initializer and card cache** (leader, once per cluster per version): ``load_cards`` reads
  the card table (``DEMO_CARDS`` generated cards of three types) in batches of ``DEMO_BATCH``
  and per batch writes the card cache (hash ``<prefix>demo:cards``: card id -> type and ICCID)
  and the ``cards`` poller's shard queues, each card due within its type's interval. The cache
  write is idempotent: a batch a new leader repeats after a failover writes the same values.
- **Polling scheduler** (leader): due cards are dispatched to ``poll_card``, which reads the
  card from the cache, simulates the gateway call (and the traffic it reports) and reschedules
  the card after its type's interval: each card is polled about every ``DEMO_POLL_EVERY_S``
  seconds until the config says otherwise.
- **Asynq scheduler** (leader enqueues, any consumer runs): ``order_expire`` (every minute),
  ``alert_check`` (every 30 s), ``data_cleanup`` (04:00 daily), ``daily_traffic_flush``
  (03:00 daily).
- **Activation check and usage resets**: ``package_activation_check`` (every 10 s, enqueueing
  ``activate_package`` with a unique key per package); ``daily_usage_reset`` (00:00),
  ``monthly_usage_reset`` (00:00 on the 1st) and ``yearly_usage_reset`` (00:00 on 1 January),
  Asia/Shanghai, each under a cluster-wide mutex and ``ctx.once`` per period, with
  ``catch_up="latest"``: the modelled worker's in-memory ``lastDailyReset`` becomes the
  leader's recorded last tick, and a reset missed during an outage runs once when a leader is back.
- ``mailbox_idle``, a singleton service, stands in for an IMAP IDLE mailbox listener: a
  blocking wait run in a thread so it never stalls the event loop.
- ``demo_report`` (every ``DEMO_REPORT_EVERY_S``, default 10 s) logs ``demo report``.

Counters go to the hash ``<prefix>demo:stats``, polls per card to ``<prefix>demo:polls``, the
simulated traffic since each reset to ``<prefix>demo:usage``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import structlog

from worker.app import App
from worker.context import Context, JobContext
from worker.storage.keys import Keys

log = structlog.get_logger("worker.demo")

CARDS = int(os.environ.get("DEMO_CARDS", "3000"))
POLL_EVERY_S = float(os.environ.get("DEMO_POLL_EVERY_S", "30"))
BATCH = int(os.environ.get("DEMO_BATCH", "500"))
REPORT_EVERY_S = float(os.environ.get("DEMO_REPORT_EVERY_S", "10"))
CARD_TYPES = ("standard", "iot", "vehicle")
TZ = "Asia/Shanghai"
#: Usage periods and how a reset's period is named (the mutex and ``once`` keys).
PERIODS = {"daily": "%Y-%m-%d", "monthly": "%Y-%m", "yearly": "%Y"}
CONFIG_TOPIC = "poll-config"

app = App("demo")
cards = app.poller("cards", task="poll_card", shards=4, batch_size=500, interval_s=0.5)


def _key(ctx: Context | JobContext, name: str) -> str:
    context = ctx.context if isinstance(ctx, JobContext) else ctx
    return f"{context.settings.key_prefix}demo:{name}"


# -- the polling-config manager ---------------------------------------------------------------


@dataclass(frozen=True)
class PollConfig:
    """Poll interval (seconds) per card type, at a version that only goes up."""

    version: int
    intervals: Mapping[str, float]

    def interval(self, card_type: str) -> float:
        return float(self.intervals.get(card_type, POLL_EVERY_S))

    @classmethod
    def from_hash(cls, raw: Mapping[bytes, bytes]) -> PollConfig:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        version = int(fields.pop("version", "0"))
        return cls(version, {t: float(s) for t, s in fields.items()})

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PollConfig:
        return cls(int(data["version"]), {t: float(s) for t, s in data["intervals"].items()})

    def data(self) -> dict[str, Any]:
        return {"version": self.version, "intervals": dict(self.intervals)}


def poll_config(ctx: Context | JobContext) -> PollConfig:
    """This process's in-memory copy of the config."""
    config = ctx.state.get("poll_config")
    return config if isinstance(config, PollConfig) else PollConfig(0, {})


async def _applied(ctx: Context, config: PollConfig) -> None:
    ctx.state["poll_config"] = config
    await ctx.redis.hset(_key(ctx, "config-applied"), ctx.instance_id, str(config.version))


@app.on_startup
async def load_poll_config(ctx: Context) -> None:
    """Create the config with its defaults if missing, and keep a copy in this process."""
    key = _key(ctx, "poll-config")
    async with ctx.redis.pipeline(transaction=True) as pipe:
        pipe.hsetnx(key, "version", "1")
        for card_type in CARD_TYPES:
            pipe.hsetnx(key, card_type, str(POLL_EVERY_S))
        pipe.hgetall(key)
        *_, raw = await pipe.execute()
    config = PollConfig.from_hash(raw)
    await _applied(ctx, config)
    log.info("poll config loaded", version=config.version, intervals=dict(config.intervals))


@app.task
async def set_poll_interval(ctx: JobContext, card_type: str, seconds: float) -> int:
    """Change one card type's poll interval and tell every process; returns the new version."""
    if card_type not in CARD_TYPES or not 0 < float(seconds) <= 86400:
        raise ValueError(f"card type one of {CARD_TYPES}, seconds in (0, 86400]")
    key = _key(ctx, "poll-config")
    async with ctx.redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, card_type, str(float(seconds)))
        pipe.hincrby(key, "version", 1)
        pipe.hgetall(key)
        *_, raw = await pipe.execute()
    config = PollConfig.from_hash(raw)
    await ctx.broadcast(CONFIG_TOPIC, config.data())
    return config.version


@app.on_broadcast(CONFIG_TOPIC)
async def apply_poll_config(ctx: Context, data: Any) -> None:
    """Every process: take a newer config into the in-memory copy (older ones are stale)."""
    config = PollConfig.from_data(data)
    if config.version <= poll_config(ctx).version:
        return
    await _applied(ctx, config)
    log.info("poll config applied", version=config.version, intervals=dict(config.intervals))


# -- the initializer, the card cache and polling ----------------------------------------------


def _card(n: int) -> tuple[str, dict[str, str]]:
    return f"card-{n:06d}", {"type": CARD_TYPES[n % len(CARD_TYPES)], "iccid": f"8986{n:015d}"}


@app.initializer(version="cards-v2", poller="cards")
async def load_cards(
    ctx: Context, cursor: str | None
) -> AsyncIterator[tuple[str, Mapping[str, float]]]:
    """Read the card table in batches after ``cursor``; cache each batch, then queue it."""
    start = int(cursor) if cursor else 0
    config = poll_config(ctx)
    for first in range(start, CARDS, BATCH):
        last = min(first + BATCH, CARDS)
        batch = dict(_card(n) for n in range(first, last))  # "SELECT … LIMIT BATCH"
        await ctx.redis.hincrby(_key(ctx, "stats"), "cards_read", len(batch))
        await ctx.redis.hset(
            _key(ctx, "cards"), mapping={cid: json.dumps(card) for cid, card in batch.items()}
        )
        now = ctx.clock.time()
        yield (
            str(last),
            {
                cid: now + random.uniform(0, config.interval(card["type"]))
                for cid, card in batch.items()
            },
        )


@app.task(timeout_s=10)
async def poll_card(ctx: JobContext, card_id: str) -> None:
    """Simulated gateway call for one card, then reschedule it after its type's interval."""
    raw = await ctx.redis.hget(_key(ctx, "cards"), card_id)
    card_type = json.loads(raw)["type"] if raw else CARD_TYPES[0]
    await asyncio.sleep(random.uniform(0.002, 0.02))
    used_mb = round(random.uniform(0.1, 5.0), 2)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        pipe.hincrby(_key(ctx, "stats"), "cards_polled", 1)
        pipe.hincrby(_key(ctx, "polls"), card_id, 1)
        for period in PERIODS:
            pipe.hincrbyfloat(_key(ctx, "usage"), f"{period}_mb", used_mb)
        await pipe.execute()
    await ctx.poller("cards").schedule(card_id, delay=poll_config(ctx).interval(card_type))


# -- periodic jobs (the modelled worker's Asynq scheduler and 10-second checks) ---------------


@app.task
async def activate_package(ctx: JobContext, package_id: int) -> None:
    await ctx.redis.hincrby(_key(ctx, "stats"), "packages_activated", 1)


@app.periodic(cron="* * * * *")
async def order_expire(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_key(ctx, "stats"), "order_expire_runs", 1)


@app.periodic(every=30)
async def alert_check(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_key(ctx, "stats"), "alert_check_runs", 1)


@app.periodic(cron="0 4 * * *", tz=TZ)
async def data_cleanup(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_key(ctx, "stats"), "data_cleanups", 1)


@app.periodic(cron="0 3 * * *", tz=TZ)
async def daily_traffic_flush(ctx: JobContext) -> None:
    await ctx.redis.hincrby(_key(ctx, "stats"), "traffic_flushes", 1)


@app.periodic(every=10)
async def package_activation_check(ctx: JobContext) -> None:
    """Find packages to activate; a unique key per package means one job even if found twice."""
    for package_id in random.sample(range(100), 3):
        await ctx.enqueue("activate_package", package_id, unique_key=f"activate:{package_id}")


def usage_period(period: str, at: dt.datetime) -> str:
    """The name of the ``period`` (daily, monthly, yearly) that ``at`` falls in, Shanghai time."""
    return at.astimezone(ZoneInfo(TZ)).strftime(PERIODS[period])


async def _reset(ctx: JobContext, period: str) -> None:
    """Zero the period's usage once per period cluster-wide: the mutex keeps two runs (a manual
    one beside a tick) from overlapping, ``once`` keeps a repeated run from resetting again."""
    stamp = usage_period(period, ctx.tick or dt.datetime.now(dt.UTC))
    name = f"usage-reset:{period}:{stamp}"
    async with ctx.mutex(name, ttl=600) as acquired:
        if acquired and await ctx.once(name, ttl=400 * 86400):
            await ctx.redis.hset(_key(ctx, "usage"), f"{period}_mb", "0")
            await ctx.redis.hincrby(_key(ctx, "stats"), f"{period}_resets", 1)
            log.info("usage reset", period=period, stamp=stamp)


@app.periodic(cron="0 0 * * *", tz=TZ, catch_up="latest")
async def daily_usage_reset(ctx: JobContext) -> None:
    await _reset(ctx, "daily")


@app.periodic(cron="0 0 1 * *", tz=TZ, catch_up="latest")
async def monthly_usage_reset(ctx: JobContext) -> None:
    await _reset(ctx, "monthly")


@app.periodic(cron="0 0 1 1 *", tz=TZ, catch_up="latest")
async def yearly_usage_reset(ctx: JobContext) -> None:
    await _reset(ctx, "yearly")


@app.periodic(every=REPORT_EVERY_S)
async def demo_report(ctx: JobContext) -> None:
    async with ctx.redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(_key(ctx, "stats"))
        pipe.hlen(_key(ctx, "cards"))
        pipe.zcard(Keys(ctx.context.settings.key_prefix).queue)
        raw, cached, depth = await pipe.execute()
    stats = {k.decode(): int(v) for k, v in raw.items()}
    log.info(
        "demo report",
        queue_depth=depth,
        cards_cached=cached,
        poll_config_version=poll_config(ctx).version,
        **stats,
    )


# -- a long-running listener (an IMAP IDLE mailbox) -------------------------------------------


def _idle_blocking(timeout_s: float) -> bool:
    """Stand-in for imaplib's blocking IDLE: wait for 'mail' up to ``timeout_s``."""
    time.sleep(timeout_s)
    return random.random() < 0.2


@app.service(cardinality="singleton")
async def mailbox_idle(ctx: Context, stop: asyncio.Event) -> None:
    """One listener cluster-wide; the blocking call runs in a thread."""
    while not stop.is_set():
        if await asyncio.to_thread(_idle_blocking, 1.0):
            await ctx.redis.hincrby(_key(ctx, "stats"), "mails_seen", 1)
