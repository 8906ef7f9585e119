"""The runtime: one worker process's lifecycle — connect, start, signals, ordered shutdown.

What runs in which role is data in :mod:`worker.runtime.roles`; this module only connects, hands the
dependencies to :func:`worker.runtime.roles.build`, starts the groups and stops them in order. What
the process is doing is a :class:`~worker.runtime.state.ProcessState` the heartbeat and the health
server read.

Shutdown order: SIGTERM -> not ready -> drain delay -> stop singletons (each iteration is
atomic) -> stop campaigning, release the lease -> the consumer stops taking jobs and lets
in-flight jobs finish within the shutdown timeout -> deregister -> shutdown hooks -> close
Redis. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from uuid import uuid4

import structlog
from redis.asyncio import Redis

from worker import manifest
from worker.app import App
from worker.client import Client
from worker.consumer import Consumer
from worker.core.clock import Clock, RedisClock, ms, on_server_time
from worker.core.component import Component, Group
from worker.core.metrics import Metrics
from worker.core.redisurl import parse_redis_url
from worker.core.serializer import get_serializer
from worker.duties.registry import Heartbeat
from worker.runtime import local, roles
from worker.runtime.embedded import Stranded, embedded_socket
from worker.runtime.preflight import (
    check_app_identity,
    check_key_permissions,
    check_redis_contract,
)
from worker.runtime.state import ProcessState
from worker.settings import SHUTDOWN_DEREGISTER_S, Settings, mask_url
from worker.storage import Shards, Store, open_shards
from worker.storage import keys as K
from worker.storage.connection import connect_redis
from worker.storage.ready import wait_for_redis
from worker.storage.shards import shard_prefixes
from worker.tracing import tracing_for
from worker.version import __version__

log = structlog.get_logger("worker.runtime")

#: The loop watchdog acts within a few seconds or not at all (``watchdog.ACTION_TIMEOUT_S``).
WATCHDOG_SOCKET_TIMEOUT_S = 3.0


class Runtime:
    """One worker process: dependencies, components, signals, ordered shutdown."""

    def __init__(
        self,
        settings: Settings,
        app: App,
        *,
        redis_url: str,
        clock: Clock | None = None,
        burst: bool = False,
    ) -> None:
        """``burst``: the consumer runs what is due and the process exits (``run --burst``)."""
        self.settings = settings
        self.burst = burst
        self.app = app
        self.redis_url = redis_url
        self.target = parse_redis_url(
            redis_url,
            sentinel_username=settings.sentinel_username,
            sentinel_password=settings.sentinel_password,
        )
        #: the WAIT policy of every durable write this process makes
        self.replication = settings.replication()
        #: wall time is the Redis server's (synced on connect, then by every heartbeat)
        self.clock = clock or RedisClock()
        self.keys = K.Keys(settings.key_prefix)
        self.metrics = Metrics()
        view = self.replication.view
        self.metrics.durability_degraded.set_function(lambda: float(view.degraded))
        self.serializer = get_serializer(settings.serializer)  # once: pickle warns
        plan = roles.plan(settings.role, app, settings)
        self.state = ProcessState(
            settings,
            f"{settings.instance_name}-{uuid4().hex[:6]}",
            self.clock,
            plan.enabled,
            plan.disabled,
            started_at=self.clock.monotonic(),
        )
        self._stop = asyncio.Event()
        self._signals = 0
        self._signal_name = ""
        self._clients: list[Redis] = []
        self._announced: Path | None = None

    @property
    def instance_id(self) -> str:
        return self.state.instance_id

    # -- dependencies -------------------------------------------------------------------------
    def _connect(
        self,
        purpose: str,
        *,
        socket_timeout_s: float | None,
        max_connections: int | None = None,
        closed_here: bool = True,
        prefix: str | None = None,
    ) -> Redis:
        """A client of its own for ``purpose``; closed at shutdown unless ``closed_here`` is
        false (the watchdog's, made and closed in its thread's own event loop). ``prefix``: a
        queue shard's (on Redis Cluster the client reaches the primary of that shard's slot)."""
        client = connect_redis(
            self.target,
            queue_name=self.keys.queue if prefix is None else K.Keys(prefix).queue,
            socket_timeout_s=socket_timeout_s,
            max_connections=max_connections,
            client_name=f"{self.instance_id}:{purpose}",
        )
        if closed_here:
            self._clients.append(client)
        return client

    def _shards(self, purpose: str, home: Redis, socket_timeout_s: float | None) -> Shards:
        """The app's queue shards over ``home`` (one server, a Sentinel primary), or on Redis
        Cluster over ``home`` and a client of its own per other shard (its slot's primary)."""
        n = self.settings.queue_shards
        prefixes = shard_prefixes(self.keys.prefix, n)
        clients = [home] * n
        if self.target.kind == "cluster":
            for i, p in enumerate(prefixes[1:], 1):
                clients[i] = self._connect(
                    f"{purpose}:{i}", socket_timeout_s=socket_timeout_s, prefix=p
                )
        return Shards(open_shards(home, self.keys, self.replication, n, clients))

    def _build(self, redis: Redis, store: Store, shards: Shards) -> roles.Wiring:
        s = self.settings
        client = Client(
            redis,
            keys=self.keys,
            serialize=self.serializer[0],
            deserialize=self.serializer[1],
            app=self.app,
            clock=self.clock,
            store=store,
            shards=shards,
            origin=self.instance_id,
            tracing=tracing_for(s.tracing),
            max_broadcast_bytes=s.max_broadcast_bytes,
            max_payload_bytes=s.max_payload_bytes,
        )
        backoff = roles.restart_backoff(s)

        def lease_store() -> Store:
            # No client-side retries (a retried renew could land after the deadline we already
            # trusted) and short socket timeouts, for the same reason.
            timeout = s.leader_renew_deadline_s / 2
            lease = self._connect("lease", socket_timeout_s=timeout, max_connections=4)
            return store.with_redis(lease)

        def watchdog_store() -> Store:
            # its own client, made and closed in the watchdog's thread (its own event loop)
            client = self._connect(
                "watchdog",
                socket_timeout_s=WATCHDOG_SOCKET_TIMEOUT_S,
                max_connections=2,
                closed_here=False,
            )
            return store.with_redis(client)

        w = roles.Wiring(
            settings=s,
            app=self.app,
            instance_id=self.instance_id,
            clock=self.clock,
            metrics=self.metrics,
            serializer=self.serializer,
            redis=redis,
            client=client,
            process=self.state,
            consumer_shards=lambda: self._shards(
                "consumer", self._connect("consumer", socket_timeout_s=None), None
            ),
            # blocking reads wait BLOCK_MS; a dead peer is noticed at the socket timeout
            broadcast_redis=lambda: self._connect("broadcast", socket_timeout_s=10),
            leader_store=lease_store,
            watchdog_store=watchdog_store,
            singletons=Group("singletons", [], backoff=backoff, on_restart=self._count_restart),
            burst=self.burst,
        )
        built = roles.build(w)
        for name in roles.GROUP_ORDER:
            self.state.groups[name] = (
                w.singletons
                if name == "singletons"
                else Group(name, built[name], backoff=backoff, on_restart=self._count_restart)
            )
        self.state.lease = w.leadership
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
        self.state.ready = False
        self.state.shutting_down = True
        self.metrics.ready.set(0)
        log.info("shutdown requested; not ready", signal=signame)
        self._stop.set()

    async def run(self) -> int:
        """Run until a signal asks to stop; return the process exit code."""
        s = self.settings
        redis = self._connect("main", socket_timeout_s=30)
        try:
            await wait_for_redis(redis, self.redis_url, s.redis_connect_timeout_s, self.clock)
            for warning in await check_redis_contract(redis, s, self.replication):
                log.warning(warning)
            shards = self._shards("main", redis, 30)  # the app's queue shards, home first
            store = shards.home  # the process's store: every key but the other shards' queues
            for shard in shards.stores:
                await check_key_permissions(shard)
            await on_server_time(self.clock, store.server_time_ms)
            await check_app_identity(store, self.app.name)
            w = self._build(redis, store, shards)
            # what admin commands describe (``status`` without ``--app``)
            written = ms(self.clock.time())
            await store.write_manifest(self.app.name, manifest.dumps(self.app, written_ms=written))
            self._announce()
            self.metrics.info.labels(s.role, s.instance_name, __version__).set(1)
            log.info(
                "worker starting",
                app=self.app.name,
                instance_id=self.instance_id,
                redis=mask_url(self.redis_url),
                wait_replicas=self.replication.replicas,
                enabled=self.state.enabled,
                disabled=self.state.disabled,
            )
            for hook in self.app.startup_hooks:
                await hook(w.context)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_shutdown, sig.name)
            for name in ("infra", "work", "leadership"):
                self.state.groups[name].start()  # LeaderWork starts the singletons on election
            self.state.ready = True
            self.metrics.ready.set(1)
            consumer = self.state.component("consumer")
            if self.burst and isinstance(consumer, Consumer):
                return await self._burst(w, consumer)
            if await self._stranded():
                return 1
            await self._shutdown(w)
            return 0
        finally:
            local.withdraw(self._announced)
            for c in self._clients:
                await c.aclose(close_connection_pool=True)

    async def _stranded(self) -> bool:
        """Wait for a stop request; ``True`` (after one error line) if, first, the embedded
        server named by ``WORKER_REDIS_URL`` went away with the worker that started it (its
        socket file is gone): its data went with it, so nothing is left to drain or release,
        and retrying would only repeat connection errors. The first warning or error logged
        once the socket is gone says so at once (:class:`~worker.runtime.embedded.Stranded`): that
        line and everything after it is dropped but the one. Any other Redis is waited for."""
        socket_file = embedded_socket(self.settings.redis_url)
        if socket_file is None:
            await self._stop.wait()
            return False
        loop, gone = asyncio.get_running_loop(), asyncio.Event()
        quiet = Stranded(socket_file, lambda: loop.call_soon_threadsafe(gone.set))
        quiet.install()
        while not self._stop.is_set():
            if gone.is_set() or not socket_file.exists():
                with quiet.saying():
                    log.error(
                        "the embedded Redis this worker used is gone (its socket was removed "
                        "when the worker that started it stopped); exiting: start a new --role "
                        "all, or point WORKER_REDIS_URL at a lasting Redis",
                        redis=mask_url(self.redis_url),
                    )
                return True
            await self.clock.wait((self._stop, gone), 1.0)
        return False

    def _announce(self) -> None:
        """Tell this host's admin commands about this process (``python -m worker health``
        finds the port it bound; see :mod:`worker.runtime.local`)."""
        s, health = self.settings, self.state.component("health-server")
        self._announced = local.announce(
            "worker",
            {
                "instance": s.instance_name,
                "instance_id": self.instance_id,
                "role": s.role,
                "app": self.app.name,
                "health_host": s.health_host,
                "health_port": getattr(health, "port", None),
            },
        )

    async def _burst(self, w: roles.Wiring, consumer: Consumer) -> int:
        """Until the consumer found nothing due (or a signal); exit 1 if a job failed."""
        emptied = asyncio.create_task(consumer.emptied.wait())
        stopped = asyncio.create_task(self._stop.wait())
        await asyncio.wait((emptied, stopped), return_when=asyncio.FIRST_COMPLETED)
        emptied.cancel()
        stopped.cancel()
        if consumer.emptied.is_set() and not self._stop.is_set():
            log.info("burst: no job is due; stopping", **consumer.totals)
            self.request_shutdown("burst")
        await self._shutdown(w)
        return 1 if consumer.totals["failed"] else 0

    async def _shutdown(self, w: roles.Wiring) -> None:
        """The ordered shutdown, within ``Settings.worst_case_shutdown_s``: an unreachable
        Redis (frozen, partitioned) must not hold the process past the bound a container's
        grace period is sized for; the steps that did not finish are logged and skipped (the
        lease expires, the orphan reaper re-queues held jobs, the heartbeat record ages)."""
        s = self.settings
        if self._signal_name == "SIGTERM" and s.drain_delay_s:
            log.info("drain delay", seconds=s.drain_delay_s)
            await self.clock.sleep(s.drain_delay_s)
        bound_s = s.worst_case_shutdown_s() - s.drain_delay_s
        try:
            await self.clock.wait_for(self._stop_in_order(w), bound_s)
        except TimeoutError:
            log.error(
                "shutdown overran its bound; exiting without the remaining steps "
                "(is Redis reachable?)",
                bound_s=round(s.worst_case_shutdown_s(), 1),
            )
            return
        log.info("worker stopped")

    async def _stop_in_order(self, w: roles.Wiring) -> None:
        s, groups = self.settings, self.state.groups
        if w.leadership is not None:
            # Singletons first; then stop campaigning/renewing, then release: a renew or
            # campaign racing the release could otherwise win the lease back for a dying process.
            await w.leadership.retire()
            await groups["leadership"].stop(2.0)
            await w.leadership.release()
        await groups["work"].stop(s.shutdown_timeout_s + 5)
        w.context.threads.close()  # the consumer has drained: no plain def job starts again
        await self._deregister()
        for hook in self.app.shutdown_hooks:
            try:
                await hook(w.context)
            except Exception as exc:
                log.error(
                    "shutdown hook failed", hook=getattr(hook, "__name__", "?"), error=str(exc)
                )
        await groups["infra"].stop(2.0)
        # Again, now that the heartbeat has stopped: a heartbeat write in flight during the
        # first deregistration (sent after its boot-marker round trip) could re-add the record.
        await self._deregister()

    async def _deregister(self) -> None:
        heartbeat = self.state.component("heartbeat")
        if isinstance(heartbeat, Heartbeat):
            try:
                await self.clock.wait_for(heartbeat.deregister(), SHUTDOWN_DEREGISTER_S)
            except Exception as exc:
                log.warning("deregistration failed", error=str(exc))
