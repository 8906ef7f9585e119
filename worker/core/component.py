"""The one lifecycle every component shares, supervision with backoff, and component groups.

A component runs until its ``stop`` event is set (``run(stop)``), reports a health snapshot,
and cleans up in ``finally``. Loop components implement ``tick()``: one unit of work that
returns the delay before the next, with the wait interruptible by ``stop``. All waiting goes
through the component's :class:`~worker.core.clock.Clock`, so tests drive time.

Supervision: each component is its own asyncio task; one that raises is logged
with its name and restarted with capped exponential backoff; it never kills the process or
stalls the others. A component that keeps failing is *not live*: liveness fails when it has
restarted ``CRASH_LOOP_RESTARTS`` times within ``CRASH_LOOP_WINDOW_S`` without completing an
iteration since, or sat in backoff past its SLA. A failure of Redis itself
(:func:`dependency_failure`: unreachable, timing out, refusing writes at ``maxmemory`` or
after a failed save (``MISCONF``), a read-only replica mid-failover) is a dependency outage,
not a crash: it makes the process *unready* until the component completes an iteration again
and never fails liveness, since restarting does not bring Redis back and would restart every
replica at once. A group is a set of components started and stopped together.

Progress, not only "process alive": a component with an SLA must report an
iteration (``Health.ok``) within it; a service reports through ``ctx.alive()``. A component
that supervises loops of its own (a ``per_key`` service: one loop per key) lists their health
in ``Health.parts``, and is overdue when one of them is. Besides liveness, a component can hold
the process *unready* (``Health.unready``: failing dependency checks) or report problems that
fail no probe (``Health.warnings``: stale periodic jobs).
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

from worker.core.clock import Clock
from worker.core.errors import LeadershipLost
from worker.core.outage import redis_outage

log = structlog.get_logger("worker.component")

#: This many restarts within the window mean a crash loop: the process is reported not live.
CRASH_LOOP_RESTARTS = 5
CRASH_LOOP_WINDOW_S = 300.0
#: SLA for components that declare none, used only to judge time spent in backoff.
DEFAULT_BACKOFF_SLA_S = 120.0
#: States in which a component owes no progress (``waiting``: a singleton service waiting for
#: its lease to settle).
AT_REST = frozenset({"idle", "stopped", "finished", "fenced", "waiting"})


def dependency_failure(exc: BaseException) -> str | None:
    """Why ``exc`` makes its component unready rather than crash-looping, or ``None`` when it
    is the component's own failure: Redis failing (:func:`worker.core.outage.redis_outage`:
    unreachable, failing over, refusing writes for memory, disk or replicas; ``NotReplicated``
    is a ``ConnectionError``), or a bounded wait running out (``TimeoutError``: on Redis, or on
    a service's own dependency)."""
    if isinstance(exc, TimeoutError):
        return f"timed out ({type(exc).__name__})"
    kind = redis_outage(exc)
    return None if kind is None else f"Redis unavailable ({kind})"


@dataclass
class Health:
    """A component's health snapshot (read by ``/healthz``, ``/status`` and metrics)."""

    name: str
    sla_s: float | None = None
    state: str = "idle"
    iterations: int = 0
    #: Restarts after the component's own errors (what ``worker_component_restarts`` counts).
    restarts: int = 0
    #: Runs again after a Redis outage (:func:`dependency_failure`): waits, not crashes.
    outage_retries: int = 0
    last_ok: float | None = None  # monotonic
    last_error: str | None = None
    started: float | None = None  # monotonic
    failing_since: float | None = None  # monotonic: first failure of the current streak
    extra: dict[str, Any] = field(default_factory=dict)
    recent_restarts: deque[float] = field(default_factory=lambda: deque(maxlen=CRASH_LOOP_RESTARTS))
    #: Loops this component supervises itself (a per_key service's key loops), by name.
    parts: dict[str, Health] = field(default_factory=dict)
    #: Why this component holds the process unready (``/readyz`` 503), e.g. failing checks.
    unready: list[str] = field(default_factory=list)
    #: Problems reported on the probes and ``/status`` without failing them.
    warnings: list[str] = field(default_factory=list)
    #: The Redis failure (:func:`dependency_failure`) of the current failing streak: the
    #: process is unready until the next completed iteration.
    dependency_error: str | None = None

    @property
    def active(self) -> bool:
        """Running or restarting (its ``unready`` and ``warnings`` count)."""
        return self.state in ("running", "backoff")

    def ok(self, now: float) -> None:
        self.iterations += 1
        self.last_ok = now
        self.failing_since = None
        self.dependency_error = None

    def failed(self, now: float, error: str, *, dependency: str | None = None) -> None:
        """Record a failure; a ``dependency`` one (its reason: Redis away or refusing writes)
        counts toward readiness (an outage retry), not toward restarts or a crash loop."""
        self.last_error = error
        if dependency is not None:
            self.outage_retries += 1
            self.dependency_error = dependency
        else:
            self.restarts += 1
            self.recent_restarts.append(now)
        if self.failing_since is None:
            self.failing_since = now

    def crash_looping(self, now: float) -> bool:
        """``CRASH_LOOP_RESTARTS`` restarts within the window, and no iteration completed
        since the last of them (a component working again is live again at once)."""
        r = self.recent_restarts
        if len(r) < CRASH_LOOP_RESTARTS or now - r[0] > CRASH_LOOP_WINDOW_S:
            return False
        return self.last_ok is None or self.last_ok < r[-1]

    def not_ready(self) -> list[str]:
        """Why this component holds the process unready: its own reasons (failing checks) and
        a Redis failure it is backing off from."""
        out = list(self.unready)
        if self.dependency_error is not None:
            out.append(f"{self.name}: {self.dependency_error}")
        return out

    def overdue(self, now: float) -> bool:
        """True when the component is not making progress: a running one has not completed an
        iteration within its SLA, one in backoff has failed for longer than its SLA, or it is
        crash-looping; or one of its ``parts`` is overdue."""
        if self.state in AT_REST:
            return False
        return self._overdue(now) or any(p.overdue(now) for p in list(self.parts.values()))

    def _overdue(self, now: float) -> bool:
        if self.crash_looping(now):
            return True
        if self.state == "backoff":
            if self.dependency_error is not None:
                return False  # Redis is away: readiness says so (see not_ready)
            since = self.failing_since
            return since is not None and now - since > (self.sla_s or DEFAULT_BACKOFF_SLA_S)
        if self.sla_s is None:
            return False
        ref = self.last_ok if self.last_ok is not None else self.started
        return ref is not None and now - ref > self.sla_s

    def snapshot(self, now: float, *, errors: bool = True) -> dict[str, Any]:
        """The health as JSON-ready data; ``errors=False`` shows only an error's class name
        (error texts can carry job data)."""
        error = self.last_error
        if error is not None and not errors:
            error = error.split(":", 1)[0]
        out: dict[str, Any] = {
            "state": self.state,
            "iterations": self.iterations,
            "restarts": self.restarts,
            "seconds_since_ok": None if self.last_ok is None else round(now - self.last_ok, 3),
            "sla_s": self.sla_s,
            "overdue": self.overdue(now),
            "crash_looping": self.crash_looping(now),
            "last_error": error,
            **self.extra,
        }
        if self.parts:
            out["overdue_parts"] = sorted(n for n, p in list(self.parts.items()) if p.overdue(now))
        if self.outage_retries:
            out["outage_retries"] = self.outage_retries
        if self.dependency_error is not None:
            out["dependency_error"] = self.dependency_error
        if self.unready:
            out["unready"] = list(self.unready)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


class Component(ABC):
    """Base class: ``run(stop)`` until stopped; ``health`` describes progress.

    ``sla_s``: seconds within which a running component must complete an iteration to count
    as live (``None``: no progress requirement).
    """

    #: Longest wait before a restart, whatever the supervisor's backoff says (``None``: its
    #: cap). The heartbeat sets its interval: after a Redis outage it must be back within one,
    #: or the reaper would judge a live process stale.
    max_backoff_s: float | None = None

    def __init__(self, name: str, clock: Clock, *, sla_s: float | None = None) -> None:
        self.name = name
        self.clock = clock
        self.health = Health(name, sla_s)

    @abstractmethod
    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then return. Raise to be restarted with backoff."""


class LoopComponent(Component):
    """A component whose work is a plain loop of ``tick()`` calls."""

    async def setup(self) -> None:
        """Called before the first tick of every (re)start."""

    async def teardown(self) -> None:
        """Called after the loop ends, also on errors and cancellation."""

    @abstractmethod
    async def tick(self) -> float:
        """Do one unit of work; return seconds until the next tick."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.setup()
        try:
            while not stop.is_set():
                delay = await self.tick()
                self.health.ok(self.clock.monotonic())
                await self.clock.wait(stop, delay)
        finally:
            await self.teardown()


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter; resets after a long healthy run."""

    base_s: float = 0.5
    cap_s: float = 30.0
    reset_after_s: float = 60.0
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)


async def supervise(
    component: Component,
    stop: asyncio.Event,
    *,
    backoff: Backoff | None = None,
    on_restart: Callable[[Component, BaseException], None] | None = None,
) -> None:
    """Run ``component`` until ``stop``; restart it with backoff whenever it raises.

    A component returning normally while ``stop`` is unset is finished (e.g. an initializer
    that completed). :class:`LeadershipLost` ends the component without a restart: the lease
    was already told (see :class:`worker.storage.FencedStore`) and stops the group.
    """
    backoff = backoff or Backoff()
    h = component.health
    clock = component.clock
    bound = structlog.contextvars.bind_contextvars(component=component.name)
    try:
        while not stop.is_set():
            h.state = "running"
            h.started = clock.monotonic()
            try:
                await component.run(stop)
            except asyncio.CancelledError:
                raise
            except LeadershipLost as exc:
                h.state = "fenced"
                h.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("leadership lost; component stops", error=str(exc))
                return
            except Exception as exc:
                now = clock.monotonic()
                dependency = dependency_failure(exc)
                first_wait = dependency is not None and h.dependency_error is None
                h.failed(now, f"{type(exc).__name__}: {exc}", dependency=dependency)
                if now - (h.started or 0) > backoff.reset_after_s:
                    backoff.attempt = 0
                delay = backoff.next_delay()
                if component.max_backoff_s is not None:
                    delay = min(delay, component.max_backoff_s)
                h.state = "backoff"
                if dependency is None:
                    log.error(
                        "component failed; restarting",
                        error=h.last_error,
                        restarts=h.restarts,
                        retry_in_s=round(delay, 2),
                        exc_info=exc,
                    )
                    if on_restart is not None:
                        on_restart(component, exc)
                else:  # Redis failing: expected in operation; one line per outage, no restart
                    (log.warning if first_wait else log.debug)(
                        "Redis unavailable; component waits and retries",
                        error=h.last_error,
                        retries=h.outage_retries,
                        retry_in_s=round(delay, 2),
                    )
                await clock.wait(stop, delay)
            else:
                if not stop.is_set():
                    h.state = "finished"
                    log.info("component finished")
                    return
    finally:
        if h.state not in ("finished", "fenced"):
            h.state = "stopped"
        structlog.contextvars.reset_contextvars(**bound)


class Group:
    """Components started together and stopped together (e.g. the leader's singletons)."""

    def __init__(
        self,
        name: str,
        components: Iterable[Component],
        *,
        backoff: Callable[[], Backoff] = Backoff,
        on_restart: Callable[[Component, BaseException], None] | None = None,
    ) -> None:
        self.name = name
        self.components = list(components)
        self._backoff = backoff
        self._on_restart = on_restart
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def running(self) -> bool:
        return any(not t.done() for t in self._tasks)

    def start(self) -> None:
        """Start every component as its own task (idempotent while running)."""
        if self.running:
            return
        self._stop = asyncio.Event()
        self._tasks = [
            asyncio.create_task(
                supervise(c, self._stop, backoff=self._backoff(), on_restart=self._on_restart),
                name=f"{self.name}:{c.name}",
            )
            for c in self.components
        ]

    async def stop(self, grace_s: float) -> bool:
        """Ask every component to stop; cancel what is still running after ``grace_s``.

        Returns ``True`` if everything stopped (including after cancellation) within
        ``2 * grace_s``; ``False`` means a component ignores cancellation.
        """
        self._stop.set()
        tasks = [t for t in self._tasks if not t.done()]
        if not tasks:
            return True
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        if not pending:
            return True
        for t in pending:
            t.cancel()
        _, still = await asyncio.wait(pending, timeout=grace_s)
        return not still
