"""HTTP probes and metrics: ``/healthz``, ``/readyz``, ``/metrics``, ``/status`` (aiohttp).

- ``/healthz`` is liveness: the event loop answers and every running component completed an
  iteration within its SLA and is not crash-looping ("process alive" is not "work
  progressing"). It stays 200 during a graceful shutdown so the kubelet does not kill
  a draining pod.
- ``/readyz`` is 200 once started and 503 from the moment SIGTERM arrives, while a dependency
  check (``@app.health_check``) fails, and while a component backs off from Redis failing
  (:func:`worker.core.outage.redis_outage`: unreachable, failing over, refusing writes at
  ``maxmemory`` or after a failed save, ``MISCONF``): a database or Redis being down makes a
  process unable to do useful work (readiness), but restarting it does not help and would
  restart every replica at once (so never liveness).
- Stale periodic jobs (a last success older than ``max_staleness``) are *reported* in both
  bodies (``warnings``) and in metrics, but fail neither probe: a user job failing is fixed by
  a human, and a leader that Kubernetes restarts or stops routing to would fix nothing (every
  leader would be judged alike). ``python -m worker doctor`` fails on them.
- ``/metrics`` is Prometheus text; ``/status`` is this process as JSON (no secrets; a
  component's last error shows as its exception class unless ``WORKER_STATUS_SHOW_ERRORS``).
- ``/status`` answers only a ``Host`` it serves (an IP, ``localhost``, the bound name or
  ``WORKER_HEALTH_ALLOWED_HOSTS``: no DNS rebinding; the probes and ``/metrics`` answer any),
  and the listener bounds its connections and the time to send headers
  (:mod:`worker.runtime.httpguard`).

The listening socket is bound when the server is built, before any component starts, so a
port in use or an unknown host fails start-up (exit 2) instead of crash-looping.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker.core.clock import Clock
from worker.core.component import Component
from worker.core.metrics import Metrics
from worker.core.views import ProcessView
from worker.runtime.httpguard import GuardedSite, allowed_hosts, host_guard, one_request
from worker.runtime.preflight import bind_health, bind_listeners

log = structlog.get_logger("worker.health")

#: Event-loop lag above which the process is reported not live.
MAX_LOOP_LAG_S = 5.0


class HealthServer(Component):
    """Serves the probes; measures event-loop lag once a second."""

    def __init__(
        self,
        process: ProcessView,
        metrics: Metrics,
        clock: Clock,
        *,
        host: str,
        port: int,
        bind_and_listen: bool = True,
        strict: bool = True,
        allowed: str = "",
    ) -> None:
        """Binds the socket at once (like ``socketserver.TCPServer``); raises
        :class:`~worker.core.errors.ConfigError` when it cannot. Not ``strict`` (the default port,
        not configured): a taken port moves to the next free one, logged; :attr:`port` is the
        port bound. ``allowed``: extra ``Host`` names served (comma-separated, ``*``: any)."""
        super().__init__("health-server", clock, sla_s=30.0)
        self.process = process
        self.metrics_ = metrics
        self.host = host
        self.port = port
        self.allowed = allowed_hosts(allowed, host)
        self.loop_lag_s = 0.0
        self._sockets: list[socket.socket] = []
        if bind_and_listen:
            self._sockets, self.port = bind_health(host, port, strict=strict)
            if self.port != port:
                log.warning(
                    f"health port {port} is in use (another local worker?); serving the probes "
                    f"on {self.port}. Set WORKER_HEALTH_PORT to choose it.",
                    port=self.port,
                )

    def build_app(self) -> web.Application:
        # probes and scrapes hold no data a page could steal, and a Service-name scrape must
        # not break by default: only /status (this process's details) checks the Host
        probes = ("/healthz", "/readyz", "/metrics")
        guard = host_guard(self.allowed, open_paths=probes)
        app = web.Application(middlewares=[one_request, guard])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/status", self.status)
        return app

    async def run(self, stop: asyncio.Event) -> None:
        # the sockets bound at start-up; a restart after a failure binds again
        sockets, self._sockets = self._sockets or bind_listeners(self.host, self.port), []
        runner = web.AppRunner(self.build_app(), access_log=None)
        try:
            await runner.setup()
            for sock in sockets:
                await GuardedSite(runner, sock, what="health server").start()
            log.info("health server listening", host=self.host, port=self.port)
            while not stop.is_set():
                before = self.clock.monotonic()
                await self.clock.sleep(1.0)
                self.loop_lag_s = max(0.0, self.clock.monotonic() - before - 1.0)
                self.health.ok(self.clock.monotonic())
        finally:
            await runner.cleanup()
            for sock in sockets:
                sock.close()

    # -- handlers -----------------------------------------------------------------------------
    def liveness(self, components: dict[str, dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
        overdue = sorted(n for n, h in components.items() if h["overdue"])
        live = not overdue and self.loop_lag_s < MAX_LOOP_LAG_S
        return live, {
            "status": "ok" if live else "failing",
            "overdue": overdue,
            "loop_lag_s": round(self.loop_lag_s, 4),
            "unready": self.process.unready_reasons(),  # shown here, judged by /readyz only
            "warnings": self.process.warnings(),
        }

    async def healthz(self, _: web.Request) -> web.Response:
        live, body = self.liveness(self.process.component_health())
        return web.json_response(body, status=200 if live else 503)

    async def readyz(self, _: web.Request) -> web.Response:
        unready = self.process.unready_reasons()
        ready = self.process.ready and not unready
        body = {
            "ready": ready,
            "shutting_down": self.process.shutting_down,
            "unready": unready,
            "warnings": self.process.warnings(),
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(self, _: web.Request) -> web.Response:
        m = self.metrics_
        m.ready.set(1 if self.process.ready and not self.process.unready_reasons() else 0)
        for name, h in self.process.component_health().items():
            if h["seconds_since_ok"] is not None:
                m.since_ok.labels(name).set(h["seconds_since_ok"])
        body = generate_latest(m.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(self, _: web.Request) -> web.Response:
        components = self.process.component_health()
        live, probe = self.liveness(components)
        return web.json_response(
            {
                **self.process.identity(),
                "live": live,
                "probe": probe,
                **self.process.describe(),
                "components": components,
            }
        )
