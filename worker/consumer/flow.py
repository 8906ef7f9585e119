"""A job's flow at its start: its deadline, and the start gates of ``keep_last`` (one run per
key at a time) and ``throttle`` (one start per key and period).

Only a record carrying the framework's own fields (a deadline, a start gate) comes here:
the executor looks for them in the record it has decoded, so every other job pays two
dictionary look-ups and nothing in Redis. A job whose deadline (epoch ms on the Redis server's
clock, as the consumer's clock reads it) has passed when it would start never starts: it ends
``expired`` (a failed result holding :class:`~worker.core.errors.JobExpired`, a failure record
of status ``expired``, the ``worker_jobs_expired`` counter). A ``keep_last`` job waits while
another job of its key runs (deferred by :data:`KEEP_LAST_WAIT_MS`, its try given back); a
``throttle`` job waits until the period since its key's last start is over (deferred to then).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol

import structlog

from worker.consumer.failures import RunFacts, failure_record
from worker.consumer.results import ResultFor
from worker.core import codec
from worker.core.errors import JobExpired
from worker.core.jobdefs import HookPlan, JobDef, JobRun
from worker.core.metrics import Metrics
from worker.core.serializer import Serialize
from worker.storage.claims import Claimed
from worker.storage.store import Store

log = structlog.get_logger("worker.consumer")

#: How long a ``keep_last`` job waits before it looks again whether its key's run has ended.
KEEP_LAST_WAIT_MS = 250
#: The least a key's state is kept once a gated job of it starts (a day).
GATE_STATE_MS = codec.EXPIRES_EXTRA_MS

_XA, _CG = codec.DEADLINE, codec.GATE

#: ``None``: start; ``"expired"``; or the time (ms) to look again (deferred, its try given back)
Verdict = Literal["expired"] | int | None


async def start_verdict(
    record: Mapping[str, Any], function: str, job_id: str, store: Store, now_ms: int
) -> Verdict:
    """``None``: the job may start; ``expired``: its deadline passed; a time: its start gate
    holds it until then (nothing to decide without the record's own fields)."""
    if _XA not in record and _CG not in record:
        return None
    flow = codec.job_flow(record)
    if flow.deadline_ms is not None and now_ms > flow.deadline_ms:
        return "expired"
    if flow.gate is None:
        return None
    mode, key, period_ms = flow.gate
    state = store.keys.coalesce(function, key)
    if mode == "throttle":
        return await store.throttle_admit(state, job_id, now_ms, period_ms, GATE_STATE_MS)
    if mode == "keep_last" and not await store.keep_last_admit(state, job_id, GATE_STATE_MS):
        return now_ms + KEEP_LAST_WAIT_MS
    return None


class Expired(NamedTuple):
    """An expired job's end: its result record (``None`` when results are not kept), its
    failure record and its error."""

    data: bytes | None
    failure: bytes
    error: JobExpired


class _Writes(Protocol):
    """What :func:`expired_end` uses of the executor."""

    serialize: Serialize
    metrics: Metrics | None


def expired_end(
    record: Mapping[str, Any],
    facts: RunFacts,
    result_for: ResultFor,
    keep_s: float,
    now_ms: int,
    writes: _Writes,
) -> Expired:
    """An expired job's records and error; logged, counted."""
    deadline = codec.job_flow(record).deadline_ms or 0
    at = dt.datetime.fromtimestamp(deadline / 1000, dt.UTC).isoformat(timespec="milliseconds")
    error = JobExpired(f"not started by its deadline {at} ({now_ms - deadline} ms late)")
    log.warning("job expired", **facts.fields, status="expired", deadline=at)
    data = None
    if keep_s > 0:
        data = result_for(False, error, facts.started_ms, now_ms, writes.serialize)
    failure = failure_record(facts, "expired", now_ms, exc=error, tb="")
    if writes.metrics is not None:
        writes.metrics.jobs_expired.labels(facts.queue, result_for.function).inc()
    return Expired(data, failure, error)


async def tell_expired(
    plan: HookPlan,
    job: JobDef,
    c: Claimed,
    record: Mapping[str, Any],
    rf: ResultFor,
    error: JobExpired,
    context: Callable[[], Any],
) -> None:
    """The hooks hear that the job ended ``expired`` (``ended`` as a failure; ``finished``
    with ``JobOutcome.status == "expired"``: ``on_job_end``); ``on_job_start`` never ran."""
    if plan.ends:
        await plan.ended(c.job_id, rf.args, "failure")
    if plan.runs:
        run = JobRun(job, c.job_id, c.queue, rf.job_try, context(), record)
        await plan.finished(run, "failure", error, None, False, 0.0)
