"""One enqueue's plan beyond its arguments: its flow key, deadline and coalescing, each from
the call or else from the task's defaults (:class:`~worker.core.flow.TaskFlow`), checked. Pure:
no Redis, no settings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.core.codec import JobFlow
from worker.core.flow import NO_FLOW, Coalesce, TaskFlow, expires_in_checked
from worker.core.ids import check_flow_key

#: The modes whose jobs the consumer checks as they would start (the record's start gate).
GATED = ("keep_last", "throttle")


def deadline_ms(
    now_ms: int,
    expires_in: float | None,
    expires_at: dt.datetime | None,
) -> int | None:
    """The deadline (epoch ms, the clock ``now_ms`` is read on: the Redis server's) of a job
    enqueued at ``now_ms``; ``None`` for none. ``expires_at`` must be timezone-aware."""
    if expires_in is not None and expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise ValueError("expires_at must be timezone-aware (e.g. datetime.now(UTC))")
        return round(expires_at.timestamp() * 1000)
    seconds = expires_in_checked(expires_in)
    return None if seconds is None else now_ms + round(seconds * 1000)


@dataclass(frozen=True)
class EnqueuePlan:
    """What one enqueue decided beyond its arguments: its flow key, its coalescing and the key
    it coalesces on (the unique key if given, else the flow key), its deadline's terms."""

    flow_key: str | None = None
    coalesce: Coalesce | None = None
    coalesce_key: str | None = None
    expires_in: float | None = None
    expires_at: dt.datetime | None = None

    def fields(self, now_ms: int) -> JobFlow | None:
        """The record's own fields for a job enqueued at ``now_ms`` (``None``: none)."""
        deadline = deadline_ms(now_ms, self.expires_in, self.expires_at)
        how, gate = self.coalesce, None
        if how is not None and how.mode in GATED and self.coalesce_key is not None:
            gate = (how.mode, self.coalesce_key, round(how.throttle_s * 1000))
        if self.flow_key is None and deadline is None and gate is None:
            return None
        return JobFlow(self.flow_key, deadline, gate)


NO_PLAN = EnqueuePlan()


def plan_enqueue(
    task: TaskFlow,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    flow_key: str | None = None,
    unique_key: str | None = None,
    job_id: str | None = None,
    expires_in: float | None = None,
    expires_at: dt.datetime | None = None,
    coalesce: str | None = None,
    debounce_s: float | None = None,
    max_wait_s: float | None = None,
    throttle_s: float | None = None,
) -> EnqueuePlan:
    """The plan of one enqueue: each option from the call, else from the task's defaults;
    :class:`ValueError` naming a contradiction."""
    asked = (flow_key, expires_in, expires_at, coalesce, debounce_s, max_wait_s, throttle_s)
    if task is NO_FLOW and all(v is None for v in asked):
        return NO_PLAN  # the usual enqueue: nothing to decide
    given = any(v is not None for v in (coalesce, debounce_s, max_wait_s, throttle_s))
    how = Coalesce.of(coalesce, debounce_s, max_wait_s, throttle_s) if given else task.coalesce
    key = flow_key if flow_key is not None else task.key_of(args, kwargs)
    if key is not None:
        check_flow_key(key)
    on = None
    if how is not None:
        if job_id is not None:
            raise ValueError("coalesce=... folds jobs of a flow_key or unique_key, not a job_id")
        on = unique_key if unique_key is not None else key
        if on is None:
            raise ValueError(f"coalesce={how.mode!r} needs a flow_key (or a unique_key)")
    if expires_in is not None and expires_at is not None:
        raise ValueError("give expires_in or expires_at, not both")
    if expires_in is None and expires_at is None:
        expires_in = task.expires_in_s
    deadline_ms(0, expires_in, expires_at)  # checks them
    return EnqueuePlan(key, how, on, expires_in, expires_at)
