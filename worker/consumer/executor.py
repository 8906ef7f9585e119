"""The one-job executor: runs one claimed job from its record to its end: the envelope, the
try counter, its flow and hooks' admission, its ``ctx``, the function under its timeout and the
claim guard, then one ``Finish`` for the completer (a result, a retry, a deferral, a dead
letter). Semantics follow arq: ``max_tries``, job timeouts, ``keep_result``, aborts."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import structlog

from worker.consumer.claims import Run
from worker.consumer.completer import Completer
from worker.consumer.config import RETRY_TTL_MS, ConsumerConfig
from worker.consumer.dead import DeadLetters
from worker.consumer.envelope import BadJob, decode_record
from worker.consumer.failures import (
    RunFacts,
    Status,
    cancelled_record,
    dead_record,
    error_text,
    failure_record,
    log_traceback,
    traceback_text,
)
from worker.consumer.flow import expired_end, start_verdict, tell_expired
from worker.consumer.guard import ClaimGuard, uncancel
from worker.consumer.results import JobFailed, ResultFor, retry_score
from worker.consumer.settling import Held
from worker.context import Context, JobContext
from worker.core import codec
from worker.core.clock import Clock, ms
from worker.core.jobdefs import HookPlan, JobDef, JobHook, JobRun, Outcome
from worker.core.logs import capped
from worker.core.metrics import JobFigures, Metrics
from worker.core.retry import is_retry
from worker.core.serializer import Deserialize, Serialize
from worker.progress import Progress
from worker.storage.claims import FOREIGN, Claimed
from worker.storage.jobs import Finish
from worker.storage.sharded import Shards
from worker.storage.store import Store

log = structlog.get_logger("worker.consumer")
_XA, _CG = codec.DEADLINE, codec.GATE  # a job's own fields its start depends on


@dataclass(frozen=True)
class _Task:
    """What every run of one task uses, settled once: its limits and its hooks' plan."""

    job: JobDef
    plan: HookPlan
    max_tries: int
    timeout_s: float
    keep_s: float


