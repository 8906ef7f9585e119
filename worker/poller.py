"""The polling scheduler: the leader moves due items from shard queues into the arq queue.

Each poller keeps its items in ``shards`` sorted sets scored by due time. A dispatch is two
round trips per batch: read the due items (read-only), then one fenced script that re-checks
each item is still due, removes it from its shard and writes an arq-compatible job for it.
While an item's previous job exists (queued or running) the item stays in its shard, pushed
back, so it is never in flight twice. Job payloads are built in Python, so every serializer
works and the record format is exactly arq's.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from arq.connections import ArqRedis
from arq.constants import expires_extra_ms

from worker import keys as K
from worker.app import PollerDef
from worker.clock import Clock, ms
from worker.component import LoopComponent
from worker.fence import run_fenced
from worker.metrics import Metrics
from worker.serializer import Serialize, job_payload

log = structlog.get_logger("worker.poller")


class PollingScheduler(LoopComponent):
    """Dispatches one poller's due items (leader only)."""

    def __init__(
        self,
        *,
        poller: PollerDef,
        redis: ArqRedis,
        keys: K.Keys,
        lock_value: Callable[[], str | None],
        serialize: Serialize,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = f"poller:{poller.name}"
        self.sla_s = max(30.0, poller.interval_s * 10)
        super().__init__(clock)
        self.poller = poller
        self.redis = redis
        self.keys = keys
        self.lock_value = lock_value
        self.serialize = serialize
        self.metrics = metrics
        self._script = redis.register_script(K.DISPATCH)
        self.dispatched_total = 0

    async def tick(self) -> float:
        """Dispatch up to one batch per shard; come back at once while a shard is full."""
        more = False
        for shard in range(self.poller.shards):
            n = await self.dispatch_shard(shard)
            more = more or n >= self.poller.batch_size
        return 0.0 if more else self.poller.interval_s

    async def dispatch_shard(self, shard: int) -> int:
        """Dispatch one batch of due items from ``shard``; return how many items were read."""
        p = self.poller
        shard_key = self.keys.poll_shard(p.name, shard)
        now_ms = ms(self.clock.time())
        due = await self.redis.zrangebyscore(
            shard_key, "-inf", now_ms, start=0, num=p.batch_size, withscores=True
        )
        if not due:
            return 0
        args: list[str | int | bytes] = [
            K.ARQ_JOB,
            K.ARQ_RESULT,
            expires_extra_ms,
            now_ms,
            ms(p.busy_defer_s),
        ]
        for raw_item, score in due:
            item = raw_item.decode()
            job_id = self.keys.poll_job_id(p.name, item, int(score))
            args += [item, job_id, job_payload(p.task, (item,), {}, now_ms, self.serialize)]
        keys = [self.keys.leader, self.keys.poll_inflight(p.name), self.keys.queue, shard_key]
        sent, busy, dup, _gone = await run_fenced(self._script, self.lock_value(), keys, args)
        self.dispatched_total += sent
        self.health.extra["dispatched"] = self.dispatched_total
        if self.metrics is not None:
            m = self.metrics.dispatched
            m.labels(p.name, "dispatched").inc(sent)
            m.labels(p.name, "in_flight").inc(busy)
            m.labels(p.name, "duplicate").inc(dup)
        return len(due)
