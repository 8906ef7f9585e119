"""The instance registry (heartbeats), data-loss detection, and orphan recovery.

Every process registers itself (id, app name, role, name, host, pid, version, components, start
time, last heartbeat) in a record that expires at about 2.5 times :data:`RECORD_EVERY_S`, and
deletes it on clean exit. Between two writes of the record a beat only moves the heartbeat score
(one ``ZADD XX``: the idle cost of a fleet); a beat that finds the score gone (reaped, or Redis
lost its data) writes the whole record at once. A sorted set of last-heartbeat times outlives
the records: the leader's orphan reaper (:mod:`worker.duties.reaper`) looks there for consumers
whose
heartbeat is stale and makes the jobs they held available again (arq alone would wait for its
in-progress key to expire, 310 s by default). A live peer's jobs are never touched: reaping is
guarded by the heartbeat score. Scores are the Redis server's clock (``TIME`` in the heartbeat's
script) and the reaper judges them on that clock, so no host's clock moves the verdict (a leader
30 s fast judged every live instance stale). Silence is evidence only while Redis accepts this
process's own writes (:class:`WriteWitness`): under ``maxmemory`` (every heartbeat refused, the
reaper's script not), a failover or an outage, the reaper reaps nobody.

Each record also carries this host's clock offset to the Redis server, measured on the previous
heartbeat: the server's ``TIME`` read in the heartbeat's own transaction minus the midpoint of
the local wall clock before and after it (``clock_offset_ms``), exact to within half the round
trip (``clock_rtt_ms`` / 2). ``doctor`` fails an instance whose offset is above its limit: the
process's own code (jobs, services) reads that host's clock. Ticks, due times and poll items are
on the Redis server's clock, which the same ``TIME`` reply keeps in sync (see
:class:`~worker.core.clock.RedisClock`).

The heartbeat also watches the dataset's boot marker (read when the record and the score were
both gone, so a steady beat pays nothing for it): a process that saw one marker and then finds
another (or none) knows Redis lost its data and says so loudly, once per loss.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import structlog

from worker.core.clock import Clock, RedisClock, host_clock, ms
from worker.core.component import LoopComponent
from worker.core.metrics import Metrics
from worker.core.views import ProcessView
from worker.storage.store import Store
from worker.version import __version__

log = structlog.get_logger("worker.registry")

#: The heartbeat writes its whole record (whose reply carries the server's ``TIME``: a new
#: sample of the process's copy of the server's clock, and of the host's offset) when the copy
#: is this old; between, a beat only moves its score (to the server's ``TIME`` where the write
#: lands, ``registry.TOUCH``).
CLOCK_SYNC_S = 60.0
#: The whole record (what ``status`` and the console show of an instance) is written at least
#: this often (every 5 beats when that is sooner, every beat when one is longer; it expires
#: after 2.5 such periods: what ``doctor`` reads as gone), and at the next beat when
#: what it says changed; the beats in between only move the heartbeat score, one command each.
RECORD_EVERY_S = 20.0
#: A beat (or a reaper's look) this late counts as a stall of this process: the orphan reaper
#: gives silent peers that much more (:meth:`WriteWitness.stall_s`).
STALL_MIN_S = 0.1
#: A host wall clock that moved this much more or less than its monotonic clock since the last
#: ``TIME`` read jumped: the next beat reads ``TIME`` again (the offset ``doctor`` judges).
CLOCK_JUMP_S = 0.5
#: What changes on every beat in a process's description (:meth:`ProcessView.describe`) without
#: saying anything new: a change in anything else (leadership, readiness, jobs in flight,
#: components' health) writes the whole record at the next beat.
VOLATILE = frozenset({"uptime_s", "lease_age_s"})


@dataclass
class WriteWitness:
    """Since when this process's heartbeat writes have been accepted without a break: the
    orphan reaper's evidence that Redis takes writes, so a silent peer is silent and not
    refused (``maxmemory``), cut off with everyone (an outage) or mid-failover.

    ``ok_since`` (monotonic) is ``None`` after a failed write; a gap longer than ``max_gap_s``
    between two accepted writes (the heartbeat hung, the process froze) starts it again.
    It also remembers how late this process's own beats came (:meth:`stall_s`): the reaper
    gives a silent peer that much more, whether or not it led when the stall happened."""

    max_gap_s: float = float("inf")
    ok_since: float | None = None
    last_ok: float | None = None
    #: the heartbeat's interval (set by it): a beat later than this after the last came late
    interval_s: float = 0.0
    #: (monotonic time, seconds late) of this process's late beats, the newest last
    stalls: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))
    _failed: bool = False

    def ok(self, now: float) -> None:
        if self.last_ok is not None and self.interval_s and not self._failed:
            late = now - self.last_ok - self.interval_s
            if late >= STALL_MIN_S:
                self.stalls.append((now, late))
        if self.ok_since is None or self.last_ok is None or now - self.last_ok > self.max_gap_s:
            self.ok_since = now
        self.last_ok, self._failed = now, False

    def failed(self) -> None:
        self.ok_since = None
        self._failed = True

    def since(self, now: float) -> float | None:
        """When the current unbroken run of accepted writes began, or ``None`` if there is
        none (the last write failed, or none was accepted for ``max_gap_s``)."""
        if self.last_ok is None or now - self.last_ok > self.max_gap_s:
            return None
        return self.ok_since

    def stall_s(self, now: float, window_s: float) -> float:
        """How late this process's beats came within the last ``window_s``, the beat overdue
        now included (a process just thawed from a freeze has not beaten since): the
        longest."""
        while self.stalls and now - self.stalls[0][0] > window_s:
            self.stalls.popleft()
        late = max((s for _, s in self.stalls), default=0.0)
        if self.last_ok is not None and self.interval_s and not self._failed:
            late = max(late, now - self.last_ok - self.interval_s)
        return late if late >= STALL_MIN_S else 0.0


class Heartbeat(LoopComponent):
    """Registers this process and refreshes its record every ``interval_s``; tells the
    ``witness`` whether each write was accepted (the orphan reaper's evidence)."""

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
        witness: WriteWitness | None = None,
    ) -> None:
        super().__init__("heartbeat", clock, sla_s=max(10.0, interval_s * 5))
        #: the record's times and the offset are the host's clock (``doctor`` compares hosts);
        #: the ``TIME`` read in the same round trip keeps a :class:`RedisClock` in sync
        self.host, self.server_clock = host_clock(clock), clock
        self.witness = witness if witness is not None else WriteWitness()
        self.witness.max_gap_s = interval_s * 2 + 1
        self.witness.interval_s = interval_s
        self.max_backoff_s = interval_s  # back within an interval after an outage (see reaper)
        self.store = store
        self.process = process
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.metrics = metrics
        self.marker: str | None = None
        self.data_losses = 0
        #: how often the whole record is written; the monotonic time it last was
        self.record_every_s = max(min(RECORD_EVERY_S, 5 * interval_s), interval_s)
        self._recorded_at: float | None = None
        self._said: dict[str, Any] = {}
        #: when (monotonic) this heartbeat last read the server's TIME, and the host's wall
        #: clock minus its monotonic clock then (a jump of the wall clock shows against it)
        self._timed: tuple[float, float] | None = None
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
        try:
            await self._beat()
        except BaseException:
            self.witness.failed()
            raise
        self.witness.ok(self.clock.monotonic())
        return self.interval_s

    def _fresh(self, mono: float) -> bool:
        """Whether a beat may move the score only (``TOUCH``, no new clock sample): this
        process's copy of the server's clock was synced within :data:`CLOCK_SYNC_S`, this
        heartbeat measured the host's offset within it too (the first beat measures it), and
        the host's wall clock has not jumped since (it moved with the monotonic clock, within
        :data:`CLOCK_JUMP_S`): a jump is measured at the next beat, so ``doctor`` sees it
        within one interval."""
        clock, timed = self.server_clock, self._timed
        if not isinstance(clock, RedisClock) or clock.sample_age_s() >= CLOCK_SYNC_S:
            return False
        if timed is None or mono - timed[0] >= CLOCK_SYNC_S:
            return False
        return abs(self.host.time() - mono - timed[1]) < CLOCK_JUMP_S

    async def _beat(self) -> None:
        mono = self.clock.monotonic()
        fresh = self._fresh(mono)
        recorded, described = self._recorded_at, self.process.describe()
        said = {k: v for k, v in described.items() if k not in VOLATILE}
        said["clock_offset"] = self.clock_offset  # a new measurement is written at once
        # the record is recent and says what it would say now: move the score only (to the
        # server's clock where the write lands); the score gone (reaped, a data loss) -> the
        # whole beat below
        if (
            fresh
            and recorded is not None
            and mono - recorded < self.record_every_s
            and said == self._said
            and await self.store.touch_heartbeat(self.instance_id)
        ):
            return
        await self._record(described, measure=not fresh)
        self._recorded_at, self._said = mono, said

    async def _record(self, described: dict[str, Any], *, measure: bool) -> None:
        """The whole beat: the record, the score and (when both were gone) the boot marker;
        ``measure``: the ``TIME`` it read is a new sample of the host's offset and of the
        process's copy of the server's clock (otherwise the record would say something new at
        every beat, and every beat would be a whole one)."""
        now = ms(self.host.time())
        record = {**self.static, **described, "heartbeat_ms": now}
        if self.clock_offset is not None:
            record["clock_offset_ms"], record["clock_rtt_ms"] = self.clock_offset
        before, sent = self.host.time(), self.clock.monotonic()
        # the score is the server's clock (HEARTBEAT): the reaper judges silence on it. Read
        # with TIME in the script where the write lands: a score dated here would be as old
        # as the wait before it reached the server (a starved process, a connection still
        # being made), and a live process would look silent that long. The boot marker
        # comes back when the record and the score were both gone.
        clock = self.server_clock
        beat = await self.store.heartbeat(
            self.instance_id,
            record,
            ms(self.record_every_s * 2.5),
            None,
            boot=f"{uuid4().hex}:{now}",
        )
        after, received = self.host.time(), self.clock.monotonic()
        if beat.server_ms is not None and measure:
            rtt = (after - before) * 1000
            offset = round(beat.server_ms - (before + after) * 500, 1)
            self.clock_offset = (offset, round(rtt, 1))
            self._timed = (received, (before + after) / 2 - (sent + received) / 2)
            if isinstance(clock, RedisClock):
                clock.observe(beat.server_ms, sent, received)
        if beat.boot is not None:
            self._saw_marker(*beat.boot)

    async def check_boot_marker(self, now_ms: int) -> bool:
        """Read (or create) the boot marker; ``True`` if it changed since the last look."""
        return self._saw_marker(*await self.store.boot_marker(f"{uuid4().hex}:{now_ms}"))

    def _saw_marker(self, marker: str, created: bool) -> bool:
        """The boot marker read now; ``True`` (logged, counted) if it is not the one seen
        before: Redis lost its data."""
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
                "Queued jobs, schedule state and results written before were lost; jobs on a "
                "schedule continue from the next tick and the next leader's epoch stays above "
                "every epoch seen before.",
                marker_recreated=created,
            )
        return lost

    async def deregister(self) -> None:
        """Remove this instance's records (clean exit)."""
        await self.store.deregister(self.instance_id)
