"""The backlog the leader exports for autoscaling (worker/duties/backlog.py): jobs due and not
claimed,
per queue; deferred jobs and claimed ones (parked at their claim's expiry) are not backlog."""

from __future__ import annotations

from typing import Any

from worker.core.clock import FakeClock
from worker.core.metrics import Metrics
from worker.duties.backlog import QueueMetrics
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("bl:")
NOW_S = 1_800_000_000.0


def gauge(metrics: Metrics, name: str, queue: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"queue": queue})


async def test_backlog_counts_due_unclaimed_jobs_per_queue(r: Any) -> None:
    now_ms = int(NOW_S * 1000)
    await r.zadd(KEYS.queue, {"due-1": now_ms - 5_000, "due-2": now_ms, "later": now_ms + 60_000})
    await r.zadd(KEYS.queue, {"claimed": now_ms + 310_000})  # parked by CLAIM
    await r.zadd(KEYS.queue_of("high"), {"h": now_ms - 1})
    metrics = Metrics()
    component = QueueMetrics(Store(r, KEYS), ["default", "high", "low"], FakeClock(NOW_S), metrics)
    assert await component.tick() == component.interval_s
    assert gauge(metrics, "worker_queue_backlog", "default") == 2
    assert gauge(metrics, "worker_queue_jobs", "default") == 4
    assert gauge(metrics, "worker_queue_backlog", "high") == 1
    assert gauge(metrics, "worker_queue_backlog", "low") == 0
    assert component.health.extra["backlog"] == {"default": 2, "high": 1, "low": 0}
    await component.teardown()  # not leading any more: the next leader exports it
    assert gauge(metrics, "worker_queue_backlog", "default") is None


async def test_a_paused_queue_shows_no_backlog_and_a_paused_gauge(r: Any) -> None:
    """Paused (``worker pause queue:NAME``): backlog 0 (no consumer would take its jobs, an
    autoscaler must not add any), its jobs still counted, ``worker_queue_paused`` 1."""
    now_ms = int(NOW_S * 1000)
    await r.zadd(KEYS.queue, {"due-1": now_ms - 5_000})
    await r.zadd(KEYS.queue_of("high"), {"h": now_ms - 1})
    await r.sadd(KEYS.paused, "queue:high")
    metrics = Metrics()
    component = QueueMetrics(Store(r, KEYS), ["default", "high"], FakeClock(NOW_S), metrics)
    await component.tick()
    assert gauge(metrics, "worker_queue_backlog", "high") == 0
    assert gauge(metrics, "worker_queue_jobs", "high") == 1
    assert gauge(metrics, "worker_queue_paused", "high") == 1
    assert gauge(metrics, "worker_queue_backlog", "default") == 1
    assert gauge(metrics, "worker_queue_paused", "default") == 0
    await r.sadd(KEYS.paused, "queue:*")  # pause --all
    await component.tick()
    assert gauge(metrics, "worker_queue_backlog", "default") == 0
    assert gauge(metrics, "worker_queue_paused", "default") == 1
    await component.teardown()
    assert gauge(metrics, "worker_queue_paused", "high") is None
