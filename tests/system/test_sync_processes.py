"""Plain ``def`` jobs in real worker processes (worker/sync.py): the event loop stays
responsive while 20 sync jobs block for 3 s each (``/healthz`` answers, the leader keeps its
lease); a timed-out sync job ends at its deadline while its thread runs on, counted stuck; with
every thread stuck, sync jobs are deferred and async jobs still run."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, wait_until
from harness.ports import free_port
from worker.client import Client

pytestmark = pytest.mark.timeout(120)
APP = "harness.apps.syncjobs:app"


def get(port: int, path: str) -> tuple[int, str, float]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.status, resp.read().decode(), time.monotonic() - started


def metric(port: int, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", get(port, "/metrics")[1], re.M)
    return float(found.group(1)) if found else None


def enqueue(url: str, prefix: str, calls: list[tuple[str, tuple[Any, ...]]]) -> list[str]:
    async def run() -> list[str]:
        client = await Client.connect(url, key_prefix=prefix)
        try:
            return [str(await client.enqueue(fn, *args)) for fn, args in calls]
        finally:
            await client.close()

    return asyncio.run(run())


def results(url: str, prefix: str, ids: list[str]) -> list[Any]:
    async def run() -> list[Any]:
        client = await Client.connect(url, key_prefix=prefix)
        try:
            return [await client.job(i).result_info() for i in ids]
        finally:
            await client.close()

    return asyncio.run(run())


def sync_ledger(rsync: redis_sync.Redis, prefix: str, kind: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in rsync.lrange(f"{prefix}sync:{kind}", 0, -1)]


def start(spawn: Spawn, port: int, threads: int) -> WorkerProc:
    env = {"WORKER_HEALTH_PORT": str(port), "WORKER_SYNC_THREADS": str(threads)}
    proc = spawn("all", name="s1", app=APP, env=env)

    def leading() -> bool:
        assert proc.alive(), proc.log()
        try:
            return metric(port, "worker_leader") == 1.0
        except OSError:
            return False  # not listening yet

    wait_until(
        leading,
        timeout=30,
        what=f"the leader\n{proc.log()}",
    )
    return proc


@pytest.mark.slow
def test_twenty_blocking_sync_jobs_leave_the_loop_responsive(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    port, prefix = free_port(), spawn.prefix  # type: ignore[attr-defined]
    proc = start(spawn, port, threads=20)
    epoch = metric(port, "worker_leader_epoch")
    enqueue(redis_url, prefix, [("block", (i, 3.0)) for i in range(20)])
    slowest, busy_seen = 0.0, 0.0
    deadline = time.monotonic() + 30
    while len(sync_ledger(rsync, prefix, "block")) < 20:
        assert time.monotonic() < deadline, proc.log()
        status, _, took = get(port, "/healthz")
        assert status == 200
        slowest = max(slowest, took)
        assert metric(port, "worker_leader") == 1.0 and metric(port, "worker_leader_epoch") == epoch
        busy_seen = max(busy_seen, metric(port, "worker_sync_threads_busy") or 0.0)
        time.sleep(0.2)
    assert slowest < 1.0, slowest
    runs = sync_ledger(rsync, prefix, "block")
    # all 20 ran at once, each in a thread of the pool
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs), runs
    assert len({r["thread"] for r in runs}) == 20 and busy_seen >= 19
    assert sync_ledger(rsync, prefix, "tick"), "the plain def periodic job ticked"
    assert all(t["thread"].startswith("worker-sync-") for t in sync_ledger(rsync, prefix, "tick"))
    assert proc.terminate() == 0, proc.log()


@pytest.mark.slow
def test_timed_out_sync_jobs_stay_stuck_and_then_sync_jobs_are_deferred(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    port, prefix = free_port(), spawn.prefix  # type: ignore[attr-defined]
    proc = start(spawn, port, threads=2)
    started = time.time()
    ids = enqueue(redis_url, prefix, [("overrun", (i, 3.0)) for i in range(2)])

    def ended() -> list[Any] | None:
        got = results(redis_url, prefix, ids)
        return got if all(r is not None for r in got) else None

    # both runs end at their 0.5 s deadline, as timed out, long before their functions return
    infos = wait_until(ended, timeout=10, interval=0.05, what="the timed-out results")
    assert time.time() - started < 2.8, "the results waited for the threads"
    assert [i.success for i in infos] == [False, False]
    assert [i.result["error"] for i in infos] == ["TimeoutError"] * 2, infos  # msgpack's form
    wait_until(lambda: metric(port, "worker_sync_threads_stuck") == 2.0, 5, what="2 stuck")
    # every thread stuck: a sync job is deferred, an async one runs at once
    later = enqueue(redis_url, prefix, [("block", (99, 0.0)), ("ping", (1,))])
    wait_until(lambda: sync_ledger(rsync, prefix, "ping"), 5, what="the async job")
    assert results(redis_url, prefix, [later[0]]) == [None]
    wait_until(lambda: sync_ledger(rsync, prefix, "block"), 15, what="the deferred sync job")
    overruns = sync_ledger(rsync, prefix, "overrun")
    assert [(o["cancelled"], o["claimed"]) for o in overruns] == [(True, False)] * 2
    # it started only once a stuck thread had returned
    assert sync_ledger(rsync, prefix, "block")[0]["start"] >= min(o["end"] for o in overruns)
    wait_until(lambda: metric(port, "worker_sync_threads_stuck") == 0.0, 5, what="0 stuck")
    events = [e.get("event", "") for e in proc.events()]
    assert any("every sync thread is stuck; deferring" in e for e in events), events
    assert any("still running past their job's end" in e for e in events), events
    assert proc.terminate() == 0, proc.log()