class Executor:
    """Runs one job at a time per call (many calls run concurrently); holds no state of its
    own besides the counters in :attr:`totals` and the figures noted for the metrics
    (:attr:`figures`, counted once per round by :meth:`JobFigures.apply`)."""

    def __init__(
        self,
        jobs: Sequence[JobDef],
        hooks: Sequence[JobHook],
        context: Context,
        store: Shards,
        serializer: tuple[Serialize, Deserialize],
        clock: Clock,
        guard: ClaimGuard,
        completer: Completer,
        *,
        instance_id: str,
        config: ConsumerConfig,
        dead: DeadLetters,
        metrics: Metrics | None = None,
    ) -> None:
        self.jobs = {j.name: j for j in jobs}
        self.hooks = list(hooks)
        c = config
        self._tasks = {
            j.name: _Task(
                j,
                HookPlan.of(self.hooks, j),  # only the hooks concerned, only their steps
                j.max_tries if j.max_tries is not None else c.max_tries,
                j.timeout_s or c.job_timeout_s,
                j.keep_result_s if j.keep_result_s is not None else c.keep_result_s,
            )
            for j in jobs
        }
        self.figures = JobFigures(metrics) if metrics is not None else None
        self._failures_ms = config.retention.failures_ms
        self.context = context
        self.store = store
        self.serialize, self.deserialize = serializer
        self.clock = clock
        self.guard = guard
        self.completer = completer
        self.totals = completer.totals
        self.instance_id = instance_id
        self.config = config
        self.dead = dead
        self.metrics = metrics
        self.held = Held(self.completer.end, clock)  # ends the hooks settle first

    async def run(self, c: Claimed, run: Run) -> None:
        """Run ``c`` to its end; bookkeeping never leaves a run unaccounted for."""
        try:
            await self.execute(c, run)
        except BaseException as exc:
            log.error("job bookkeeping failed", job_id=c.job_id, error=repr(exc))
            self.held.drop(c.job_id)
            self._end(c, run, "retry", score_ms=c.score_ms)

    async def execute(self, c: Claimed, run: Run) -> None:
        """Check, admit, run and finish one job."""
        job_id, store, start_ms = c.job_id, self.store.of(c.job_id), ms(self.clock.time())
        try:
            record, (fn_name, args, kwargs, enqueue_try, enqueued_ms) = decode_record(
                c, self.deserialize, store.keys, self.config.max_payload_bytes
            )
            task = self._tasks.get(fn_name)
            if task is None:
                raise BadJob(f"unknown function {fn_name!r}", "unknown")
            run.function = fn_name  # a task the app defines: its runs are counted per task
        except BadJob as bad:
            self._waited(c, "<unknown>", start_ms)
            await self._give_up(c, run, bad, start_ms)
            return
        job, plan, max_tries = task.job, task.plan.for_id(job_id), task.max_tries
        job_try = max(c.try_, enqueue_try or 0)
        if job_try > c.try_:  # enqueued with a higher try: it counts from there
            await store.raise_try(job_id, job_try, RETRY_TTL_MS)
        queue_key = store.keys.queue_of(c.queue)
        result_for = ResultFor(fn_name, args, kwargs, job_try, enqueued_ms, job_id, queue_key)
        if job_try > max_tries:
            reason = f"max {max_tries} retries exceeded"
            await self._give_up(c, run, BadJob(reason, "retries"), start_ms, result_for)
            return
        gate = plan.admit or _XA in record or _CG in record  # most jobs: none (see flow)
        if gate and not await self._admitted(task, c, run, record, result_for, start_ms):
            return  # expired, or deferred: it waits (a slot, its key's run), its try given back
        self._waited(c, fn_name, start_ms)
        timeout, keep = task.timeout_s, task.keep_s
        ctx = self._context(plan, c, run, job_try, enqueued_ms, store)
        ctx.make_progress = partial(Progress, store, job_id, ms(timeout + keep), self.clock)
        hooked = JobRun(job, job_id, c.queue, job_try, ctx, record) if plan.hooked else None
        run.aborted |= hooked is not None and not await self.held.started(plan, hooked)
        started = self.clock.monotonic()
        outcome: Outcome = "success"
        error: BaseException | None = None
        result: Any = None
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                if run.aborted:  # claimed with its abort pending (or asked meanwhile): not run
                    raise asyncio.CancelledError("aborted before it started")
                run.calling = True
                try:
                    result = await self.guard.guard(job.fn(ctx, *args, **kwargs), job_id)
                finally:
                    run.calling = False
            if run.aborted:  # it caught the cancellation and went on: the abort still holds
                raise asyncio.CancelledError("aborted")
        except asyncio.CancelledError as exc:
            error = exc
            uncancel()  # handled here: the run ends normally
            outcome = self._cancelled(c, run, result_for, start_ms, keep)
        except Exception as exc:  # Retry and RetryJob (ours or arq's) included
            error = exc
            if run.aborted:  # however it ended, it ends aborted
                outcome = self._cancelled(c, run, result_for, start_ms, keep)
            elif is_retry(exc):  # run again, deferred as asked
                now_ms, outcome = ms(self.clock.time()), "retry"
                self._end(c, run, "retry", score_ms=retry_score(exc, job, job_try, now_ms, c))
                self.totals["retried"] += 1
            else:
                status: Status = "timeout" if scope.expired() else "failed"
                outcome = await self._failed(
                    c, run, job, exc, result_for, start_ms, keep, max_tries, status
                )
        else:
            data = self._result(result_for, True, result, start_ms) if keep > 0 else None
            self._end(c, run, "done", data, ms(keep))
            self.totals["complete"] += 1
        finally:
            took = await self._over(plan, job, ctx, outcome, started)
        end = (outcome, error, result, scope.expired(), took)
        if hooked is not None and plan.settles:
            await self.held.settle(c, run, plan, hooked, *end)
        if plan.ends:
            await plan.ended(job_id, args, outcome)
        if hooked is not None:
            await plan.finished(hooked, *end)

    async def _over(
        self, plan: HookPlan, job: JobDef, ctx: JobContext, outcome: Outcome, started: float
    ) -> float:
        """The run is over (however it ended): its last progress written, what the admitting
        hooks took given back, its figures noted; how long it ran."""
        progress = ctx.progress_writer  # made by the run's first ctx.progress(): most have none
        if progress is not None and progress.pending:  # the last value, before the end
            await progress.flush()
        for hook in plan.release:
            with contextlib.suppress(Exception):
                await hook.release(job, ctx.job_id)
        took = self.clock.monotonic() - started
        if self.figures is not None:
            self.figures.runs.append((job.name, outcome, took))
        return took

    def _waited(self, c: Claimed, task: str, start_ms: int) -> None:
        """Note ``worker_job_wait_seconds``: from the job's due time (its score) to its start,
        both on the Redis server's clock. Only the app's task names are labels."""
        if self.figures is not None:
            label = task if task in self._tasks else "<unknown>"
            self.figures.waits.append((c.queue, label, max(0, start_ms - c.score_ms) / 1000))

    async def _admitted(
        self, task: _Task, c: Claimed, run: Run, record: dict[str, Any], rf: ResultFor, at: int
    ) -> bool:
        """Its flow (:mod:`worker.consumer.flow`: else expired, or waiting) and every hook let
        it start; else deferred to when the first refusing hook said (the others give back)."""
        store = self.store.of(c.job_id)
        verdict = await start_verdict(record, rf.function, c.job_id, store, at)
        if verdict == "expired":
            out = expired_end(record, self._facts(c, rf, at), rf, task.keep_s, at, self)
            self._end(c, run, "failed", out.data, ms(task.keep_s), failure=out.failure)
            self.totals["failed"] += 1
            made = partial(self._context, task.plan, c, run, rf.job_try, rf.enqueued_ms, store)
            await tell_expired(task.plan, task.job, c, record, rf, out.error, made)
            return False
        if verdict is not None:  # its start gate holds it (keep_last, throttle) until then
            self._end(c, run, "defer", score_ms=verdict)
            return False
        due_ms = await task.plan.admitted(task.job, c.job_id, record)
        if due_ms is not None:  # a hook held it back (a slot, say): it waits, its try given back
            self._end(c, run, "defer", score_ms=due_ms)
        return due_ms is None

    def _context(
        self, plan: HookPlan, c: Claimed, run: Run, job_try: int, enqueued_ms: int, store: Store
    ) -> JobContext:
        extra: dict[str, Any] = {}
        for hook in plan.context:
            extra.update(hook.context(c.job_id))
        ctx = JobContext(
            {
                "redis": self.context.redis,
                "worker_instance": self.instance_id,
                "job_id": c.job_id,
                "job_try": job_try,
                "enqueue_time": dt.datetime.fromtimestamp(enqueued_ms / 1000, dt.UTC),
                "score": c.score_ms,
            },
            self.context,
            **extra,
        )
        ctx.claim = (store, run.token)  # for ctx.still_claimed()
        return ctx

    def _end(
        self, c: Claimed, run: Run, kind: str, data: bytes | None = None, keep_ms: int = 0,
        *, score_ms: int | None = None, failure: bytes | None = None,
    ) -> None:  # fmt: skip
        failure_ttl = max(keep_ms, self._failures_ms)
        run_ms = max(round((self.clock.monotonic() - run.started) * 1000), 0)  # per-task counts
        finish = Finish(
            kind, c.job_id, run.token, data, keep_ms, score_ms=score_ms, queue=c.queue,
            failure=failure, failure_ttl_ms=failure_ttl, task=run.function, run_ms=run_ms,
        )  # fmt: skip
        self.held.end(finish)

    def _facts(self, c: Claimed, rf: ResultFor | None, start_ms: int) -> RunFacts:
        """What a failure record says of the run besides its error."""
        return RunFacts.of(c, rf, start_ms, self.instance_id, self.context.settings.instance_name)

    def _result(self, rf: ResultFor, success: bool, result: Any, start_ms: int) -> bytes | None:
        return rf(success, result, start_ms, ms(self.clock.time()), self.serialize)

    def _cancelled(
        self, c: Claimed, run: Run, result_for: ResultFor, start_ms: int, keep: float
    ) -> Outcome:
        """A run cancelled: its claim was taken over (nothing written; an abort request stays
        for the new owner), it was aborted (however it ended: a failed result and a cancelled
        record; that ``FINISH`` removes the request), or the shutdown timeout cut it."""
        if c.job_id in self.guard.lost:
            self.guard.lost.discard(c.job_id)  # another consumer runs it now: nothing to write
            self.totals["lost"] += 1
            if self.metrics is not None:
                self.metrics.claims_lost.inc()
            return "retry"
        if run.aborted:
            aborted = asyncio.CancelledError("aborted")
            data = self._result(result_for, False, aborted, start_ms) if keep > 0 else None
            facts = self._facts(c, result_for, start_ms)
            failure = cancelled_record(facts, ms(self.clock.time()))
            self._end(c, run, "failed", data, ms(keep), failure=failure)
            self.totals["failed"] += 1
            return "failure"
        self._end(c, run, "retry", score_ms=c.score_ms)
        self.totals["retried"] += 1
        return "retry"

    async def _failed(
        self,
        c: Claimed,
        run: Run,
        job: JobDef,
        exc: Exception,
        result_for: ResultFor,
        start_ms: int,
        keep: float,
        max_tries: int,
        status: Status = "failed",
    ) -> Outcome:
        """A run that raised (or timed out): retried if the task retries that exception and
        tries remain (then logged at WARNING; set aside once they are used up), else a failed
        result (arq semantics) and a failure record, logged at ERROR with the traceback."""
        full = f"{type(exc).__name__}: {exc}"
        facts = self._facts(c, result_for, start_ms)
        error, tb = f"{type(exc).__name__}: {error_text(exc)}", traceback_text(exc)
        if job.retry_on and isinstance(exc, job.retry_on):
            if result_for.job_try < max_tries:
                delay = job.retry_delay(result_for.job_try) if job.retry_delay else 0.0
                self._end(c, run, "retry", score_ms=ms(self.clock.time() + delay))
                self.totals["retried"] += 1
                log.warning("job failed; retrying", **facts.fields, error=error,
                            exception=log_traceback(tb), retry_in_s=delay)  # fmt: skip
                return "retry"
            reason = f"{full} (after {result_for.job_try} tries)"
            bad = BadJob(reason, "retries")
            await self._give_up(c, run, bad, start_ms, result_for, count=False, exc=exc)
            return "failure"
        event = "job timed out" if status == "timeout" else "job failed"
        log.error(event, **facts.fields, status=status, error=error, exception=log_traceback(tb))
        data = self._result(result_for, False, exc, start_ms) if keep > 0 else None
        failure = failure_record(facts, status, ms(self.clock.time()), exc=exc)
        self._end(c, run, "failed", data, ms(keep), failure=failure)
        self.totals["failed"] += 1
        return "failure"

    async def _give_up(
        self,
        c: Claimed,
        run: Run,
        bad: BadJob,
        start_ms: int,
        result_for: ResultFor | None = None,
        *,
        count: bool = True,
        exc: Exception | None = None,
    ) -> None:
        """Set the job aside, keep a failed result (as arq does) and a failure record (``dead``:
        ``exc`` used up the tries, if given), take it off the queue."""
        try:
            await self.dead.set_aside(
                c.job_id,
                bad.reason,
                bad.kind,
                c.payload,
                max(c.size, 0),
                queue=c.queue,
                task=result_for.function if result_for else None,
                tries=c.try_ if c.try_ >= 0 else None,
            )
        except Exception as exc:
            log.error("dead-lettering failed", job_id=c.job_id, error=str(exc))
        if c.size == FOREIGN:  # CLAIM took it off the queue; its keys are not the app's
            self.totals["failed"] += 1
            return
        keep = self.config.keep_result_s
        data = None
        if keep > 0:
            queue = self.store.of(c.job_id).keys.queue_of(c.queue)
            rf = result_for or ResultFor("<unknown>", (), {}, max(c.try_, 0), 0, c.job_id, queue)
            data = self._result(rf, False, JobFailed(capped(bad.reason)), start_ms)
        facts = self._facts(c, result_for, start_ms)
        failure = dead_record(facts, ms(self.clock.time()), bad.reason, exc)
        self._end(c, run, "failed", data, ms(keep), failure=failure)
        self.totals["failed"] += 1
        if count and self.metrics is not None:
            self.metrics.jobs.labels(
                result_for.function if result_for else "<unknown>", "failure"
            ).inc()
