"""The queue backlog as a metric, exported by the leader: what an autoscaler scales consumers on.

KEDA's Redis list scaler reads ``LLEN``; the queues are sorted sets (arq's layout), and a plain
``ZCARD`` would count deferred jobs and jobs already claimed (parked at their claim's expiry)
too. So the leader, and only the leader (one series cluster-wide, whoever leads), reads each
queue every ``interval_s`` and exports ``worker_queue_backlog{queue}`` (due, not claimed) and
``worker_queue_jobs{queue}`` (everything in it). deploy/k8s/keda/ scales the consumer
Deployment on the first through KEDA's Prometheus scaler.

With queue shards (``WORKER_QUEUE_SHARDS`` > 1) both stay the queue's totals over every shard
(so the KEDA query and the alerts read the same series whatever N), and a separate gauge
``worker_queue_shard_backlog{queue,shard}`` has each shard's part (at most 64 shards per
queue), exported only then: a ``shard`` label on the first would split its series by N and
change what ``sum``-less queries read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from itertools import product

from worker.core.clock import Clock, ms
from worker.core.component import LoopComponent
from worker.core.metrics import Metrics
from worker.storage import Store

NAME = "queue-metrics"
#: How often the leader reads the queue depths.
INTERVAL_S = 5.0


class QueueMetrics(LoopComponent):
    """Leader-only: exports every queue's backlog (see module docstring)."""

    def __init__(
        self,
        store: Store,
        queues: Sequence[str],
        clock: Clock,
        metrics: Metrics,
        *,
        interval_s: float = INTERVAL_S,
        shards: Sequence[Store] = (),
    ) -> None:
        super().__init__(NAME, clock, sla_s=max(60.0, interval_s * 10))
        self.store = store
        self.queues = list(queues)
        self.metrics = metrics
        self.interval_s = interval_s
        #: every shard's store, home first, when there are more than one
        self.shards = list(shards) if len(shards) > 1 else []

    async def tick(self) -> float:
        now_ms = ms(self.clock.time())
        if self.shards:
            each = [await s.queue_depths(self.queues, now_ms) for s in self.shards]
            for i, shard in enumerate(each):
                for queue, (due, _) in zip(self.queues, shard, strict=True):
                    self.metrics.queue_shard_backlog.labels(queue, str(i)).set(due)
            depths = [
                (sum(s[q][0] for s in each), sum(s[q][1] for s in each))
                for q in range(len(self.queues))
            ]
        else:
            depths = await self.store.queue_depths(self.queues, now_ms)
        for queue, (due, total) in zip(self.queues, depths, strict=True):
            self.metrics.queue_backlog.labels(queue).set(due)
            self.metrics.queue_jobs.labels(queue).set(total)
        self.health.extra["backlog"] = {q: d for q, (d, _) in zip(self.queues, depths, strict=True)}
        return self.interval_s

    async def teardown(self) -> None:
        # not leading any more: the next leader exports them (one series cluster-wide)
        for queue in self.queues:
            for gauge in (self.metrics.queue_backlog, self.metrics.queue_jobs):
                with contextlib.suppress(KeyError):
                    gauge.remove(queue)
        for queue, i in product(self.queues, range(len(self.shards))):
            with contextlib.suppress(KeyError):
                self.metrics.queue_shard_backlog.remove(queue, str(i))
