"""``SyncClient`` (worker/sync_client.py) against the real server: shared by 8 threads that
enqueue 100 jobs each, all run by a real worker process; the same semantics as ``Client``
(unique keys, deferral, queues, job handles, abort); close is idempotent, later calls raise;
inside a running event loop it refuses to block."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import types
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.arqfmt import JobStatus
from worker import SyncClient
from worker.core.errors import ConfigError
from worker.sync_client import ClientClosed


@pytest.mark.slow
def test_eight_threads_share_one_client_and_a_worker_runs_every_job(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("all", app="harness.apps.syncjobs:app")
    ids: list[list[str | None]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    with SyncClient.connect(redis_url, key_prefix=prefix) as client:
        barrier = threading.Barrier(8)

        def enqueue(t: int) -> None:
            try:
                barrier.wait(10)
                ids[t] = [client.enqueue("ping", t * 1000 + i) for i in range(100)]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=enqueue, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        flat = [i for chunk in ids for i in chunk]
        assert len(flat) == 800 and None not in flat and len(set(flat)) == 800
        key = f"{prefix}sync:ping"
        wait_until(lambda: rsync.llen(key) >= 800, timeout=60, what=f"800 runs\n{proc.log()}")
        ran = sorted(json.loads(x)["i"] for x in rsync.lrange(key, 0, -1))
        assert ran == sorted(t * 1000 + i for t in range(8) for i in range(100))  # each once
        # a job handle: the result of a plain def task, waited for
        job_id = client.enqueue("block", 7, 0.0)
        assert job_id is not None
        assert client.job(job_id).result(timeout=30) == 7
        assert client.job(job_id).status() == JobStatus.complete
        info = client.job(job_id).info()
        assert info is not None and info.success and info.function == "block"
    assert proc.terminate() == 0, proc.log()


def test_the_client_semantics_and_its_lifecycle(redis_url: str, rsync: redis_sync.Redis) -> None:
    client = SyncClient.connect(redis_url, key_prefix="sc:")
    first = client.enqueue("ping", 1, unique_key="once")
    assert first == client.unique_job_id("once") == "sc:unique:once"
    assert client.enqueue("ping", 1, unique_key="once") is None  # already queued
    later = client.enqueue("ping", 2, defer_by=60, queue="slow")
    assert later is not None
    assert client.job(first).status() == JobStatus.queued
    assert client.job(later, queue="slow").status() == JobStatus.deferred
    assert rsync.zcard("sc:queue:slow") == 1
    assert client.job(later).info() is None
    client.abort(later)  # asks the consumers; nothing raises without one
    assert client.run(lambda c: c.job(first).status()) == JobStatus.queued  # any Client call
    client.close()
    client.close()  # idempotent
    assert client.closed
    with pytest.raises(ClientClosed, match="closed"):
        client.enqueue("ping", 3)
    with pytest.raises(ClientClosed):
        client.job(first)


def test_from_env_reads_the_workers_settings(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WORKER_REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="WORKER_REDIS_URL"):
        SyncClient.from_env()
    monkeypatch.setenv("WORKER_REDIS_URL", redis_url)
    monkeypatch.setenv("WORKER_KEY_PREFIX", "env:")
    with SyncClient.from_env() as client:
        assert client.enqueue("ping", 1, job_id="env:j1") == "env:j1"


async def test_inside_an_event_loop_it_refuses_to_block(redis_url: str) -> None:
    client = await asyncio.to_thread(SyncClient.connect, redis_url, key_prefix="el:")
    try:
        with pytest.raises(RuntimeError, match=r"use worker\.Client"):
            client.enqueue("ping", 1)
    finally:
        await asyncio.to_thread(client.close)


def test_the_readme_flask_example_runs(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.docpages import python_block
    from worker import App

    jobs = types.ModuleType("myservice.jobs")
    jobs.app = App("shop")  # type: ignore[attr-defined]
    # the README's app declares the task it enqueues (a client that knows the app refuses others)
    jobs.app.task(name="send_receipt")(lambda ctx, order_id: None)  # type: ignore[attr-defined]
    package = types.ModuleType("myservice")
    package.jobs = jobs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myservice", package)
    monkeypatch.setitem(sys.modules, "myservice.jobs", jobs)
    monkeypatch.setenv("WORKER_REDIS_URL", redis_url)
    monkeypatch.setenv("WORKER_KEY_PREFIX", "rd:")
    scope: dict[str, Any] = {"__name__": "readme_web"}
    code = python_block("web-apps", "From a sync web app (Flask/Django)")
    exec(compile(code, "docs/web-apps.md", "exec"), scope)
    try:
        http = scope["web"].test_client()
        first = http.post("/orders/42/receipt").get_json()
        assert first == {"job_id": "rd:unique:receipt:42"}
        assert http.post("/orders/42/receipt").get_json() == {"job_id": None}
        got = http.get("/jobs/rd:unique:receipt:42").get_json()
        assert got == {"status": "queued", "done": False}
    finally:
        scope["client"].close()
