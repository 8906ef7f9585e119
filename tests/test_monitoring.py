"""Monitoring: the job-wait histogram, and the shipped alert rules and Grafana dashboard
(``deploy/monitoring/``) checked by ``promtool`` and against what a running worker exports."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.test_consumer import KEYS, Loop, eventually
from worker.app import App
from worker.client import Client
from worker.context import JobContext
from worker.metrics import Metrics
from worker.serializer import msgpack_dumps

# -- worker_job_wait_seconds ----------------------------------------------------------------------


async def test_wait_is_observed_from_the_due_time_per_queue_and_known_task(r: Any) -> None:
    app = App("t")

    @app.task
    async def early(ctx: JobContext) -> None:
        return None

    @app.task
    async def later(ctx: JobContext) -> None:
        return None

    metrics = Metrics()
    lp = Loop(r, app, metrics=metrics)
    await lp.client.enqueue("early")
    await lp.client.enqueue("early")
    await asyncio.sleep(0.6)  # queued, no consumer yet: they wait
    lp.start()
    try:
        await lp.client.enqueue("later", defer_by=1.5)  # due in 1.5 s: waits from then
        plain = Client(r, keys=KEYS, serialize=msgpack_dumps)  # knows no app: enqueues anything
        await plain.enqueue("no_such_function")
        await plain.enqueue("another_typo")

        def seen(task: str, suffix: str = "count", **extra: str) -> float:
            labels = {"queue": "default", "task": task, **extra}
            value = metrics.registry.get_sample_value(f"worker_job_wait_seconds_{suffix}", labels)
            return value or 0.0

        await eventually(lambda: seen("later") == 1 and seen("<unknown>") == 2, what="all runs")
    finally:
        await lp.halt()
    assert seen("early") == 2
    assert seen("early", "bucket", le="0.5") == 0  # waited the 0.6 s before a consumer came
    assert seen("early", "sum") >= 1.2
    assert seen("later", "bucket", le="1.0") == 1  # from its due time, not from its enqueue
    assert seen("<unknown>") == 2  # one label for every name the app does not define
    names = {s.labels.get("task") for m in metrics.registry.collect() for s in m.samples}
    assert not names & {"no_such_function", "another_typo"}
