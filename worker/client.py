"""Enqueueing from anywhere (web apps, tasks, initializers): jobs, unique jobs, poll items.

A :class:`Client` wraps an :class:`arq.connections.ArqRedis` configured with the framework's
queue name and serializer, so what it writes is exactly what the consumers read::

    client = await worker.Client.connect("redis://redis:6379/0", app=app)
    await client.enqueue("send_report", 42)
    await client.enqueue("activate", pkg_id, unique_key=f"activate:{pkg_id}")
    await client.poller("cards").schedule("card-17", delay=30)
    await client.close()

Plain arq works too: ``arq.create_pool(settings, default_queue_name="worker:queue",
job_serializer=..., job_deserializer=...)`` with the pair from
:func:`worker.serializer.get_serializer`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import uuid4

from arq.connections import ArqRedis
from arq.constants import expires_extra_ms
from redis.asyncio import ConnectionPool

from worker import keys as K
from worker.clock import Clock, SystemClock, ms
from worker.serializer import Deserialize, Serialize, SerializerName, get_serializer, job_payload

if TYPE_CHECKING:
    from worker.app import App, PollerDef


def connect_redis(
    url: str,
    *,
    queue_name: str,
    serialize: Serialize,
    deserialize: Deserialize,
    socket_timeout_s: float | None = 10.0,
    max_connections: int | None = None,
) -> ArqRedis:
    """An ``ArqRedis`` for ``url`` (redis://, rediss:// with TLS, unix://; user/password)."""
    extra: dict[str, Any] = {} if url.startswith("unix:") else {"socket_keepalive": True}
    pool = ConnectionPool.from_url(
        url,
        socket_connect_timeout=5,
        socket_timeout=socket_timeout_s,
        health_check_interval=30,
        max_connections=max_connections,
        **extra,
    )
    return ArqRedis(
        pool,
        job_serializer=serialize,
        job_deserializer=deserialize,
        default_queue_name=queue_name,
    )


def _to_ms(at: dt.datetime | float | None, delay: float, clock: Clock) -> int:
    if at is None:
        return ms(clock.time() + delay)
    if isinstance(at, dt.datetime):
        if at.tzinfo is None:
            raise ValueError("a datetime for scheduling must be timezone-aware")
        return ms(at.timestamp())
    return ms(float(at))


@dataclass
class BoundPoller:
    """A poller's shard queues, bound to a Redis connection: add, reschedule, remove items."""

    definition: PollerDef
    redis: ArqRedis
    keys: K.Keys
    clock: Clock

    @property
    def name(self) -> str:
        return self.definition.name

    def shard_key(self, item: str) -> str:
        return self.keys.poll_shard(self.name, self.definition.shard_of(item))

    async def schedule(
        self, item: str, *, at: dt.datetime | float | None = None, delay: float = 0.0
    ) -> None:
        """Make ``item`` due at ``at`` (aware datetime or epoch seconds) or after ``delay`` s.

        Rescheduling an item already waiting moves it; an item in flight is dispatched again
        only after its current job ends.
        """
        await self.redis.zadd(self.shard_key(item), {item: _to_ms(at, delay, self.clock)})

    async def schedule_many(
        self, items: Mapping[str, dt.datetime | float] | Iterable[str], *, delay: float = 0.0
    ) -> int:
        """Schedule many items in one pipelined round trip; returns how many were new."""
        grouped: dict[str, dict[str, int]] = {}
        if isinstance(items, Mapping):
            pairs = [(i, _to_ms(at, 0.0, self.clock)) for i, at in items.items()]
        else:
            due = _to_ms(None, delay, self.clock)
            pairs = [(i, due) for i in items]
        for item, due_ms in pairs:
            grouped.setdefault(self.shard_key(item), {})[item] = due_ms
        if not grouped:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, mapping in grouped.items():
                pipe.zadd(key, mapping)
            added = await pipe.execute()
        return int(sum(added))

    async def remove(self, item: str) -> bool:
        """Stop polling ``item`` (a job already in flight still runs)."""
        removed = bool(await self.redis.zrem(self.shard_key(item), item))
        await self.redis.eval(
            K.INFLIGHT_CLEAR, 1, self.keys.poll_inflight(self.name), item, "", K.ARQ_JOB
        )
        return removed

    async def backlog(self) -> list[dict[str, int]]:
        """Per shard: items waiting and items due now."""
        now = ms(self.clock.time())
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in range(self.definition.shards):
                key = self.keys.poll_shard(self.name, shard)
                pipe.zcard(key)
                pipe.zcount(key, "-inf", now)
            raw = await pipe.execute()
        return [
            {"shard": s, "waiting": int(raw[2 * s]), "due": int(raw[2 * s + 1])}
            for s in range(self.definition.shards)
        ]


class Client:
    """Enqueue jobs and schedule poll items with the framework's conventions."""

    def __init__(
        self,
        redis: ArqRedis,
        *,
        keys: K.Keys,
        serialize: Serialize,
        app: App | None = None,
        clock: Clock | None = None,
        expires_ms: int = expires_extra_ms,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.app = app
        self.clock = clock or SystemClock()
        self._serialize = serialize
        self._expires_ms = expires_ms
        self._unique = redis.register_script(K.UNIQUE_ENQUEUE)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        app: App | None = None,
        key_prefix: str = "worker:",
        serializer: SerializerName = "msgpack",
    ) -> Client:
        """Connect to ``url`` with the same settings the workers use (prefix, serializer)."""
        serialize, deserialize = get_serializer(serializer)
        keys = K.Keys(key_prefix)
        redis = connect_redis(
            url, queue_name=keys.queue, serialize=serialize, deserialize=deserialize
        )
        await redis.ping()
        return cls(redis, keys=keys, serialize=serialize, app=app)

    async def close(self) -> None:
        await self.redis.aclose(close_connection_pool=True)

    async def enqueue(
        self,
        function: str,
        *args: Any,
        unique_key: str | None = None,
        job_id: str | None = None,
        defer_by: float = 0.0,
        defer_until: dt.datetime | None = None,
        **kwargs: Any,
    ) -> str | None:
        """Enqueue ``function(*args, **kwargs)``; return its job id, or ``None`` if a job with
        the same id is already queued, running, or finished within the result TTL.

        ``unique_key`` makes the id ``<prefix>unique:<unique_key>``: enqueueing the same key
        twice while the first job is queued, in flight or its result is kept runs it once
        (seed 002 §6.2's activation tasks).
        """
        if unique_key is not None and job_id is not None:
            raise ValueError("give unique_key or job_id, not both")
        jid = job_id or (
            self.keys.unique_job_id(unique_key) if unique_key is not None else uuid4().hex
        )
        now = ms(self.clock.time())
        score = _to_ms(defer_until, 0.0, self.clock) if defer_until else now + ms(defer_by)
        payload = job_payload(function, args, kwargs, now, self._serialize)
        ok = await self._unique(
            keys=[self.keys.queue],
            args=[
                jid,
                K.ARQ_JOB,
                K.ARQ_RESULT,
                self._expires_ms + max(0, score - now),
                score,
                payload,
            ],
        )
        return jid if ok else None

    def poller(self, name: str) -> BoundPoller:
        """The shard queues of the app's poller ``name``."""
        if self.app is None:
            raise RuntimeError("Client was created without app=...; pollers need the app")
        return BoundPoller(self.app.pollers[name], self.redis, self.keys, self.clock)
