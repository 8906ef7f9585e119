"""Bulk enqueue: :class:`JobSpec`, one job of ``Client.enqueue_many``, and its checks."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.core.codec import JobFlow
from worker.core.enqueueplan import plan_enqueue
from worker.core.flow import TaskFlow
from worker.core.ids import check_flow_key, check_id

#: Jobs per round trip of ``enqueue_many`` unless told (bounds the script's run time and the
#: request's size: ~0.6 ms of server time and ~100 KB for 500 small jobs).
DEFAULT_CHUNK = 500


@dataclass(frozen=True)
class JobSpec:
    """One job for :meth:`worker.client.Client.enqueue_many`: ``function(*args, **kwargs)``
    with the options :meth:`~worker.client.Client.enqueue` takes, meaning the same."""

    function: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    unique_key: str | None = None
    job_id: str | None = None
    defer_by: float = 0.0
    defer_until: dt.datetime | None = None
    queue: str | None = None
    shard_key: str | None = None
    flow_key: str | None = None
    expires_in: float | None = None
    expires_at: dt.datetime | None = None


#: What ``enqueue_many`` takes per job: a :class:`JobSpec`, or ``(function, args)`` /
#: ``(function, args, kwargs)``.
JobLike = JobSpec | tuple[str, Sequence[Any]] | tuple[str, Sequence[Any], dict[str, Any]]


def as_spec(job: JobLike) -> JobSpec:
    """``job`` as a :class:`JobSpec` (a tuple is ``(function, args[, kwargs])``)."""
    if isinstance(job, JobSpec):
        spec = job
    elif isinstance(job, tuple) and len(job) in (2, 3) and isinstance(job[0], str):
        kwargs = job[2] if len(job) == 3 else {}
        spec = JobSpec(job[0], tuple(job[1]), dict(kwargs))
    else:
        raise TypeError(f"enqueue_many takes JobSpec or (function, args[, kwargs]), not {job!r}")
    if spec.unique_key is not None and spec.job_id is not None:
        raise ValueError(f"{spec.function}: give unique_key or job_id, not both")
    if spec.job_id is not None:
        check_id(spec.job_id, "job_id")
    elif spec.unique_key is not None:
        check_id(spec.unique_key, "unique_key")
    check_flow_key(spec.flow_key)
    return spec


async def checked(
    jobs: Iterable[JobLike], check: Callable[[str], None], chunk_size: int = DEFAULT_CHUNK
) -> list[JobSpec]:
    """Every job as a spec, each function name passed to ``check`` (the client's
    ``check_function``: an unknown name raises before anything is sent). Yields to the event
    loop after each ``chunk_size`` jobs: 200,000 of them take seconds of CPU on a slow core, and
    a leader running them in a task renews its lease meanwhile."""
    specs: list[JobSpec] = []
    names: set[str] = set()
    for n, job in enumerate(jobs, 1):
        spec = as_spec(job)
        specs.append(spec)
        if spec.function not in names:
            check(spec.function)
            names.add(spec.function)
        if n % chunk_size == 0:
            await asyncio.sleep(0)
    return specs


def spec_fields(spec: JobSpec, task: TaskFlow, now_ms: int) -> JobFlow | None:
    """A spec's own record fields (flow key, deadline) enqueued at ``now_ms``; a task that
    coalesces is refused (its jobs are enqueued one by one)."""
    plan = plan_enqueue(
        task, spec.args, spec.kwargs, flow_key=spec.flow_key, unique_key=spec.unique_key,
        expires_in=spec.expires_in, expires_at=spec.expires_at,
    )  # fmt: skip
    if plan.coalesce is not None:
        raise ValueError(f"{spec.function}: coalesced jobs are enqueued one by one (enqueue)")
    return plan.fields(now_ms)
