"""Health means progress: service SLAs and ``ctx.alive()``, per-key loops, dependency
checks (readiness, not liveness), periodic run ends recorded cluster-wide, their freshness on
the leader, and the heartbeat's clock-offset measurement."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from prometheus_client import generate_latest

from harness import FixedLease
from worker.app import App
from worker.context import Context
from worker.core.clock import FakeClock, SystemClock
from worker.core.component import Group, Health, supervise
from worker.core.errors import ConfigError
from worker.core.metrics import Metrics
from worker.duties.checks import HealthChecks
from worker.duties.keyed import KeyedService
from worker.duties.periodic import ERROR_NOTE, PeriodicEnqueuer, TickHook, freshness
from worker.duties.registry import Heartbeat
from worker.duties.services import Service
from worker.runtime.health import HealthServer
from worker.runtime.roles import plan
from worker.runtime.state import ProcessState
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.periodic import PeriodicRuns
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("t:")


def context(clock: Any, iid: str = "i-1") -> Context:
    return Context(Settings.model_construct(), None, None, clock, iid)  # type: ignore[arg-type]


async def yield_to_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


# -- services -------------------------------------------------------------------------------------


async def test_a_service_that_stops_calling_alive_becomes_overdue_after_its_sla() -> None:
    app, clock, beating = App(), FakeClock(), {"on": True}

    @app.service(cardinality="per_process", sla_s=5)
    async def loop(ctx: Context, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if beating["on"]:
                ctx.alive()
            await ctx.clock.wait(stop, 1.0)

    svc = Service(app.services["loop"], context(clock), clock)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(svc, stop))
    await clock.run_for(20, step=0.5)
    assert not svc.health.overdue(clock.monotonic()) and svc.health.iterations >= 20
    beating["on"] = False
    await clock.run_for(4.5, step=0.5)
    assert not svc.health.overdue(clock.monotonic())  # within its SLA
    await clock.run_for(1.5, step=0.5)
    assert svc.health.overdue(clock.monotonic())
    assert svc.health.snapshot(clock.monotonic())["overdue"] is True
    beating["on"] = True
    await clock.run_for(1.5, step=0.5)
    assert not svc.health.overdue(clock.monotonic())  # progress again: live again
    stop.set()
    await task


async def test_without_sla_alive_is_enough_and_alive_is_a_noop_elsewhere() -> None:
    app, clock = App(), FakeClock()

    @app.service(cardinality="per_process")
    async def idle(ctx: Context, stop: asyncio.Event) -> None:
        await stop.wait()

    svc = Service(app.services["idle"], context(clock), clock)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(svc, stop))
    await clock.run_for(3600, step=60)
    assert not svc.health.overdue(clock.monotonic())
    context(clock).alive()  # the process context: nothing to report to
    stop.set()
    await task


async def test_an_async_generator_service_reports_progress_by_yielding() -> None:
    app, clock, yields = App(), FakeClock(), {"n": 0}

    @app.service(cardinality="per_process", sla_s=2)
    async def gen(ctx: Context, stop: asyncio.Event) -> Any:
        while not stop.is_set() and yields["n"] < 5:
            yields["n"] += 1
            yield
            await ctx.clock.wait(stop, 1.0)
        await stop.wait()  # stops reporting

    svc = Service(app.services["gen"], context(clock), clock)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(svc, stop))
    await clock.run_for(4, step=0.25)
    assert not svc.health.overdue(clock.monotonic()) and svc.health.iterations >= 5
    await clock.run_for(4, step=0.25)
    assert svc.health.overdue(clock.monotonic())
    stop.set()
    await task


async def test_a_singleton_waiting_for_its_lease_to_settle_owes_no_progress() -> None:
    app, clock, settled = App(), FakeClock(), asyncio.Event()

    @app.service(sla_s=1)
    async def single(ctx: Context, stop: asyncio.Event) -> None:
        while not stop.is_set():
            ctx.alive()
            await ctx.clock.wait(stop, 0.5)

    class SlowLease(FixedLease):
        async def settled(self, stop: asyncio.Event) -> bool:
            await settled.wait()
            return True

    svc = Service(app.services["single"], context(clock), clock, leader=SlowLease("1:tok"))
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(svc, stop))
    await clock.run_for(10, step=0.5)
    assert svc.health.state == "waiting" and not svc.health.overdue(clock.monotonic())
    settled.set()
    await clock.run_for(3, step=0.25)
    assert svc.health.state == "running" and not svc.health.overdue(clock.monotonic())
    stop.set()
    await task


def test_service_and_check_declarations_are_validated() -> None:
    app = App()
    with pytest.raises(ConfigError, match="sla_s"):
        app.service(sla_s=0)
    with pytest.raises(ConfigError, match="max_staleness"):
        app.periodic(every=5, max_staleness=-1)
    with pytest.raises(ConfigError, match="timeout_s"):
        app.health_check(timeout_s=0)

    @app.periodic(every=5, max_staleness=dt.timedelta(minutes=2))
    async def job(ctx: Any) -> None: ...

    assert app.periodics["job"].max_staleness_s == 120.0

    @app.health_check
    async def database(ctx: Context) -> None: ...

    @app.health_check(name="imap", timeout_s=2, interval_s=7)
    async def check_imap(ctx: Context) -> None: ...

    assert app.health_checks["database"].timeout_s == 5.0
    assert (app.health_checks["imap"].timeout_s, app.health_checks["imap"].interval_s) == (2, 7)
    with pytest.raises(ConfigError, match="twice"):
        app.health_check(name="imap")(check_imap)
    with pytest.raises(ConfigError, match="async"):
        app.health_check(lambda ctx: None)  # type: ignore[arg-type,return-value]
    # every role runs the checks (each process checks its own connections)
    s = Settings.model_construct(health_port=0)
    assert "health-checks" in plan("consumer", app, s).enabled
    assert "health-checks" not in plan("consumer", App(), s).enabled


async def test_a_stalled_key_loop_makes_its_per_key_service_overdue(r: Any) -> None:
    app, stalled = App(), {"k1"}

    @app.service(cardinality="per_key", keys=["k1", "k2"], sla_s=0.3)
    async def box(ctx: Context, stop: asyncio.Event, key: str) -> None:
        while not stop.is_set():
            if key not in stalled:
                ctx.alive()
            await asyncio.sleep(0.05)

    clock = SystemClock()  # leases expire on the server's clock
    svc = KeyedService(
        app.services["box"], context(clock), Store(r, KEYS), clock, instance_id="p",
        lease_ttl_s=2.0, renew_interval_s=0.1, renew_deadline_s=1.0, stop_grace_s=0.5,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(svc, stop))
    try:
        deadline = asyncio.get_running_loop().time() + 5
        while not svc.health.overdue(clock.monotonic()):
            assert asyncio.get_running_loop().time() < deadline, "never overdue"
            await asyncio.sleep(0.05)
        assert svc.health.snapshot(clock.monotonic())["overdue_parts"] == ["k1"]
        assert set(svc.health.parts) == {"k1", "k2"}
        stalled.clear()
        await asyncio.sleep(0.2)
        assert not svc.health.overdue(clock.monotonic())
        assert svc.health.snapshot(clock.monotonic())["overdue_parts"] == []
    finally:
        stop.set()
        await task
    assert svc.health.parts == {}


# -- dependency checks ----------------------------------------------------------------------------


async def test_health_checks_run_in_the_background_with_a_timeout() -> None:
    app, clock, state = App(), FakeClock(), {"mode": "ok", "runs": 0}

    @app.health_check(timeout_s=1, interval_s=5)
    async def db(ctx: Context) -> None:
        state["runs"] += 1  # type: ignore[operator]
        if state["mode"] == "down":
            raise OSError("connection refused to postgres://u:secret@db")
        if state["mode"] == "hang":
            await asyncio.Event().wait()

    metrics = Metrics()
    checks = HealthChecks(list(app.health_checks.values()), context(clock), clock, metrics)
    assert checks.health.unready == ["check db: pending"]  # ready only once it answered
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(checks, stop))
    await clock.run_for(1, step=0.1)
    assert checks.health.unready == [] and state["runs"] == 1
    assert checks.health.extra["checks"]["db"]["state"] == "ok"
    await clock.run_for(10, step=0.1)
    assert state["runs"] == 3  # every interval_s, not more
    state["mode"] = "down"
    await clock.run_for(5.5, step=0.1)
    assert checks.health.unready == ["check db: OSError"]
    snap = checks.health.extra["checks"]["db"]
    assert snap["state"] == "failing" and snap["error"] == "OSError"
    assert "secret" not in json.dumps(checks.health.snapshot(clock.monotonic()))
    assert b'worker_health_check_up{check="db"} 0.0' in generate_latest(metrics.registry)
    state["mode"] = "hang"
    await clock.run_for(6.5, step=0.1)
    assert checks.health.unready == ["check db: TimeoutError"]
    state["mode"] = "ok"
    await clock.run_for(5.5, step=0.1)
    assert checks.health.unready == []
    assert not checks.health.overdue(clock.monotonic())
    stop.set()
    await task
    assert checks.health.unready == []


async def test_a_failing_check_fails_readiness_not_liveness() -> None:
    clock = FakeClock()
    comp = HealthChecks([], context(clock), clock)
    comp.health.state = "running"
    comp.health.unready = ["check db: OSError"]
    state = ProcessState(
        Settings.model_construct(status_show_errors=False), "i-1", clock, ["health-checks"], []
    )
    state.groups["infra"] = Group("infra", [comp])
    state.ready = True
    server = HealthServer(state, Metrics(), clock, host="127.0.0.1", port=0, bind_and_listen=False)
    req = make_mocked_request("GET", "/")
    ready = await server.readyz(req)
    assert ready.status == 503
    assert json.loads(ready.body)["unready"] == ["check db: OSError"]  # type: ignore[arg-type]
    assert (await server.healthz(req)).status == 200
    assert state.describe()["ready"] is False  # the heartbeat record says so (doctor reads it)
    assert state.describe()["unready"] == ["check db: OSError"]
    comp.health.state = "stopped"  # a stopped component holds nothing
    assert (await server.readyz(req)).status == 200


# -- periodic run ends ----------------------------------------------------------------------------


def periodic_app() -> App:
    app = App()

    @app.periodic(every=60, max_staleness=120)
    async def report(ctx: Any) -> None:
        if ctx.get("fail"):
            raise ValueError("boom")

    return app


async def test_the_tick_hook_records_successes_and_failures_with_their_error_class(r: Any) -> None:
    app, clock, store = periodic_app(), FakeClock(1_700_000_000.0), Store(r, KEYS)
    job = app.periodics["report"].job()
    hook = TickHook(store, list(app.periodics), clock, instance_id="c-1")
    tick = 1_699_999_980_000
    job_id = store.ids.periodic("report", tick)

    async def run(fail: bool) -> str:
        ctx = {**hook.context(job_id), "fail": fail}
        try:
            await job.fn(ctx)
        except ValueError:
            return "failure"
        return "success"

    assert hook.context("t:other") == {}
    await hook.ended(job_id, (), await run(fail=True))  # type: ignore[arg-type]
    runs = (await store.periodic_runs())["report"]
    assert runs.success is None and runs.failing_since_ms == 1_700_000_000_000
    assert runs.failure == {
        "at_ms": 1_700_000_000_000, "tick_ms": tick, "instance": "c-1", "error": "ValueError",
    }  # fmt: skip
    clock.advance(30)
    hook.context(job_id)
    await hook.ended(job_id, (), "retry")  # runs again: nothing recorded
    assert (await store.periodic_runs())["report"] == runs
    clock.advance(30)
    await hook.ended(job_id, (), await run(fail=False))  # type: ignore[arg-type]
    runs = (await store.periodic_runs())["report"]
    assert runs.success == {"at_ms": 1_700_000_060_000, "tick_ms": tick, "instance": "c-1"}
    assert runs.failing_since_ms is None and runs.failure is not None  # the failure stays
    assert ERROR_NOTE in hook.context(job_id)  # a run begun: its note waits for the end
    assert len(hook._open) == 1


def test_freshness_judges_success_age_or_failing_time() -> None:
    job = periodic_app().periodics["report"]
    now = 1_000_000
    assert freshness(job, None, now).stale is False
    ok = PeriodicRuns(success={"at_ms": now - 100_000})
    assert freshness(job, ok, now).success_age_s == 100 and not freshness(job, ok, now).stale
    assert freshness(job, PeriodicRuns(success={"at_ms": now - 121_000}), now).stale
    failing = PeriodicRuns(failure={"at_ms": now}, failing_since_ms=now - 130_000)
    f = freshness(job, failing, now)
    assert f.stale and f.failing_for_s == 130 and "failing for 130s" in f.explain(120)


async def test_the_leader_exports_freshness_and_warns_about_stale_jobs(r: Any) -> None:
    app, clock, metrics = periodic_app(), FakeClock(1_700_000_000.0), Metrics()
    store = Store(r, KEYS)
    fenced = FencedStore(store, FixedLease("1:tok"))
    enq = PeriodicEnqueuer(
        list(app.periodics.values()), store, fenced, lambda x: b"", clock, metrics
    )
    now = 1_700_000_000_000
    await store.periodic_result("report", "success", {"at_ms": now - 30_000}, now - 30_000)
    await enq.report_freshness(now)
    text = generate_latest(metrics.registry).decode()
    assert 'worker_periodic_last_success_age_seconds{periodic="report"} 30.0' in text
    assert 'worker_periodic_stale{periodic="report"} 0.0' in text
    assert enq.health.warnings == []
    clock.advance(10)  # past RUNS_REFRESH_S: read again
    await store.periodic_result("report", "success", {"at_ms": now - 200_000}, now - 200_000)
    await enq.report_freshness(now + 10_000)
    assert enq.health.warnings == [
        "periodic report: stale, last success 210s ago (max_staleness 120s)"
    ]
    assert (
        'worker_periodic_stale{periodic="report"} 1.0' in generate_latest(metrics.registry).decode()
    )
    await enq.teardown()  # leadership lost: another process exports it now
    assert enq.health.warnings == []
    assert "worker_periodic_stale{" not in generate_latest(metrics.registry).decode()


# -- clock offset ---------------------------------------------------------------------------------


async def test_the_heartbeat_measures_its_clock_offset_to_redis(r: Any) -> None:
    class View:
        ready = True
        shutting_down = False

        def describe(self) -> dict[str, Any]:
            return {}

    hb = Heartbeat(
        Store(r, KEYS), View(), SystemClock(), instance_id="i-1", instance_name="n",  # type: ignore[arg-type]
        role="consumer", interval_s=2,
    )  # fmt: skip
    await hb.tick()
    first = json.loads(await r.get(KEYS.instance("i-1")))
    assert "clock_offset_ms" not in first  # measured by the first heartbeat, sent by the next
    await hb.tick()
    rec = json.loads(await r.get(KEYS.instance("i-1")))
    assert abs(rec["clock_offset_ms"]) < 1000 and 0 <= rec["clock_rtt_ms"] < 1000


def test_health_parts_are_judged_only_while_the_parent_runs() -> None:
    parent, part = Health("svc", state="stopped"), Health("svc[k]", sla_s=1, state="running")
    part.started = 0.0
    parent.parts["k"] = part
    assert not parent.overdue(10.0)
    parent.state = "running"
    assert parent.overdue(10.0)


async def test_status_shows_the_last_success_and_failure(r: Any) -> None:
    from worker.ops import status

    app, store = periodic_app(), Store(r, KEYS)
    now = 1_700_000_000_000
    ok = {"at_ms": now - 300_000, "tick_ms": now - 300_000, "instance": "c-1"}
    bad = {"at_ms": now - 5_000, "tick_ms": now - 60_000, "instance": "c-2", "error": "KeyError"}
    await store.periodic_result("report", "success", ok, ok["at_ms"])
    await store.periodic_result("report", "failure", bad, bad["at_ms"])
    data = await status.collect(r, KEYS, app, FakeClock(now / 1000))
    (p,) = data["periodic"]
    assert p["last_success"]["at"] == "2023-11-14T22:08:20+00:00"
    assert p["last_failure"]["error"] == "KeyError" and p["last_failure"]["instance"] == "c-2"
    assert p["failing_since"] == "2023-11-14T22:13:15+00:00"
    assert p["success_age_s"] == 300.0 and p["max_staleness_s"] == 120 and p["stale"] is True
    text = status.render(data)
    assert "LAST SUCCESS" in text and "300s ago STALE" in text and "5s ago KeyError" in text
