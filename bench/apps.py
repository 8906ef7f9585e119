"""Minimal apps the benchmarks run as real ``python -m worker`` processes.

- ``noop_app``: one no-op task ``noop(x)`` (consumer throughput) and ``burn(ms)``, which spins
  ``ms`` of CPU time (CPU-bound jobs: ``bench/consumer.py --processes N``).
- ``periodic_app``: ``noop`` plus a periodic job every second, so a leader has a singleton
  to run (failover).
"""

from __future__ import annotations

import time
from typing import Any

from worker import App, JobContext

noop_app = App("bench-noop")


@noop_app.task
async def noop(ctx: JobContext, *args: Any) -> None:
    return None


@noop_app.task
async def burn(ctx: JobContext, ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


periodic_app = App("bench-periodic")


@periodic_app.task(name="noop")
async def _noop(ctx: JobContext, *args: Any) -> None:
    return None


@periodic_app.periodic(every=1, catch_up="latest")
async def tick(ctx: JobContext) -> None:
    return None
