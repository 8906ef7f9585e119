"""Testing helpers for apps: run tasks and periodic ticks inline, with a real ``JobContext``.

    from worker.testing import Harness

    async def test_receipt_is_sent_once():
        async with Harness(app) as h:               # fakeredis, a fake clock
            await h.run("send_receipt", 42)
            await h.run("send_receipt", 42)         # ctx.once(...) dedups the second
            assert h.state["mailer"].sent == [42]

    async def test_daily_reset_runs_on_its_tick():
        async with Harness(app) as h:
            await h.tick("daily_reset")             # ctx.tick = the schedule's latest instant
            assert await h.run_enqueued() == 3      # the jobs it enqueued, run inline

The harness builds the same ``Context`` a worker process gives your code (``ctx.state``,
``ctx.enqueue``, ``ctx.mutex``, ``ctx.once``, ``ctx.poller``), on fakeredis by default (``pip
install 'fakeredis[lua]'``) or on a Redis you pass. Startup hooks run on entry, shutdown hooks
on exit. Time is a :class:`~worker.core.clock.FakeClock` you can advance. For the full process,
``python -m worker run --burst`` runs every due job and exits.
"""

from __future__ import annotations

import datetime as dt
from types import TracebackType
from typing import Any

from redis.asyncio import Redis

from worker.app import App
from worker.client import Client
from worker.consumer.envelope import validate
from worker.context import Context, JobContext
from worker.core import codec
from worker.core.clock import FakeClock, ms
from worker.core.serializer import get_serializer
from worker.settings import Settings
from worker.storage import keys as K


class Harness:
    """An app's jobs, run inline against fakeredis (or ``redis``) on a fake clock."""

    def __init__(
        self,
        app: App,
        *,
        redis: Any = None,
        clock: FakeClock | None = None,
        key_prefix: str = "test:",
        settings: Settings | None = None,
    ) -> None:
        self.app = app
        self.clock = clock or FakeClock()
        self.keys = K.Keys(key_prefix)
        self.serialize, self.deserialize = get_serializer("msgpack")
        self._own_redis = redis is None
        self.redis: Redis = redis if redis is not None else _fake_redis()
        settings = settings or Settings.model_construct(key_prefix=key_prefix)
        self.client = Client(
            self.redis, keys=self.keys, serialize=self.serialize, deserialize=self.deserialize,
            app=app, clock=self.clock,
            max_payload_bytes=settings.max_payload_bytes,
        )  # fmt: skip
        self.context = Context(
            settings,
            self.redis,
            self.client,
            self.clock,
            "test-instance",
        )

    @property
    def state(self) -> dict[str, Any]:
        """``ctx.state`` as the app's startup hooks left it."""
        return self.context.state

    async def __aenter__(self) -> Harness:
        for hook in self.app.startup_hooks:
            await hook(self.context)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for hook in self.app.shutdown_hooks:
            await hook(self.context)
        self.context.threads.close()
        if self._own_redis:
            await self.redis.aclose()

    def job_context(
        self, *, job_id: str | None = None, job_try: int = 1, **extra: Any
    ) -> JobContext:
        """The ``ctx`` a job gets, as a consumer builds it."""
        now = self.clock.time()
        arq_ctx = {
            "redis": self.redis,
            "job_id": job_id or self.client.store.ids.random(),
            "job_try": job_try,
            "enqueue_time": dt.datetime.fromtimestamp(now, dt.UTC),
            "score": ms(now),
        }
        return JobContext(arq_ctx, self.context, **extra)

    async def run(self, function: str, *args: Any, job_try: int = 1, **kwargs: Any) -> Any:
        """Run task ``function(*args, **kwargs)`` now, inline; its exceptions propagate."""
        job = self.app.tasks[function]
        return await job.fn(self.job_context(job_try=job_try), *args, **kwargs)

    async def tick(self, name: str, at: dt.datetime | None = None) -> Any:
        """Run periodic job ``name`` for the tick ``at`` (default: its latest instant)."""
        periodic = self.app.periodics[name]
        tick_ms = (
            ms(at.timestamp())
            if at is not None
            else periodic.schedule.latest(ms(self.clock.time()))
        )
        job_id = self.client.store.ids.periodic(name, tick_ms)
        return await periodic.fn(self.job_context(job_id=job_id, tick_ms=tick_ms))

    async def run_enqueued(self, *, limit: int = 10_000) -> int:
        """Run every job waiting in the app's queues and due now, inline (also the ones those
        jobs enqueue), in queue priority order; returns how many ran (a job past its deadline
        does not run: it is dropped)."""
        ran = 0
        while ran < limit:
            found = False
            for queue in self.app.queue_names():
                popped = await self.client.store.pop_due(queue, ms(self.clock.time()))
                if popped is None:
                    continue
                job_id, raw = popped
                if raw is None:
                    continue
                record = self.deserialize(raw)
                fn, args, kwargs, _, _ = validate(record)
                found = True
                deadline = codec.job_flow(record).deadline_ms
                if deadline is not None and ms(self.clock.time()) > deadline:
                    break  # expired: it never runs (as in a worker)
                extra = {}
                parsed = self.client.store.ids.parse_periodic(job_id)
                if parsed is not None:
                    extra["tick_ms"] = parsed[1]
                jobs = {**self.app.tasks, **{p.name: p.job() for p in self.app.periodics.values()}}
                await jobs[fn].fn(self.job_context(job_id=job_id, **extra), *args, **kwargs)
                ran += 1
                break
            if not found:
                break
        return ran


def _fake_redis() -> Redis:
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - a clear message for a missing test dependency
        raise ImportError(
            "worker.testing runs on fakeredis by default: pip install 'fakeredis[lua]' "
            "(or pass redis=... to Harness)"
        ) from None
    client: Redis = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    return client
