"""Minimal apps the benchmarks run as real ``python -m worker`` processes.

- ``noop_app``: one no-op task ``noop(x)`` (consumer throughput) and ``burn(ms)``, which spins
  ``ms`` of CPU time (CPU-bound jobs: ``bench/consumer.py --processes N``).
- ``traced_noop_app``: ``noop`` under the OpenTelemetry SDK's provider whose processor drops
  every span (``bench/consumer.py --tracing``).
- ``periodic_app``: ``noop`` plus a periodic job every second, so a leader has a singleton
  to run (failover).
- ``many_periodic_app``: ``BENCH_PERIODIC_N`` periodic jobs every second, recording runs per
  tick and how late each tick was enqueued (leader scale).
- ``keys_app``: a ``per_key`` service over ``BENCH_KEYS_N`` keys (lease renewal scale).
- ``latency_app``: ``stamp(sent_ms)`` records enqueue-to-start; ``every_second`` records
  instant-to-start of each tick (wake-up latency).
- ``leakcheck_app``: a poller ``leakcheck`` (2 shards) dispatching to ``noop`` (the in-flight
  hash check of ``bench/dispatch.py``).
- ``idle_app``: ``wake_stamp(sent)`` records enqueue-to-start after an idle spell; ``hold(s)``
  (queue ``slow``) records which process started it and when (orphan recovery).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from worker import App, Context, JobContext

noop_app = App("bench-noop")


@noop_app.task
async def noop(ctx: JobContext, *args: Any) -> None:
    return None


@noop_app.task
async def burn(ctx: JobContext, ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


traced_noop_app = App("bench-noop")
traced_noop_app.task(noop)


def _install_sdk() -> None:
    """The SDK's provider, with a processor that drops spans: the cost of making them."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())  # the base class: on_end does nothing
    trace.set_tracer_provider(provider)


if os.environ.get("WORKER_TRACING") == "otel":
    _install_sdk()

periodic_app = App("bench-periodic")


@periodic_app.task(name="noop")
async def _noop(ctx: JobContext, *args: Any) -> None:
    return None


@periodic_app.periodic(every=1, catch_up="latest")
async def tick(ctx: JobContext) -> None:
    return None


# -- leader at scale: many periodic jobs, many per_key keys ----------------------------------

many_periodic_app = App("bench-many-periodic")
PERIODIC_N = int(os.environ.get("BENCH_PERIODIC_N", "1000"))


async def _record_tick(ctx: JobContext) -> None:
    """Counts each tick's runs and how late it was enqueued (ms buckets of 10)."""
    assert ctx.tick is not None
    tick_ms = int(ctx.tick.timestamp() * 1000)
    enqueued_ms = int(ctx["enqueue_time"].timestamp() * 1000)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        pipe.hincrby("bench:runs", str(tick_ms), 1)
        pipe.hincrby("bench:late", str(max(0, enqueued_ms - tick_ms) // 10 * 10), 1)
        await pipe.execute()


for _n in range(PERIODIC_N):
    many_periodic_app.periodic(every=1, name=f"p{_n:05d}", catch_up="latest")(_record_tick)

keys_app = App("bench-keys")
KEYS_N = int(os.environ.get("BENCH_KEYS_N", "10000"))


@keys_app.task(name="noop")
async def _keys_noop(ctx: JobContext, *args: Any) -> None:
    return None


@keys_app.service(cardinality="per_key", keys=[f"k{n:05d}" for n in range(KEYS_N)])
async def holder(ctx: Context, stop: asyncio.Event, key: str) -> None:
    await stop.wait()


# -- latency: an idle consumer waking on enqueue; a tick starting after its instant ---------

latency_app = App("bench-latency")


@latency_app.task
async def stamp(ctx: JobContext, sent_ms: int) -> None:
    await ctx.redis.rpush("bench:wake", int(time.time() * 1000) - sent_ms)


@latency_app.periodic(every=1, catch_up="skip")
async def every_second(ctx: JobContext) -> None:
    assert ctx.tick is not None
    await ctx.redis.rpush("bench:tick", int(time.time() * 1000 - ctx.tick.timestamp() * 1000))


# -- dispatch: a poller whose jobs run through a real consumer (the in-flight hash empties) --

leakcheck_app = App("bench-leakcheck")


@leakcheck_app.task(name="noop")
async def _leak_noop(ctx: JobContext, item: str) -> None:
    return None


leakcheck_poller = leakcheck_app.poller("leakcheck", task="noop", shards=2)


# -- idle: what an idle fleet costs Redis, and what it gives up (bench/idle.py) ------------

idle_app = App("bench-idle")


@idle_app.task
async def wake_stamp(ctx: JobContext, sent: float) -> None:
    """Enqueue to start, ms (same host: both ends read this host's clock)."""
    await ctx.redis.rpush("bench:idle:wake", f"{(time.time() - sent) * 1000:.3f}")


@idle_app.task(queue="slow", timeout_s=600)
async def hold(ctx: JobContext, seconds: float) -> None:
    """A long job: each start records ``<pid>:<start time>`` (orphan recovery measure)."""
    await ctx.redis.rpush("bench:idle:hold", f"{os.getpid()}:{time.time():.3f}")
    await asyncio.sleep(seconds)


#: Fair queues (``bench/fair.py``): ``plain_noop`` and ``fair_noop`` (the same no-op, the second
#: of a fair task) for the cost per job; ``fair_job(key, sent)`` sleeps ``BENCH_FAIR_STEP_S``
#: (10 ms) and, for key ``quiet``, records enqueue-to-start in ms (same host's clock).
fair_app = App("bench-fair")
FAIR_STEP_S = float(os.environ.get("BENCH_FAIR_STEP_S", "0.01"))


@fair_app.task(queue="plain")
async def plain_noop(ctx: JobContext, key: str) -> None:
    return None


@fair_app.task(fair=True, flow_key=lambda key: key)
async def fair_noop(ctx: JobContext, key: str) -> None:
    return None


@fair_app.task(fair=True, flow_key=lambda key, sent: key)
async def fair_job(ctx: JobContext, key: str, sent: float) -> None:
    if key == "quiet":
        await ctx.redis.rpush("bench:fair:waits", f"{(time.time() - sent) * 1000:.3f}")
    await asyncio.sleep(FAIR_STEP_S)
