"""What user code receives: the process :class:`Context` and the per-job :class:`JobContext`.

Both offer the cross-replica helpers, so users never hand-roll locks:

- ``ctx.enqueue(fn, *args, unique_key=...)`` – enqueue once per key while queued/in flight.
- ``ctx.enqueue_many([...])`` – many jobs, one round trip per chunk (``Client.enqueue_many``).
- ``ctx.mutex(key, ttl)`` – a distributed try-lock (e.g. daily/monthly usage resets).
- ``ctx.once(key, ttl)`` – side-effect dedup (a reminder's ``dedup_key``).
- ``ctx.poller(name)`` – schedule items on a poller's shard queues.
- ``ctx.broadcast(topic, data)`` – every process's ``@app.on_broadcast(topic)`` handlers.

Services report progress with ``ctx.alive()`` (each service loop gets its own context, bound to
its component's health: a loop that stops calling it within its ``sla_s`` fails ``/healthz``).

Singleton services also get a handle on the lease: ``ctx.is_leading()`` (cheap, never raises),
``ctx.leader_epoch()``, ``ctx.fenced_pipeline()`` (Redis writes that commit only while this
process still holds the lease) and ``ctx.fencing_token()`` (the token that fences writes outside
Redis, e.g. a database row updated ``WHERE token <= $1``: docs/fencing.md), with
``ctx.fence_refused()`` to step down when such a fence refused a write.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import warnings
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from redis.asyncio import Redis

from worker.bulk import DEFAULT_CHUNK, JobLike
from worker.client import Client
from worker.core.clock import Clock, ms
from worker.core.errors import LeadershipLost
from worker.core.outage import RIDE_OUT_S
from worker.core.views import LeaderView
from worker.polls import BoundPoller
from worker.progress import Progress, checked
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.fenced import FencedPipeline
from worker.storage.store import FencedStore, Store
from worker.sync import SyncHelpers, SyncThreads

#: What to use instead of the deprecated :class:`Context` attributes.
USE_INSTEAD = {
    "keys": "ctx.settings.key_prefix to name the app's own keys",
    "store": "the context's helpers (ctx.enqueue, ctx.mutex, ctx.once, ctx.poller, "
    "ctx.fenced_pipeline) or ctx.redis for the app's own keys",
}


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(
        f"Context.{name} is deprecated and will be removed in the next release: use {instead}",
        DeprecationWarning,
        stacklevel=3,
    )


@dataclass
class Context:
    """Process-wide dependencies, built once by the runtime and shared by every component.

    ``state`` is yours: fill it in an ``@app.on_startup`` hook (database pools, HTTP
    clients) and read it from tasks as ``ctx.state``.
    """

    settings: Settings
    redis: Redis
    client: Client
    clock: Clock
    instance_id: str
    state: dict[str, Any] = field(default_factory=dict)
    leader: LeaderView | None = None
    #: The threads plain ``def`` jobs run in (``WORKER_SYNC_THREADS``; see :mod:`worker.sync`).
    threads: SyncThreads = field(default_factory=SyncThreads, repr=False, compare=False)
    #: Set on a service loop's own context (see :meth:`bound`): reports its progress.
    progress: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    #: Set on a singleton service's own context (see :meth:`under`): the epoch of the lease
    #: it runs under, its fencing token.
    fence_token: int | None = field(default=None, repr=False, compare=False)

    def alive(self) -> None:
        """Report that the service loop this context belongs to made progress: cheap, sync,
        safe from a thread (``asyncio.to_thread``). A service declared with ``sla_s`` that
        does not call it within ``sla_s`` seconds makes ``/healthz`` fail. A no-op outside a
        service (the process context, job contexts)."""
        if self.progress is not None:
            self.progress()

    def bound(self, progress: Callable[[], None]) -> Context:
        """A copy for one service loop whose :meth:`alive` calls ``progress`` (``state`` and
        everything else shared)."""
        return dataclasses.replace(self, progress=progress)

    def under(self, epoch: int) -> Context:
        """A copy for one run of a singleton service under the lease of ``epoch``: its
        :meth:`fencing_token`."""
        return dataclasses.replace(self, fence_token=epoch)

    @property
    def _keys(self) -> K.Keys:
        return self.client.keys

    @property
    def _store(self) -> Store:
        return self.client.store

    @property
    def keys(self) -> K.Keys:
        """Deprecated, removed in the next release: the framework's key names are internal.
        Name the app's own keys from ``ctx.settings.key_prefix``."""
        _deprecated("keys", USE_INSTEAD["keys"])
        return self._keys

    @property
    def store(self) -> Store:
        """Deprecated, removed in the next release: the framework's internal store is not part
        of the API. Use the helpers (``ctx.enqueue``, ``ctx.mutex``, ``ctx.once``,
        ``ctx.poller``, ``ctx.fenced_pipeline``) or ``ctx.redis`` for the app's own keys."""
        _deprecated("store", USE_INSTEAD["store"])
        return self._store

    def is_leading(self) -> bool:
        """``True`` while this process holds the leader lease: cheap, never raises, and
        ``False`` the moment leadership is in doubt. Check it before a side effect outside
        Redis in a singleton service."""
        return self.leader is not None and self.leader.is_leading()

    def leader_epoch(self) -> int | None:
        """The epoch of the lease this process holds, or ``None``."""
        return self.leader.epoch if self.leader is not None and self.leader.is_leading() else None

    def fencing_token(self) -> int:
        """The fencing token of the leadership this singleton service runs under: the lease's
        epoch, fixed for the run (a paused process that wakes up deposed still holds its old,
        lower token — that is the point). Strictly greater for every new leadership,
        cluster-wide, and it never goes back, not even after Redis lost its data (bounds in
        docs/fencing.md). Carry it with every write outside Redis and let the store refuse a
        token below the highest it has seen::

            token = ctx.fencing_token()
            async with conn.transaction():
                cur = await conn.execute(
                    "UPDATE fence SET token = %s WHERE name = %s AND token <= %s",
                    (token, "ledger", token),
                )
                if cur.rowcount == 0:  # a newer leader wrote: roll back and stop
                    raise ctx.fence_refused("ledger")
                await conn.execute("INSERT INTO ledger ...")

        :class:`LeadershipLost` outside a singleton service (a job, a ``per_process`` or
        ``per_key`` service, the process context): only the leader's singleton services have
        a leadership to fence."""
        if self.fence_token is None:
            raise LeadershipLost(
                "ctx.fencing_token() is for singleton services (@app.service(cardinality="
                "'singleton')): only they run under a leadership"
            )
        return self.fence_token

    def fence_refused(self, what: str) -> LeadershipLost:
        """A fence outside Redis refused this service's write (``what`` names it): a newer
        leadership wrote there, so this process steps down at once (as a refused fenced Redis
        write makes it). Returns the :class:`LeadershipLost` to raise: raised from the
        service, it ends the service without a restart."""
        reason = f"the fence of {what} refused token {self.fence_token}: a newer leader wrote"
        if self.leader is not None:
            self.leader.lost(reason)
        return LeadershipLost(reason)

    def fenced_pipeline(self) -> FencedPipeline:
        """A redis-py transaction pipeline that commits only while this process holds the
        lease (the lock is checked in the same atomic step)::

            async with ctx.fenced_pipeline() as pipe:
                pipe.hset("report", "last", now)
                await pipe.execute()   # raises LeadershipLost if the lease moved

        """
        if self.leader is None:
            raise LeadershipLost("this process is not a leader candidate (role consumer)")
        return FencedStore(self._store, self.leader).pipeline()

    async def enqueue(
        self, function: str, *args: Any, flow_key: str | None = None, **kwargs: Any
    ) -> str | None:
        """See :meth:`worker.client.Client.enqueue` (its options pass through)."""
        return await self.client.enqueue(function, *args, flow_key=flow_key, **kwargs)

    async def enqueue_many(
        self, jobs: Iterable[JobLike], *, chunk_size: int = DEFAULT_CHUNK, on_complete: Any = None
    ) -> list[str | None]:
        """See :meth:`worker.client.Client.enqueue_many`."""
        return await self.client.enqueue_many(jobs, chunk_size=chunk_size, on_complete=on_complete)

    async def start_workflow(self, flow: Any, **options: Any) -> str:
        """See :meth:`worker.client.Client.start_workflow`."""
        return await self.client.start_workflow(flow, **options)

    def poller(self, name: str) -> BoundPoller:
        """The shard queues of the app's poller ``name``; its calls ride out a Redis outage
        (a failover, writes refused for memory or disk) for up to :data:`RIDE_OUT_S`, so a
        job or a service goes on instead of failing on the framework's own call."""
        return dataclasses.replace(self.client.poller(name), ride_out_s=RIDE_OUT_S)

    async def broadcast(self, topic: str, data: Any = None) -> int | None:
        """See :meth:`worker.client.Client.broadcast`."""
        return await self.client.broadcast(topic, data)

    @asynccontextmanager
    async def mutex(self, key: str, ttl: float) -> AsyncIterator[bool]:
        """Try to take a cluster-wide mutex for at most ``ttl`` seconds.

        Yields ``True`` if this caller holds it (released on exit), ``False`` if another holds
        it: skip the work then. Never blocks. Pick ``ttl`` longer than the guarded work; a
        holder that dies frees it after ``ttl``.
        """
        token = uuid4().hex
        name = self._keys.mutex(key)
        acquired = await self._store.take_lease(name, token, ms(ttl))
        try:
            yield acquired
        finally:
            if acquired:
                await self._store.release_lease(name, token)

    async def once(self, key: str, ttl: float) -> bool:
        """``True`` the first time ``key`` is seen within ``ttl`` seconds, cluster-wide.

        Use it to make a side effect outside Redis happen once even if the job runs twice
        (retries, a duplicate tick, manual re-runs). It marks before you act: if the side
        effect then fails and must be retried, call :meth:`forget`.
        """
        return await self._store.once(key, ms(ttl))

    async def forget(self, key: str) -> None:
        """Undo :meth:`once` for ``key`` (e.g. the side effect failed)."""
        await self._store.forget(key)


