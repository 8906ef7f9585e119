"""The consumer: arq's own ``Worker`` running the app's jobs, in every role.

arq does the consuming; this component only adds what the framework needs around it:

- it runs inside the runtime (``handle_signals=False``), which owns signals and drains it:
  stop taking jobs, let in-flight jobs finish within the shutdown timeout, then cancel the
  rest (arq re-queues cancelled jobs, so nothing is lost);
- a per-instance health-check key (one worker's exit never fails another's check, arq #291);
- the ids of the jobs it holds, written to Redis for orphan recovery;
- jobs arq cannot run (malformed payload, unknown function, retries exhausted, expired) are
  set aside in a dead-letter set with their raw payload instead of vanishing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from arq.connections import ArqRedis
from arq.worker import Function, Retry, Worker, func

from worker import keys as K
from worker.app import App
from worker.clock import Clock, ms
from worker.component import Component
from worker.context import Context, JobContext
from worker.metrics import Metrics
from worker.serializer import Deserialize, Serialize

log = structlog.get_logger("worker.consumer")

HOLDS_FLUSH_S = 0.25
SUMMARY_EVERY_S = 60.0


def build_functions(app: App, context: Context, metrics: Metrics | None = None) -> list[Function]:
    """arq ``Function`` objects for every task and periodic job, wrapped to get a JobContext."""
    keys = context.keys
    poller_tasks = {p.task for p in app.pollers.values()}
    clear = _InflightClear(app, context) if poller_tasks else None
    functions: list[Function] = []
    for t in app.tasks.values():
        functions.append(
            func(
                _wrap(
                    t.name, t.fn, context, metrics, None, clear if t.name in poller_tasks else None
                ),  # type: ignore[arg-type]
                name=t.name,
                timeout=t.timeout_s,
                max_tries=t.max_tries,
                keep_result=t.keep_result_s,
            )
        )
    for p in app.periodics.values():
        prefix = keys.periodic_job_id(p.name, 0)[:-1]
        functions.append(
            func(
                _wrap(p.name, p.fn, context, metrics, prefix, None),  # type: ignore[arg-type]
                name=p.name,
                timeout=p.timeout_s,
            )
        )
    return functions


class _InflightClear:
    """Forgets a poll item's in-flight job id when that job ends (see keys.INFLIGHT_CLEAR)."""

    def __init__(self, app: App, context: Context) -> None:
        self.app = app
        self.keys = context.keys
        self.prefix = f"{context.keys.prefix}poll:"
        self._script = context.redis.register_script(K.INFLIGHT_CLEAR)

    async def __call__(self, job_id: str, args: tuple[Any, ...]) -> None:
        if not job_id.startswith(self.prefix) or not args:
            return  # enqueued directly, not by a poller
        poller = job_id[len(self.prefix) :].split(":", 1)[0]
        if poller not in self.app.pollers:
            return
        try:
            await self._script(
                keys=[self.keys.poll_inflight(poller)], args=[str(args[0]), job_id, K.ARQ_JOB]
            )
        except Exception as exc:  # the next dispatch of the item overwrites the entry anyway
            log.warning("could not clear in-flight entry", job_id=job_id, error=str(exc))


