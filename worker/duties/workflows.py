"""Workflows, the consumer's side: :class:`WorkflowHook` checks a step may start and, once its
task returned, advances the workflow before the step's job is finished.

Advance before finish: the step's end is recorded (once: ``ADVANCE`` in
:mod:`worker.storage.workflows`), the dependents it made ready are enqueued under their
deterministic ids, and only then does the completer finish the step's job. A consumer dying
anywhere in between leaves the job unfinished: it runs again (at least once, as every job) and
the repeat records nothing new and enqueues nothing twice, so a fan-in fires exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from worker.core import codec
from worker.core.clock import Clock, ms
from worker.core.jobdefs import JobDef, JobHook, JobOutcome, JobRun, SkipRun
from worker.core.logs import error_text
from worker.core.metrics import Metrics
from worker.core.outage import ride_out
from worker.core.serializer import Deserialize, Serialize
from worker.core.workflow import parse_step, step_job_id
from worker.storage.store import Store
from worker.storage.workflows import result_blob

log = structlog.get_logger("worker.workflows")


class WorkflowHook(JobHook):
    """Every job whose id names a workflow step (``<prefix>wf:<id>:<step>``, its
    :attr:`id_prefix`); any other job costs the consumer one string comparison and no Redis
    command."""

    def __init__(
        self,
        store: Store,
        jobs: Sequence[JobDef],
        serializer: tuple[Serialize, Deserialize],
        clock: Clock,
        *,
        keep_result_s: float,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.prefix = store.keys.prefix
        self.id_prefix = step_job_id(self.prefix, "", 0)[: -len(":0")]  # <prefix>wf:
        #: tasks that take their parents' results through ``ctx.parents``
        self.by_context = frozenset(j.name for j in jobs if j.parents == "context")
        self.serialize, self.deserialize = serializer
        self.clock = clock
        self.keep_ms = ms(keep_result_s)
        self.metrics = metrics

    async def started(self, run: JobRun) -> None:
        step = parse_step(self.prefix, run.job_id)
        if step is None:
            return
        wid, index = step
        begin = lambda: self.store.begin_step(wid, index)  # noqa: E731
        if not await ride_out(begin, self.clock, "workflow step start"):
            log.info("workflow step not started", workflow_id=wid, step=index)
            raise SkipRun(run.job_id)
        if run.job.parents == "context":
            run.ctx.parents = run.record.get("wf_parents")

    async def settle(self, run: JobRun, outcome: JobOutcome) -> None:
        step = parse_step(self.prefix, run.job_id)
        if step is None or outcome.status == "retry":
            return
        wid, index = step
        done = outcome.status == "success"
        value: bytes | str
        if done:
            try:
                value = result_blob(outcome.result, self.serialize)
            except Exception as exc:  # the step's result cannot be handed on: it failed
                done, value = False, f"result not serializable: {error_text(exc)}"
        else:
            err = outcome.error
            value = f"{type(err).__name__}: {error_text(err)}" if err else outcome.status
        now = ms(self.clock.time())

        async def advance() -> None:
            moved = await self.store.advance_workflow(
                wid, index, done, value, now, self.keep_ms, self.deserialize
            )
            if moved.ready:
                expires, steps = codec.EXPIRES_EXTRA_MS, moved.ready
                await self.store.enqueue_steps(
                    wid, steps, now, self.serialize, expires, self.by_context
                )
            if moved.ended_now and moved.state is not None and self.metrics is not None:
                self.metrics.workflows.labels(moved.state).inc()

        await ride_out(advance, self.clock, "workflow step end")