class JobContext(dict[str, Any]):
    """The ``ctx`` a task receives: arq's ctx dict (``ctx["job_id"]``, ``ctx["redis"]`` …) plus
    attributes and the :class:`Context` helpers."""

    #: The store and claim token of this run (set by the consumer).
    claim: tuple[Store, str] | None = None
    #: Writes this run's progress (made at the first :meth:`progress` call, by
    #: :attr:`make_progress`, which the consumer sets: most runs report none).
    progress_writer: Progress | None = None
    make_progress: Callable[[], Progress] | None = None
    #: The last ``(fraction, message)`` given to :meth:`progress` in this run.
    last_progress: tuple[float, str | None] | None = None
    #: A workflow step's parents' results when its task takes them so
    #: (``@app.task(parents="context")``): one result, or the list of them.
    parents: Any = None
    #: A plain ``def`` task's thread helpers (set by :mod:`worker.sync`): see :attr:`sync`.
    sync_helpers: SyncHelpers | None = None

    def __init__(self, arq_ctx: dict[str, Any], context: Context, **extra: Any) -> None:
        super().__init__(arq_ctx)
        self.update(extra)
        self.context = context

    async def still_claimed(self) -> bool:
        """``True`` while this run still owns its job. A consumer paused or cut off past the
        orphan bound can find its job handed to another consumer; ask before a side effect
        outside Redis (an email, a payment) in a long job. ``False`` when Redis cannot say."""
        if self.claim is None:
            return True
        store, token = self.claim
        try:
            return (await store.claim_tokens([self.job_id]))[0] == token
        except Exception:
            return False

    async def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far this run is: ``fraction`` from 0 to 1 (``ValueError`` otherwise) and
        an optional ``message``. Cheap in a tight loop: at most one Redis write per 0.5 s per
        run, the latest value always written (at the latest when the run ends). Never fails
        the job (a Redis error is logged once). Read it with ``Client.progress(job_id)`` or
        ``python -m worker job ID``; kept as long as the job's result."""
        self.last_progress = checked(fraction, message)
        if self.progress_writer is None and self.make_progress is not None:
            self.progress_writer = self.make_progress()
        if self.progress_writer is not None:
            await self.progress_writer.report(*self.last_progress)

    @property
    def sync(self) -> SyncHelpers:
        """In a plain ``def`` task (run in a thread): the async helpers, callable from the
        thread — ``ctx.sync.still_claimed()``, ``ctx.sync.enqueue(...)``, ``ctx.sync.once(...)``,
        ``ctx.sync.run(coroutine)``; ``ctx.sync.cancelled`` once the run ended (its timeout)."""
        if self.sync_helpers is None:
            raise RuntimeError(
                "ctx.sync is for plain def tasks (run in a thread); in async def tasks await "
                "the helpers themselves (await ctx.still_claimed())"
            )
        return self.sync_helpers

    @property
    def job_id(self) -> str:
        return str(self["job_id"])

    @property
    def job_try(self) -> int:
        return int(self.get("job_try", 1))

    @property
    def tick(self) -> dt.datetime | None:
        """For periodic jobs: the scheduled instant this run belongs to (UTC)."""
        tick_ms = self.get("tick_ms")
        return None if tick_ms is None else dt.datetime.fromtimestamp(tick_ms / 1000, dt.UTC)

    @property
    def state(self) -> dict[str, Any]:
        return self.context.state

    @property
    def redis(self) -> Redis:
        return self.context.redis

    async def enqueue(
        self, function: str, *args: Any, flow_key: str | None = None, **kwargs: Any
    ) -> str | None:
        return await self.context.enqueue(function, *args, flow_key=flow_key, **kwargs)

    async def enqueue_many(
        self, jobs: Iterable[JobLike], *, chunk_size: int = DEFAULT_CHUNK, on_complete: Any = None
    ) -> list[str | None]:
        return await self.context.enqueue_many(jobs, chunk_size=chunk_size, on_complete=on_complete)

    async def start_workflow(self, flow: Any, **options: Any) -> str:
        return await self.context.start_workflow(flow, **options)

    def poller(self, name: str) -> BoundPoller:
        return self.context.poller(name)

    async def broadcast(self, topic: str, data: Any = None) -> int | None:
        return await self.context.broadcast(topic, data)

    def mutex(self, key: str, ttl: float) -> AbstractAsyncContextManager[bool]:
        return self.context.mutex(key, ttl)

    async def once(self, key: str, ttl: float) -> bool:
        return await self.context.once(key, ttl)

    async def forget(self, key: str) -> None:
        await self.context.forget(key)
