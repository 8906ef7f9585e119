"""An abort holds until the run has ended, against real worker processes: a task that catches
the cancellation and goes on (inside Redis calls, in sleeps, or always) still ends aborted,
never as a success; a job aborted before it runs never starts; a job taken over by another
consumer (the first one frozen) with its abort pending is aborted there, not run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, client_call, wait_until
from harness.arqfmt import JobResult, deserialize_result
from worker.client import Client
from worker.core.serializer import msgpack_loads
from worker.storage import keys as K

pytestmark = [pytest.mark.timeout(90), pytest.mark.slow]

APP = "harness.apps.aborts:app"


def _result(rsync: redis_sync.Redis, jid: str) -> JobResult | None:
    raw = rsync.get(K.ARQ_RESULT + jid)
    return None if raw is None else deserialize_result(raw, deserializer=msgpack_loads)


def _aborted(rsync: redis_sync.Redis, jid: str, timeout: float = 30) -> JobResult:
    info: JobResult = wait_until(lambda: _result(rsync, jid), timeout, what=f"{jid}'s end")
    assert info.success is False, f"an aborted job ended as a success: {info.result!r}"
    assert info.result["error"] == "CancelledError", info.result
    return info


def _started(rsync: redis_sync.Redis, prefix: str) -> dict[str, int]:
    raw: dict[bytes, bytes] = rsync.hgetall(f"{prefix}aborts:started")  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}


def _warm(redis_url: str, prefix: str, rsync: redis_sync.Redis) -> None:
    """A first job run to its end: a consumer is up and claiming."""
    jid = client_call(redis_url, prefix, "enqueue", "sleeper", 0)
    wait_until(lambda: _result(rsync, jid), 30, what="a consumer to run a first job")


def test_an_abort_holds_against_a_task_that_catches_the_cancellation(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("consumer", name="c1", app=APP)
    seconds = {"in_redis": 10, "sleeper": 10, "deaf": 6}  # each outlasts the abort
    jobs = {t: client_call(redis_url, prefix, "enqueue", t, s) for t, s in seconds.items()}
    for jid in jobs.values():
        wait_until(lambda j=jid: any(k.startswith(j) for k in _started(rsync, prefix)), 30,
                   what=f"{jid} to start")  # fmt: skip
    for jid in jobs.values():
        client_call(redis_url, prefix, "abort", jid)
    for task, jid in jobs.items():
        _aborted(rsync, jid)
        if task != "deaf":  # it catches the second cancellation as well: it ends by itself
            assert rsync.hget(f"{prefix}aborts:finished", jid) is None, f"{task} ran on"
    assert rsync.zcard(K.Keys(prefix).abort) == 0  # removed with the runs' ends


def test_a_job_aborted_before_it_runs_never_starts(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("consumer", name="c1", app=APP)
    _warm(redis_url, prefix, rsync)

    async def enqueue_and_abort() -> list[str]:
        client = await Client.connect(redis_url, key_prefix=prefix)
        try:
            ids: list[Any] = [await client.enqueue("sleeper", 3, defer_by=3.0) for _ in range(5)]
            for jid in ids:
                await client.abort(jid)  # about to run: due within 3 s
            return ids
        finally:
            await client.close()

    ids = asyncio.run(enqueue_and_abort())
    for jid in ids:
        _aborted(rsync, jid)
    started = [k for k in _started(rsync, prefix) if k.rsplit(":", 1)[0] in ids]
    assert started == [], f"aborted jobs started: {started}"
    assert rsync.zcard(K.Keys(prefix).abort) == 0


def test_a_job_taken_over_with_its_abort_pending_is_aborted_not_run(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    # its orphan reaper hands the frozen consumer's job over; it runs no job itself
    spawn("leader", name="l1", app=APP, env={"WORKER_QUEUES": "elsewhere"})
    a = spawn("consumer", name="a", app=APP)
    _warm(redis_url, prefix, rsync)
    jid = client_call(redis_url, prefix, "enqueue", "sleeper", 20)
    wait_until(lambda: f"{jid}:{a.pid}" in _started(rsync, prefix), 30, what="the job to start")
    a.pause()  # frozen with the job
    try:
        b = spawn("consumer", name="b", app=APP)
        client_call(redis_url, prefix, "abort", jid)
        _aborted(rsync, jid)
        assert f"{jid}:{b.pid}" not in _started(rsync, prefix), "the taken-over job ran on b"
    finally:
        a.resume()
    # the frozen consumer, back, finds its claim gone: it writes nothing over the end
    wait_until(lambda: "claim taken over" in a.log() or "after their claims" in a.log(), 30,
               what=f"a to see its claim gone\n{a.log()}")  # fmt: skip
    info = _aborted(rsync, jid, 1)
    assert info.success is False
    assert rsync.hget(f"{prefix}aborts:finished", jid) is None
