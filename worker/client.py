"""Enqueueing from anywhere (web apps, tasks, initializers): jobs, unique jobs, poll items.

A :class:`Client` writes exactly what the consumers read: a web app reads the same
``WORKER_*`` settings as the workers, so the two cannot disagree::

    client = await worker.Client.from_env(app=app)   # or Client.connect(url, app=app, ...)
    await client.enqueue("send_report", 42)
    await client.enqueue("activate", pkg_id, unique_key=f"activate:{pkg_id}")
    await client.enqueue_many([("send_report", (n,)) for n in range(1000)])  # 2 round trips
    await client.poller("cards").schedule("card-17", delay=30)
    info = await client.job(job_id).result_info()     # status, result (as arq's Job)
    await client.broadcast("pricing", {"version": 7})  # every process's handlers
    await client.close()

Plain arq works too: ``arq.create_pool(..., **arq_options(settings))``. Connections come from
:func:`worker.storage.connection.connect_redis` (one server, a Sentinel primary or a Redis
Cluster); with a WAIT policy an ``enqueue`` returns once the replicas have the job
(:class:`~worker.core.errors.NotReplicated` otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, cast
from uuid import uuid4

from redis.asyncio import Redis

from worker.bulk import DEFAULT_CHUNK, JobLike, JobSpec, checked, spec_fields
from worker.core import codec
from worker.core.clock import Clock, RedisClock, ms, on_server_time
from worker.core.enqueueplan import NO_PLAN, EnqueuePlan, plan_enqueue
from worker.core.errors import ConfigError, PayloadTooLarge, UnknownTask
from worker.core.flow import NO_FLOW, Mode, TaskFlow
from worker.core.ids import check_id
from worker.core.jobdefs import JobDef
from worker.core.redisurl import RedisTarget, Replication, parse_redis_url
from worker.core.serializer import (
    Deserialize,
    Serialize,
    SerializerName,
    get_serializer,
    loads_for,
)
from worker.core.topics import MAX_BYTES as MAX_BROADCAST_BYTES
from worker.core.topics import publish
from worker.core.workflow import Job as WorkflowJob
from worker.core.workflow import OnFailure, WorkflowInfo, compile_flow, step_job_id
from worker.core.workflow import batch as batch_flow
from worker.polls import BoundPoller, Pollers, due_ms
from worker.settings import Settings, load_settings
from worker.storage import keys as K
from worker.storage import server
from worker.storage.connection import connect_redis, connect_shards
from worker.storage.enqueue import QueuedJob, send_chunk
from worker.storage.handle import Job
from worker.storage.jobs import NewJob
from worker.storage.keys import DEFAULT_QUEUE
from worker.storage.ready import wait_for_redis
from worker.storage.schedules import Schedules
from worker.storage.sharded import Shards
from worker.storage.shards import shard_prefixes
from worker.storage.store import Store, open_shards, open_store
from worker.tracing import Batch, Tracing, tracing_for

__all__ = ["Client", "arq_options", "connect_redis"]

#: ``WORKER_MAX_PAYLOAD_BYTES``' default: the largest job record a consumer reads.
DEFAULT_MAX_PAYLOAD_BYTES: int = Settings.model_fields["max_payload_bytes"].default


class _Routes(Protocol):
    """An app that knows which queue each function's jobs go to (told by ``hasattr``)."""

    def queue_of(self, function: str) -> str: ...


class _Declares(Protocol):
    """An app that knows the names of the jobs it runs."""

    name: str

    def job_names(self) -> list[str]: ...


