"""A job's failure and progress records: FINISH writes them with the end (and indexes the
recent failures and completions, bounded), the store reads them back; the executor builds
them (ERROR log with the traceback, masked) and ``ctx.progress`` writes progress, throttled."""

from __future__ import annotations

import json
from typing import Any

from worker.storage import Finish, Retention, Store
from worker.storage import keys as K

KEYS = K.Keys("t:")
T = 1_700_000_000_000


async def _running(r: Any, *job_ids: str, token: str = "me/1") -> None:
    """Jobs as a claim leaves them: queued record, in-progress marker, in the holds set."""
    for jid in job_ids:
        await r.zadd(KEYS.queue, {jid: T})
        await r.set(K.ARQ_JOB + jid, b"p")
        await r.set(K.ARQ_IN_PROGRESS + jid, token)
        await r.sadd(KEYS.holds("me"), jid)


def _failure(jid: str, **extra: Any) -> bytes:
    return json.dumps(
        {"job_id": jid, "status": "failed", "error_type": "ValueError", **extra}
    ).encode()


async def test_finish_keeps_the_failure_record_and_indexes_it(r: Any) -> None:
    store = Store(r, KEYS)
    await _running(r, "ok1", "ok2", "bad", "plain", "again")
    runs = [
        Finish("done", "ok1", "me/1", b"r1", 5000),
        Finish("done", "ok2", "me/1"),
        Finish("failed", "bad", "me/1", b"r", 5000, failure=_failure("bad"), failure_ttl_ms=9000),
        Finish("failed", "plain", "me/1"),  # no record given: none written, not indexed
        Finish("retry", "again", "me/1", score_ms=T, failure=_failure("again")),
    ]
    out = await store.finish("me", runs, now_ms=T)
    assert (out.done, out.retried) == (4, 1)
    assert await store.failure("bad") == json.loads(_failure("bad"))
    assert 8000 < await r.pttl(KEYS.failure("bad")) <= 9000
    assert await store.failure("plain") is None
    assert await store.failure("again") is None  # a retry is not a failure (yet)
    assert await store.recent_failures(10) == [("bad", T)]
    assert sorted(await store.recent_done(10)) == [("ok1", T), ("ok2", T)]
    assert await store.failures_many(["plain", "bad"]) == [None, json.loads(_failure("bad"))]
    assert await store.failures_many([]) == []
    # arq's result record is what it was
    assert await r.get(K.ARQ_RESULT + "bad") == b"r"


async def test_a_stolen_run_writes_no_failure(r: Any) -> None:
    store = Store(r, KEYS)
    await _running(r, "stolen", token="other/9")
    await store.finish("me", [Finish("failed", "stolen", "me/1", failure=_failure("x"))], now_ms=T)
    assert await store.failure("stolen") is None
    assert await store.recent_failures(10) == []


async def test_recent_failures_are_bounded_by_count_and_age_with_their_records(r: Any) -> None:
    store = Store(r, KEYS)
    keep = Retention(failures=3, failures_ms=60_000, done=2)
    for i in range(5):
        jid = f"f{i}"
        await _running(r, jid)
        f = Finish("failed", jid, "me/1", failure=_failure(jid), failure_ttl_ms=10**9)
        await store.finish("me", [f], now_ms=T + i, retention=keep)
    assert [j for j, _ in await store.recent_failures(10)] == ["f4", "f3", "f2"]
    assert await r.exists(KEYS.failure("f0"), KEYS.failure("f1")) == 0  # trimmed with them
    assert await r.exists(KEYS.failure("f2"), KEYS.failure("f4")) == 2
    # a minute later, one new failure: every older one is past the age limit
    await _running(r, "late")
    f = Finish("failed", "late", "me/1", failure=_failure("late"), failure_ttl_ms=10**9)
    await store.finish("me", [f], now_ms=T + 4 + 60_001, retention=keep)
    assert await store.recent_failures(10) == [("late", T + 60_005)]
    assert await r.exists(*(KEYS.failure(f"f{i}") for i in range(5))) == 0
    # completions: trimmed by rank, one ZADD per batch
    for i in range(3):
        await _running(r, f"d{i}")
    runs = [Finish("done", f"d{i}", "me/1") for i in range(3)]
    await store.finish("me", runs[:1], now_ms=T, retention=keep)
    await store.finish("me", runs[1:], now_ms=T + 1, retention=keep)
    assert sorted(await store.recent_done(10)) == [("d1", T + 1), ("d2", T + 1)]


async def test_recent_ends_are_paged_newest_first(r: Any) -> None:
    store = Store(r, KEYS)
    await r.zadd(KEYS.failures, {f"j{i}": T + i for i in range(7)})
    await r.zadd(KEYS.done, {"d": T, "bad": "+inf"})
    first = await store.recent_failures(3)
    assert first == [("j6", T + 6), ("j5", T + 5), ("j4", T + 4)]
    second = await store.recent_failures(3, before_ms=first[-1][1])
    assert second == [("j3", T + 3), ("j2", T + 2), ("j1", T + 1)]
    assert await store.recent_failures(3, before_ms=T + 1) == [("j0", T)]
    assert await store.recent_failures(0) == []
    assert await store.recent_done(5) == [("d", T)]  # an infinite score: skipped, logged


async def test_malformed_records_read_as_none(r: Any) -> None:
    store = Store(r, KEYS)
    await r.set(KEYS.failure("a"), b"{not json")
    await r.set(KEYS.failure("b"), b"[1, 2]")
    await r.set(KEYS.progress("a"), b'{"fraction": "half"}')
    await r.set(KEYS.progress("b"), b"\xff")
    assert await store.failure("a") is None
    assert await store.failures_many(["a", "b"]) == [None, None]
    assert await store.progress("a") is None
    assert await store.progress("b") is None


async def test_progress_is_written_with_its_ttl_and_read_back(r: Any) -> None:
    store = Store(r, KEYS)
    assert await store.progress("j") is None
    await store.set_progress("j", 0.25, "a quarter", T, 5000)
    assert await store.progress("j") == {"fraction": 0.25, "message": "a quarter", "at_ms": T}
    assert 4000 < await r.pttl(KEYS.progress("j")) <= 5000


async def test_the_index_stays_bounded_under_many_failures_on_the_real_server(
    redis_url: str,
) -> None:
    """3,000 final failures in batches of 1,500 (ZADDs chunked inside the script): the index
    and the records stay at the default 1,000."""
    from redis import asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url)
    store = Store(r, KEYS)
    try:
        for batch in range(2):
            ids = [f"b{batch}-{i}" for i in range(1500)]
            async with r.pipeline(transaction=False) as pipe:
                for jid in ids:
                    pipe.set(K.ARQ_IN_PROGRESS + jid, "me/1")
                await pipe.execute()
            runs = [
                Finish("failed", j, "me/1", failure=_failure(j), failure_ttl_ms=60_000) for j in ids
            ]
            await store.finish("me", runs, now_ms=T + batch)
        assert await r.zcard(KEYS.failures) == 1000
        assert len([k async for k in r.scan_iter(match=KEYS.failure("*"), count=1000)]) == 1000
        assert (await store.recent_failures(1))[0][0].startswith("b1-")
    finally:
        await r.aclose()
