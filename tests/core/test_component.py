"""Supervision with capped backoff, groups, loop components, and the health SLA."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.fakes import RecordingBackoff
from worker.core.clock import FakeClock, SystemClock
from worker.core.component import (
    Backoff,
    Component,
    Group,
    Health,
    LoopComponent,
    dependency_failure,
    supervise,
)
from worker.core.errors import LeadershipLost


class Flaky(Component):
    """Fails ``failures`` times, then either finishes or waits for stop."""

    def __init__(self, failures: int, then: str = "finish", clock: Any = None) -> None:
        super().__init__("flaky", clock or SystemClock())
        self.failures = failures
        self.then = then
        self.runs = 0
        self.advance_per_run = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(0)  # yield, so a supervisor that loops forever fails by timeout
        self.runs += 1
        if self.advance_per_run:
            self.clock.advance(self.advance_per_run)  # type: ignore[attr-defined]
        if self.runs <= self.failures:
            raise RuntimeError(f"boom {self.runs}")
        if self.then == "lost":
            raise LeadershipLost("FENCED lock moved")
        if self.then == "wait":
            await stop.wait()


def test_backoff_grows_and_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    b = Backoff(base_s=0.01, cap_s=0.04)
    seen: list[tuple[float, float]] = []
    monkeypatch.setattr(
        "worker.core.component.random.uniform", lambda lo, hi: seen.append((lo, hi)) or hi
    )
    assert [b.next_delay() for _ in range(5)] == [0.01, 0.02, 0.04, 0.04, 0.04]
    # full jitter in [ceiling/2, ceiling]
    assert seen[0] == (0.005, 0.01) and seen[-1] == (0.02, 0.04)


def test_backoff_jitter_stays_in_range() -> None:
    b = Backoff(base_s=1, cap_s=8)
    for attempt in range(10):
        ceiling = min(8, 2**attempt)
        assert ceiling / 2 <= b.next_delay() <= ceiling


async def test_supervise_restarts_with_growing_capped_backoff() -> None:
    c = Flaky(failures=5)
    bo = RecordingBackoff(base_s=0.001, cap_s=0.004)
    restarts: list[tuple[Component, BaseException]] = []
    await asyncio.wait_for(
        supervise(
            c, asyncio.Event(), backoff=bo, on_restart=lambda comp, e: restarts.append((comp, e))
        ),
        timeout=5,
    )
    assert c.runs == 6
    assert bo.ceilings == [0.001, 0.002, 0.004, 0.004, 0.004]
    assert all(ceil / 2 <= d <= ceil for d, ceil in zip(bo.delays, bo.ceilings, strict=True))
    assert [str(e) for _, e in restarts] == [f"boom {i}" for i in range(1, 6)]
    assert all(comp is c for comp, _ in restarts)
    assert c.health.restarts == 5
    assert c.health.last_error == "RuntimeError: boom 5"
    assert c.health.state == "finished"  # returned normally after the failures


async def test_supervise_resets_backoff_after_a_long_healthy_run() -> None:
    clock = FakeClock()
    c = Flaky(failures=4, clock=clock)
    c.advance_per_run = 120.0  # each run lasted two minutes before failing
    bo = RecordingBackoff(base_s=0.001, cap_s=0.004, reset_after_s=60)
    task = asyncio.create_task(supervise(c, asyncio.Event(), backoff=bo))
    for _ in range(1000):  # the backoff waits on the fake clock: drive it
        if task.done():
            break
        await clock.run_for(0.01, step=0.001)
    await asyncio.wait_for(task, timeout=5)
    assert bo.ceilings == [0.001] * 4


async def test_a_component_caps_its_own_restart_delay() -> None:
    """The heartbeat caps its backoff at its interval: after a long Redis outage it is back
    within one interval, not after the supervisor's 30 s cap (the reaper would judge it
    stale; see OrphanReaper)."""
    clock = FakeClock()
    c = Flaky(failures=8, clock=clock)
    c.max_backoff_s = 0.5
    waits: list[float] = []
    original = clock.wait

    async def recording_wait(stop: Any, seconds: float) -> bool:
        waits.append(seconds)
        return await original(stop, seconds)

    clock.wait = recording_wait  # type: ignore[method-assign]
    task = asyncio.create_task(supervise(c, asyncio.Event(), backoff=Backoff(0.5, 30)))
    for _ in range(1000):
        if task.done():
            break
        await clock.run_for(0.5, step=0.1)
    await asyncio.wait_for(task, timeout=5)
    assert len(waits) == 8 and max(waits) <= 0.5


async def test_finished_component_is_not_restarted() -> None:
    c = Flaky(failures=0)
    await asyncio.wait_for(supervise(c, asyncio.Event(), backoff=Backoff(0.001, 0.001)), 5)
    assert c.runs == 1
    assert c.health.state == "finished"
    assert c.health.restarts == 0


async def test_leadership_lost_ends_the_component_without_restart() -> None:
    c = Flaky(failures=1, then="lost")
    restarts: list[BaseException] = []
    await asyncio.wait_for(
        supervise(
            c,
            asyncio.Event(),
            backoff=Backoff(0.001, 0.001),
            on_restart=lambda comp, e: restarts.append(e),
        ),
        5,
    )
    assert c.runs == 2  # one ordinary failure (restarted), then fenced: stop
    assert [str(e) for e in restarts] == ["boom 1"]  # the fenced refusal is no restart
    assert c.health.state == "fenced"
    assert "FENCED" in (c.health.last_error or "")


async def test_supervise_stops_when_asked() -> None:
    c = Flaky(failures=0, then="wait")
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(c, stop))
    await asyncio.sleep(0)
    assert c.health.state == "running"
    stop.set()
    await asyncio.wait_for(task, 5)
    assert c.health.state == "stopped"
    assert c.runs == 1


async def test_stop_during_backoff_ends_supervision_promptly() -> None:
    c = Flaky(failures=100)
    stop = asyncio.Event()
    task = asyncio.create_task(supervise(c, stop, backoff=Backoff(base_s=30, cap_s=30)))
    for _ in range(100):
        await asyncio.sleep(0)
        if c.health.state == "backoff":
            break
    assert c.health.state == "backoff"
    stop.set()
    await asyncio.wait_for(task, 2)  # did not sleep out the 15-30 s backoff
    assert c.runs == 1


async def test_cancellation_propagates() -> None:
    c = Flaky(failures=0, then="wait")
    task = asyncio.create_task(supervise(c, asyncio.Event()))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert c.health.state == "stopped"


# ---------------------------------------------------------------------------------------------
# Group
# ---------------------------------------------------------------------------------------------


class Waiter(Component):
    def __init__(self, name: str) -> None:
        super().__init__(name, SystemClock())
        self.started = asyncio.Event()
        self.cleaned_up = False

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        try:
            await stop.wait()
        finally:
            self.cleaned_up = True


class Stubborn(Component):
    """Ignores stop and swallows cancellation until released (e.g. a shielded call)."""

    def __init__(self) -> None:
        super().__init__("stubborn", SystemClock())
        self.release = asyncio.Event()
        self.cancels = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not self.release.is_set():
            try:
                await asyncio.shield(self.release.wait())
            except asyncio.CancelledError:
                self.cancels += 1


async def test_group_start_and_stop() -> None:
    a, b = Waiter("a"), Waiter("b")
    g = Group("singletons", [a, b])
    assert not g.running
    g.start()
    tasks = list(g._tasks)
    g.start()  # idempotent while running
    assert g._tasks == tasks
    await asyncio.wait_for(asyncio.gather(a.started.wait(), b.started.wait()), 5)
    assert g.running
    assert {t.get_name() for t in tasks} == {"singletons:a", "singletons:b"}
    assert await g.stop(grace_s=2) is True
    assert not g.running
    assert a.cleaned_up and b.cleaned_up
    assert a.health.state == b.health.state == "stopped"

    # restartable after a stop
    a.started.clear()
    g.start()
    await asyncio.wait_for(a.started.wait(), 5)
    assert await g.stop(grace_s=2) is True


async def test_group_stop_reports_component_ignoring_cancellation() -> None:
    s, w = Stubborn(), Waiter("w")
    g = Group("g", [s, w])
    g.start()
    await asyncio.wait_for(w.started.wait(), 5)
    assert await g.stop(grace_s=0.05) is False
    assert s.cancels >= 1  # it was cancelled, and ignored it
    assert w.cleaned_up
    assert g.running
    s.release.set()
    await asyncio.wait_for(asyncio.gather(*g._tasks), 5)
    assert not g.running


async def test_group_member_fenced_out_ends_and_others_keep_running() -> None:
    c, w = Flaky(failures=0, then="lost"), Waiter("w")
    g = Group("g", [c, w])
    g.start()
    await asyncio.wait_for(w.started.wait(), 5)
    for _ in range(100):
        await asyncio.sleep(0)
    assert c.health.state == "fenced" and c.runs == 1
    assert w.health.state == "running"
    assert await g.stop(1) is True


# ---------------------------------------------------------------------------------------------
# LoopComponent and helpers
# ---------------------------------------------------------------------------------------------


class Counter(LoopComponent):
    def __init__(self, stop_after: int, fail_at: int | None = None) -> None:
        super().__init__("counter", FakeClock())
        self.stop_after = stop_after
        self.fail_at = fail_at
        self.calls: list[str] = []
        self.stop: asyncio.Event | None = None

    async def setup(self) -> None:
        self.calls.append("setup")

    async def teardown(self) -> None:
        self.calls.append("teardown")

    async def tick(self) -> float:
        n = sum(1 for c in self.calls if c == "tick") + 1
        self.calls.append("tick")
        if n == self.fail_at:
            raise RuntimeError("tick failed")
        if n >= self.stop_after and self.stop is not None:
            self.stop.set()
        return 0.0


async def test_loop_component_ticks_until_stop() -> None:
    c = Counter(stop_after=3)
    c.stop = asyncio.Event()
    await asyncio.wait_for(c.run(c.stop), 5)
    assert c.calls == ["setup", "tick", "tick", "tick", "teardown"]
    assert c.health.iterations == 3
    assert c.health.last_ok == c.clock.monotonic()


async def test_loop_component_teardown_runs_on_error() -> None:
    c = Counter(stop_after=10, fail_at=2)
    with pytest.raises(RuntimeError):
        await c.run(asyncio.Event())
    assert c.calls == ["setup", "tick", "tick", "teardown"]
    assert c.health.iterations == 1


async def test_system_clock_waits() -> None:
    clock = SystemClock()
    e, f = asyncio.Event(), asyncio.Event()
    assert await clock.wait(e, 0.01) is False
    assert await clock.wait(e, -1) is False
    assert await clock.wait((e, f), 0.01) is False
    f.set()
    assert await clock.wait((e, f), 100) is True
    e.set()
    assert await clock.wait(e, 100) is True
    with pytest.raises(TimeoutError):
        await clock.wait_for(asyncio.sleep(10), 0.01)
    assert await clock.wait_for(asyncio.sleep(0, "x"), 1) == "x"


async def test_fake_clock_wakes_sleepers_only_when_advanced() -> None:
    clock = FakeClock()
    e = asyncio.Event()
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("a", 5)), asyncio.create_task(sleeper("b", 2))]
    waiter = asyncio.create_task(clock.wait(e, 3))
    for _ in range(20):
        await asyncio.sleep(0)
    assert woke == [] and not waiter.done()  # real time passes, fake time does not
    await clock.run_for(2.5, step=0.5)
    assert woke == ["b"] and not waiter.done()
    await clock.run_for(1)
    assert waiter.done() and waiter.result() is False
    e2 = asyncio.Event()
    waiter2 = asyncio.create_task(clock.wait(e2, 100))
    await asyncio.sleep(0)
    e2.set()
    assert await asyncio.wait_for(waiter2, 1) is True
    await clock.run_for(2)
    assert woke == ["b", "a"]
    await asyncio.gather(*tasks)
    slow = asyncio.create_task(clock.wait_for(asyncio.sleep(3600), 1))
    await clock.run_for(1.5)
    with pytest.raises(TimeoutError):
        await slow


# ---------------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------------


def test_health_overdue() -> None:
    assert Health("x").overdue(1e9) is False  # no SLA: never overdue
    h = Health("x", sla_s=10)
    h.started = 100.0
    assert h.overdue(200) is False  # idle components are not judged
    h.state = "running"
    assert h.overdue(110) is False
    assert h.overdue(110.5) is True  # no iteration at all since start
    h.ok(108)
    assert h.iterations == 1
    assert h.overdue(118) is False
    assert h.overdue(118.01) is True
    for state in ("stopped", "finished", "fenced"):
        h.state = state
        assert h.overdue(1e9) is False
    h.state = "running"
    h.started = h.last_ok = None
    assert h.overdue(1e9) is False


def test_health_snapshot() -> None:
    h = Health("x", sla_s=5, state="running", started=0.0)
    h.extra["dispatched"] = 7
    h.ok(2.0)
    snap = h.snapshot(8.0)
    assert snap == {
        "state": "running",
        "iterations": 1,
        "restarts": 0,
        "seconds_since_ok": 6.0,
        "sla_s": 5,
        "overdue": True,
        "crash_looping": False,
        "last_error": None,
        "dispatched": 7,
    }
    assert Health("y").snapshot(1.0)["seconds_since_ok"] is None


def test_health_backoff_past_sla_and_crash_loops_are_overdue() -> None:
    h = Health("x", sla_s=10, state="backoff")
    h.failed(100.0, "RuntimeError: db down")
    assert h.overdue(105) is False  # failing, but not yet for longer than the SLA
    assert h.overdue(110.5) is True
    h.ok(111)  # a successful iteration ends the streak
    assert h.failing_since is None and h.overdue(500) is False

    c = Health("y", state="running")  # no SLA at all: only a crash loop makes it overdue
    for t in range(4):
        c.failed(float(t), "boom")
    assert not c.crash_looping(4.0) and not c.overdue(4.0)
    c.failed(4.0, "boom")
    assert c.crash_looping(5.0) and c.overdue(5.0)
    assert not c.crash_looping(4.0 + 301)  # the five restarts left the window
    assert c.snapshot(5.0, errors=False)["last_error"] == "boom"
    c.failed(6.0, "RuntimeError: secret job data")
    assert c.snapshot(7.0, errors=False)["last_error"] == "RuntimeError"
    assert c.snapshot(7.0)["last_error"] == "RuntimeError: secret job data"


def test_a_crash_loop_ends_at_the_next_completed_iteration() -> None:
    """Liveness comes back as soon as the component works again, not 300 s later."""
    h = Health("x", state="running")
    for t in range(5):
        h.failed(float(t), "RuntimeError: boom")
    assert h.crash_looping(5.0) and h.overdue(5.0)
    h.ok(6.0)
    assert not h.crash_looping(6.5) and not h.overdue(6.5)
    h.failed(7.0, "RuntimeError: boom")  # failing again, without an iteration since
    assert h.crash_looping(7.5)


def test_redis_failures_make_a_component_unready_never_crash_looping() -> None:
    """Redis refusing writes (maxmemory) or away: every replica at once, and a restart brings
    nothing back; so readiness says it, liveness does not."""
    h = Health("heartbeat", sla_s=10, state="backoff")
    for t in range(20):
        h.failed(float(t), "OutOfMemoryError: command not allowed", dependency="Redis down")
    assert not h.crash_looping(20.0) and not h.overdue(60.0)  # past its SLA in backoff too
    assert h.not_ready() == ["heartbeat: Redis down"]
    assert h.snapshot(20.0)["dependency_error"] == "Redis down"
    h.ok(21.0)
    assert h.not_ready() == [] and "dependency_error" not in h.snapshot(21.0)


async def test_supervise_classifies_redis_errors_as_dependency_failures() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import OutOfMemoryError, ResponseError

    class Failing(Component):
        def __init__(self, errors: list[Exception]) -> None:
            super().__init__("f", SystemClock())
            self.errors = errors

        async def run(self, stop: asyncio.Event) -> None:
            await asyncio.sleep(0)
            if self.errors:
                raise self.errors.pop(0)

    c = Failing([OutOfMemoryError("OOM"), RedisConnectionError("gone"), ResponseError("bug")])
    await asyncio.wait_for(
        supervise(c, asyncio.Event(), backoff=Backoff(base_s=0.001, cap_s=0.001)), timeout=5
    )
    # only the ResponseError (a bug) is a restart and counts toward a loop; Redis failing is
    # waited out (outage retries: unready meanwhile, no restart storm)
    assert (c.health.restarts, c.health.outage_retries) == (1, 2)
    assert len(c.health.recent_restarts) == 1
    assert c.health.snapshot(0.0)["outage_retries"] == 2
    assert dependency_failure(OutOfMemoryError("x")) == "Redis unavailable (OutOfMemoryError)"
    assert dependency_failure(TimeoutError()) == "timed out (TimeoutError)"
    assert dependency_failure(ResponseError("x")) is None


@pytest.mark.parametrize(
    "reply",
    [
        "MISCONF Valkey is configured to save RDB snapshots, but it's currently unable to persist",
        "LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
        "NOREPLICAS Not enough good replicas to write.",
        "READONLY You can't write against a read only replica.",
        "OOM command not allowed when used memory > 'maxmemory'.",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down",
        # redis-py's wording for an error inside a MULTI/EXEC pipeline
        "Command # 1 (SET c 1) of pipeline caused error: MISCONF Errors writing to the AOF file",
    ],
)
def test_every_reply_that_means_writes_refused_for_now_is_a_dependency_failure(
    reply: str,
) -> None:
    """Parsed as redis-py parses a reply (its classes where it has one, a plain
    ``ResponseError`` otherwise): each is Redis failing, not the component."""
    from redis._parsers.base import BaseParser
    from redis.exceptions import ResponseError

    exc = BaseParser.parse_error(reply) if not reply.startswith("Command") else ResponseError(reply)
    assert dependency_failure(exc) is not None, (type(exc), reply)


def test_a_reply_that_means_a_bug_is_not_a_dependency_failure() -> None:
    from redis.exceptions import NoScriptError, ResponseError

    for exc in (
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ResponseError("ERR value is not an integer or out of range"),
        ResponseError("BUSYGROUP Consumer Group name already exists"),
        ResponseError("ERR Error running script: user_script:3: fenced"),
        NoScriptError("No matching script."),
    ):
        assert dependency_failure(exc) is None, exc
