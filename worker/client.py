"""Enqueueing from anywhere (web apps, tasks, initializers): jobs, unique jobs, poll items.

A :class:`Client` wraps an :class:`arq.connections.ArqRedis` configured with the framework's
queue name and serializer, so what it writes is exactly what the consumers read::

    client = await worker.Client.connect("redis://redis:6379/0", app=app)
    await client.enqueue("send_report", 42)
    await client.enqueue("activate", pkg_id, unique_key=f"activate:{pkg_id}")
    await client.poller("cards").schedule("card-17", delay=30)
    await client.broadcast("pricing", {"version": 7})  # every process's handlers
    await client.close()

Plain arq works too: ``arq.create_pool(settings, default_queue_name=f"{prefix}queue",
job_serializer=..., job_deserializer=...)`` with the pair from
:func:`worker.serializer.get_serializer`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from uuid import uuid4

from arq.connections import ArqRedis
from arq.constants import expires_extra_ms
from redis.asyncio import ConnectionPool

from worker import keys as K
from worker.broadcast import publish
from worker.clock import Clock, SystemClock, ms
from worker.poller import BoundPoller, Pollers, due_ms
from worker.serializer import Deserialize, Serialize, SerializerName, get_serializer, job_payload
from worker.store import NewJob, Store


def connect_redis(
    url: str,
    *,
    queue_name: str,
    serialize: Serialize,
    deserialize: Deserialize,
    socket_timeout_s: float | None = 10.0,
    max_connections: int | None = None,
    client_name: str | None = None,
) -> ArqRedis:
    """An ``ArqRedis`` for ``url`` (redis://, rediss:// with TLS, unix://; user/password).
    ``client_name`` shows in ``CLIENT LIST`` (which process and which connection is which)."""
    extra: dict[str, Any] = {} if url.startswith("unix:") else {"socket_keepalive": True}
    if client_name:
        extra["client_name"] = client_name
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


class Client:
    """Enqueue jobs and schedule poll items with the framework's conventions."""

    def __init__(
        self,
        redis: ArqRedis,
        *,
        keys: K.Keys,
        serialize: Serialize,
        app: Pollers | None = None,
        clock: Clock | None = None,
        expires_ms: int = expires_extra_ms,
        store: Store | None = None,
        origin: str | None = None,
    ) -> None:
        self.redis = redis
        #: Who sends this client's broadcasts: a worker's instance id, else a random client id.
        self.origin = origin or f"client-{uuid4().hex[:12]}"
        self.keys = keys
        self.store = store or Store(redis, keys)
        self.app = app
        self.clock = clock or SystemClock()
        self._serialize = serialize
        self._expires_ms = expires_ms

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        app: Pollers | None = None,
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
            self.store.ids.unique(unique_key) if unique_key is not None else uuid4().hex
        )
        now = ms(self.clock.time())
        score = due_ms(defer_until, 0.0, self.clock) if defer_until else now + ms(defer_by)
        payload = job_payload(function, args, kwargs, now, self._serialize)
        ttl = self._expires_ms + max(0, score - now)
        ok = await self.store.unique_enqueue(NewJob(jid, payload, score), ttl)
        return jid if ok else None

    async def broadcast(self, topic: str, data: Any = None) -> int | None:
        """Send ``data`` (any value the serializer takes) to the ``@app.on_broadcast(topic)``
        handlers of every live process, whatever its role, this one included; a process that
        is reconnecting catches up (see :mod:`worker.broadcast`). Returns the message's
        sequence number in its topic, or ``None`` when refused because it was sent from a
        handler it would trigger again (a loop)."""
        return await publish(self.store, self._serialize, topic, data, origin=self.origin)

    def poller(self, name: str) -> BoundPoller:
        """The shard queues of the app's poller ``name``."""
        if self.app is None:
            raise RuntimeError("Client was created without app=...; pollers need the app")
        return BoundPoller(self.app.pollers[name], self.store, self.clock)
