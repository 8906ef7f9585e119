"""Pollers, whole: the definition, shard math, client-side writes, the leader's dispatcher and
the consumer hook that forgets an item's in-flight entry when its job ends.

Each poller keeps its items in ``shards`` sorted sets scored by due time. Anyone schedules an
item (:class:`BoundPoller`); the leader's :class:`PollingScheduler` dispatches due items, two
round trips per batch: read the due items (read-only), then one fenced script that re-checks
each item is still due, removes it from its shard and writes an arq-compatible job for it.
While an item's previous job exists (queued or running) the item stays in its shard, pushed
back, so it is never in flight twice. Job payloads are built in Python, so every serializer
works and the record format is exactly arq's.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from arq.constants import expires_extra_ms

from worker.clock import Clock, ms, on_server_time
from worker.component import LoopComponent
from worker.ids import JobIds
from worker.jobs import Outcome
from worker.keys import DEFAULT_QUEUE
from worker.metrics import Metrics
from worker.serializer import Serialize, job_payload
from worker.store import FencedStore, NewJob, Store

log = structlog.get_logger("worker.poller")


def shard_of(item: str, shards: int) -> int:
    """Stable shard of an item (crc32 of its UTF-8 bytes), the same in every process."""
    return zlib.crc32(item.encode()) % shards


@dataclass(frozen=True)
class PollerDef:
    """Due items in ``shards`` sorted sets; the leader enqueues one ``task(item)`` job per item.

    An item is never in flight twice: while its job exists, the item waits in its shard.
    """

    name: str
    task: str
    shards: int = 1
    batch_size: int = 500
    interval_s: float = 1.0
    busy_defer_s: float = 1.0

    def shard_of(self, item: str) -> int:
        return shard_of(item, self.shards)


class Pollers(Protocol):
    """Anything that declares pollers by name (an :class:`~worker.app.App`)."""

    @property
    def pollers(self) -> Mapping[str, PollerDef]: ...


def due_ms(at: dt.datetime | float | None, delay: float, clock: Clock) -> int:
    """Epoch ms of ``at`` (aware datetime or epoch seconds), or ``delay`` seconds from now."""
    if at is None:
        return ms(clock.time() + delay)
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            raise ValueError("a datetime for scheduling must be timezone-aware")
        return ms(at.timestamp())
    return ms(float(at))


@dataclass
class BoundPoller:
    """A poller's shard queues, bound to a store: add, reschedule, remove items."""

    definition: PollerDef
    store: Store
    clock: Clock

    @property
    def name(self) -> str:
        return self.definition.name

    def shard_key(self, item: str) -> str:
        return self.store.keys.poll_shard(self.name, self.definition.shard_of(item))

    async def schedule(
        self, item: str, *, at: dt.datetime | float | None = None, delay: float = 0.0
    ) -> None:
        """Make ``item`` due at ``at`` (aware datetime or epoch seconds) or after ``delay`` s.

        Rescheduling an item already waiting moves it; an item in flight is dispatched again
        only after its current job ends.
        """
        await on_server_time(self.clock, self.store.server_time_ms)
        await self.store.schedule_items(
            {self.shard_key(item): {item: due_ms(at, delay, self.clock)}}
        )

    async def schedule_many(
        self, items: Mapping[str, dt.datetime | float] | Iterable[str], *, delay: float = 0.0
    ) -> int:
        """Schedule many items in one pipelined round trip; returns how many were new."""
        await on_server_time(self.clock, self.store.server_time_ms)
        if isinstance(items, Mapping):
            pairs = [(i, due_ms(at, 0.0, self.clock)) for i, at in items.items()]
        else:
            due = due_ms(None, delay, self.clock)
            pairs = [(i, due) for i in items]
        grouped: dict[str, dict[str, int]] = {}
        for item, due in pairs:
            grouped.setdefault(self.shard_key(item), {})[item] = due
        return await self.store.schedule_items(grouped)

    async def remove(self, item: str) -> bool:
        """Stop polling ``item`` (a job already in flight still runs)."""
        return await self.store.unschedule_item(self.shard_key(item), self.name, item)

    async def backlog(self) -> list[dict[str, int]]:
        """Per shard: items waiting and items due now."""
        keys = [self.store.keys.poll_shard(self.name, s) for s in range(self.definition.shards)]
        counts = await self.store.shard_backlog(keys, ms(self.clock.time()))
        return [{"shard": s, "waiting": w, "due": d} for s, (w, d) in enumerate(counts)]


class PollingScheduler(LoopComponent):
    """Dispatches one poller's due items (leader only)."""

    def __init__(
        self,
        poller: PollerDef,
        store: FencedStore,
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> None:
        super().__init__(f"poller:{poller.name}", clock, sla_s=max(30.0, poller.interval_s * 10))
        self.poller = poller
        self.queue = queue  # the poller task's queue
        self.store = store
        self.serialize = serialize
        self.metrics = metrics
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
        shard_key = self.store.keys.poll_shard(p.name, shard)
        now_ms = ms(self.clock.time())
        due = await self.store.store.due_items(shard_key, now_ms, p.batch_size)
        if not due:
            return 0
        items = [
            (
                item,
                NewJob(
                    self.store.ids.poll(p.name, item, score),
                    job_payload(p.task, (item,), {}, now_ms, self.serialize),
                ),
            )
            for item, score in due
        ]
        out = await self.store.dispatch(
            p.name, shard_key, now_ms, ms(p.busy_defer_s), items, expires_extra_ms, self.queue
        )
        self.dispatched_total += out.dispatched
        self.health.extra["dispatched"] = self.dispatched_total
        if self.metrics is not None:
            m = self.metrics.dispatched
            m.labels(p.name, "dispatched").inc(out.dispatched)
            m.labels(p.name, "in_flight").inc(out.in_flight)
            m.labels(p.name, "duplicate").inc(out.duplicate)
        return len(due)


class InflightHook:
    """Consumer hook: once a poll item's job ended, forget its in-flight entry (so the hash
    holds only items whose job may still exist)."""

    def __init__(self, store: Store, pollers: Mapping[str, PollerDef]) -> None:
        self.store = store
        self.ids: JobIds = store.ids
        self.pollers = dict(pollers)

    def context(self, job_id: str) -> Mapping[str, Any]:
        return {}

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        if outcome == "retry" or not args:
            return
        parsed = self.ids.parse_poll(job_id)
        if parsed is None or parsed[0] not in self.pollers:
            return  # enqueued directly, not by a poller
        try:
            await self.store.inflight_clear(parsed[0], str(args[0]), job_id)
        except Exception as exc:  # the next dispatch of the item overwrites the entry anyway
            log.warning("could not clear in-flight entry", job_id=job_id, error=str(exc))
