"""Job hooks: ``@app.on_job_start`` / ``@app.on_job_end`` run around every job in the consumer,
in order, with a :class:`~worker.JobOutcome` whose status is exact; a hook that raises or hangs
is logged and changes nothing about the job. The docs' Sentry example (docs/hooks-and-tracing.md)
runs here, against the real ``sentry_sdk`` with a transport of its own (nothing leaves the
process)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from harness import eventually
from harness.arqfmt import Job, JobStatus, Retry
from harness.docpages import python_block, python_blocks, section
from tests.consumer.test_consumer import KEYS, Loop, loops
from worker import App, JobContext, JobOutcome
from worker.core.errors import ConfigError
from worker.core.hooks import UserHooks
from worker.core.jobdefs import status_of
from worker.core.serializer import msgpack_loads

__all__ = ["loops"]  # the fixture, shared with test_consumer


def hooked(app: App, timeout_s: float = 5.0) -> UserHooks:
    return UserHooks(app.job_start_hooks, app.job_end_hooks, timeout_s=timeout_s)


def test_status_of_derives_the_fine_status() -> None:
    assert status_of("success", None, timed_out=False, dead=False) == "success"
    assert status_of("retry", ValueError(), timed_out=False, dead=False) == "retry"
    assert status_of("retry", TimeoutError(), timed_out=True, dead=False) == "retry"
    assert status_of("failure", ValueError(), timed_out=False, dead=False) == "failed"
    assert status_of("failure", TimeoutError(), timed_out=False, dead=False) == "failed"
    assert status_of("failure", TimeoutError(), timed_out=True, dead=False) == "timeout"
    assert status_of("failure", ValueError(), timed_out=False, dead=True) == "dead"
    cancelled = asyncio.CancelledError("aborted")
    assert status_of("failure", cancelled, timed_out=False, dead=False) == "cancelled"


def test_hooks_must_be_async() -> None:
    app = App("t")
    with pytest.raises(ConfigError, match="on_job_end hook 'sync' must be an async function"):

        @app.on_job_end  # type: ignore[arg-type]
        def sync(ctx: JobContext, outcome: JobOutcome) -> None: ...


async def test_every_status_reaches_the_end_hooks_in_order(
    fake_arq: Any, loops: list[Loop]
) -> None:
    app = App("t")
    calls: list[tuple[str, str, str]] = []
    ends: dict[str, JobOutcome] = {}
    running = asyncio.Event()

    @app.on_job_start
    async def first(ctx: JobContext) -> None:
        calls.append(("start-1", ctx.job_id, ""))

    @app.on_job_start
    async def second(ctx: JobContext) -> None:
        calls.append(("start-2", ctx.job_id, ""))

    @app.on_job_end
    async def end_1(ctx: JobContext, outcome: JobOutcome) -> None:
        calls.append(("end-1", ctx.job_id, outcome.status))
        ends.setdefault(f"{outcome.job_id}:{outcome.job_try}", outcome)

    @app.on_job_end
    async def end_2(ctx: JobContext, outcome: JobOutcome) -> None:
        calls.append(("end-2", ctx.job_id, outcome.status))

    @app.task
    async def ok(ctx: JobContext, x: int) -> int:
        return x * 2

    @app.task
    async def boom(ctx: JobContext) -> None:
        raise ValueError("no")

    @app.task(max_tries=3)
    async def again(ctx: JobContext) -> str:
        if ctx.job_try < 2:
            raise Retry(defer=0.01)
        return "second"

    @app.task(timeout_s=0.1)
    async def slow(ctx: JobContext) -> None:
        await asyncio.sleep(5)

    @app.task(retry_on=KeyError, max_tries=2)
    async def doomed(ctx: JobContext) -> None:
        raise KeyError("gone")

    @app.task
    async def long(ctx: JobContext) -> None:
        running.set()
        await asyncio.sleep(10)

    lp = Loop(fake_arq, app, hooks=[hooked(app)])
    loops.append(lp.start())
    ids = {n: await lp.client.enqueue(n, *a) for n, a in
           [("ok", (21,)), ("boom", ()), ("again", ()), ("slow", ()), ("doomed", ())]}  # fmt: skip
    long_id = await lp.client.enqueue("long")
    await asyncio.wait_for(running.wait(), 10)
    await lp.client.abort(long_id)  # type: ignore[arg-type]
    await eventually(lambda: len(ends) == 8, what="every run's end hook")

    def end(name: str, job_try: int = 1) -> JobOutcome:
        return ends[f"{ids.get(name) or long_id}:{job_try}"]

    assert end("ok").status == "success" and end("ok").result == 42 and end("ok").error is None
    assert end("ok").task == "ok" and end("ok").duration_s >= 0
    assert end("boom").status == "failed" and isinstance(end("boom").error, ValueError)
    assert end("again").status == "retry" and isinstance(end("again").error, Retry)
    assert end("again", 2).status == "success" and end("again", 2).result == "second"
    assert end("slow").status == "timeout" and isinstance(end("slow").error, TimeoutError)
    assert [end("doomed", t).status for t in (1, 2)] == ["retry", "dead"]
    assert end("long").status == "cancelled"
    # per run: both start hooks, then both end hooks, each in the order registered
    ok_calls = [c[0] for c in calls if c[1] == ids["ok"]]
    assert ok_calls == ["start-1", "start-2", "end-1", "end-2"]


async def test_a_raising_or_hanging_hook_changes_nothing(fake_arq: Any, loops: list[Loop]) -> None:
    app = App("t")
    seen: list[str] = []

    @app.on_job_start
    async def broken_start(ctx: JobContext) -> None:
        raise RuntimeError("start hook bug")

    @app.on_job_end
    async def hangs(ctx: JobContext, outcome: JobOutcome) -> None:
        await asyncio.sleep(3600)

    @app.on_job_end
    async def broken_end(ctx: JobContext, outcome: JobOutcome) -> None:
        raise RuntimeError("end hook bug")

    @app.on_job_end
    async def after(ctx: JobContext, outcome: JobOutcome) -> None:
        seen.append(outcome.status)

    @app.task
    async def ok(ctx: JobContext) -> str:
        return "done"

    lp = Loop(fake_arq, app, hooks=[hooked(app, timeout_s=0.2)])
    loops.append(lp.start())
    with structlog.testing.capture_logs() as logs:
        jid = await lp.client.enqueue("ok")
        assert jid is not None
        job = Job(jid, fake_arq, _queue_name=KEYS.queue, _deserializer=msgpack_loads)
        # the result is written while the end hook still hangs: it does not delay the job's end
        assert await job.result(timeout=5, poll_delay=0.02) == "done"
        assert seen == []
        await eventually(lambda: seen == ["success"], what="the hooks after the broken ones")
    assert await job.status() == JobStatus.complete
    assert lp.consumer.totals["complete"] == 1 and lp.consumer.totals["failed"] == 0
    failed = [e for e in logs if e["event"] == "job hook failed"]
    assert {e["hook"].rsplit(".", 1)[-1] for e in failed} == {"broken_start", "broken_end"}
    assert all(e["log_level"] == "error" and e.get("exc_info") for e in failed)
    timed_out = [e for e in logs if e["event"] == "job hook timed out"]
    assert [e["hook"].rsplit(".", 1)[-1] for e in timed_out] == ["hangs"]
    assert timed_out[0]["job_id"] == jid and timed_out[0]["timeout_s"] == 0.2


async def test_the_readme_sentry_example_reports_failures(fake_arq: Any, loops: list[Loop]) -> None:
    import sentry_sdk
    from sentry_sdk.transport import Transport

    sent: list[Any] = []

    class Keep(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            sent.append(envelope)

    code = python_blocks(section("hooks-and-tracing", "Job hooks"))[-1]
    assert "sentry_sdk.capture_exception" in code
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/hooks-and-tracing.md (Job hooks: Sentry)", "exec"), namespace)
    app: App = namespace["app"]
    sentry_sdk.init(dsn="https://key@sentry.invalid/1", transport=Keep, default_integrations=False)
    try:

        @app.task
        async def charge(ctx: JobContext, order: int) -> None:
            raise ValueError(f"card declined for order {order}")

        lp = Loop(fake_arq, app, hooks=[hooked(app)])
        loops.append(lp.start())
        jid = await lp.client.enqueue("charge", 7)
        await eventually(lambda: sent, what="an event sent to Sentry")
    finally:
        sentry_sdk.get_client().close()
    event = sent[0].get_event()
    assert event["exception"]["values"][-1]["type"] == "ValueError"
    assert event["tags"] == {"task": "charge", "job_id": jid, "job_try": "1", "status": "failed"}


async def test_the_readme_hooks_example_runs(fake_arq: Any, loops: list[Loop]) -> None:
    code = python_block("hooks-and-tracing", "Job hooks")
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/hooks-and-tracing.md (Job hooks)", "exec"), namespace)
    app: App = namespace["app"]
    assert [len(app.job_start_hooks), len(app.job_end_hooks)] == [1, 1]
    seen: list[float] = []

    @app.task
    async def work(ctx: JobContext) -> None:
        seen.append(ctx["started_at"])  # set by the docs' on_job_start hook

    lp = Loop(fake_arq, app, hooks=[hooked(app)])
    loops.append(lp.start())
    await lp.client.enqueue("work")
    await eventually(lambda: seen and lp.consumer.totals["complete"] == 1, what="the job")
    assert seen[0] > 0
