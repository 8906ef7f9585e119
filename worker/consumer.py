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
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from arq.connections import ArqRedis
from arq.worker import Function, Retry, Worker, func

from worker.clock import Clock, ms
from worker.component import Component
from worker.context import Context, JobContext
from worker.jobs import JobDef, JobHook, Outcome
from worker.metrics import Metrics
from worker.serializer import Deserialize, Serialize
from worker.store import Store

log = structlog.get_logger("worker.consumer")

HOLDS_FLUSH_S = 0.25
SUMMARY_EVERY_S = 60.0


@dataclass(frozen=True)
class ConsumerConfig:
    """The consumer's slice of the settings."""

    concurrency: int = 100
    poll_delay_s: float = 0.05
    idle_poll_max_s: float = 0.5
    job_timeout_s: float = 300.0
    max_tries: int = 5
    keep_result_s: float = 3600.0
    shutdown_timeout_s: float = 30.0
    holds_ttl_s: float = 360.0


def build_functions(
    jobs: Sequence[JobDef],
    hooks: Sequence[JobHook],
    context: Context,
    metrics: Metrics | None = None,
) -> list[Function]:
    """arq ``Function`` objects for every job, wrapped to get a JobContext and run the hooks."""
    return [
        func(
            _wrap(j, context, hooks, metrics),  # type: ignore[arg-type]
            name=j.name,
            timeout=j.timeout_s,
            max_tries=j.max_tries,
            keep_result=j.keep_result_s,
        )
        for j in jobs
    ]


def _wrap(
    job: JobDef, context: Context, hooks: Sequence[JobHook], metrics: Metrics | None
) -> Callable[..., Awaitable[Any]]:
    name, fn = job.name, job.fn

    async def run(arq_ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        job_id = str(arq_ctx.get("job_id", ""))
        extra: dict[str, Any] = {}
        for hook in hooks:
            extra.update(hook.context(job_id))
        ctx = JobContext(arq_ctx, context, **extra)
        started = time.perf_counter()
        outcome: Outcome = "success"
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
            for hook in hooks:
                try:
                    await hook.ended(job_id, args, outcome)
                except Exception as exc:
                    log.warning("job hook failed", job_id=job_id, error=str(exc))

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
        idle_max = c.config.idle_poll_max_s
        if self._jobs_started() != started or not self.allow_pick_jobs:
            c._idle_extra_s = 0.0
        elif idle_max > self.poll_delay_s:
            c._idle_extra_s = min(
                max(c._idle_extra_s * 2, self.poll_delay_s), idle_max - self.poll_delay_s
            )
            await c.clock.sleep(c._idle_extra_s)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        await self._consumer._dead_letter(self, job_id, result_data)
        await super().finish_failed_job(job_id, result_data)


class Consumer(Component):
    """Runs arq's worker until stopped, then drains it (see module docstring)."""

    def __init__(
        self,
        jobs: Sequence[JobDef],
        hooks: Sequence[JobHook],
        context: Context,
        redis: ArqRedis,
        store: Store,
        serializer: tuple[Serialize, Deserialize],
        clock: Clock,
        *,
        instance_id: str,
        config: ConsumerConfig,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__("consumer", clock, sla_s=60.0)
        self.jobs = list(jobs)
        self.hooks = list(hooks)
        self.context = context
        self.redis = redis
        self.store = store
        self.keys = store.keys
        self.instance_id = instance_id
        self.serialize, self.deserialize = serializer
        self.config = config
        self.metrics = metrics
        self.worker: _ArqWorker | None = None
        self._idle_extra_s = 0.0
        self._flushed: frozenset[str] = frozenset()
        self._last_flush = 0.0
        self._last_summary = self.clock.monotonic()
        self._summary_totals = (0, 0, 0)

    @property
    def in_flight(self) -> int:
        w = self.worker
        return 0 if w is None else sum(not t.done() for t in w.tasks.values())

    def _build(self) -> _ArqWorker:
        functions = build_functions(self.jobs, self.hooks, self.context, self.metrics)
        if not functions:
            raise RuntimeError("the app registers no tasks or periodic jobs")
        return _ArqWorker(
            functions,
            consumer=self,
            queue_name=self.keys.queue,
            redis_pool=self.redis,
            handle_signals=False,
            max_jobs=self.config.concurrency,
            job_timeout=self.config.job_timeout_s,
            keep_result=self.config.keep_result_s,
            poll_delay=self.config.poll_delay_s,
            max_tries=self.config.max_tries,
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
        worker.allow_pick_jobs = False
        pending = [t for t in worker.tasks.values() if not t.done()]
        timeout = self.config.shutdown_timeout_s
        log.info("consumer draining", in_flight=len(pending), timeout_s=timeout)
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
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
        await self.store.set_holds(self.instance_id, held, ms(self.config.holds_ttl_s))
        self._flushed = held

    async def _dead_letter(
        self, worker: _ArqWorker, job_id: str, result_data: bytes | None
    ) -> None:
        """Keep the raw payload of a job arq gives up on, with the reason."""
        try:
            payload = await self.store.job_payload(job_id)
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
            await self.store.add_dead(job_id, record, at_ms)
            log.warning("job set aside in dead-letter set", job_id=job_id, reason=reason)
            if self.metrics is not None:
                self.metrics.dead.labels(reason.split(" ")[0]).inc()
        except Exception as exc:  # never let bookkeeping stop the consumer
            log.error("dead-lettering failed", job_id=job_id, error=str(exc))
