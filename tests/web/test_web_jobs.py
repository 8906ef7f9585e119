"""The console's Jobs view API on the real server, with a real consumer running the jobs: pages
by state with filters and cursors, a job's detail, per-task figures, retry and cancel through
``Operations`` (token-guarded, audited), hostile strings returned as data.

The browser test (tests/web/test_web_browser.py) drives the same endpoints through the page.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from harness import eventually
from harness.apps.ledger import app as ledger
from harness.arqfmt import serialize_result
from tests.consumer.test_consumer import KEYS, Loop
from worker.client import Client
from worker.core.serializer import job_payload, msgpack_dumps
from worker.web import create_app

pytestmark = pytest.mark.timeout(90)
TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}", "X-Worker-Operator": "ada"}
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


@pytest.fixture
async def r(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def consumer(r: Any) -> AsyncIterator[Loop]:
    lp = Loop(r, ledger, doubt_s=2.0).start()
    yield lp
    await lp.halt()


@pytest.fixture
async def http(consumer: Loop) -> AsyncIterator[TestClient[Any, Any]]:
    h: TestClient[Any, Any] = TestClient(
        TestServer(create_app(consumer.client, ledger, token=TOKEN))
    )
    await h.start_server()
    yield h
    await h.close()


async def _get(http: TestClient[Any, Any], path: str, **params: Any) -> Any:
    resp = await http.get(path, params=params, headers=AUTH)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def _post(http: TestClient[Any, Any], path: str, body: Any) -> Any:
    resp = await http.post(path, json=body, headers=AUTH)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_the_jobs_api_needs_the_token(http: TestClient[Any, Any], r: Any) -> None:
    assert (await http.get("/api/jobs")).status == 401
    assert (await http.get("/api/jobs/x")).status == 401
    assert (await http.get("/api/tasks")).status == 401
    assert (await http.post("/api/jobs/retry", json={"id": "x"})).status == 401
    assert (await http.post("/api/jobs/cancel", json={"id": "x"})).status == 401
    bad = {**AUTH, "Origin": "https://evil.example"}
    assert (await http.post("/api/jobs/cancel", json={"id": "x"}, headers=bad)).status == 403
    assert await r.llen(KEYS.audit) == 0  # nothing was even tried
    assert (await http.get("/api/jobs", params={"state": "nope"}, headers=AUTH)).status == 400
    assert (await http.get("/api/jobs", params={"queue": "nope"}, headers=AUTH)).status == 400
    assert (await http.post("/api/jobs/retry", json={"id": 3}, headers=AUTH)).status == 400


async def test_a_failed_job_listed_found_and_retried(
    http: TestClient[Any, Any], consumer: Loop, r: Any
) -> None:
    client = consumer.client
    ok = await client.enqueue("record", "fine")
    bad = await client.enqueue("fail", HOSTILE)
    # a plain (app-less) client enqueues any name; the consumer sets it aside: a dead letter
    plain = Client(client.redis, keys=client.keys, serialize=msgpack_dumps, clock=client.clock)
    unknown = await plain.enqueue("no_such_task", HOSTILE)
    assert ok and bad and unknown
    await eventually(_true(lambda: r.exists(f"arq:result:{bad}")), what="the failed run")
    await eventually(_true(lambda: r.exists(f"arq:result:{ok}")), what="the good run")
    await eventually(_true(lambda: r.zscore(KEYS.dead, unknown)), what="the dead letter")

    page = await _get(http, "/api/jobs", state="failed")
    (row,) = [j for j in page["items"] if j["job_id"] == unknown]
    assert (row["state"], row["queue"]) == ("dead", "default")
    assert page["now_ms"] > 0 and "fail" in page["tasks"] and page["queues"] == ["default"]
    # search by argument text and by id, filter by task: the hostile string comes back as data
    found = await _get(http, "/api/jobs", state="failed", search="unknown function")
    assert unknown in [j["job_id"] for j in found["items"]]
    by_id = await _get(http, "/api/jobs", state="failed", search=unknown[-8:])
    assert [j["job_id"] for j in by_id["items"]] == [unknown]
    assert (await _get(http, "/api/jobs", state="failed", task="record"))["items"] == []
    dead = await _get(http, f"/api/jobs/{unknown}")
    assert dead["dead"]["reason"] == "unknown function 'no_such_task'"  # its dead letter

    # a plain failure (no retry_on: never a dead letter) is listed too, with its traceback
    failed = await _get(http, "/api/jobs", state="failed", task="fail")
    assert [j["job_id"] for j in failed["items"]] == [bad]
    detail = await _get(http, f"/api/jobs/{bad}")
    assert detail["state"] == "failed" and detail["task"] == "fail"
    assert HOSTILE in detail["args"]
    assert detail["error"]["type"] == "ValueError"
    assert "fails on purpose" in detail["error"]["message"]
    assert "Traceback" in detail["error"]["traceback"]
    assert "raise ValueError" in detail["error"]["traceback"]
    missing = await http.get("/api/jobs/t:no-such-job", headers=AUTH)
    assert missing.status == 404

    stats = {t["task"]: t for t in (await _get(http, "/api/tasks"))["tasks"]}
    assert stats["fail"]["failed"] == 1 and stats["fail"]["done"] == 0
    assert stats["record"]["done"] == 1 and stats["record"]["failure_ratio"] == 0.0
    assert stats["record"]["p50_ms"] is not None and len(stats["record"]["throughput"]) == 60

    out = await _post(http, "/api/jobs/retry", {"id": bad})
    assert out["ok"], out
    await eventually(  # the task counts its runs
        async_eq(lambda: r.hget(f"{KEYS.prefix}ledger:failed", HOSTILE), b"2"), what="twice"
    )
    refused = await _post(http, "/api/jobs/retry", {"id": ok})  # done: nothing to re-run
    assert refused["ok"] is False
    audit = [a for a in await client.store.audit_log(10) if a["action"] == "retry"]
    assert [(a["target"], a["ok"], a["via"], a["who"]) for a in audit] == [
        (ok, False, "web", "ada"),
        (bad, True, "web", "ada"),
    ]


def _true(read: Any) -> Any:
    """An awaited read as a predicate for ``eventually`` (a lambda returning a coroutine is
    not a coroutine function: it would always look true)."""

    async def check() -> bool:
        return bool(await read())

    return check


def async_eq(read: Any, want: Any) -> Any:
    async def check() -> bool:
        return bool(await read() == want)

    return check


async def test_scheduled_pages_and_cancel_queued_and_running(
    http: TestClient[Any, Any], consumer: Loop, r: Any
) -> None:
    client = consumer.client
    later = [await client.enqueue("record", f"k{i}", defer_by=600) for i in range(5)]
    seen: list[str] = []
    cursor = ""
    for _ in range(5):
        page = await _get(http, "/api/jobs", state="scheduled", limit=2, cursor=cursor)
        assert len(page["items"]) <= 2
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next_cursor"] or ""
        if not cursor:
            break
    assert sorted(seen) == sorted(later) and len(set(seen)) == 5  # each once (ties by id)

    out = await _post(http, "/api/jobs/cancel", {"id": later[0]})
    assert out["ok"] and out["details"]["state"] == "cancelled"
    assert await r.zscore(KEYS.queue, later[0]) is None  # it never starts
    assert (await _get(http, f"/api/jobs/{later[0]}"))["state"] == "cancelled"

    slow = await client.enqueue("slow_job", 60)
    started = _true(lambda: r.hget(f"{KEYS.prefix}ledger:slow-started", slow))
    await eventually(started, what="the slow job started")
    assert (await _get(http, f"/api/jobs/{slow}"))["state"] == "running"
    loop = asyncio.get_running_loop()
    asked = loop.time()
    out = await _post(http, "/api/jobs/cancel", {"id": slow})
    assert out["ok"] and out["details"]["state"] == "cancelling"

    async def cancelled() -> bool:
        return bool((await _get(http, f"/api/jobs/{slow}"))["state"] == "cancelled")

    await eventually(cancelled, within=10, what="the running job cancelled")
    took = loop.time() - asked
    assert took < 5, took  # the bound is 2 s (claim checks every doubt_s / 4); generous here
    assert await r.hget(f"{KEYS.prefix}ledger:slow-done", slow) is None  # it never finished
    print(f"cancel of a running job: {took:.2f} s")


#: The payload of a big job (pages of 50 such jobs read 200 MB before).
BIG = 4 * 1024 * 1024


async def _net_out(r: Any) -> int:
    """Bytes the server has sent to all its clients so far."""
    return int((await r.info("stats"))["total_net_output_bytes"])


async def _big_jobs(r: Any, n: int, now_ms: int, *, scheduled: bool) -> list[str]:
    """``n`` jobs of 4 MiB arguments written with plain redis-py (one record ``COPY``'d: the
    server does the copying), scheduled 10 minutes on, or ended (a result record each)."""
    src = "big-src"
    big = [b"\0" * BIG, "tail-arg"]
    if scheduled:
        record = job_payload("record", big, {"who": "x"}, now_ms, msgpack_dumps)
    else:
        times = (now_ms, True, None, now_ms, now_ms + 5, "ref", KEYS.queue, "")
        record = serialize_result("record", tuple(big), {}, 1, *times, serializer=msgpack_dumps)
    await r.set(src, record)
    ids = [f"{KEYS.prefix}big-{i:02d}" for i in range(n)]
    async with r.pipeline(transaction=False) as pipe:
        for i, j in enumerate(ids):
            if scheduled:
                pipe.copy(src, f"arq:job:{j}")
                pipe.zadd(KEYS.queue, {j: now_ms + 600_000 + i})
            else:
                pipe.copy(src, f"arq:result:{j}")
                pipe.zadd(KEYS.done, {j: now_ms + i})
        pipe.delete(src)
        await pipe.execute()
    return ids


@pytest.mark.parametrize("state", ["scheduled", "done"])
async def test_a_page_of_big_jobs_reads_a_few_kib_each(
    http: TestClient[Any, Any], consumer: Loop, r: Any, state: str
) -> None:
    now = round(await consumer.client.store.server_time_ms())
    ids = await _big_jobs(r, 50, now, scheduled=state == "scheduled")
    loop = asyncio.get_running_loop()
    before, start = await _net_out(r), loop.time()
    page = await _get(http, "/api/jobs", state=state, limit=50)
    took, sent = loop.time() - start, await _net_out(r) - before
    print(f"a page of 50 {state} 4 MiB jobs: {sent} bytes read, {took:.3f} s")
    assert sent < 1_000_000, sent  # 210 MB before: every payload read whole
    assert took < 0.5, took  # 4-6 s before (2.6-10 s outside), the console's loop blocked
    assert sorted(j["job_id"] for j in page["items"]) == ids
    row = page["items"][0]
    assert row["task"] == "record" and row["state"] == state
    assert row["args"].startswith("b'\\x00") and row["args"].endswith(" bytes)"), row["args"]

    before = await _net_out(r)
    detail = await _get(http, f"/api/jobs/{ids[0]}")
    sent = await _net_out(r) - before
    assert detail["state"] == state and detail["task"] == "record"
    assert "bytes in all" in detail["args"] and len(detail["args"]) <= 2000, detail["args"]
    assert detail["args"].startswith("(b'\\x00") and detail["kwargs"].startswith("… (")
    assert sent < 200_000, sent  # a capped head, never the whole 4 MiB
    if state == "done":  # the times and queue read from the record's tail
        assert (detail["started_ms"], detail["finished_ms"]) == (now, now + 5)
        assert detail["queue"] == "default"
