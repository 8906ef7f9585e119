"""Plain ``def`` tasks and periodic jobs (worker/sync.py): run in the process's bounded threads,
with the job's context, its helpers through ``ctx.sync``, contextvars carried in; timeouts
end the run while the thread runs on (stuck, counted, not reused); every thread stuck defers
sync jobs. In-process here; tests/system/test_sync_processes.py runs real worker processes."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest

from harness.docpages import python_block
from worker import App, JobContext
from worker.core.clock import FakeClock
from worker.core.errors import ConfigError
from worker.core.jobdefs import JobDef
from worker.sync import SyncThreads, SyncThreadsHook, is_sync
from worker.testing import Harness

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def make_app() -> App:
    app = App("s")

    @app.task
    def add(ctx: JobContext, a: int, b: int) -> dict[str, Any]:
        return {
            "sum": a + b,
            "thread": threading.current_thread().name,
            "request_id": request_id.get(),
            "job_id": ctx.job_id,
        }

    @app.task
    def fan_out(ctx: JobContext, n: int) -> list[str | None]:
        ids = [ctx.sync.enqueue("add", i, i, unique_key=f"fan:{i}") for i in range(n)]
        assert ctx.sync.once("fanned", ttl=60) is True
        assert ctx.sync.once("fanned", ttl=60) is False
        with ctx.sync.mutex("m", ttl=5) as held:
            assert held
        assert ctx.sync.still_claimed() is True  # no claim outside a consumer: True
        assert ctx.sync.cancelled is False
        return ids

    @app.task
    async def asynchronous(ctx: JobContext) -> None:
        ctx.sync.still_claimed()  # raises: ctx.sync is for plain def tasks

    @app.periodic(every=60)
    def minutely(ctx: JobContext) -> str:
        assert ctx.tick is not None
        return ctx.tick.isoformat()

    return app


async def test_a_plain_def_task_runs_in_a_thread_with_its_context() -> None:
    async with Harness(make_app()) as h:
        token = request_id.set("req-7")
        try:
            out = await h.run("add", 2, 3)
        finally:
            request_id.reset(token)
        assert out["sum"] == 5
        assert out["thread"].startswith("worker-sync-")  # not the loop's thread
        assert out["request_id"] == "req-7"  # the caller's contextvars, copied in
        assert out["job_id"]
        assert is_sync(h.app.tasks["add"].fn) and not is_sync(h.app.tasks["asynchronous"].fn)


async def test_ctx_sync_calls_the_async_helpers_from_the_thread() -> None:
    async with Harness(make_app()) as h:
        ids = await h.run("fan_out", 3)
        assert ids == [f"test:unique:fan:{i}" for i in range(3)]
        assert await h.run_enqueued() == 3  # what the thread enqueued is in the queue


async def test_ctx_sync_outside_a_thread_is_a_clear_error() -> None:
    async with Harness(make_app()) as h:
        with pytest.raises(RuntimeError, match=r"ctx\.sync is for plain def tasks"):
            await h.run("asynchronous")


async def test_a_plain_def_periodic_job_ticks() -> None:
    async with Harness(make_app()) as h:
        assert (await h.tick("minutely")).endswith("+00:00")
        assert is_sync(h.app.periodics["minutely"].job().fn)  # carried through job()'s wrapper


def test_generators_are_refused_at_registration() -> None:
    app = App("g")
    with pytest.raises(ConfigError, match="'gen' is a generator"):

        @app.task
        def gen(ctx: JobContext) -> Any:
            yield 1


async def test_at_most_size_functions_run_at_once_and_the_rest_wait() -> None:
    threads = SyncThreads(2)
    lock = threading.Lock()
    now = peak = 0

    def work(ctx: Any, i: int) -> int:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.1)
        with lock:
            now -= 1
        return i

    try:
        got = await asyncio.gather(*(threads.call(work, None, i) for i in range(6)))
        assert got == list(range(6)) and peak == 2
        assert threads.busy == 0 and threads.stuck == 0
    finally:
        threads.close()


async def test_a_timed_out_sync_job_leaves_its_thread_stuck_until_it_returns() -> None:
    threads = SyncThreads(1)
    release = threading.Event()
    seen: dict[str, Any] = {}

    class Ctx(dict[str, Any]):
        sync_helpers: Any = None

        async def still_claimed(self) -> bool:
            return True

    ctx = Ctx()

    def overrun(ctx: Any) -> None:
        release.wait(10)
        seen["cancelled"] = ctx.sync_helpers.cancelled
        seen["claimed"] = ctx.sync_helpers.still_claimed()  # False without asking Redis

    def quick(ctx: Any) -> float:
        return time.monotonic()

    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await threads.call(overrun, ctx)
        assert time.monotonic() - started < 1  # the run ended at its deadline
        assert threads.stuck == 1 and threads.busy == 1 and threads.all_stuck
        # the stuck thread is not reused: the next call waits until the function returns
        nxt = asyncio.create_task(threads.call(quick, None))
        await asyncio.sleep(0.2)
        assert not nxt.done()
        released_at = time.monotonic()
        release.set()
        assert await asyncio.wait_for(nxt, 5) >= released_at
        assert seen == {"cancelled": True, "claimed": False}
        assert threads.stuck == 0 and threads.busy == 0
    finally:
        release.set()
        threads.close()


async def test_every_thread_stuck_defers_sync_jobs_only() -> None:
    threads = SyncThreads(1)
    clock = FakeClock()
    hook = SyncThreadsHook(threads, clock)
    app = make_app()
    sync_job, async_job = app.tasks["add"], app.tasks["asynchronous"]
    assert await hook.admit(sync_job, "j1") is None
    threads.stuck = 1  # as _abandoned counts it
    assert await hook.admit(sync_job, "j1") == int((clock.time() + 1.0) * 1000)
    assert await hook.admit(async_job, "j2") is None  # async jobs need no thread
    threads.stuck = 0
    assert await hook.admit(JobDef("x", sync_job.fn), "j3") is None


async def test_a_closed_pool_refuses_new_calls() -> None:
    threads = SyncThreads(1)
    assert await threads.call(lambda ctx: 1, None) == 1
    threads.close()
    with pytest.raises(RuntimeError, match="closed"):
        await threads.call(lambda ctx: 1, None)


async def test_the_readme_plain_def_example_runs() -> None:
    code = python_block("duties", "Plain `def` tasks")
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/duties.md", "exec"), scope)
    async with Harness(scope["app"]) as h:
        assert await h.run("export_orders", "2026-12-01") == 300
        assert await h.tick("nightly_cleanup") is None
        queued = await h.client.store.pop_due("default", 2**62)
        assert queued is not None  # the notify job the thread enqueued
