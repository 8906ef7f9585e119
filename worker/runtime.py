"""The runtime: one worker process's lifecycle — connect, start, signals, ordered shutdown.

What runs in which role is data in :mod:`worker.roles`; this module only connects, hands the
dependencies to :func:`worker.roles.build`, starts the groups and stops them in order. It is
also the process's :class:`~worker.views.ProcessView` (what the heartbeat and the health
server read).

Shutdown order: SIGTERM -> not ready -> drain delay -> stop singletons (each iteration is
atomic) -> stop campaigning, release the lease -> the consumer stops taking jobs and lets
in-flight jobs finish within the shutdown timeout -> deregister -> shutdown hooks -> close
Redis. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any
from uuid import uuid4

import structlog
from arq.connections import ArqRedis
from redis.asyncio import Redis

from worker import keys as K
from worker import roles
from worker.app import App
from worker.client import Client, connect_redis
from worker.clock import Clock, SystemClock
from worker.component import Component, Group
from worker.consumer import Consumer
from worker.errors import ConfigError
from worker.metrics import Metrics
from worker.preflight import check_redis_contract
from worker.registry import Heartbeat
from worker.serializer import get_serializer
from worker.settings import Settings, mask_url
from worker.store import Store
from worker.version import __version__

log = structlog.get_logger("worker.runtime")


class Runtime:
    """One worker process: dependencies, components, signals, ordered shutdown."""

    def __init__(
        self, settings: Settings, app: App, *, redis_url: str, clock: Clock | None = None
    ) -> None:
        self.settings = settings
        self.app = app
        self.redis_url = redis_url
        self.clock = clock or SystemClock()
        self.keys = K.Keys(settings.key_prefix)
        self.instance_id = f"{settings.instance_name}-{uuid4().hex[:6]}"
        self.metrics = Metrics()
        self.serializer = get_serializer(settings.serializer)  # once: pickle warns
        self.plan = roles.plan(settings.role, app, settings)
        self._ready = False
        self._shutting_down = False
        self.started_at = self.clock.monotonic()
        self._stop = asyncio.Event()
        self._signals = 0
        self._signal_name = ""
        self.wiring: roles.Wiring | None = None
        self.groups: dict[roles.GroupName, Group] = {}
        self._clients: list[Redis] = []

    # -- ProcessView --------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def _component(self, name: str) -> Component | None:
        return next((c for g in self.groups.values() for c in g.components if c.name == name), None)

    def describe(self) -> dict[str, Any]:
        lead = self.wiring.leadership if self.wiring else None
        consumer = self._component("consumer")
        age = lead.lease_age() if lead else None
        return {
            "components": self.plan.enabled,
            "is_leader": bool(lead and lead.is_leading()),
            "epoch": lead.epoch if lead else None,
            "lease_age_s": round(age, 3) if age is not None else None,
            "in_flight": consumer.in_flight if isinstance(consumer, Consumer) else 0,
            "ready": self._ready,
            "uptime_s": round(self.clock.monotonic() - self.started_at, 1),
        }

    def identity(self) -> dict[str, Any]:
        s = self.settings
        return {
            "instance_id": self.instance_id,
            "instance_name": s.instance_name,
            "role": s.role,
            "plan": {"enabled": self.plan.enabled, "disabled": self.plan.disabled},
            "settings": s.redacted(),
        }

    def component_health(self) -> dict[str, dict[str, Any]]:
        now = self.clock.monotonic()
        errors = self.settings.status_show_errors  # error texts can carry job data
        return {
            c.name: c.health.snapshot(now, errors=errors)
            for g in self.groups.values()
            for c in g.components
        }

    # -- dependencies -------------------------------------------------------------------------
    def _connect(
        self, *, socket_timeout_s: float | None, max_connections: int | None = None
    ) -> ArqRedis:
        serialize, deserialize = self.serializer
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

    def _build(self, redis: ArqRedis) -> roles.Wiring:
        s = self.settings
        store = Store(redis, self.keys)
        client = Client(
            redis,
            keys=self.keys,
            serialize=self.serializer[0],
            app=self.app,
            clock=self.clock,
            store=store,
        )
        backoff = roles.restart_backoff(s)
        on_restart = self._count_restart
        # The lease connection: no client-side retries (a retried renew could land after the
        # deadline we already trusted) and short socket timeouts for the same reason.
        lease = lambda: Store(  # noqa: E731 - a factory the leadership row calls once
            self._connect(socket_timeout_s=s.leader_renew_deadline_s / 2, max_connections=4),
            self.keys,
        )
        w = roles.Wiring(
            settings=s,
            app=self.app,
            instance_id=self.instance_id,
            clock=self.clock,
            metrics=self.metrics,
            serializer=self.serializer,
            redis=redis,
            client=client,
            process=self,
            consumer_redis=lambda: self._connect(socket_timeout_s=None),
            leader_store=lease,
            singletons=Group("singletons", [], backoff=backoff, on_restart=on_restart),
        )
        built = roles.build(w)
        self.groups = {
            name: (
                w.singletons
                if name == "singletons"
                else Group(name, built[name], backoff=backoff, on_restart=on_restart)
            )
            for name in roles.GROUP_ORDER
        }
        return w

    def _count_restart(self, component: Component, _: BaseException) -> None:
        self.metrics.restarts.labels(component.name).inc()

    # -- lifecycle ----------------------------------------------------------------------------
    def request_shutdown(self, signame: str = "request") -> None:
        """First call: graceful shutdown. Second call: exit at once."""
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now", signal=signame)
            os._exit(1)
        self._signal_name = signame
        self._ready = False
        self._shutting_down = True
        self.metrics.ready.set(0)
        log.info("shutdown requested; not ready", signal=signame)
        self._stop.set()

    async def run(self) -> int:
        """Run until a signal asks to stop; return the process exit code."""
        s = self.settings
        redis = self._connect(socket_timeout_s=30)
        try:
            await self._wait_for_redis(redis)
            for warning in await check_redis_contract(redis, s):
                log.warning(warning)
            self.wiring = w = self._build(redis)
            self.metrics.info.labels(s.role, s.instance_name, __version__).set(1)
            log.info(
                "worker starting",
                app=self.app.name,
                instance_id=self.instance_id,
                redis=mask_url(self.redis_url),
                enabled=self.plan.enabled,
                disabled=self.plan.disabled,
            )
            for hook in self.app.startup_hooks:
                await hook(w.context)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_shutdown, sig.name)
            for name in ("infra", "work", "leadership"):
                self.groups[name].start()  # the leadership starts the singletons itself
            self._ready = True
            self.metrics.ready.set(1)
            await self._stop.wait()
            await self._shutdown(w)
            return 0
        finally:
            for c in self._clients:
                await c.aclose(close_connection_pool=True)

    async def _shutdown(self, w: roles.Wiring) -> None:
        s = self.settings
        if self._signal_name == "SIGTERM" and s.drain_delay_s:
            log.info("drain delay", seconds=s.drain_delay_s)
            await asyncio.sleep(s.drain_delay_s)
        if w.leadership is not None:
            # Singletons first; then stop campaigning/renewing, then release: a renew or
            # campaign racing the release could otherwise win the lease back for a dying process.
            await w.leadership.retire()
            await self.groups["leadership"].stop(2.0)
            await w.leadership.release()
        await self.groups["work"].stop(s.shutdown_timeout_s + 5)
        await self._deregister()
        for hook in self.app.shutdown_hooks:
            try:
                await hook(w.context)
            except Exception as exc:
                log.error(
                    "shutdown hook failed", hook=getattr(hook, "__name__", "?"), error=str(exc)
                )
        await self.groups["infra"].stop(2.0)
        # Again, now that the heartbeat has stopped: a heartbeat write in flight during the
        # first deregistration (sent after its boot-marker round trip) could re-add the record.
        await self._deregister()
        log.info("worker stopped")

    async def _deregister(self) -> None:
        heartbeat = self._component("heartbeat")
        if isinstance(heartbeat, Heartbeat):
            try:
                await heartbeat.deregister()
            except Exception as exc:
                log.warning("deregistration failed", error=str(exc))
