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
run ends), so a backlog costs at most one announcement per look and shard. A late duty lane
job (one a consumer that died had claimed) goes to the shard's duty marker, where a consumer
whose shared slots are all busy takes it too.

The leader also relays the plain announcements: consumers wait on each shard's wake marker
(:mod:`worker.storage.wake`), not on the pub/sub channel, so a due time published there alone
(a producer of an earlier version, the Node producer of docs/protocol.md, a job put back for a
retry) is copied to the shard's marker, where one idle consumer takes it. The framework's
enqueues set the marker themselves and mark their message (``+<due>``): not relayed. A burst of
plain messages is one ``ZADD`` per shard (the earliest due time heard since the last one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import LoopComponent
from worker.core.jobdefs import is_duty_lane
from worker.storage.store import Store
from worker.storage.wake import MARKED

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
        #: the relay: shard -> the earliest plain due time heard and not yet copied
        self.relaying: dict[int, int] = {}
        self.relayed = 0
        self._flush: asyncio.Task[None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        relay = asyncio.create_task(self.relay(stop), name="unannounced:relay")
        try:
            await super().run(stop)
        finally:
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)

    async def relay(self, stop: asyncio.Event) -> None:
        """Copy every plain announcement on a shard's wake channel to its marker."""
        by_channel = {s.keys.wake: i for i, s in enumerate(self.shards)}
        await self.shards[0].listen(
            list(by_channel),
            lambda channel, data: self.heard(by_channel.get(channel), data),
            stop,
            clock=self.clock,
            poll_s=1.0,
            retry_s=1.0,
            ping_s=55.0,
        )

    def heard(self, shard: int | None, data: bytes) -> None:
        """A message on ``shard``'s wake channel: a plain one is copied to its marker soon."""
        if shard is None or data.startswith(MARKED.encode()):
            return
        try:
            due = int(data)
        except ValueError:
            return
        self.relaying[shard] = min(due, self.relaying.get(shard, due))
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._copy(), name="unannounced:copy")

    async def _copy(self) -> None:
        await asyncio.sleep(0)  # the messages already received join this one write
        while self.relaying:
            shard, due = self.relaying.popitem()
            try:
                await self.shards[shard].mark_wake(due)
                self.relayed += 1
            except Exception as exc:  # the look above covers it
                log.info("could not relay an announcement", shard=shard, error=repr(exc))
        self.health.extra["relayed"] = self.relayed

    async def tick(self) -> float:
        began = self.clock.monotonic()
        late_ms = ms(self.clock.time()) - ms(self.interval_s / 2)
        for shard, store in enumerate(self.shards):
            due: dict[bool, list[tuple[str, int]]] = {False: [], True: []}
            for queue, head in zip(self.queues, await store.heads(self.queues), strict=True):
                if head is not None and head[1] <= late_ms and self._new(shard, queue, head):
                    due[is_duty_lane(queue)].append(head)
            for duty, heads in due.items():  # a duty lane's on the duty marker
                if heads:
                    await store.announce(min(score for _, score in heads), duty=duty)
                    self._announced(shard, heads)
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
