"""Dependency health checks (``@app.health_check``): run in the background, reported on probes.

A check is ``async def fn(ctx) -> None`` that raises when a dependency (a database, an IMAP
server) is unusable. Every process runs each check every ``interval_s`` seconds, cancelled
after ``timeout_s``, in its own loop: a probe request never runs a check (a slow database must
not make the kubelet's probe time out), it reads the latest result.

A failing check makes the process **unready** (``/readyz`` 503), not dead: ``/healthz`` stays
200, because restarting a process does not bring a database back, and restarting every replica
at once during a database outage (a liveness failure everywhere) only adds a restart storm to
the outage. Readiness is the signal Kubernetes and load balancers read for "cannot do useful
work right now"; the process keeps running (its consumer keeps claiming: jobs that need the
dependency fail or retry as they would anyway). A check that has not finished its first run
counts as failing, so a new replica is ready only once its dependencies answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import Component
from worker.core.metrics import Metrics
from worker.core.views import ContextView

log = structlog.get_logger("worker.checks")

NAME = "health-checks"
#: ``async def fn(ctx)``, ``ctx`` the process's job context (a :class:`worker.Context`)
CheckFn = Callable[[Any], Awaitable[None]]
#: Grace after ``timeout_s`` before a check that ignores cancellation is reported as stuck.
STUCK_GRACE_S = 1.0


@dataclass(frozen=True)
class HealthCheckDef:
    """A dependency check: ``fn(ctx)`` raises when the dependency is unusable."""

    name: str
    fn: CheckFn
    timeout_s: float = 5.0
    interval_s: float = 15.0


@dataclass
class CheckState:
    """The latest result of one check (times: wall clock ms; ``running_since``: monotonic)."""

    state: str = "pending"  # pending | ok | failing
    error: str | None = None  # exception class (texts can carry secrets: they go to the log)
    last_run_ms: int | None = None
    last_ok_ms: int | None = None
    duration_s: float | None = None
    failures: int = 0  # consecutive
    running_since: float | None = None

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "last_run_ms": self.last_run_ms,
            "last_ok_ms": self.last_ok_ms,
            "duration_s": self.duration_s,
            "consecutive_failures": self.failures,
        }


class HealthChecks(Component):
    """Runs every declared check on its own interval; publishes the results in its health
    (``unready`` while a check fails; each check's state under ``checks``)."""

    def __init__(
        self,
        checks: Sequence[HealthCheckDef],
        context: ContextView,
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        longest = max((c.timeout_s + c.interval_s for c in checks), default=0.0)
        super().__init__(NAME, clock, sla_s=max(30.0, 3 * longest))
        self.checks = list(checks)
        self.context = context
        self.metrics = metrics
        self.states = {c.name: CheckState() for c in self.checks}
        self.publish()

    async def run(self, stop: asyncio.Event) -> None:
        loops = [
            asyncio.create_task(self._loop(c, stop), name=f"check:{c.name}") for c in self.checks
        ]
        try:
            while not stop.is_set():
                self.publish()
                self.health.ok(self.clock.monotonic())
                await self.clock.wait(stop, 0.5)
        finally:
            for task in loops:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(loops, timeout=STUCK_GRACE_S)
            self.health.unready = []

    async def _loop(self, check: HealthCheckDef, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.run_check(check)
            self.publish()
            await self.clock.wait(stop, check.interval_s)

    async def run_check(self, check: HealthCheckDef) -> CheckState:
        """Run ``check`` once under its timeout and record the result."""
        st = self.states[check.name]
        started = st.running_since = self.clock.monotonic()
        error: str | None = None
        try:
            await self.clock.wait_for(check.fn(self.context), check.timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            error, detail = "TimeoutError", f"no answer within {check.timeout_s:g}s"
        except Exception as exc:
            error, detail = type(exc).__name__, str(exc)
        st.running_since = None
        st.duration_s = round(self.clock.monotonic() - started, 4)
        st.last_run_ms = ms(self.clock.time())
        was = st.state
        if error is None:
            st.state, st.error, st.failures = "ok", None, 0
            st.last_ok_ms = st.last_run_ms
            if was == "failing":
                log.info("health check recovered", check=check.name)
        else:
            st.state, st.error = "failing", error
            st.failures += 1
            if was != "failing":
                log.warning("health check failing", check=check.name, error=f"{error}: {detail}")
        if self.metrics is not None:
            self.metrics.check_up.labels(check.name).set(1 if error is None else 0)
        return st

    def publish(self) -> None:
        """Copy the results into the component's health (read by the probes and ``/status``)."""
        now = self.clock.monotonic()
        unready = []
        for c in self.checks:
            st = self.states[c.name]
            stuck = (
                st.running_since is not None
                and now - st.running_since > c.timeout_s + STUCK_GRACE_S
            )
            if stuck:
                unready.append(f"check {c.name}: stuck (ignores cancellation)")
            elif st.state != "ok":
                unready.append(f"check {c.name}: {st.error or st.state}")
        self.health.unready = unready
        self.health.extra["checks"] = {n: st.snapshot() for n, st in self.states.items()}

    def failing(self) -> list[str]:
        return list(self.health.unready)