def arq_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for a plain ``arq.create_pool`` that writes what the workers read:
    the queue name derived from ``WORKER_KEY_PREFIX`` and the ``WORKER_SERIALIZER`` pair."""
    serialize, deserialize = get_serializer(settings.serializer)
    return {
        "default_queue_name": K.Keys(settings.key_prefix).queue,
        "job_serializer": serialize,
        "job_deserializer": deserialize,
    }


class Client:
    """Enqueue jobs and schedule poll items with the framework's conventions."""

    def __init__(
        self,
        redis: Redis,
        *,
        keys: K.Keys,
        serialize: Serialize,
        deserialize: Deserialize | None = None,
        app: Pollers | None = None,
        clock: Clock | None = None,
        expires_ms: int = codec.EXPIRES_EXTRA_MS,
        store: Store | None = None,
        origin: str | None = None,
        replication: Replication | None = None,
        tracing: Tracing | None = None,
        shards: Shards | None = None,
        max_broadcast_bytes: int = MAX_BROADCAST_BYTES,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.redis = redis
        #: Largest broadcast this client sends (``WORKER_MAX_BROADCAST_BYTES``).
        self.max_broadcast_bytes = max_broadcast_bytes
        #: ``WORKER_MAX_PAYLOAD_BYTES``: a larger job is refused (:class:`PayloadTooLarge`),
        #: as every consumer would dead-letter it ``oversized``
        self.max_payload_bytes = max_payload_bytes
        #: Spans per enqueue when ``WORKER_TRACING=otel`` (see :mod:`worker.tracing`).
        self.tracing = tracing
        #: Who sends this client's broadcasts: a worker's instance id, else a random client id.
        self.origin = origin or f"client-{uuid4().hex[:12]}"
        self.keys = keys
        self.store = store or (shards.home if shards else open_store(redis, keys, replication))
        #: the app's queue shards (``WORKER_QUEUE_SHARDS``), home (:attr:`store`) first
        self.shards = shards or Shards([self.store])
        self.app = app
        #: the Redis server's clock by default: a due time means the same on every host
        self.clock = clock or RedisClock()
        self._serialize = serialize
        #: reads result and job records (:meth:`job`); by default the pair of ``serialize``
        self._deserialize = deserialize or loads_for(serialize)
        self._expires_ms = expires_ms

    @classmethod
    async def connect(
        cls,
        url: str | RedisTarget,
        *,
        app: Pollers | None = None,
        key_prefix: str = "worker:",
        serializer: SerializerName = "msgpack",
        wait_replicas: int | None = None,
        wait_timeout_s: float = 0.5,
        tracing: Literal["off", "otel"] = "off",
        queue_shards: int = 1,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> Client:
        """Connect to ``url`` with the same settings the workers use (prefix, serializer).
        ``url`` may be a ``redis+sentinel://`` or ``redis+cluster://`` URL (or a parsed
        :class:`~worker.core.redisurl.RedisTarget`, which carries Sentinel credentials).
        ``wait_replicas``: replicas an enqueue waits for, strictly (``None``, as
        ``WORKER_REDIS_WAIT_REPLICAS=auto``: with Sentinel or Cluster the attached ones, up to
        1, else 0). ``tracing="otel"``: a PRODUCER span per enqueue, as
        ``WORKER_TRACING=otel`` (see :mod:`worker.tracing`). ``queue_shards``: the workers'
        ``WORKER_QUEUE_SHARDS``. ``max_payload_bytes``: the workers'
        ``WORKER_MAX_PAYLOAD_BYTES`` (a larger job is refused: :class:`PayloadTooLarge`)."""
        target = parse_redis_url(url) if isinstance(url, str) else url
        adaptive = wait_replicas is None
        if wait_replicas is None:
            wait_replicas = 0 if target.kind == "single" else 1
        wait_ms = max(1, round(wait_timeout_s * 1000))
        replication = Replication(wait_replicas, wait_ms, adaptive=adaptive)
        return await cls._open(
            target, key_prefix, serializer, replication, queue_shards, server.ping,
            app=app, tracing=tracing_for(tracing), max_payload_bytes=max_payload_bytes,
        )  # fmt: skip

    @classmethod
    async def _open(
        cls, target: RedisTarget, key_prefix: str, serializer: SerializerName,
        replication: Replication, queue_shards: int,
        ready: Callable[[Redis], Awaitable[Any]], **options: Any,
    ) -> Client:  # fmt: skip
        """A client on every queue shard, once ``ready`` (awaited with the home shard's
        connection) returned; every connection closed if it raised."""
        serialize, deserialize = get_serializer(serializer)
        keys = K.Keys(key_prefix)
        prefixes = shard_prefixes(key_prefix, queue_shards)
        clients = connect_shards(target, prefixes, queue_name=keys.queue)
        try:
            await ready(clients[0])
        except BaseException:
            await _close_all(clients)
            raise
        stores = open_shards(clients[0], keys, replication, queue_shards, clients)
        return cls(
            clients[0], keys=keys, serialize=serialize, deserialize=deserialize,
            replication=replication, shards=Shards(stores), **options,
        )  # fmt: skip

    @classmethod
    async def from_settings(
        cls, settings: Settings, *, app: Pollers | None = None, clock: Clock | None = None
    ) -> Client:
        """Connect with the workers' settings: the Redis URL (``WORKER_REDIS_URL`` or
        ``WORKER_REDIS_URL_FILE``), ``WORKER_KEY_PREFIX``, ``WORKER_SERIALIZER`` and
        ``WORKER_MAX_PAYLOAD_BYTES``. Waits up
        to ``WORKER_REDIS_CONNECT_TIMEOUT_S`` for Redis; :class:`ConfigError` (one line) when
        the URL is missing or Redis does not answer."""
        target = settings.redis_target()
        if target is None:
            raise ConfigError(
                "WORKER_REDIS_URL: not set (nor WORKER_REDIS_URL_FILE); the client needs the "
                "Redis URL the workers use"
            )
        clock = clock or RedisClock()

        async def ready(redis: Redis) -> None:
            await wait_for_redis(redis, target.url, settings.redis_connect_timeout_s, clock)

        return await cls._open(
            target, settings.key_prefix, settings.serializer, settings.replication(),
            settings.queue_shards, ready, app=app, clock=clock,
            tracing=tracing_for(settings.tracing),
            max_broadcast_bytes=settings.max_broadcast_bytes,
            max_payload_bytes=settings.max_payload_bytes,
        )  # fmt: skip

    @classmethod
    async def from_env(cls, *, app: Pollers | None = None, **overrides: Any) -> Client:
        """:meth:`from_settings` with :func:`~worker.settings.load_settings` (``WORKER_*``
        environment, ``WORKER_CONFIG_FILE``; ``overrides`` win): what a web app's lifespan
        calls. Pass ``app`` (the workers' :class:`~worker.App`) to schedule poll items."""
        return await cls.from_settings(load_settings(**overrides), app=app)

    async def close(self) -> None:
        await _close_all([self.redis, *(s.redis for s in self.shards.stores)])

    async def enqueue(
        self,
        function: str,
        *args: Any,
        unique_key: str | None = None,
        job_id: str | None = None,
        defer_by: float = 0.0,
        defer_until: dt.datetime | None = None,
        queue: str | None = None,
        shard_key: str | None = None,
        flow_key: str | None = None,
        expires_in: float | None = None,
        expires_at: dt.datetime | None = None,
        coalesce: Mode | None = None,
        debounce_s: float | None = None,
        max_wait_s: float | None = None,
        throttle_s: float | None = None,
        **kwargs: Any,
    ) -> str | None:
        """Enqueue ``function(*args, **kwargs)``; return its job id, or ``None`` if a job with
        the same id is already queued, running, or finished within the result TTL.

        ``flow_key``: whose work it is (a tenant; fair tasks take turns by it, per-key limits
        count by it). ``expires_in`` (s) / ``expires_at``: a job not started by then never
        starts, it ends ``expired``. ``coalesce`` (``debounce_s``, ``max_wait_s``,
        ``throttle_s``): fold the enqueues of ``function`` per flow key (or ``unique_key``):
        returns the job the call joined, ``None`` when throttled. Each defaults to the task's
        (docs/flow-control.md).

        ``unique_key`` makes the id ``<prefix>unique:<unique_key>``: the same key enqueued
        while its job is queued, running or kept runs once. ``queue``: by default the task's
        (``@app.task(queue=...)``, when the client knows the app), else ``default``. With
        ``WORKER_QUEUE_SHARDS`` > 1 a job goes to the shard its ``shard_key`` names, else its
        ``unique_key``'s, else a ``job_id``'s prefix's, else its ``flow_key``'s, else the
        shards in turn (docs/deployment.md).
        """
        if unique_key is not None and job_id is not None:
            raise ValueError("give unique_key or job_id, not both")
        self.check_function(function)
        if job_id is not None:
            check_id(job_id, "job_id")
        elif unique_key is not None:
            check_id(unique_key, "unique_key")
        plan = plan_enqueue(
            self.flow_of(function), args, kwargs, flow_key=flow_key, unique_key=unique_key,
            job_id=job_id, expires_in=expires_in, expires_at=expires_at, coalesce=coalesce,
            debounce_s=debounce_s, max_wait_s=max_wait_s, throttle_s=throttle_s,
        )  # fmt: skip
        if job_id is not None:
            store, jid = self.shards.of(job_id), job_id
        else:
            key = shard_key if shard_key is not None else (plan.coalesce_key or unique_key)
            key = key if key is not None else plan.flow_key
            store = self.shards.next() if key is None else self.shards.for_key(key)
            by_key = unique_key is not None and plan.coalesce is None  # coalesced: ids of its own
            jid = store.ids.unique(unique_key) if by_key and unique_key else store.ids.random()
        if queue is None:
            queue = self.queue_for(function)
        put = (function, args, kwargs, jid, queue, defer_by, defer_until, plan, self.fair(function))
        if self.tracing is None:
            return await self._put(store, *put)
        with self.tracing.send(function, jid, queue) as extra:
            return await self._put(store, *put, extra)

    async def _put(
        self,
        store: Store,
        function: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        jid: str,
        queue: str,
        defer_by: float,
        defer_until: dt.datetime | None,
        plan: EnqueuePlan = NO_PLAN,
        fair: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> str | None:
        await on_server_time(self.clock, self.store.server_time_ms)
        now = ms(self.clock.time())
        score = due_ms(defer_until, 0.0, self.clock) if defer_until else now + ms(defer_by)
        flow = plan.fields(now)  # the deadline on the server's clock
        payload = codec.encode_job(
            function, args, kwargs, now, self._serialize, extra=extra, flow=flow
        )
        self._sized(function, payload)
        if plan.coalesce is not None and plan.coalesce_key is not None:
            done = await store.coalesce_enqueue(
                plan.coalesce, store.keys.coalesce(function, plan.coalesce_key), jid, payload,
                now_ms=now, due_ms=score, ttl_ms=self._expires_ms, queue=queue,
            )  # fmt: skip
            return done.job_id
        ttl = self._expires_ms + max(0, score - now)
        if fair:  # a fair task's job: it waits in its flow key's queue
            job = QueuedJob(NewJob(jid, payload, score), queue, ttl, plan.flow_key or "")
            return jid if (await store.fair_enqueue([job]))[0] else None
        ok = await store.unique_enqueue(NewJob(jid, payload, score), ttl, queue)
        return jid if ok else None

    async def enqueue_many(
        self, jobs: Iterable[JobLike], *, chunk_size: int = DEFAULT_CHUNK,
        on_complete: WorkflowJob | None = None,
    ) -> list[str | None]:  # fmt: skip
        """Enqueue many jobs, ``chunk_size`` per round trip (one script call per queue shard,
        and one ``WAIT`` with a WAIT policy, per chunk); per job, in order, its id or ``None``
        where :meth:`enqueue` would return ``None``. A job is a :class:`~worker.bulk.JobSpec`
        (``function``, ``args``, ``kwargs`` and :meth:`enqueue`'s options) or a tuple
        ``(function, args[, kwargs])``. Every function is checked first (an unknown one:
        :class:`~worker.core.errors.UnknownTask`, nothing sent). Each chunk is written
        atomically per shard after the previous one was answered; an error leaves the earlier
        chunks and sends no later one. ``on_complete=Job("done", ...)``: the jobs are one
        workflow whose task ``done`` runs once after all ended, given ``{"done": n, "failed":
        m}`` first (docs/workflows.md)."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        specs = await checked(jobs, self.check_function, chunk_size)
        if on_complete is not None:
            wid = await self.start_workflow(batch_flow(specs, on_complete))
            return [step_job_id(self.keys.prefix, wid, i) for i in range(len(specs))]
        out: list[str | None] = []
        sending: asyncio.Future[list[str | None]] | None = None
        for lo in range(0, len(specs), chunk_size):
            await on_server_time(self.clock, self.store.server_time_ms)
            spans = self.tracing.batch() if self.tracing is not None else None
            try:
                batch = self._batch(specs[lo : lo + chunk_size], spans)
            except BaseException:  # e.g. an argument the serializer refuses: stop here
                if sending is not None:
                    await asyncio.wait([sending])  # the chunk sent before it still lands
                raise
            if sending is not None:  # the previous chunk ran while this one was built
                out += await sending
            sending = asyncio.ensure_future(self._send(batch, spans))
        if sending is not None:
            out += await sending
        return out

    def _batch(
        self, specs: Sequence[JobSpec], spans: Batch | None
    ) -> list[tuple[Store, QueuedJob]]:
        """The records of one chunk, enqueued now, each as :meth:`enqueue` writes it, with the
        shard it goes to (chosen as :meth:`enqueue` chooses it)."""
        now = ms(self.clock.time())
        batch = []
        for s in specs:
            flow = spec_fields(s, self.flow_of(s.function), now)
            flow_key = flow.flow_key if flow is not None else None
            if s.job_id is not None:
                store, jid = self.shards.of(s.job_id), s.job_id
            else:
                key = s.shard_key if s.shard_key is not None else s.unique_key
                key = key if key is not None else flow_key
                store = self.shards.next() if key is None else self.shards.for_key(key)
                jid = store.ids.random() if s.unique_key is None else store.ids.unique(s.unique_key)
            queue = s.queue if s.queue is not None else self.queue_for(s.function)
            score = due_ms(s.defer_until, 0.0, self.clock) if s.defer_until else None
            score = now + ms(s.defer_by) if score is None else score
            extra = spans.create(s.function, jid, queue) if spans is not None else None
            payload = codec.encode_job(
                s.function, s.args, s.kwargs, now, self._serialize, extra=extra, flow=flow
            )
            self._sized(s.function, payload)
            ttl = self._expires_ms + max(0, score - now)
            fair = (flow_key or "") if self.fair(s.function) else None
            batch.append((store, QueuedJob(NewJob(jid, payload, score), queue, ttl, fair)))
        return batch

    async def _send(
        self, batch: list[tuple[Store, QueuedJob]], spans: Batch | None
    ) -> list[str | None]:
        """Each shard's part of a chunk in one script call (the shards at once)."""
        with spans.send() if spans is not None else contextlib.nullcontext():
            return await send_chunk(batch)

    def flow_of(self, function: str) -> TaskFlow:
        """The flow defaults ``function``'s task declares (none without the app)."""
        job = getattr(self.app, "tasks", {}).get(function)
        return job.flow if isinstance(job, JobDef) else NO_FLOW

    def _sized(self, function: str, payload: bytes) -> None:
        """:class:`PayloadTooLarge` (one line) when ``payload`` is larger than the consumers
        read (``WORKER_MAX_PAYLOAD_BYTES``)."""
        if len(payload) > self.max_payload_bytes:
            raise PayloadTooLarge(function, len(payload), self.max_payload_bytes)

    def fair(self, function: str) -> bool:
        """Whether ``function``'s task is fair (``@app.task(fair=True)``; not without the app)."""
        return getattr(getattr(self.app, "tasks", {}).get(function), "fair", False) is True

    def queue_for(self, function: str) -> str:
        """The queue ``function``'s jobs wait in unless told: the one the task declares when
        the client knows the app, else ``default``."""
        app = cast(_Routes, self.app)  # hasattr: a runtime Protocol's isinstance costs 15-37 µs
        return app.queue_of(function) if hasattr(app, "queue_of") else DEFAULT_QUEUE

    def check_function(self, function: str) -> None:
        """Raise :class:`~worker.core.errors.UnknownTask` if the client's app does not declare
        ``function`` (a task or a periodic job); a client without an app accepts any name, as
        arq does."""
        if hasattr(self.app, "job_names"):
            app = cast(_Declares, self.app)
            if function not in (names := app.job_names()):
                raise UnknownTask(function, app.name, sorted(names))

    def new_job_id(self) -> str:
        """A random job id: the key prefix and a uuid (``<prefix><32 hex>``), so arq's per-job
        keys (``arq:job:<id>`` …) fall under the app's ACL patterns and, with a hash-tagged
        prefix, in its Redis Cluster slot. A plain arq client enqueueing into an app whose
        Redis user is limited to its prefix (or on a Cluster) passes
        ``_job_id=client.new_job_id()``."""
        return self.shards.next().ids.random()

    async def abort(self, job_id: str) -> None:
        """Ask the consumer running (or about to run) ``job_id`` to cancel it: what arq's
        ``Job.abort()`` asks, in the app's own set (``<prefix>abort``, the one the consumers
        read; arq's shared ``arq:abort`` is not, so use this instead of ``Job.abort()``)."""
        await self.shards.of(job_id).request_abort(job_id, ms(self.clock.time()))

    async def progress(self, job_id: str) -> dict[str, Any] | None:
        """The last progress ``job_id`` reported (``await ctx.progress(...)`` in the task):
        ``{"fraction": 0..1, "message": str | None, "at_ms": epoch ms}``, ``None`` if none is
        kept; readable while the job runs and as long as its result is kept."""
        return await self.shards.of(job_id).progress(job_id)

    async def failure(self, job_id: str) -> dict[str, Any] | None:
        """The last final failure of ``job_id`` (status ``failed``, ``timeout``, ``cancelled``
        or ``dead``, ``error_type``, ``message``, ``traceback``, ``try``, times, ``args``),
        ``None`` if it has none kept (see docs/monitoring.md, "Why did my job fail?")."""
        return await self.shards.of(job_id).failure(job_id)

    async def start_workflow(
        self, flow: Any, *, on_failure: OnFailure | None = None, workflow_id: str | None = None
    ) -> str:
        """Start ``flow`` (a :class:`~worker.Job`, ``chain``, ``group``, ``chord`` or
        :class:`~worker.Workflow`, see docs/workflows.md); its id. Calling it again with the
        same ``workflow_id`` after an error starts it once."""
        await on_server_time(self.clock, self.store.server_time_ms)
        now, sz = ms(self.clock.time()), self._serialize
        wf = compile_flow(flow, on_failure)
        for step in wf.steps:
            self.check_function(step.job.function)
        queues = [self.queue_for(s.job.function) for s in wf.steps]
        wid = workflow_id or uuid4().hex
        check_id(wid, "workflow_id")
        roots = await self.store.start_workflow(wid, wf, queues, now, sz)
        await self.store.enqueue_steps(wid, roots, now, sz, self._expires_ms)
        return wid

    async def workflow(self, workflow_id: str) -> WorkflowInfo | None:
        """The workflow's state and each step's (state, result, error); ``None`` when unknown."""
        return await self.store.read_workflow(workflow_id, self._reads())

    async def cancel_workflow(self, workflow_id: str) -> bool:
        """Cancel it: no step starts once this returned, running steps are aborted (as
        :meth:`abort`). ``False`` when it was not running."""
        return await self.store.cancel_workflow(workflow_id, ms(self.clock.time()))

    def unique_job_id(self, unique_key: str, shard_key: str | None = None) -> str:
        """The job id ``enqueue(..., unique_key=unique_key)`` uses (to look the job up)."""
        store = self.shards.for_key(unique_key if shard_key is None else shard_key)
        return store.ids.unique(unique_key)

    def job(self, job_id: str, queue: str = DEFAULT_QUEUE) -> Job:
        """A :class:`~worker.storage.handle.Job` for ``job_id`` in ``queue`` (arq's ``Job``
        methods): ``await job.status()``,
        ``await job.result_info()`` (without waiting), ``await job.result(timeout=...)``."""
        store = self.shards.of(job_id)  # the job's queue shard
        return Job(job_id, store.redis, store.keys.queue_of(queue), self._reads())

    def _reads(self) -> Deserialize:
        if self._deserialize is None:
            raise ValueError("Client(serialize=<custom>) reads jobs only with deserialize=...")
        return self._deserialize

    async def broadcast(self, topic: str, data: Any = None) -> int | None:
        """Send ``data`` (any value the serializer takes) to the ``@app.on_broadcast(topic)``
        handlers of every live process, whatever its role, this one included; a process that
        is reconnecting catches up (see :mod:`worker.duties.broadcast`). Returns the message's
        sequence number in its topic, or ``None`` when refused because it was sent from a
        handler it would trigger again (a loop). :class:`~worker.duties.broadcast.BroadcastTooLarge`
        when ``data`` serializes to more than ``WORKER_MAX_BROADCAST_BYTES``."""
        return await publish(
            self.store,
            self._serialize,
            topic,
            data,
            origin=self.origin,
            max_bytes=self.max_broadcast_bytes,
        )

    def poller(self, name: str) -> BoundPoller:
        """The shard queues of the app's poller ``name``."""
        if self.app is None:
            raise RuntimeError("Client was created without app=...; pollers need the app")
        return BoundPoller(self.app.pollers[name], self.store, self.clock)

    @property
    def schedules(self) -> Schedules:
        """Run-time schedules of the app's tasks (:class:`~worker.storage.schedules.Schedules`)."""
        return Schedules(self.store, self._schedulable)

    def _schedulable(self, task: str) -> None:
        tasks = getattr(self.app, "tasks", None)
        if not isinstance(tasks, dict):
            raise ConfigError("schedules need the app: make the client with app=...")
        if task not in tasks:
            raise UnknownTask(task, getattr(self.app, "name", "app"), sorted(tasks))


async def _close_all(clients: Sequence[Redis]) -> None:
    """Close each distinct client once (the shards of one server share one)."""
    for c in {id(c): c for c in clients}.values():
        await c.aclose(close_connection_pool=True)
