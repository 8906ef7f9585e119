"""Orphan recovery: the leader's :class:`OrphanReaper` re-queues the jobs of processes whose
heartbeat (:mod:`worker.duties.registry`) went stale, judged on the Redis server's clock and only
while this process's own writes are accepted (:class:`~worker.duties.registry.WriteWitness`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import structlog

from worker.core.clock import Clock, ms
from worker.core.component import LoopComponent
from worker.core.errors import LeadershipLost, ShardFenced
from worker.core.metrics import Metrics
from worker.duties.registry import STALL_MIN_S, WriteWitness
from worker.storage.keys import DEFAULT_QUEUE
from worker.storage.store import FencedStore, Store, same_store

log = structlog.get_logger("worker.registry")

#: The orphan reaper looks for stale instances at least this often (the heartbeat interval
#: when shorter): a dead consumer's jobs are due again within ``orphan_stale_s`` plus this.
REAP_EVERY_S = 2.0


class OrphanReaper(LoopComponent):
    """Leader-only: re-queue the in-flight jobs of instances whose heartbeat is stale.

    Staleness is judged on the Redis server's clock (the heartbeat scores are its ``TIME``).
    Silence is judged only while this process itself could write to Redis: for ``settle_s``
    after a gap in its own ticks (it was frozen, or its calls hung through a failover), after
    this process's own heartbeat last failed or stalled (the ``witness``: Redis at
    ``maxmemory`` refuses every heartbeat but still runs the reaper's script) or, without a
    witness, after the reaper (re)starts, it reaps nobody. An outage, a full Redis or a primary
    failover stops every heartbeat at once; reaping then would hand the jobs of live consumers
    (whose finishes are on their way) to others: a second run. A witness's unbroken run may
    predate the reaper's start: a standby elected because the leader died reaps the dead
    leader's jobs as soon as its heartbeat is stale, as any dead consumer's.

    A silent peer is given this process's own recent stall on top of ``stale_s``: when the
    reaper's own ticks or reads came late (a starved CPU, a slow Redis) within the last two
    stale bounds, its peers' heartbeats were most likely held up just as long, so a peer is
    judged only once it has been silent for ``stale_s`` plus the longest such stall (capped
    at ``stale_s``: a dead process is still reaped within twice the bound). A busy box costs a
    dead consumer's jobs a little latency instead of a live consumer's jobs a second run.
    """

    def __init__(
        self,
        store: Store,
        fenced: FencedStore,
        clock: Clock,
        *,
        stale_s: float,
        interval_s: float,
        metrics: Metrics | None = None,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        settle_s: float | None = None,
        witness: WriteWitness | None = None,
        shards: Sequence[FencedStore] = (),
    ) -> None:
        super().__init__("orphan-reaper", clock, sla_s=max(30.0, interval_s * 10))
        #: Redis must have been reachable this long (default ``stale_s``) before anyone is
        #: judged stale (see the class docstring).
        self.settle_s = stale_s if settle_s is None else settle_s
        self._reachable_since = clock.monotonic()
        self._last_tick: float | None = None
        self._holding_off = False
        #: reads (the lease, the server's clock, the heartbeats); the fenced store reaps
        self.store = same_store(store, fenced)
        self.fenced = fenced
        self.queues = list(queues)
        self.stale_s = stale_s
        self.interval_s = interval_s
        self.metrics = metrics
        self.witness = witness
        #: the queue shards other than home (``WORKER_QUEUE_SHARDS``), fenced by token
        self.shards = list(shards)
        #: shards whose fence is above this leadership's epoch though the lease is ours
        self._fenced_out: set[str] = set()
        #: this process's own recent stalls: (monotonic time, seconds late)
        self._stalls: deque[tuple[float, float]] = deque(maxlen=64)
        self._sparing = False

    def _stalled(self, at: float, late_s: float) -> None:
        """Note that this process was ``late_s`` late at ``at`` (ignored below 0.1 s)."""
        if late_s >= STALL_MIN_S:
            self._stalls.append((at, late_s))

    def slack_s(self, now: float) -> float:
        """The extra silence a peer is given: this process's longest stall within the last
        two stale bounds, at most ``stale_s`` — the reaper's own late looks, and the
        heartbeat's late beats (the witness: they go back before this leadership, and a beat
        overdue right now shows a freeze the reaper's first look just woke from)."""
        window = 2 * self.stale_s
        while self._stalls and now - self._stalls[0][0] > window:
            self._stalls.popleft()
        late = max((s for _, s in self._stalls), default=0.0)
        if self.witness is not None:
            late = max(late, self.witness.stall_s(now, window))
        return min(self.stale_s, late)

    async def setup(self) -> None:
        # With a witness, silence is judged from the unbroken run of this process's own
        # accepted heartbeat writes, which started before it led: a standby elected when the
        # leader died reaps the dead leader's jobs at once, within the same bound as any dead
        # consumer's (the lease's TTL is within it), not a settle time after its election.
        # Without one, from this start.
        self._reachable_since = -math.inf if self.witness else self.clock.monotonic()
        self._last_tick = None
        self._fenced_out.clear()
        self._stalls.clear()
        await self._raise_fences(self.shards)

    async def _raise_fences(self, shards: Sequence[FencedStore]) -> None:
        """Raise each shard's fence to the lease epoch (a new leader's first act in a shard;
        retried at every tick for a shard fenced out, so deleting the bad fence heals it)."""
        for shard in shards:
            try:
                await shard.raise_fence()
            except ShardFenced as exc:
                await self._fenced(shard, exc)
            else:
                if shard.keys.prefix in self._fenced_out:
                    self._fenced_out.discard(shard.keys.prefix)
                    log.info("queue shard no longer fenced out", shard=shard.keys.prefix)
        if self.metrics is not None:
            self.metrics.shard_fenced.set(len(self._fenced_out))

    async def _fenced(self, shard: FencedStore, exc: ShardFenced) -> None:
        """A shard refused this leadership's epoch. The lease gone at home too: a newer leader
        raised the fence, step down. The lease still ours: someone else wrote it; stepping
        down would only make leadership flap, so the shard is skipped (logged, counted in
        ``worker_queue_shards_fenced``, named by ``doctor``) until the fence is deleted."""
        lock = self.fenced.leader.lock
        held, _ = await self.store.read_lock()
        if lock is None or held != lock:
            self.fenced.leader.lost(f"fenced write refused: {exc}")
            raise LeadershipLost(str(exc)) from None
        prefix = shard.keys.prefix
        if prefix not in self._fenced_out:
            self._fenced_out.add(prefix)
            log.error(
                "queue shard fenced above this leadership; skipped",
                hint="the lease is ours at home: someone else wrote the fence; delete it "
                "(worker doctor names it)",
                shard=prefix,
                fence=exc.fence,
                epoch=lock.epoch,
            )

    def _writable_for(self, now: float) -> float | None:
        """Seconds this process has had Redis reachable and taking its writes (``None``: its
        own heartbeat is not being written)."""
        since = self._reachable_since
        if self.witness is not None:
            ok_since = self.witness.since(now)
            if ok_since is None:
                return None
            since = max(since, ok_since)
        return now - since

    async def tick(self) -> float:
        now = self.clock.monotonic()
        if self._last_tick is not None:
            if now - self._last_tick > self.interval_s * 2 + 1:
                # This process was frozen, or its Redis calls hung (a failover): the others
                # may have been cut off just as long. Silence counts only from now.
                self._reachable_since = now
            self._stalled(now, now - self._last_tick - self.interval_s)
        if self._fenced_out:
            await self._raise_fences([s for s in self.shards if s.keys.prefix in self._fenced_out])
        sent = self.clock.monotonic()
        server_ms = round(await self.store.server_time_ms())
        stale_instances = await self.store.stale_instances(server_ms - ms(self.stale_s))
        self._last_tick = self.clock.monotonic()
        self._stalled(self._last_tick, self._last_tick - sent)
        slack = self.slack_s(self._last_tick)
        if slack:
            spared = [
                s for s in stale_instances if s.heartbeat_ms > server_ms - ms(self.stale_s + slack)
            ]
            if spared and not self._sparing:
                log.info(
                    "orphan reaper gives silent instances this process's own recent stall "
                    "before judging them",
                    spared=len(spared),
                    stall_s=round(slack, 2),
                )
            self._sparing = bool(spared)
            stale_instances = [s for s in stale_instances if s not in spared]
        writable_s = self._writable_for(self._last_tick)
        if writable_s is None or writable_s < self.settle_s:
            # too soon after a (re)start, an outage or a refused heartbeat to judge anyone
            if stale_instances and writable_s is None and not self._holding_off:
                log.warning(
                    "orphan reaper holds off: this process's own heartbeat is not being "
                    "written (Redis refusing writes, unreachable or failing over), so silent "
                    "instances may be alive",
                    silent=len(stale_instances),
                )
                self._holding_off = True
            return self.interval_s
        self._holding_off = False
        for stale in stale_instances:
            released = await self.fenced.reap(
                stale.instance_id, stale.heartbeat_ms, server_ms, self.queues
            )
            if released is None:
                continue  # it heartbeated meanwhile
            for shard in self.shards:  # judged dead and forgotten at home: its shard claims
                if shard.keys.prefix in self._fenced_out:
                    continue
                try:
                    released += await shard.reap_shard(stale.instance_id, server_ms, self.queues)
                except ShardFenced as exc:
                    await self._fenced(shard, exc)
            if self.metrics is not None:
                self.metrics.orphans.inc(released)
            log.warning(
                "stale instance reaped",
                instance=stale.instance_id,
                jobs_released=released,
                silent_for_s=round((server_ms - stale.heartbeat_ms) / 1000, 1),
            )
        return self.interval_s
