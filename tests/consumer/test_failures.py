"""A job's failure and progress records: FINISH writes them with the end (and indexes the
recent failures and completions, bounded), the store reads them back; the executor builds
them (ERROR log with the traceback, masked) and ``ctx.progress`` writes progress, throttled."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from harness import Spawn, client_call, eventually, wait_until
from harness.arqfmt import Job
from harness.probes import hold_running
from tests.consumer.test_consumer import Loop, loops
from worker.app import App
from worker.context import JobContext
from worker.core.serializer import msgpack_loads
from worker.storage import keys as K
from worker.storage.jobs import Finish, Retention
from worker.storage.store import Store

KEYS = K.Keys("t:")
T = 1_700_000_000_000
__all__ = ["loops"]  # the fixture, shared with test_consumer


def _failure(jid: str, **extra: Any) -> bytes:
    return json.dumps(
        {"job_id": jid, "status": "failed", "error_type": "ValueError", **extra}
    ).encode()


async def test_finish_keeps_the_failure_record_and_indexes_it(r: Any) -> None:
    store = Store(r, KEYS)
    await hold_running(r, KEYS, T, "ok1", "ok2", "bad", "plain", "again")
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
    await hold_running(r, KEYS, T, "stolen", token="other/9")
    await store.finish("me", [Finish("failed", "stolen", "me/1", failure=_failure("x"))], now_ms=T)
    assert await store.failure("stolen") is None
    assert await store.recent_failures(10) == []


async def test_recent_failures_are_bounded_by_count_and_age_with_their_records(r: Any) -> None:
    store = Store(r, KEYS)
    keep = Retention(failures=3, failures_ms=60_000, done=2)
    for i in range(5):
        jid = f"f{i}"
        await hold_running(r, KEYS, T, jid)
        f = Finish("failed", jid, "me/1", failure=_failure(jid), failure_ttl_ms=10**9)
        await store.finish("me", [f], now_ms=T + i, retention=keep)
    assert [j for j, _ in await store.recent_failures(10)] == ["f4", "f3", "f2"]
    assert await r.exists(KEYS.failure("f0"), KEYS.failure("f1")) == 0  # trimmed with them
    assert await r.exists(KEYS.failure("f2"), KEYS.failure("f4")) == 2
    # a minute later, one new failure: every older one is past the age limit
    await hold_running(r, KEYS, T, "late")
    f = Finish("failed", "late", "me/1", failure=_failure("late"), failure_ttl_ms=10**9)
    await store.finish("me", [f], now_ms=T + 4 + 60_001, retention=keep)
    assert await store.recent_failures(10) == [("late", T + 60_005)]
    assert await r.exists(*(KEYS.failure(f"f{i}") for i in range(5))) == 0
    # completions: trimmed by rank, one ZADD per batch
    for i in range(3):
        await hold_running(r, KEYS, T, f"d{i}")
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


# -- the executor: logs and records of failed runs (fakeredis and the real server) -------------


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    with structlog.testing.capture_logs() as logs:
        yield logs


async def test_failed_runs_log_their_traceback_and_keep_a_record(
    r: Any, loops: list[Loop], captured: list[dict[str, Any]]
) -> None:
    app = App("t")
    secret = "redis://:hunter2-secret@db.example:6379/0"

    @app.task
    async def boom(ctx: JobContext, n: int, *, who: str = "x") -> None:
        raise ValueError(f"cannot reach {secret}")

    @app.task(timeout_s=0.1)
    async def sleepy(ctx: JobContext) -> None:
        await asyncio.sleep(10)

    @app.task(max_tries=2, retry_on=(KeyError,))
    async def flaky(ctx: JobContext) -> None:
        raise KeyError("again")

    lp = Loop(r, app)
    loops.append(lp.start())
    bad = await lp.client.enqueue("boom", 7, who="me")
    slow = await lp.client.enqueue("sleepy")
    dead = await lp.client.enqueue("flaky")
    assert bad and slow and dead

    async def recorded() -> bool:
        return len(await lp.client.store.recent_failures(10)) == 3

    await eventually(recorded, what="three failure records")
    rec = await lp.client.failure(bad)
    assert rec is not None
    assert rec["status"] == "failed" and rec["error_type"] == "ValueError"
    assert rec["task"] == "boom" and rec["queue"] == "default" and rec["try"] == 1
    assert rec["instance"] == "i-1" and rec["args"] == "7, who='me'"
    assert rec["enqueued_ms"] <= rec["started_ms"] <= rec["finished_ms"]
    assert "Traceback (most recent call last)" in rec["traceback"]
    assert 'raise ValueError(f"cannot reach {secret}")' in rec["traceback"]
    assert "hunter2" not in json.dumps(rec) and "***" in rec["message"]
    timed = await lp.client.failure(slow)
    assert timed is not None and timed["status"] == "timeout"
    assert timed["error_type"] == "TimeoutError"
    gone = await lp.client.failure(dead)
    assert gone is not None and gone["status"] == "dead" and gone["error_type"] == "KeyError"
    assert gone["try"] == 2 and "raise KeyError" in gone["traceback"]
    # arq's Job reads the result as before
    info = await Job(bad, r, _deserializer=msgpack_loads).result_info()
    assert info is not None and info.success is False and info.function == "boom"
    assert list(info.args) == [7] and info.kwargs == {"who": "me"}
    # the log lines: ERROR with the traceback; the retried try at WARNING
    errors = [e for e in captured if e["log_level"] == "error" and e.get("job_id") == bad]
    assert len(errors) == 1 and errors[0]["event"] == "job failed"
    assert errors[0]["task"] == "boom" and errors[0]["try"] == 1
    assert "Traceback" in errors[0]["exception"] and "ValueError" in errors[0]["exception"]
    by_event = {(e["event"], e["log_level"]) for e in captured if e.get("job_id") in (slow, dead)}
    assert ("job timed out", "error") in by_event
    assert ("job failed; retrying", "warning") in by_event
    assert ("job failed; no tries left, dead-lettered", "error") in by_event


async def test_an_aborted_run_is_recorded_as_cancelled(r: Any, loops: list[Loop]) -> None:
    app = App("t")
    started = asyncio.Event()

    @app.task
    async def waits(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)

    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("waits")
    assert jid is not None
    await asyncio.wait_for(started.wait(), 5)
    await lp.client.abort(jid)

    async def recorded() -> bool:
        return await lp.client.failure(jid) is not None

    await eventually(recorded, what="the cancelled run's record")
    rec = await lp.client.failure(jid)
    assert rec is not None and rec["status"] == "cancelled" and rec["task"] == "waits"


async def test_a_succeeding_job_is_indexed_as_done_and_writes_no_failure(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")

    @app.task
    async def fine(ctx: JobContext) -> int:
        return 1

    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("fine")

    async def indexed() -> bool:
        return bool(await lp.client.store.recent_done(5))

    await eventually(indexed, what="the completion")
    assert [j for j, _ in await lp.client.store.recent_done(5)] == [jid]
    assert await lp.client.store.recent_failures(5) == []


# -- progress -----------------------------------------------------------------------------------


async def test_progress_is_throttled_and_its_last_value_written_at_the_end(
    r: Any, loops: list[Loop]
) -> None:
    app = App("t")
    release = asyncio.Event()
    writes: list[Any] = []

    @app.task
    async def crunch(ctx: JobContext) -> None:
        for i in range(1, 1001):  # a tight loop: one write, the rest kept for later
            await ctx.progress(i / 1000, f"row {i}")
        await release.wait()

    lp = Loop(r, app)
    store = lp.client.store
    real_set = store.set_progress

    async def counting(*args: Any) -> None:
        writes.append(args[1])
        await real_set(*args)

    store.set_progress = counting  # type: ignore[method-assign]
    loops.append(lp.start())
    jid = await lp.client.enqueue("crunch")
    assert jid is not None

    async def trailing() -> bool:
        p = await lp.client.progress(jid)
        return p is not None and p["fraction"] == 1.0

    await eventually(trailing, within=5, what="the trailing write of the last value")
    assert len(writes) == 2  # the first call, then the latest one ~0.5 s later
    p = await lp.client.progress(jid)
    assert p is not None and p["message"] == "row 1000"
    ttl = await r.pttl(KEYS.progress(jid))
    assert 300_000 < ttl <= (300 + 3600) * 1000  # the job's timeout + keep_result_s
    release.set()


async def test_the_last_progress_is_flushed_with_the_end(r: Any, loops: list[Loop]) -> None:
    app = App("t")

    @app.task
    async def quick(ctx: JobContext) -> None:
        await ctx.progress(0.1)
        await ctx.progress(0.9, "almost")  # throttled: written when the run ends

    lp = Loop(r, app)
    loops.append(lp.start())
    jid = await lp.client.enqueue("quick")

    async def finished() -> bool:
        return bool(await lp.client.store.recent_done(5))

    await eventually(finished, what="the run to end")
    p = await lp.client.progress(jid)  # type: ignore[arg-type]
    assert p is not None and (p["fraction"], p["message"]) == (0.9, "almost")


async def test_progress_rejects_bad_fractions_and_survives_redis_errors(
    loops: list[Loop], captured: list[dict[str, Any]]
) -> None:
    from worker.core.clock import SystemClock
    from worker.progress import Progress

    class Broken:
        async def set_progress(self, *args: Any) -> None:
            raise ConnectionError("redis away")

    writer = Progress(Broken(), "j", 1000, SystemClock())  # type: ignore[arg-type]
    for bad in (-0.1, 1.5, float("nan"), True, "half"):
        with pytest.raises(ValueError, match="from 0 to 1"):
            await writer.report(bad)  # type: ignore[arg-type]
    await writer.report(0.5)
    await writer.report(0.6)
    await writer.flush()  # never raises
    warned = [e for e in captured if e["event"] == "job progress not recorded"]
    assert len(warned) == 1  # logged once per run


# -- real processes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_process_logs_records_and_reports_progress(
    spawn: Spawn, redis_url: str, rsync: Any
) -> None:
    """A real consumer process: a failing job's ERROR line with the traceback in its JSON log,
    its failure record and index entry; a job's progress read back while it runs and after;
    arq's ``Job.result_info()`` as before."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    proc = spawn("consumer", name="c1", env={"WORKER_LOG_FORMAT": "json"})
    bad = client_call(redis_url, prefix, "enqueue", "fail", "redis://:hunter2@db:6379")
    slow = client_call(redis_url, prefix, "enqueue", "halfway", "k")
    wait_until(lambda: rsync.zscore(keys.failures, bad) is not None, what="the failure index")
    rec = client_call(redis_url, prefix, "failure", bad)
    assert rec["status"] == "failed" and rec["error_type"] == "ValueError"
    assert rec["task"] == "fail" and rec["try"] == 1 and rec["instance_name"] == "c1"
    assert "fails on purpose" in rec["message"] and "hunter2" not in json.dumps(rec)
    assert "Traceback (most recent call last)" in rec["traceback"]
    line = wait_until(
        lambda: [e for e in proc.events() if e.get("job_id") == bad and e["level"] == "error"],
        what="the ERROR line",
    )[0]
    assert line["event"] == "job failed" and line["task"] == "fail" and line["queue"] == "default"
    assert "Traceback" in line["exception"] and "raise ValueError" in line["exception"]
    assert "hunter2" not in proc.log()

    async def result_info() -> Any:
        from redis import asyncio as aioredis

        r = aioredis.Redis.from_url(redis_url)
        try:
            return await Job(bad, r, _deserializer=msgpack_loads).result_info()
        finally:
            await r.aclose()

    result = asyncio.run(result_info())
    assert result is not None and result.success is False and result.function == "fail"
    # progress, while the job runs and once it is done
    seen = wait_until(
        lambda: client_call(redis_url, prefix, "progress", slow), what="the first progress"
    )
    assert seen["fraction"] in (0.25, 0.75)
    wait_until(lambda: rsync.hget(f"{prefix}ledger:halfway", "k"), what="the job to end")
    last = wait_until(
        lambda: (
            (p := client_call(redis_url, prefix, "progress", slow)) and p["fraction"] == 0.75 and p
        )
    )
    assert last["message"] == "three quarters"
    assert wait_until(lambda: rsync.zscore(keys.done, slow) is not None, what="the done index")