def _wrap(
    name: str,
    fn: Callable[..., Awaitable[Any]],
    context: Context,
    metrics: Metrics | None,
    tick_prefix: str | None,
    on_end: _InflightClear | None,
) -> Callable[..., Awaitable[Any]]:
    async def run(arq_ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        extra: dict[str, Any] = {}
        job_id = str(arq_ctx.get("job_id", ""))
        if tick_prefix is not None and job_id.startswith(tick_prefix):
            tail = job_id[len(tick_prefix) :]
            if tail.isdigit():
                extra["tick_ms"] = int(tail)
        ctx = JobContext(arq_ctx, context, **extra)
        started = time.perf_counter()
        outcome = "success"
        try:
            return await fn(ctx, *args, **kwargs)
        except (Retry, asyncio.CancelledError):
            outcome = "retry"
            raise
        except Exception:
            outcome = "failure"
            raise
        finally:
            if metrics is not None:
                metrics.jobs.labels(name, outcome).inc()
                metrics.job_seconds.labels(name).observe(time.perf_counter() - started)
            if on_end is not None and outcome != "retry":
                await on_end(job_id, args)

    run.__qualname__ = run.__name__ = name
    return run


class _ArqWorker(Worker):
    """arq's Worker plus holds tracking, a progress hook and dead-lettering."""

    def __init__(self, *args: Any, consumer: Consumer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._consumer = consumer

    async def _poll_iteration(self) -> None:
        started = self._jobs_started()
        await super()._poll_iteration()
        await self._consumer._after_poll(self)
        # An empty poll backs off (doubling, up to idle_poll_max_s) so an idle process costs a
        # few Redis commands per second instead of 1 / poll_delay; any new job resets it.
        c = self._consumer
        if self._jobs_started() != started or not self.allow_pick_jobs:
            c._idle_extra_s = 0.0
        elif c.idle_poll_max_s > self.poll_delay_s:
            c._idle_extra_s = min(
                max(c._idle_extra_s * 2, self.poll_delay_s), c.idle_poll_max_s - self.poll_delay_s
            )
            await asyncio.sleep(c._idle_extra_s)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await self._consumer._dead_letter(self, job_id, result_data)
        await super().finish_failed_job(job_id, result_data)


class Consumer(Component):
    """Runs arq's worker until stopped, then drains it (see module docstring)."""

    name = "consumer"
    sla_s = 60.0

    def __init__(
        self,
        *,
        app: App,
        context: Context,
        redis: ArqRedis,
        keys: K.Keys,
        instance_id: str,
        serialize: Serialize,
        deserialize: Deserialize,
        concurrency: int,
        poll_delay_s: float,
        idle_poll_max_s: float,
        job_timeout_s: float,
        max_tries: int,
        keep_result_s: float,
        shutdown_timeout_s: float,
        holds_ttl_s: float,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.app = app
        self.context = context
        self.redis = redis
        self.keys = keys
        self.instance_id = instance_id
        self.serialize = serialize
        self.deserialize = deserialize
        self.concurrency = concurrency
        self.poll_delay_s = poll_delay_s
        self.idle_poll_max_s = idle_poll_max_s
        self._idle_extra_s = 0.0
        self.job_timeout_s = job_timeout_s
        self.max_tries = max_tries
        self.keep_result_s = keep_result_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.holds_ttl_s = holds_ttl_s
        self.metrics = metrics
        self.worker: _ArqWorker | None = None
        self._flushed: frozenset[str] = frozenset()
        self._last_flush = 0.0
        self._last_summary = self.clock.monotonic()
        self._summary_totals = (0, 0, 0)
        self._draining = False

    @property
    def in_flight(self) -> int:
        w = self.worker
        return 0 if w is None else sum(not t.done() for t in w.tasks.values())

    def _build(self) -> _ArqWorker:
        functions = build_functions(self.app, self.context, self.metrics)
        if not functions:
            raise RuntimeError("the app registers no tasks or periodic jobs")
        return _ArqWorker(
            functions,
            consumer=self,
            queue_name=self.keys.queue,
            redis_pool=self.redis,
            handle_signals=False,
            max_jobs=self.concurrency,
            job_timeout=self.job_timeout_s,
            keep_result=self.keep_result_s,
            poll_delay=self.poll_delay_s,
            max_tries=self.max_tries,
            health_check_interval=10,
            health_check_key=self.keys.arq_health(self.instance_id),
            job_serializer=self.serialize,
            job_deserializer=self.deserialize,
            log_results=False,
            ctx={"worker_instance": self.instance_id},
        )

    async def run(self, stop: asyncio.Event) -> None:
        worker = self.worker = self._build()
        self._summary_totals = (0, 0, 0)  # a new arq Worker counts from zero
        self._draining = False
        main = asyncio.create_task(worker.main(), name="consumer:arq")
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({main, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if main.done():
                main.result()  # raises the arq loop's error: the supervisor restarts us
                return
            await self._drain(worker)
        finally:
            stopper.cancel()
            main.cancel()
            await asyncio.gather(main, return_exceptions=True)
            await self._cancel_jobs(worker)
            with contextlib.suppress(Exception):
                await self.redis.delete(worker.health_check_key)

    async def _drain(self, worker: _ArqWorker) -> None:
        """Stop taking jobs; wait up to the shutdown timeout for in-flight jobs."""
        self._draining = True
        worker.allow_pick_jobs = False
        pending = [t for t in worker.tasks.values() if not t.done()]
        log.info("consumer draining", in_flight=len(pending), timeout_s=self.shutdown_timeout_s)
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.shutdown_timeout_s)
            if still:
                log.warning(
                    "shutdown timeout: cancelling jobs; arq will retry them", cancelled=len(still)
                )

    async def _cancel_jobs(self, worker: _ArqWorker) -> None:
        tasks = [t for t in worker.tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- hooks called by _ArqWorker ------------------------------------------------------------
    async def _after_poll(self, worker: _ArqWorker) -> None:
        now = self.clock.monotonic()
        self.health.ok(now)
        self.health.extra.update(
            in_flight=self.in_flight,
            complete=worker.jobs_complete,
            failed=worker.jobs_failed,
            retried=worker.jobs_retried,
        )
        held = frozenset(worker.tasks)
        if held != self._flushed and now - self._last_flush >= HOLDS_FLUSH_S:
            await self._flush_holds(held)
            self._last_flush = now
        if now - self._last_summary >= SUMMARY_EVERY_S:
            self._summarize(worker, now)

    def _summarize(self, worker: _ArqWorker, now: float) -> None:
        """One INFO line per minute with what the consumer did (per-job lines are DEBUG)."""
        totals = (worker.jobs_complete, worker.jobs_failed, worker.jobs_retried)
        done, failed, retried = (a - b for a, b in zip(totals, self._summary_totals, strict=True))
        if done or failed or retried:
            log.info(
                "consumer summary",
                window_s=round(now - self._last_summary),
                complete=done,
                failed=failed,
                retried=retried,
                in_flight=self.in_flight,
            )
        self._summary_totals = totals
        self._last_summary = now

    async def _flush_holds(self, held: frozenset[str]) -> None:
        key = self.keys.holds(self.instance_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if held:
                pipe.sadd(key, *held)
                pipe.pexpire(key, ms(self.holds_ttl_s))
            await pipe.execute()
        self._flushed = held

    async def _dead_letter(
        self, worker: _ArqWorker, job_id: str, result_data: bytes | None
    ) -> None:
        """Keep the raw payload of a job arq gives up on, with the reason."""
        try:
            payload = await self.redis.get(K.ARQ_JOB + job_id)
            reason = "failed"
            if result_data:
                try:
                    r = self.deserialize(result_data).get("r")
                    reason = (
                        str(r.get("message") or r.get("error")) if isinstance(r, dict) else str(r)
                    )
                except Exception:
                    reason = "failed (unreadable result)"
            if payload is not None:
                try:
                    fn = self.deserialize(payload).get("f")
                    if fn not in worker.functions:
                        reason = f"unknown function {fn!r}"
                except Exception:
                    reason = "malformed payload"
            at_ms = ms(self.clock.time())
            record = {
                "job_id": job_id,
                "reason": reason,
                "at_ms": at_ms,
                "instance": self.instance_id,
                "payload_b64": base64.b64encode(payload).decode() if payload else None,
            }
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self.keys.dead_jobs, job_id, json.dumps(record))
                pipe.zadd(self.keys.dead, {job_id: at_ms})
                await pipe.execute()
            log.warning("job set aside in dead-letter set", job_id=job_id, reason=reason)
            if self.metrics is not None:
                self.metrics.dead.labels(reason.split(" ")[0]).inc()
        except Exception as exc:  # never let bookkeeping stop the consumer
            log.error("dead-lettering failed", job_id=job_id, error=str(exc))
