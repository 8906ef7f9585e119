"""Pollers, the client side: a poller's definition, the shard an item lives in, and
:class:`BoundPoller`, which schedules, reschedules and removes items from anywhere (a web
app, a task, a service). The leader's dispatcher is :mod:`worker.duties.poller`."""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from worker.core.clock import Clock, ms, on_server_time
from worker.core.outage import ride_out
from worker.storage.store import Store

T = TypeVar("T")


def shard_of(item: str, shards: int) -> int:
    """Stable shard of an item (crc32 of its UTF-8 bytes), the same in every process."""
    return zlib.crc32(item.encode()) % shards


@dataclass(frozen=True)
class PollerDef:
    """Due items in ``shards`` sorted sets; the leader enqueues one ``task(item)`` job per item.

    An item is never in flight twice: while its job exists, the item waits in its shard. An
    item whose job failed for good is due again ``failure_delay_s`` later.
    """

    name: str
    task: str
    shards: int = 1
    batch_size: int = 500
    interval_s: float = 1.0
    busy_defer_s: float = 1.0
    failure_delay_s: float = 60.0

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
    """A poller's shard queues, bound to a store: add, reschedule, remove items.

    ``ride_out_s`` > 0 (``ctx.poller(...)``: a call made inside a job or a service): a call
    that meets a Redis outage (:func:`worker.core.outage.redis_outage`: a failover, writes refused
    for memory or disk) is sent again with backoff until Redis takes it, for up to that long,
    so the job goes on instead of failing on the framework's own call. Each call is safe to
    send again (a schedule sets the due time; a remove removes)."""

    definition: PollerDef
    store: Store
    clock: Clock
    ride_out_s: float = 0.0

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

        async def send() -> None:
            await on_server_time(self.clock, self.store.server_time_ms)
            due = due_ms(at, delay, self.clock)
            await self.store.schedule_items({self.shard_key(item): {item: due}})

        await self._call(send, "poll schedule")

    async def schedule_many(
        self, items: Mapping[str, dt.datetime | float] | Iterable[str], *, delay: float = 0.0
    ) -> int:
        """Schedule many items in one pipelined round trip; returns how many were new (a call
        sent again after an outage counts only those its last sending added)."""
        items = items if isinstance(items, Mapping) else list(items)

        async def send() -> int:
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

        return await self._call(send, "poll schedule_many")

    async def remove(self, item: str) -> bool:
        """Stop polling ``item``: whether it was waiting or in flight (a job in flight still
        runs; if it fails, the item is not put back)."""
        key = self.shard_key(item)
        return await self._call(
            lambda: self.store.unschedule_item(key, self.name, item), "poll remove"
        )

    async def _call(self, send: Callable[[], Awaitable[T]], what: str) -> T:
        if self.ride_out_s <= 0:
            return await send()
        return await ride_out(send, self.clock, f"{what} ({self.name})", bound_s=self.ride_out_s)

    async def backlog(self) -> list[dict[str, int]]:
        """Per shard: items waiting and items due now."""
        keys = [self.store.keys.poll_shard(self.name, s) for s in range(self.definition.shards)]
        counts = await self.store.shard_backlog(keys, ms(self.clock.time()))
        return [{"shard": s, "waiting": w, "due": d} for s, (w, d) in enumerate(counts)]
