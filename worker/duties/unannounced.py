"""Jobs nobody announced: the leader looks at every queue's head and wakes the consumers.

A producer that writes the job record and ``ZADD``\\ s it to the queue without publishing on
the wake channel (a plain arq client, a producer in another language that skips that step)
wakes nobody, and an idle consumer looks at the queue itself only every
``WORKER_IDLE_POLL_SUBSCRIBED_S`` (30 s). So the leader, and only the leader (one look
cluster-wide, whoever leads; a hint, not fenced: two leaders for a moment announce twice),
reads the head of every queue of every shard every ``WORKER_UNANNOUNCED_LOOK_S`` (0.5 s: one
``ZRANGE`` per queue and shard) and, when that head has been due for more than half the
interval, publishes its due time on the shard's wake channel as an enqueue does. So such a job
starts within 1.5 intervals (0.75 s).

Needless wake-ups are avoided: a job its producer announced is claimed within milliseconds, and
a claimed one is parked at its claim's expiry, so the head of a queue drained normally is never
late; a late head is announced once (the same job still there at the next look means every
consumer is busy or none serves its queue, and a consumer with room looks by itself when a
run ends), so a backlog costs at most one announcement per look and shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import LoopComponent
from worker.storage import Store

log = structlog.get_logger("worker.unannounced")

NAME = "unannounced-jobs"


class UnannouncedJobs(LoopComponent):
    """Leader-only: announces due jobs nobody announced (see module docstring)."""

    def __init__(
        self, shards: Sequence[Store], queues: Sequence[str], clock: Clock, *, interval_s: float
    ) -> None:
        super().__init__(NAME, clock, sla_s=max(60.0, interval_s * 10))
        self.shards = list(shards)  # home first
        self.queues = list(queues)
        self.interval_s = interval_s
        #: (shard, queue) -> the late head announced last: not announced again
        self.announced: dict[tuple[int, str], tuple[str, int]] = {}
        self.count = 0

    async def tick(self) -> float:
        began = self.clock.monotonic()
        late_ms = ms(self.clock.time()) - ms(self.interval_s / 2)
        for shard, store in enumerate(self.shards):
            due = [
                head
                for queue, head in zip(self.queues, await store.heads(self.queues), strict=True)
                if head is not None and head[1] <= late_ms and self._new(shard, queue, head)
            ]
            if due:
                await store.announce(min(score for _, score in due))
                self._announced(shard, due)
        return max(0.0, self.interval_s - (self.clock.monotonic() - began))

    def _new(self, shard: int, queue: str, head: tuple[str, int]) -> bool:
        """Whether ``head`` is not the late head announced last for this queue and shard."""
        if self.announced.get((shard, queue)) == head:
            return False
        self.announced[(shard, queue)] = head
        return True

    def _announced(self, shard: int, due: list[tuple[str, int]]) -> None:
        if not self.count:
            log.info(
                "due jobs nobody announced (a plain arq client or another producer that writes "
                "only the record and the ZADD): the leader announces them",
                shard=shard,
                job_id=due[0][0],
            )
        self.count += len(due)
        self.health.extra["announced"] = self.count
