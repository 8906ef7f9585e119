"""The instance registry (heartbeats), data-loss detection, and orphan recovery.

Every process registers itself (id, app name, role, name, host, pid, version, components, start
time, last heartbeat) in a record that expires at about twice the heartbeat interval, and
deletes it on clean exit. A sorted set of last-heartbeat times outlives the records: the
leader's :class:`OrphanReaper` looks there for consumers whose heartbeat is stale and makes the
jobs they held available again (arq alone would wait for its in-progress key to expire, 310 s
by default). A live peer's jobs are never touched: reaping is guarded by the heartbeat score
(seed 004 #1).

Each record also carries this host's clock offset to the Redis server, measured on the previous
heartbeat: the server's ``TIME`` read in the heartbeat's own transaction minus the midpoint of
the local wall clock before and after it (``clock_offset_ms``), exact to within half the round
trip (``clock_rtt_ms`` / 2). ``doctor`` compares the offsets of all instances: clock skew
between hosts can make the orphan reaper judge a live consumer stale (ticks, due times and poll
items are on the Redis server's clock, which the same ``TIME`` reply keeps in sync: see
:class:`~worker.clock.RedisClock`).

The heartbeat also watches the dataset's boot marker: a process that saw one marker and then
finds another (or none) knows Redis lost its data (a restart without persistence, a failover
to a replica that missed writes, a FLUSHALL) and says so loudly, once per loss.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from uuid import uuid4

import structlog

from worker.clock import Clock, RedisClock, host_clock, ms
from worker.component import LoopComponent
from worker.keys import DEFAULT_QUEUE
from worker.metrics import Metrics
from worker.store import FencedStore, Store
from worker.version import __version__
from worker.views import ProcessView

log = structlog.get_logger("worker.registry")


class Heartbeat(LoopComponent):
    """Registers this process and refreshes its record every ``interval_s``."""

    def __init__(
        self,
        store: Store,
        process: ProcessView,
        clock: Clock,
        *,
        instance_id: str,
        instance_name: str,
        role: str,
        interval_s: float,
        metrics: Metrics | None = None,
        app: str | None = None,
    ) -> None:
        super().__init__("heartbeat", clock, sla_s=max(10.0, interval_s * 5))
        #: the record's times and the offset are the host's clock (``doctor`` compares hosts);
        #: the ``TIME`` read in the same round trip keeps a :class:`RedisClock` in sync
        self.host, self.server_clock = host_clock(clock), clock
        self.max_backoff_s = interval_s  # back within an interval after an outage (see reaper)
        self.store = store
        self.process = process
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.metrics = metrics
        self.marker: str | None = None
        self.data_losses = 0
        #: (offset of the server's clock to ours, round trip), both ms, from the last heartbeat
        self.clock_offset: tuple[float, float] | None = None
        self.static = {
            "id": instance_id,
            "app": app,  # App.name: start-up refuses a prefix live instances of another app use
            "name": instance_name,
            "role": role,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "started_ms": ms(self.host.time()),
        }

    async def tick(self) -> float:
        now = ms(self.host.time())
        await self.check_boot_marker(now)
        record = {**self.static, **self.process.describe(), "heartbeat_ms": now}
        if self.clock_offset is not None:
            record["clock_offset_ms"], record["clock_rtt_ms"] = self.clock_offset
        before, sent = self.host.time(), self.clock.monotonic()
        server_ms = await self.store.heartbeat(
            self.instance_id, record, ms(self.interval_s * 2.5), now
        )
        after, received = self.host.time(), self.clock.monotonic()
        rtt = (after - before) * 1000
        self.clock_offset = (round(server_ms - (before + after) * 500, 1), round(rtt, 1))
        if isinstance(self.server_clock, RedisClock):
            self.server_clock.observe(server_ms, sent, received)
        return self.interval_s

    async def check_boot_marker(self, now_ms: int) -> bool:
        """Read (or create) the boot marker; ``True`` if it changed since the last look."""
        marker, created = await self.store.boot_marker(f"{uuid4().hex}:{now_ms}")
        lost = self.marker is not None and marker != self.marker
        self.marker = marker
        if lost:
            self.data_losses += 1
            self.health.extra["data_losses"] = self.data_losses
            if self.metrics is not None:
                self.metrics.data_loss.inc()
            log.error(
                "REDIS LOST ITS DATA: the boot marker this process saw is gone (a restart "
                "without persistence, a failover to a replica that missed writes, a FLUSHALL). "
                "Queued jobs, schedule state and results written before were lost; periodic "
                "jobs continue from the next tick and the next leader's epoch stays above "
                "every epoch seen before.",
                marker_recreated=created,
            )
        return lost

    async def deregister(self) -> None:
        """Remove this instance's records (clean exit)."""
        await self.store.deregister(self.instance_id)


class OrphanReaper(LoopComponent):
    """Leader-only: re-queue the in-flight jobs of instances whose heartbeat is stale.

    Silence is judged only while this process itself could reach Redis: for ``stale_s`` after
    the reaper (re)starts — a new lease, a failed round trip — or after a gap in its own ticks
    (it was frozen, or its calls hung through a failover), it reaps nobody. A Redis outage or
    a primary failover stops every heartbeat at once; reaping then would hand the jobs of live
    consumers (whose finishes are on their way to the new primary) to others: a second run.
    """

    def __init__(
        self,
        store: FencedStore,
        clock: Clock,
        *,
        stale_s: float,
        interval_s: float,
        metrics: Metrics | None = None,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        settle_s: float | None = None,
    ) -> None:
        super().__init__("orphan-reaper", clock, sla_s=max(30.0, interval_s * 10))
        #: Redis must have been reachable this long (default ``stale_s``) before anyone is
        #: judged stale (see the class docstring).
        self.settle_s = stale_s if settle_s is None else settle_s
        self._reachable_since = clock.monotonic()
        self._last_tick: float | None = None
        self.store = store
        self.queues = list(queues)
        self.stale_s = stale_s
        self.interval_s = interval_s
        self.metrics = metrics

    async def setup(self) -> None:
        self._reachable_since = self.clock.monotonic()
        self._last_tick = None

    async def tick(self) -> float:
        now = self.clock.monotonic()
        if self._last_tick is not None and now - self._last_tick > self.interval_s * 2 + 1:
            # This process was frozen, or its Redis calls hung (a failover): the others may
            # have been cut off just as long. Silence counts only from now.
            self._reachable_since = now
        cutoff = ms(self.clock.time() - self.stale_s)
        stale_instances = await self.store.store.stale_instances(cutoff)
        self._last_tick = self.clock.monotonic()
        if self._last_tick - self._reachable_since < self.settle_s:
            return self.interval_s  # too soon after a (re)start or an outage to judge anyone
        for stale in stale_instances:
            released = await self.store.reap(
                stale.instance_id, stale.heartbeat_ms, ms(self.clock.time()), self.queues
            )
            if released is None:
                continue  # it heartbeated meanwhile
            if self.metrics is not None:
                self.metrics.orphans.inc(released)
            log.warning(
                "stale instance reaped",
                instance=stale.instance_id,
                jobs_released=released,
                silent_for_s=round((ms(self.clock.time()) - stale.heartbeat_ms) / 1000, 1),
            )
        return self.interval_s
