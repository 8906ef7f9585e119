"""``SyncClient``: enqueue from synchronous code (Flask, Django views, scripts), thread-safe.

One background event loop thread per client runs an ordinary async :class:`~worker.client.Client`;
every method hands its coroutine to that loop (``asyncio.run_coroutine_threadsafe``) and waits
for the answer. So the sync client writes exactly what the async one writes (the same scripts,
unique keys, WAIT policy, Sentinel and Cluster connections, the server's clock), with no second
implementation to drift, and it is safe to share across threads: the calls of every thread
run on the one loop, which serializes them over the client's connection pool::

    from worker import SyncClient

    client = SyncClient.from_env(app=jobs.app)        # once per process, e.g. at import
    job_id = client.enqueue("send_receipt", 42)       # from any thread
    client.job(job_id).result(timeout=10)             # waits for the result
    client.close()                                    # idempotent; later calls raise

Inside a running event loop (an ``async def`` view), use :class:`~worker.client.Client` and
``await``: a blocking call there would stall that loop, so :class:`SyncClient` refuses it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar

from worker.bulk import DEFAULT_CHUNK, JobLike
from worker.client import DEFAULT_MAX_PAYLOAD_BYTES, Client
from worker.core.codec import JobResult, JobStatus
from worker.core.flow import Mode
from worker.core.redisurl import RedisTarget
from worker.core.schedule_spec import ScheduleSpec
from worker.core.serializer import SerializerName
from worker.core.workflow import WorkflowInfo
from worker.polls import Pollers
from worker.settings import Settings, load_settings
from worker.storage.keys import DEFAULT_QUEUE

T = TypeVar("T")

__all__ = ["ClientClosed", "SyncClient", "SyncJob"]


class ClientClosed(RuntimeError):
    """A call on a :class:`SyncClient` after :meth:`SyncClient.close`."""


class SyncClient:
    """A :class:`~worker.client.Client` for synchronous code, safe to share across threads
    (module docstring). Build it with :meth:`from_env`, :meth:`from_settings` or
    :meth:`connect`; use it as a context manager or call :meth:`close`."""

    def __init__(self, connect: Callable[[], Awaitable[Client]]) -> None:
        """``connect``: makes the async client, run on this client's own loop (the
        classmethods pass :meth:`Client.from_settings` and friends)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="worker-sync-client", daemon=True
        )
        self._lock = threading.Lock()
        self._closed = False
        self._thread.start()

        async def make() -> Client:
            return await connect()

        try:
            self.client: Client = self._submit(make())
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def from_settings(cls, settings: Settings, *, app: Pollers | None = None) -> SyncClient:
        """:meth:`Client.from_settings` (the workers' ``WORKER_*`` settings)."""
        return cls(lambda: Client.from_settings(settings, app=app))

    @classmethod
    def from_env(cls, *, app: Pollers | None = None, **overrides: Any) -> SyncClient:
        """:meth:`Client.from_env`: the ``WORKER_*`` environment (``overrides`` win); pass the
        workers' ``app`` so enqueues go to each task's queue and pollers are known."""
        settings = load_settings(**overrides)
        return cls.from_settings(settings, app=app)

    @classmethod
    def connect(
        cls,
        url: str | RedisTarget,
        *,
        app: Pollers | None = None,
        key_prefix: str = "worker:",
        serializer: SerializerName = "msgpack",
        wait_replicas: int | None = None,
        wait_timeout_s: float = 0.5,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> SyncClient:
        """:meth:`Client.connect` (the settings one by one)."""
        return cls(
            lambda: Client.connect(
                url,
                app=app,
                key_prefix=key_prefix,
                serializer=serializer,
                wait_replicas=wait_replicas,
                wait_timeout_s=wait_timeout_s,
                max_payload_bytes=max_payload_bytes,
            )
        )

    # -- calls --------------------------------------------------------------------------------
    def enqueue(
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
        """:meth:`Client.enqueue`: the job id, or ``None`` when that id is already queued,
        running or kept (or the enqueue was throttled)."""
        return self._submit(
            self.client.enqueue(
                function,
                *args,
                unique_key=unique_key,
                job_id=job_id,
                defer_by=defer_by,
                defer_until=defer_until,
                queue=queue,
                shard_key=shard_key,
                flow_key=flow_key,
                expires_in=expires_in,
                expires_at=expires_at,
                coalesce=coalesce,
                debounce_s=debounce_s,
                max_wait_s=max_wait_s,
                throttle_s=throttle_s,
                **kwargs,
            )
        )

    def enqueue_many(
        self, jobs: Iterable[JobLike], *, chunk_size: int = DEFAULT_CHUNK, on_complete: Any = None
    ) -> list[str | None]:
        """:meth:`Client.enqueue_many`: per job its id or ``None``, one round trip per chunk."""
        return self._submit(
            self.client.enqueue_many(list(jobs), chunk_size=chunk_size, on_complete=on_complete)
        )

    def job(self, job_id: str, queue: str = DEFAULT_QUEUE) -> SyncJob:
        """A handle on ``job_id``: :meth:`SyncJob.status`, :meth:`SyncJob.info`,
        :meth:`SyncJob.result`."""
        self._check()
        return SyncJob(self, job_id, queue)

    def abort(self, job_id: str) -> None:
        """:meth:`Client.abort`: ask the consumer running (or about to run) it to cancel it."""
        self._submit(self.client.abort(job_id))

    def start_workflow(self, flow: Any, **options: Any) -> str:
        """:meth:`Client.start_workflow`."""
        return self._submit(self.client.start_workflow(flow, **options))

    def workflow(self, workflow_id: str) -> WorkflowInfo | None:
        """:meth:`Client.workflow`."""
        return self._submit(self.client.workflow(workflow_id))

    def cancel_workflow(self, workflow_id: str) -> bool:
        """:meth:`Client.cancel_workflow`."""
        return self._submit(self.client.cancel_workflow(workflow_id))

    def unique_job_id(self, unique_key: str, shard_key: str | None = None) -> str:
        """The job id ``enqueue(..., unique_key=...)`` uses."""
        self._check()
        return self.client.unique_job_id(unique_key, shard_key)

    def broadcast(self, topic: str, data: Any = None) -> int | None:
        """:meth:`Client.broadcast`."""
        return self._submit(self.client.broadcast(topic, data))

    @property
    def schedules(self) -> SyncSchedules:
        """:attr:`Client.schedules`, synchronous: ``upsert``, ``remove``, ``list``, ``get``."""
        self._check()
        return SyncSchedules(self)

    def run(self, call: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
        """Any async :class:`Client` call, from this thread:
        ``client.run(lambda c: c.poller("cards").schedule("card-1", delay=5))``."""
        self._check()
        return self._submit(call(self.client))

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections and stop the loop thread; a second call does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self.client.close(), self._loop).result(10)
        finally:
            self._stop_loop()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ClientClosed("this SyncClient is closed; make a new one")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is not None:
            raise RuntimeError(
                "SyncClient blocks its caller: inside an event loop use worker.Client "
                "(await client.enqueue(...))"
            )

    def _submit(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self._check()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()


class SyncJob:
    """One job, seen from synchronous code (:class:`~worker.storage.handle.Job` underneath)."""

    def __init__(self, client: SyncClient, job_id: str, queue: str = DEFAULT_QUEUE) -> None:
        self.client = client
        self.job_id = job_id
        self.queue = queue

    def status(self) -> JobStatus:
        """``deferred``, ``queued``, ``in_progress``, ``complete`` or ``not_found``."""
        return self.client.run(lambda c: c.job(self.job_id, self.queue).status())

    def info(self) -> JobResult | None:
        """The result record (success, result or error, tries, times), ``None`` until the job
        ended (or once its result expired)."""
        return self.client.run(lambda c: c.job(self.job_id, self.queue).result_info())

    def result(self, timeout: float | None = None, *, poll_delay: float = 0.2) -> Any:
        """Wait for the job's result (arq's ``Job.result``): its return value, or its
        exception raised; ``TimeoutError`` after ``timeout`` seconds."""
        return self.client.run(
            lambda c: c.job(self.job_id, self.queue).result(timeout, poll_delay=poll_delay)
        )

    def abort(self) -> None:
        """:meth:`SyncClient.abort` of this job."""
        self.client.abort(self.job_id)


class SyncSchedules:
    """:class:`~worker.storage.schedules.Schedules` for synchronous code (same arguments)."""

    def __init__(self, client: SyncClient) -> None:
        self._client = client

    def upsert(self, name: str, task: str, *args: Any, **options: Any) -> ScheduleSpec:
        """:meth:`Schedules.upsert <worker.storage.schedules.Schedules.upsert>`."""
        return self._client.run(lambda c: c.schedules.upsert(name, task, *args, **options))

    def remove(self, name: str) -> bool:
        return self._client.run(lambda c: c.schedules.remove(name))

    def list(self) -> list[ScheduleSpec]:
        return self._client.run(lambda c: c.schedules.list())

    def get(self, name: str) -> ScheduleSpec | None:
        return self._client.run(lambda c: c.schedules.get(name))
