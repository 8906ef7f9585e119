"""The jobs read model on the real server: pages by state, cursors, filters that read a bounded
window, and a job's detail from its records (bad payloads shown, never raised)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis import asyncio as aioredis

from harness.arqfmt import serialize_result
from worker import App, JobContext
from worker.client import Client
from worker.core.serializer import job_payload, msgpack_dumps
from worker.ops import jobsview
from worker.ops.actions import Actor, Operations
from worker.storage import keys as K
from worker.storage.store import Store, open_store

pytestmark = pytest.mark.timeout(60)
P = "jv:"
KEYS = K.Keys(P)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    c = await Client.connect(redis_url, key_prefix=P)
    yield c
    await c.close()


@pytest.fixture
async def store(client: Client) -> Store:
    return client.store


async def _now(store: Store) -> int:
    return round(await store.server_time_ms())


async def _load(r: Any, n: int, *, task: str, base_ms: int, queue: str = "default") -> list[str]:
    """``n`` arq jobs written straight into ``queue`` (scores ``base_ms`` + i)."""
    ids = [f"{P}{task}-{i:06d}" for i in range(n)]
    async with r.pipeline(transaction=False) as pipe:
        for i, job_id in enumerate(ids):
            pipe.set(
                K.ARQ_JOB + job_id, job_payload(task, [i], {"who": f"u{i}"}, base_ms, msgpack_dumps)
            )
            pipe.zadd(KEYS.queue_of(queue), {job_id: base_ms + i})
        await pipe.execute()
    return ids


async def test_queued_and_scheduled_pages_walk_the_queue_with_a_cursor(
    client: Client, store: Store
) -> None:
    now = await _now(store)
    due = await _load(client.redis, 120, task="a", base_ms=now - 10_000)
    later = await _load(client.redis, 5, task="b", base_ms=now + 600_000)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await jobsview.list_jobs(store, state="queued", limit=50, cursor=cursor)
        assert len(page.items) <= 50 and page.scanned <= 50
        seen += [j.job_id for j in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == due  # every due job once, earliest first
    first = (await jobsview.list_jobs(store, state="queued", limit=1)).items[0]
    assert (first.task, first.queue, first.state, first.due_ms) == (
        "a",
        "default",
        "queued",
        now - 10_000,
    )
    assert first.args is not None and "who='u0'" in first.args
    sched = await jobsview.list_jobs(store, state="scheduled", limit=50)
    assert [j.job_id for j in sched.items] == later and sched.next_cursor is None


async def test_equal_scores_are_paged_without_loss_or_repeats(client: Client, store: Store) -> None:
    now = await _load_same_score(client.redis, store, 37)
    seen: list[str] = []
    cursor = None
    while True:
        page = await jobsview.list_jobs(store, state="queued", limit=10, cursor=cursor)
        seen += [j.job_id for j in page.items]
        if (cursor := page.next_cursor) is None:
            break
    assert sorted(seen) == sorted(f"{P}same-{i}" for i in range(37)) and len(seen) == 37
    assert now


async def _load_same_score(r: Any, store: Store, n: int) -> int:
    now = await _now(store)
    async with r.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.set(K.ARQ_JOB + f"{P}same-{i}", job_payload("same", [], {}, now, msgpack_dumps))
            pipe.zadd(KEYS.queue, {f"{P}same-{i}": now - 1})
        await pipe.execute()
    return now


async def test_a_filter_reads_a_bounded_window_and_hands_back_a_cursor(
    client: Client, store: Store, redis_url: str
) -> None:
    now = await _now(store)
    await _load(client.redis, 20_000, task="noise", base_ms=now - 100_000)
    await _load(client.redis, 3, task="needle", base_ms=now - 50)
    before = await _commands(redis_url)
    page = await jobsview.list_jobs(store, state="queued", task="needle", limit=10)
    spent = await _commands(redis_url) - before
    # at most 10 × limit entries read, in a handful of commands and three bounded reads of
    # each entry's record (its head, size and tail), however long the queue
    assert page.items == [] and page.scanned == 10 * 10 and page.next_cursor is not None
    assert spent <= 40 + 3 * page.scanned, spent
    found: list[str] = []
    cursor, calls = page.next_cursor, 1
    while cursor is not None and calls < 400:
        page = await jobsview.list_jobs(
            store, state="queued", task="needle", limit=10, cursor=cursor
        )
        found += [j.job_id for j in page.items]
        cursor, calls = page.next_cursor, calls + 1
    assert found == [f"{P}needle-{i:06d}" for i in range(3)]
    search = await jobsview.list_jobs(store, state="queued", search="U19999", limit=5)
    assert search.items == [] or search.items[0].task == "noise"


async def _commands(url: str) -> int:
    r = aioredis.Redis.from_url(url)
    try:
        info = await r.info("commandstats")
    finally:
        await r.aclose()
    return sum(int(v["calls"]) for v in info.values())


async def test_detail_finds_the_state_from_the_records(client: Client, store: Store) -> None:
    now = await _now(store)
    queued = await client.enqueue("work", 1, flag=True)
    later = await client.enqueue("work", 2, defer_by=600)
    assert queued and later
    d = await jobsview.job_detail(store, queued)
    assert d is not None and (d.state, d.task, d.queue, d.args, d.kwargs) == (
        "queued",
        "work",
        "default",
        "(1,)",
        "{'flag': True}",
    )
    d = await jobsview.job_detail(store, later)
    assert d is not None and d.state == "scheduled" and d.due_ms and d.due_ms > now
    # a running job: its claim marker
    await client.redis.set(K.ARQ_IN_PROGRESS + queued, "inst-1/3")
    d = await jobsview.job_detail(store, queued)
    assert d is not None and d.state == "running" and d.instance == "inst-1"
    # done and failed: arq's result records
    for job_id, ok, value in (
        (f"{P}ok", True, 42),
        (f"{P}bad", False, ValueError("boom")),
        (f"{P}gone", False, RuntimeError("x")),
    ):
        raw = serialize_result(
            "work", (7,), {}, 1, now - 10, ok, value, now - 5, now, "r", KEYS.queue,
            job_id=job_id, serializer=msgpack_dumps,
        )  # fmt: skip
        assert raw is not None
        await client.redis.set(K.ARQ_RESULT + job_id, raw)
    d = await jobsview.job_detail(store, f"{P}ok")
    assert d is not None and (d.state, d.result, d.started_ms, d.finished_ms) == (
        "done",
        "42",
        now - 5,
        now,
    )
    d = await jobsview.job_detail(store, f"{P}bad")
    assert d is not None and d.state == "failed" and d.error is not None
    assert (d.error["type"], d.error["message"]) == ("ValueError", "boom")
    assert await jobsview.job_detail(store, f"{P}nothing") is None


async def test_a_bad_payload_is_shown_as_undecodable(client: Client, store: Store) -> None:
    now = await _now(store)
    await client.redis.set(K.ARQ_JOB + f"{P}junk", b"\xc1not msgpack")
    await client.redis.zadd(KEYS.queue, {f"{P}junk": now - 1})
    d = await jobsview.job_detail(store, f"{P}junk")
    assert d is not None and d.state == "queued" and d.undecodable is not None
    page = await jobsview.list_jobs(store, state="queued")
    assert [j.job_id for j in page.items] == [f"{P}junk"] and page.items[0].task is None


async def test_dead_letters_are_listed_as_failed(client: Client, store: Store) -> None:
    now = await _now(store)
    for i in range(3):
        await store.add_dead(
            f"{P}d{i}",
            {"job_id": f"{P}d{i}", "reason": f"bad {i}", "queue": "default", "task": "t"},
            now - 1000 + i,
            100,
        )
    page = await jobsview.list_jobs(store, state="failed", limit=2)
    assert [j.job_id for j in page.items] == [f"{P}d2", f"{P}d1"]
    assert {j.state for j in page.items} == {"dead"} and page.next_cursor is not None
    rest = await jobsview.list_jobs(store, state="failed", limit=2, cursor=page.next_cursor)
    assert [j.job_id for j in rest.items] == [f"{P}d0"]
    d = await jobsview.job_detail(store, f"{P}d1")
    assert d is not None and d.state == "dead" and d.dead is not None and d.error is not None


async def test_a_bad_cursor_or_state_is_a_value_error(store: Store) -> None:
    with pytest.raises(ValueError, match="cursor"):
        await jobsview.list_jobs(store, state="queued", cursor="nope!")
    with pytest.raises(ValueError, match="state"):
        await jobsview.list_jobs(store, state="lost")  # type: ignore[arg-type]


async def test_open_store_has_the_reads(redis_url: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    try:
        s = open_store(r, KEYS, None)
        assert await s.queue_entries("default", low="-inf", high="+inf", offset=0, count=5) == []
    finally:
        await r.aclose()


async def test_failures_and_successes_are_listed_from_their_indexes(
    client: Client, store: Store
) -> None:
    now = await _now(store)
    r = client.redis
    for i, ok in enumerate((True, False, True)):
        job_id = f"{P}end{i}"
        raw = serialize_result(
            "work", (i,), {}, 1, now - 100, ok, 1 if ok else ValueError("bad"), now - 50,
            now - 10 + i, "r", KEYS.queue, job_id=job_id, serializer=msgpack_dumps,
        )  # fmt: skip
        assert raw is not None
        await r.set(K.ARQ_RESULT + job_id, raw)
        await r.zadd(KEYS.done if ok else KEYS.failures, {job_id: now - 10 + i})
    record = {
        "job_id": f"{P}end1", "task": "work", "queue": "default", "status": "timeout",
        "error_type": "TimeoutError", "message": "took too long", "try": 2,
        "traceback": "Traceback (most recent call last):\n  ...\nTimeoutError", "instance": "i1",
        "instance_name": "c1", "enqueued_ms": now - 100, "started_ms": now - 50,
        "finished_ms": now - 9, "args": "(1,)",
    }  # fmt: skip
    await r.set(KEYS.failure(f"{P}end1"), json.dumps(record))
    await r.set(KEYS.progress(f"{P}end1"), json.dumps({"fraction": 0.5, "message": "half"}))
    failed = await jobsview.list_jobs(store, state="failed")
    assert [(j.job_id, j.state, j.instance, j.args) for j in failed.items] == [
        (f"{P}end1", "timeout", "c1", "TimeoutError: took too long")
    ]
    done = await jobsview.list_jobs(store, state="done", limit=1)
    assert [j.job_id for j in done.items] == [f"{P}end2"] and done.next_cursor is not None
    rest = await jobsview.list_jobs(store, state="done", cursor=done.next_cursor)
    assert [j.job_id for j in rest.items] == [f"{P}end0"]
    d = await jobsview.job_detail(store, f"{P}end1")
    assert d is not None and d.state == "timeout" and d.error is not None
    assert d.error["traceback"].endswith("TimeoutError") and d.error["try"] == 2
    assert (d.progress, d.progress_message, d.instance) == (0.5, "half", "c1")


async def test_cancel_and_retry_through_operations(client: Client, store: Store) -> None:
    app = App("t", queues=("high", "default"))

    @app.task(queue="high")
    async def urgent(ctx: JobContext, n: int) -> None: ...

    ops = Operations(client, app, Actor("tester", "cli"))
    job_id = await client.enqueue("urgent", 5, queue="high")
    assert job_id is not None
    refused = await ops.retry_job(job_id)
    assert not refused.ok and "queued" in refused.message
    cancelled = await ops.cancel_job(job_id)
    assert cancelled.ok and cancelled.details["state"] == "cancelled"
    assert await client.redis.zscore(KEYS.queue_of("high"), job_id) is None
    d = await ops.detail(job_id)
    assert d is not None and (d.state, d.queue, d.task) == ("cancelled", "high", "urgent")
    again = await ops.cancel_job(job_id)
    assert not again.ok and "nothing to cancel" in again.message
    retried = await ops.retry_job(job_id)  # from its result record, under the same id
    assert retried.ok, retried.message
    d = await ops.detail(job_id)
    assert d is not None and (d.state, d.queue, d.args) == ("queued", "high", "(5,)")
    unknown = await ops.cancel_job(f"{P}nope")
    assert not unknown.ok and "unknown" in unknown.message
    audit = await store.audit_log(10)
    assert [(e["action"], e["ok"], e["who"]) for e in audit] == [
        ("cancel", False, "tester"),
        ("retry", True, "tester"),
        ("cancel", False, "tester"),
        ("cancel", True, "tester"),
        ("retry", False, "tester"),
    ]


async def test_running_reads_the_holds_sets_without_a_scan(
    client: Client, store: Store, redis_url: str
) -> None:
    now = await _now(store)
    ids = await _load(client.redis, 2_000, task="busy", base_ms=now + 60_000)  # parked claims
    r = client.redis
    await r.zadd(KEYS.instances, {"inst-a": now})
    await r.sadd(KEYS.holds("inst-a"), *ids[:3])
    await r.set(KEYS.progress(ids[1]), json.dumps({"fraction": 0.4, "message": None}))
    for job_id in ids[:3]:
        await r.set(K.ARQ_IN_PROGRESS + job_id, "inst-a/1")
    before = await r.info("commandstats")
    page = await jobsview.list_jobs(store, state="running", limit=2)
    after = await r.info("commandstats")
    assert "cmdstat_scan" not in after or after["cmdstat_scan"] == before.get("cmdstat_scan")
    assert [(j.job_id, j.instance, j.state) for j in page.items] == [
        (ids[0], "inst-a", "running"),
        (ids[1], "inst-a", "running"),
    ]
    assert page.items[1].progress == 0.4 and page.next_cursor is not None
    rest = await jobsview.list_jobs(store, state="running", cursor=page.next_cursor)
    assert [j.job_id for j in rest.items] == [ids[2]] and rest.next_cursor is None
    # parked claims are not "scheduled"
    assert ids[0] not in [
        j.job_id for j in (await jobsview.list_jobs(store, state="scheduled")).items
    ]


async def test_duty_lane_jobs_are_listed_found_and_their_failures_shown(
    client: Client, store: Store
) -> None:
    """Ticks and poll jobs wait in their queue's duty lane (``default:duty``): the listing, a
    job's detail and the failures list see them like any job of the app's queues."""
    now = await _now(store)
    (tick,) = await _load(client.redis, 1, task="tick", base_ms=now - 1000, queue="default:duty")
    queued = await jobsview.list_jobs(store, state="queued")
    assert [(j.job_id, j.queue) for j in queued.items] == [(tick, "default:duty")]
    d = await jobsview.job_detail(store, tick)
    assert d is not None and d.state == "queued"
    job_id = f"{P}tick-failed"
    record = {"job_id": job_id, "task": "tick", "queue": "default:duty", "status": "failed",
              "error_type": "ValueError", "message": "bad", "try": 1}  # fmt: skip
    await client.redis.set(KEYS.failure(job_id), json.dumps(record))
    await client.redis.zadd(KEYS.failures, {job_id: now})
    failed = await jobsview.list_jobs(store, state="failed")
    assert [(j.job_id, j.queue) for j in failed.items] == [(job_id, "default:duty")]
