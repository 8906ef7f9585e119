"""The instance registry (heartbeats) and orphan recovery of dead consumers' jobs.

Every process registers itself (id, role, name, host, pid, version, components, start time,
last heartbeat) in a hash that expires at about twice the heartbeat interval, and deletes it
on clean exit. A sorted set of last-heartbeat times outlives the hashes: the leader's
:class:`OrphanReaper` looks there for consumers whose heartbeat is stale and makes the jobs
they held available again (arq alone would wait for its in-progress key to expire, 310 s by
default). A live peer's jobs are never touched: reaping is guarded by the heartbeat score
(seed 004 #1).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any

import structlog
from arq.connections import ArqRedis

from worker import __version__
from worker import keys as K
from worker.clock import Clock, ms
from worker.component import LoopComponent
from worker.fence import run_fenced
from worker.metrics import Metrics

log = structlog.get_logger("worker.registry")


class Heartbeat(LoopComponent):
    """Registers this process and refreshes its record every ``interval_s``."""

    name = "heartbeat"

    def __init__(
        self,
        *,
        redis: ArqRedis,
        keys: K.Keys,
        instance_id: str,
        instance_name: str,
        role: str,
        interval_s: float,
        describe: Callable[[], dict[str, Any]],
        clock: Clock | None = None,
    ) -> None:
        self.sla_s = max(10.0, interval_s * 5)
        super().__init__(clock)
        self.redis = redis
        self.keys = keys
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.describe = describe
        self.started_ms = ms(self.clock.time())
        self.static = {
            "id": instance_id,
            "name": instance_name,
            "role": role,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "started_ms": self.started_ms,
        }

    async def tick(self) -> float:
        now = ms(self.clock.time())
        record = {**self.static, **self.describe(), "heartbeat_ms": now}
        key = self.keys.instance(self.instance_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(key, json.dumps(record, default=str), px=ms(self.interval_s * 2.5))
            pipe.zadd(self.keys.instances, {self.instance_id: now})
            await pipe.execute()
        return self.interval_s

    async def deregister(self) -> None:
        """Remove this instance's records (clean exit)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.instance(self.instance_id), self.keys.holds(self.instance_id))
            pipe.zrem(self.keys.instances, self.instance_id)
            await pipe.execute()


class OrphanReaper(LoopComponent):
    """Leader-only: re-queue the in-flight jobs of instances whose heartbeat is stale."""

    name = "orphan-reaper"

    def __init__(
        self,
        *,
        redis: ArqRedis,
        keys: K.Keys,
        lock_value: Callable[[], str | None],
        stale_s: float,
        interval_s: float,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.sla_s = max(30.0, interval_s * 10)
        super().__init__(clock)
        self.redis = redis
        self.keys = keys
        self.lock_value = lock_value
        self.stale_s = stale_s
        self.interval_s = interval_s
        self.metrics = metrics
        self._reap = redis.register_script(K.REAP)
        self.released_total = 0

    async def tick(self) -> float:
        cutoff = ms(self.clock.time() - self.stale_s)
        stale = await self.redis.zrangebyscore(self.keys.instances, "-inf", cutoff, withscores=True)
        for raw_id, score in stale:
            instance_id = raw_id.decode()
            released = await run_fenced(
                self._reap,
                self.lock_value(),
                [
                    self.keys.leader,
                    self.keys.queue,
                    self.keys.holds(instance_id),
                    self.keys.instances,
                ],
                [K.ARQ_IN_PROGRESS, instance_id, int(score)],
            )
            if released < 0:
                continue
            self.released_total += released
            if self.metrics is not None:
                self.metrics.orphans.inc(released)
            log.warning(
                "stale instance reaped",
                instance=instance_id,
                jobs_released=released,
                silent_for_s=round((ms(self.clock.time()) - score) / 1000, 1),
            )
        return self.interval_s
