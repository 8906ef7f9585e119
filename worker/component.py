"""The one lifecycle every component shares, supervision with backoff, and component groups.

A component runs until its ``stop`` event is set (``run(stop)``), reports a health snapshot,
and cleans up in ``finally``. Loop components implement ``tick()``: one unit of work that
returns the delay before the next, with the sleep interruptible by ``stop``.

Supervision (seed 001): each component is its own asyncio task; one that raises is logged
with its name and restarted with capped exponential backoff; it never kills the process or
stalls the others. A group is a set of components started and stopped together: the leader's
singletons are one.
"""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.clock import Clock, SystemClock
from worker.errors import LeadershipLost

log = structlog.get_logger("worker.component")


@dataclass
class Health:
    """A component's health snapshot (read by ``/healthz``, ``/status`` and metrics)."""

    name: str
    sla_s: float | None = None
    state: str = "idle"
    iterations: int = 0
    restarts: int = 0
    last_ok: float | None = None  # monotonic
    last_error: str | None = None
    started: float | None = None  # monotonic
    extra: dict[str, Any] = field(default_factory=dict)

    def ok(self, now: float) -> None:
        self.iterations += 1
        self.last_ok = now

    def overdue(self, now: float) -> bool:
        """True when a running component has not completed an iteration within its SLA."""
        if self.sla_s is None or self.state != "running":
            return False
        ref = self.last_ok if self.last_ok is not None else self.started
        return ref is not None and now - ref > self.sla_s

    def snapshot(self, now: float) -> dict[str, Any]:
        return {
            "state": self.state,
            "iterations": self.iterations,
            "restarts": self.restarts,
            "seconds_since_ok": None if self.last_ok is None else round(now - self.last_ok, 3),
            "sla_s": self.sla_s,
            "overdue": self.overdue(now),
            "last_error": self.last_error,
            **self.extra,
        }


class Component(ABC):
    """Base class: ``run(stop)`` until stopped; ``health`` describes progress."""

    name: str = "component"
    #: Seconds within which a running component must complete an iteration to count as live.
    sla_s: float | None = None

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.health = Health(self.name, self.sla_s)

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
                await wait_for_event(stop, delay)
        finally:
            await self.teardown()


async def wait_for_event(event: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``, waking early when ``event`` is set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
    except TimeoutError:
        return False
    return True


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
    on_leadership_lost: Callable[[Component, LeadershipLost], None] | None = None,
) -> None:
    """Run ``component`` until ``stop``; restart it with backoff whenever it raises.

    A component returning normally while ``stop`` is unset is finished (e.g. an initializer
    that completed). :class:`LeadershipLost` is not retried here: it is reported through
    ``on_leadership_lost`` so the elector steps down and the group is stopped.
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
                h.last_error = str(exc)
                log.warning("fenced write refused; leadership lost", error=str(exc))
                if on_leadership_lost is not None:
                    on_leadership_lost(component, exc)
                return
            except Exception as exc:
                h.restarts += 1
                h.last_error = f"{type(exc).__name__}: {exc}"
                if clock.monotonic() - (h.started or 0) > backoff.reset_after_s:
                    backoff.attempt = 0
                delay = backoff.next_delay()
                h.state = "backoff"
                log.error(
                    "component failed; restarting",
                    error=h.last_error,
                    restarts=h.restarts,
                    retry_in_s=round(delay, 2),
                    # Redis being away is expected in operation; keep those lines short.
                    exc_info=None if isinstance(exc, RedisConnectionError | TimeoutError) else exc,
                )
                if on_restart is not None:
                    on_restart(component, exc)
                await wait_for_event(stop, delay)
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
        on_leadership_lost: Callable[[Component, LeadershipLost], None] | None = None,
    ) -> None:
        self.name = name
        self.components = list(components)
        self._backoff = backoff
        self._on_restart = on_restart
        self._on_lost = on_leadership_lost
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
                supervise(
                    c,
                    self._stop,
                    backoff=self._backoff(),
                    on_restart=self._on_restart,
                    on_leadership_lost=self._on_lost,
                ),
                name=f"{self.name}:{c.name}",
            )
            for c in self.components
        ]

    def signal_stop(self) -> None:
        self._stop.set()

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

    async def wait(self) -> None:
        """Wait until every component task ended."""
        if self._tasks:
            await asyncio.wait(self._tasks)