async def test_a_plain_def_task_reports_progress_through_ctx_sync() -> None:
    from worker.testing import Harness

    app = App("s")

    @app.task
    def steps(ctx: JobContext, bad: bool) -> Any:
        ctx.sync.progress(0.5, "half")
        if bad:
            ctx.sync.progress(2.0)
        return ctx.last_progress

    async with Harness(app) as h:
        assert await h.run("steps", False) == (0.5, "half")
        with pytest.raises(ValueError, match="from 0 to 1"):
            await h.run("steps", True)


def test_tracebacks_and_args_are_capped_keeping_head_and_tail() -> None:
    from worker.consumer.failures import (
        TRACEBACK_BYTES,
        RunFacts,
        args_text,
        failure_record,
        log_traceback,
        traceback_text,
    )

    try:
        raise RuntimeError("x" * 1_000_000 + " password=hunter2")
    except RuntimeError as exc:
        tb = traceback_text(exc)
        facts = RunFacts("j", "t", "default", 1, "i", "n", T, T, ("y" * 5000,), {"k": 1})
        rec = json.loads(failure_record(facts, "failed", T + 1, exc=exc))
    assert len(tb.encode()) <= TRACEBACK_BYTES
    assert tb.startswith("Traceback (most recent call last)")  # the head
    assert "bytes cut" in tb and "password=***" in tb and "hunter2" not in tb  # the tail
    assert len(log_traceback(tb).encode()) <= 8 * 1024
    assert len(rec["traceback"].encode()) <= TRACEBACK_BYTES and len(rec["args"]) <= 1024
    assert len(rec["message"]) < 3000 and "hunter2" not in json.dumps(rec)
    assert args_text((1, "a"), {"b": None}) == "1, 'a', b=None"
