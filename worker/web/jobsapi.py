"""The console's Jobs view: pages of jobs by state, one job in detail, and per-task figures.

Reads go through the jobs read model (:mod:`worker.ops.jobsview`, what ``worker jobs`` and ``worker
job`` print) and the per-task counters FINISH keeps (:meth:`Store.task_stats
<worker.storage.store.Store.task_stats>`); each answer carries the Redis server's ``now_ms``, the
clock the page computes ages with. Records are hostile input: decoded with msgpack or JSON
only (a pickle payload is never unpickled here: it shows as undecodable), returned as data for
the page to show as text. Retry and cancel are :class:`~worker.ops.actions.Operations` calls, made
by the console's action handler (audited like every action).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Protocol

from aiohttp import web

from worker.app import App
from worker.client import Client
from worker.core.clock import ms, on_server_time
from worker.core.serializer import Deserialize, Serialize, get_serializer, json_loads, msgpack_loads
from worker.ops import jobsview
from worker.ops.actions import Operations, Outcome
from worker.storage.operators import TaskStats


class ConsoleState(Protocol):
    """What the Jobs view reads with: the workers' client and app and their serializer's name
    (the console's :class:`worker.web.api.ConsoleState` is one)."""

    @property
    def client(self) -> Client: ...
    @property
    def app(self) -> App: ...
    @property
    def serializer(self) -> str: ...


#: Jobs per page by default (the read model caps a page at :data:`jobsview.MAX_LIMIT`).
PAGE = 50
#: Longest search text and task name accepted in a query.
MAX_FILTER = 200
#: Minutes of per-task figures.
TASK_MINUTES = 60


def _unpickled(payload: bytes) -> Any:
    raise ValueError("pickle records are never unpickled by the console")


def serializer(name: str) -> tuple[Serialize, Deserialize]:
    """What the console encodes and decodes job records with: the workers' serializer, except
    that a pickle record is never decoded (it would run code from Redis)."""
    if name == "json":
        return get_serializer("json")[0], json_loads
    if name == "msgpack":
        return get_serializer("msgpack")[0], msgpack_loads
    return get_serializer("msgpack")[0], _unpickled


async def _now_ms(state: ConsoleState) -> int:
    client = state.client
    await on_server_time(client.clock, client.store.server_time_ms)
    return ms(client.clock.time())


def bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 with ``{"error": message}``."""
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


def _filter(query: Mapping[str, str], name: str) -> str | None:
    value = (query.get(name) or "").strip()
    if len(value) > MAX_FILTER:
        raise bad_request(f"{name}: at most {MAX_FILTER} characters")
    return value or None


async def jobs_page(state: ConsoleState, query: Mapping[str, str]) -> dict[str, Any]:
    """One page of jobs: ``state`` (queued, scheduled, running, failed, done), ``queue``,
    ``task``, ``search`` (text in the id, task or arguments), ``limit``, ``cursor`` (the last
    page's ``next_cursor``). A bad filter or cursor is a 400."""
    job_state = query.get("state") or "queued"
    queue = _filter(query, "queue")
    names = state.app.queue_names()
    if queue is not None and queue not in names:
        raise bad_request(f"queue: no queue {queue!r}; one of: {', '.join(names)}")
    try:
        limit = int(query.get("limit") or PAGE)
    except ValueError:
        raise bad_request("limit: a number") from None
    now = await _now_ms(state)
    try:
        page = await _list(state, query, job_state, queue, limit, now)
    except ValueError as exc:  # a bad state or cursor
        raise bad_request(str(exc)) from None
    return {
        "now_ms": now,
        "state": job_state,
        "queues": names,
        "tasks": sorted(j.name for j in state.app.jobs()),
        **page.to_json(),
    }


async def _list(
    state: ConsoleState,
    query: Mapping[str, str],
    job_state: str,
    queue: str | None,
    limit: int,
    now: int,
) -> jobsview.JobPage:
    return await jobsview.list_jobs(
        state.client.store,
        state=job_state,  # type: ignore[arg-type]  # checked by list_jobs
        queue=queue,
        task=_filter(query, "task"),
        search=_filter(query, "search"),
        limit=limit,
        cursor=query.get("cursor") or None,
        queues=state.app.queue_names(),
        deserialize=serializer(state.serializer)[1],
        now_ms=now,
        shards=state.client.shards.stores,
    )


async def job_info(state: ConsoleState, job_id: str) -> dict[str, Any] | None:
    """One job in full (its failure with the traceback, progress, dead letter), ``None`` when
    nothing of it is left."""
    now = await _now_ms(state)
    detail = await jobsview.job_detail(
        state.client.shards.of(job_id),  # the queue shard the id names
        job_id,
        queues=state.app.queue_names(),
        deserialize=serializer(state.serializer)[1],
        now_ms=now,
    )
    if detail is None:
        return None
    return {"now_ms": now, **detail.to_json()}


def _bound(value: float | None) -> tuple[float | None, bool]:
    """A run-time quantile for JSON: ``(ms, over)``, ``over`` when above every bucket."""
    if value is None or not math.isinf(value):
        return value, False
    return None, True


def task_row(name: str, stats: TaskStats) -> dict[str, Any]:
    """One task's figures over the last hour (pure)."""
    done = sum(p[1] for p in stats.series)
    failed = sum(p[2] for p in stats.series)
    recent = stats.series[-5:]
    p50, p50_over = _bound(stats.quantile_ms(0.5))
    p95, p95_over = _bound(stats.quantile_ms(0.95))
    mean = stats.mean_ms()
    return {
        "task": name,
        "done": done,
        "failed": failed,
        "failure_ratio": round(failed / (done + failed), 4) if done + failed else None,
        "per_min": round((done + failed) / max(len(stats.series), 1), 2),
        "per_min_5m": round(sum(p[1] + p[2] for p in recent) / max(len(recent), 1), 2),
        "mean_ms": None if mean is None else round(mean, 1),
        "p50_ms": p50,
        "p50_over": p50_over,
        "p95_ms": p95,
        "p95_over": p95_over,
        "throughput": [list(p) for p in stats.series],
    }


async def tasks(state: ConsoleState) -> dict[str, Any]:
    """Every task's throughput, failures and run time over the last :data:`TASK_MINUTES`
    minutes, busiest first (tasks without runs last, by name)."""
    now = await _now_ms(state)
    names = sorted({j.name for j in state.app.jobs()})
    stats = await state.client.store.task_stats(names, now, TASK_MINUTES)
    rows = [task_row(n, stats[n]) for n in names]
    rows.sort(key=lambda r: (-(r["done"] + r["failed"]), r["task"]))
    return {"now_ms": now, "minutes": TASK_MINUTES, "tasks": rows}


def _job_id(body: Mapping[str, Any]) -> str:
    job_id = body.get("id")
    if not isinstance(job_id, str) or not job_id or len(job_id) > 1024:
        raise bad_request('name the job: {"id": "<job id>"}')
    return job_id


async def retry(ops: Operations, body: dict[str, Any]) -> Outcome:
    """``POST /api/jobs/retry`` ``{"id"}``: :meth:`Operations.retry_job`."""
    return await ops.retry_job(_job_id(body))


async def cancel(ops: Operations, body: dict[str, Any]) -> Outcome:
    """``POST /api/jobs/cancel`` ``{"id"}``: :meth:`Operations.cancel_job`."""
    return await ops.cancel_job(_job_id(body))
