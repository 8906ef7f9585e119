"""The runtime: builds shared dependencies once, wires role -> components, owns signals.

This is the only module that knows the role. Role -> components wiring lives in
:func:`plan` (what runs) and :meth:`Runtime._build` (how it is built), side by side.

Shutdown order (DESIGN §6): SIGTERM -> not ready -> drain delay -> stop singletons (each
iteration is atomic) -> release the leader lock -> consumer stops taking jobs and lets
in-flight jobs finish within the shutdown timeout -> deregister -> close Redis. A second
signal forces exit.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import structlog
from arq.connections import ArqRedis
from redis.asyncio import Redis

from worker import keys as K
from worker.app import App
from worker.client import Client, connect_redis
from worker.clock import Clock, SystemClock
from worker.component import Backoff, Component, Group
from worker.consumer import Consumer
from worker.context import Context
from worker.errors import ConfigError, LeadershipLost
from worker.initializer import Initializer
from worker.keyed import KeyedService
from worker.leader import LeaderElector, Leadership, LeaderTiming, StaticLeader
from worker.metrics import Metrics
from worker.periodic import PeriodicEnqueuer
from worker.poller import PollingScheduler
from worker.registry import Heartbeat, OrphanReaper
from worker.serializer import get_serializer
from worker.services import Service
from worker.settings import Settings, mask_url

log = structlog.get_logger("worker.runtime")

#: Exit code when singletons refuse to stop after leadership was lost (never run unfenced).
EXIT_UNFENCED = 70


@dataclass
class Plan:
    """Which components a role runs; computed without touching Redis."""

    role: str
    enabled: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"role: {self.role}",
            f"enabled: {', '.join(self.enabled) or '-'}",
            f"disabled: {', '.join(self.disabled) or '-'}",
        ]


def plan(role: str, app: App, settings: Settings) -> Plan:
    """Role -> components. Every role consumes; only leader/all campaign and run singletons."""
    every = ["consumer", "heartbeat"]
    if settings.health_port:
        every.append("health-server")
    every += [
        f"service:{s.name}"
        for s in app.services.values()
        if s.cardinality in ("per_process", "per_key")
    ]
    singletons = ["leader-election"]
    singletons += [f"initializer:{n}" for n in app.initializers]
    singletons += [f"poller:{n}" for n in app.pollers]
    if app.periodics:
        singletons.append("periodic")
    singletons.append("orphan-reaper")
    singletons += [
        f"service:{s.name}" for s in app.services.values() if s.cardinality == "singleton"
    ]
    if role == "consumer":
        return Plan(role, every, singletons)
    return Plan(role, every + singletons, [])


class Runtime:
    """One worker process: dependencies, components, signals, ordered shutdown."""

    def __init__(
        self,
        settings: Settings,
        app: App,
        *,
        redis_url: str,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings
        self.app = app
        self.redis_url = redis_url
        self.clock = clock or SystemClock()
        self.keys = K.Keys(settings.key_prefix)
        self.instance_id = f"{settings.instance_name}-{uuid4().hex[:6]}"
        self.metrics = Metrics()
        self.serializers = get_serializer(settings.serializer)  # once: pickle warns
        self.plan = plan(settings.role, app, settings)
        self.ready = False
        self.shutting_down = False
        self.started_at = self.clock.monotonic()
        self._stop = asyncio.Event()
        self._signals = 0
        self._signal_name = ""
        self.leadership: Leadership | None = None
        self.components: list[Component] = []
        self.singletons: Group | None = None
        self.groups: dict[str, Group] = {}
        self.consumer: Consumer | None = None
        self.heartbeat: Heartbeat | None = None
        self._clients: list[Redis] = []

    # -- dependencies -------------------------------------------------------------------------
    def _connect(
        self, *, socket_timeout_s: float | None, max_connections: int | None = None
    ) -> ArqRedis:
        serialize, deserialize = self.serializers
        client = connect_redis(
            self.redis_url,
            queue_name=self.keys.queue,
            serialize=serialize,
            deserialize=deserialize,
            socket_timeout_s=socket_timeout_s,
            max_connections=max_connections,
        )
        self._clients.append(client)
        return client

    async def _wait_for_redis(self, redis: Redis) -> None:
        deadline = self.clock.monotonic() + self.settings.redis_connect_timeout_s
        while True:
            try:
                await asyncio.wait_for(redis.ping(), timeout=5)
                return
            except Exception as exc:
                if self.clock.monotonic() >= deadline:
                    raise ConfigError(
                        f"WORKER_REDIS_URL: cannot reach Redis at {mask_url(self.redis_url)} "
                        f"within {self.settings.redis_connect_timeout_s:g}s "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                await asyncio.sleep(0.5)

    def _build(self, redis: ArqRedis) -> None:
        """Build every component of this role (the wiring; see :func:`plan`)."""
        s = self.settings
        serialize, deserialize = self.serializers
        client = Client(redis, keys=self.keys, serialize=serialize, app=self.app, clock=self.clock)
        self.context = Context(self.app, s, redis, client, self.clock, self.instance_id)

        consumer_redis = self._connect(socket_timeout_s=None)
        self.consumer = Consumer(
            app=self.app,
            context=self.context,
            redis=consumer_redis,
            keys=self.keys,
            instance_id=self.instance_id,
            serialize=serialize,
            deserialize=deserialize,
            concurrency=s.concurrency,
            poll_delay_s=s.poll_delay_s,
            idle_poll_max_s=s.idle_poll_max_s,
            job_timeout_s=s.job_timeout_s,
            max_tries=s.max_tries,
            keep_result_s=s.keep_result_s,
            shutdown_timeout_s=s.shutdown_timeout_s,
            holds_ttl_s=max(s.job_timeout_s + 60, s.orphan_stale_s * 3),
            metrics=self.metrics,
            clock=self.clock,
        )
        self.heartbeat = Heartbeat(
            redis=redis,
            keys=self.keys,
            instance_id=self.instance_id,
            instance_name=s.instance_name,
            role=s.role,
            interval_s=s.heartbeat_interval_s,
            describe=self.describe,
            clock=self.clock,
        )
        work: list[Component] = [self.consumer]
        for sv in self.app.services.values():
            if sv.cardinality == "per_process":
                work.append(Service(sv, self.context, self.clock))
            elif sv.cardinality == "per_key":
                work.append(
                    KeyedService(
                        service=sv,
                        context=self.context,
                        redis=redis,
                        keys=self.keys,
                        instance_id=self.instance_id,
                        lease_ttl_s=s.leader_ttl_s,
                        renew_interval_s=s.leader_renew_interval_s,
                        renew_deadline_s=s.leader_renew_deadline_s,
                        stop_grace_s=s.stop_grace_s,
                        clock=self.clock,
                    )
                )
        infra: list[Component] = [self.heartbeat]
        if s.health_port:
            from worker.health import HealthServer

            infra.append(
                HealthServer(self, host=s.health_host, port=s.health_port, clock=self.clock)
            )
        self.groups["infra"] = self._group("infra", infra)
        self.groups["work"] = self._group("work", work)
        self.components = infra + work

        if s.role == "consumer":
            return
        if s.leader_election == "static":
            self.leadership = StaticLeader(redis, self.keys, self.clock)
        else:
            timing = LeaderTiming(
                s.leader_ttl_s,
                s.leader_renew_interval_s,
                s.leader_renew_deadline_s,
                s.leader_poll_interval_s,
            )
            # No client-side retries on the lease connection: a retried renew could land after
            # the deadline we already trusted; short socket timeouts for the same reason.
            leader_redis = self._connect(
                socket_timeout_s=s.leader_renew_deadline_s / 2, max_connections=4
            )
            self.leadership = LeaderElector(leader_redis, self.keys, timing, self.clock)
        self.leadership.on_elected = self._on_elected
        self.leadership.on_lost = self._on_lost
        self.groups["leadership"] = self._group("leadership", [self.leadership])

        lock_value = self._lock_value
        singles: list[Component] = []
        for init in self.app.initializers.values():
            poller = self.app.pollers.get(init.poller) if init.poller else None
            singles.append(
                Initializer(
                    initializer=init,
                    poller=poller,
                    context=self.context,
                    redis=redis,
                    keys=self.keys,
                    lock_value=lock_value,
                    epoch=self._epoch,
                    metrics=self.metrics,
                    clock=self.clock,
                )
            )
        for p in self.app.pollers.values():
            singles.append(
                PollingScheduler(
                    poller=p,
                    redis=redis,
                    keys=self.keys,
                    lock_value=lock_value,
                    serialize=serialize,
                    metrics=self.metrics,
                    clock=self.clock,
                )
            )
        if self.app.periodics:
            singles.append(
                PeriodicEnqueuer(
                    jobs=list(self.app.periodics.values()),
                    redis=redis,
                    keys=self.keys,
                    lock_value=lock_value,
                    serialize=serialize,
                    metrics=self.metrics,
                    clock=self.clock,
                )
            )
        singles.append(
            OrphanReaper(
                redis=redis,
                keys=self.keys,
                lock_value=lock_value,
                stale_s=s.orphan_stale_s,
                interval_s=s.heartbeat_interval_s,
                metrics=self.metrics,
                clock=self.clock,
            )
        )
        singles += [
            Service(sv, self.context, self.clock)
            for sv in self.app.services.values()
            if sv.cardinality == "singleton"
        ]
        self.singletons = self._group("singletons", singles)
        self.components += [self.leadership, *singles]

    def _group(self, name: str, components: list[Component]) -> Group:
        s = self.settings
        return Group(
            name,
            components,
            backoff=lambda: Backoff(s.restart_backoff_base_s, s.restart_backoff_cap_s),
            on_restart=lambda c, _e: self.metrics.restarts.labels(c.name).inc(),
            on_leadership_lost=self._on_fenced,
        )

    # -- leadership callbacks -----------------------------------------------------------------
    def _lock_value(self) -> str | None:
        return self.leadership.value if self.leadership is not None else None

    def _epoch(self) -> int | None:
        return self.leadership.epoch if self.leadership is not None else None

    def _on_elected(self, value: str, epoch: int) -> None:
        self.metrics.is_leader.set(1)
        self.metrics.leader_epoch.set(epoch)
        self.metrics.leader_transitions.labels("acquired").inc()
        if self.singletons is not None and not self.shutting_down:
            log.info(
                "starting singleton components",
                epoch=epoch,
                components=[c.name for c in self.singletons.components],
            )
            self.singletons.start()

    async def _on_lost(self, reason: str) -> None:
        self.metrics.is_leader.set(0)
        self.metrics.leader_epoch.set(0)
        self.metrics.leader_transitions.labels("lost").inc()
        if self.singletons is None:
            return
        ok = await self.singletons.stop(self.settings.stop_grace_s)
        if not ok:
            log.critical(
                "singletons did not stop after leadership was lost; exiting rather "
                "than run unfenced",
                reason=reason,
            )
            os._exit(EXIT_UNFENCED)

    def _on_fenced(self, component: Component, exc: LeadershipLost) -> None:
        if self.leadership is not None:
            self.leadership.lost(f"{component.name}: {exc}")

    # -- introspection ------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the heartbeat publishes and ``/status`` shows about this process."""
        lead = self.leadership
        now = self.clock.monotonic()
        return {
            "components": self.plan.enabled,
            "is_leader": bool(lead and lead.is_leader),
            "epoch": lead.epoch if lead else None,
            "lease_age_s": round(lead.lease_age() or 0, 3) if lead and lead.is_leader else None,
            "in_flight": self.consumer.in_flight if self.consumer else 0,
            "ready": self.ready,
            "uptime_s": round(now - self.started_at, 1),
        }

    def component_health(self) -> dict[str, dict[str, Any]]:
        now = self.clock.monotonic()
        return {c.name: c.health.snapshot(now) for c in self.components}

    # -- lifecycle ----------------------------------------------------------------------------
    def request_shutdown(self, signame: str = "request") -> None:
        """First call: graceful shutdown. Second call: exit at once."""
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now", signal=signame)
            os._exit(1)
        self._signal_name = signame
        self.ready = False
        self.shutting_down = True
        self.metrics.ready.set(0)
        log.info("shutdown requested; not ready", signal=signame)
        self._stop.set()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown, sig.name)

    async def run(self) -> int:
        """Run until a signal asks to stop; return the process exit code."""
        s = self.settings
        redis = self._connect(socket_timeout_s=30)
        try:
            await self._wait_for_redis(redis)
            self._build(redis)
            self.metrics.info.labels(s.role, s.instance_name, _version()).set(1)
            log.info(
                "worker starting",
                app=self.app.name,
                instance_id=self.instance_id,
                redis=mask_url(self.redis_url),
                enabled=self.plan.enabled,
                disabled=self.plan.disabled,
            )
            for hook in self.app.startup_hooks:
                await hook(self.context)
            self._install_signals()
            self.groups["infra"].start()
            self.groups["work"].start()
            if "leadership" in self.groups:
                self.groups["leadership"].start()
            self.ready = True
            self.metrics.ready.set(1)
            await self._stop.wait()
            await self._shutdown()
            return 0
        finally:
            for c in self._clients:
                await c.aclose(close_connection_pool=True)

    async def _shutdown(self) -> None:
        s = self.settings
        if self._signal_name == "SIGTERM" and s.drain_delay_s:
            log.info("drain delay", seconds=s.drain_delay_s)
            await asyncio.sleep(s.drain_delay_s)
        if self.singletons is not None and not await self.singletons.stop(s.stop_grace_s):
            log.error("singleton components ignored cancellation")
        if self.leadership is not None:
            # Stop campaigning/renewing first, then release: a renew or campaign racing the
            # release could otherwise win the lease back for a dying process.
            await self.groups["leadership"].stop(2.0)
            await self.leadership.release()
        await self.groups["work"].stop(s.shutdown_timeout_s + 5)
        if self.heartbeat is not None:
            try:
                await self.heartbeat.deregister()
            except Exception as exc:
                log.warning("deregistration failed", error=str(exc))
        for hook in self.app.shutdown_hooks:
            try:
                await hook(self.context)
            except Exception as exc:
                log.error(
                    "shutdown hook failed", hook=getattr(hook, "__name__", "?"), error=str(exc)
                )
        await self.groups["infra"].stop(2.0)
        log.info("worker stopped")


def _version() -> str:
    from worker import __version__

    return __version__
