"""The consumer component: runs the app's jobs from the queue, in every role — arq's records,
our loop, assembled from its parts.

Job records, keys and results are arq's own (a plain arq client enqueues work, ``arq.jobs.Job``
reads statuses and results, and arq's ``Worker`` can consume the same queue during a rollout),
but the loop is the framework's, for what arq's ``Worker`` cannot give:

- **batched**: one script claims a batch of due jobs and one finishes every run that ended
  since the last round: a few Redis commands per job, not seventeen (:mod:`.fetch`,
  :mod:`.completer`);
- **claims are fenced**: a run finishes only while its marker still holds its claim token; a
  paused or cut-off consumer *knows* it may have lost its claims, holds every job at its next
  step until they are confirmed and cancels the ones taken over (:mod:`.claims`, :mod:`.guard`);
- **a blocked event loop** (a task calling ``time.sleep``) does not leave finished runs
  unrecorded: the loop watchdog's thread sends their ``FINISH`` meanwhile
  (:meth:`Consumer.loop_blocked`);
- **draining** stops claiming first, then waits for every job that started (up to the shutdown
  timeout) — no job that started is cut short by a graceful stop within that time;
- **hostile records** are dead-lettered one by one (:mod:`.envelope`); the loop never crashes;
- **durable under a failover** (with a WAIT policy): a batch runs only once the replicas
  confirmed its claim; ends the replicas did not confirm are sent again, same tokens, until
  they are; a claim whose reply was lost is given back before claiming again;
- **features hook in** (:class:`worker.core.jobdefs.JobHook`: limits, periodic results, poll items),
  registered by the wiring; the consumer knows none of them.

One job's run is :mod:`.executor`'s; wake-ups are :mod:`.wakeups`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import Sequence

import structlog
from redis.exceptions import RedisError

from worker.consumer.claims import Claims, Run
from worker.consumer.completer import Completer
from worker.consumer.config import FINAL_FLUSH_S, HEALTH_EVERY_S, SUMMARY_EVERY_S, ConsumerConfig
from worker.consumer.dead import DeadLetters
from worker.consumer.executor import Executor
from worker.consumer.fetch import Fetcher
from worker.consumer.wakeups import Wakeups
from worker.context import Context
from worker.core.clock import Clock, ms
from worker.core.component import Component
from worker.core.jobdefs import JobDef, JobHook, with_lanes
from worker.core.metrics import Metrics
from worker.core.serializer import Deserialize, Serialize
from worker.storage.sharded import Shards
from worker.storage.store import Store

log = structlog.get_logger("worker.consumer")


class Consumer(Component):
    """Claims, runs and finishes jobs until stopped, then drains (see module docstring)."""

    def __init__(
        self,
        jobs: Sequence[JobDef],
        hooks: Sequence[JobHook],
        context: Context,
        store: Store | Shards,
        serializer: tuple[Serialize, Deserialize],
        clock: Clock,
        *,
        instance_id: str,
        config: ConsumerConfig,
        dead: DeadLetters,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__("consumer", clock, sla_s=60.0)
        self.jobs = {j.name: j for j in jobs}
        self.hooks = list(hooks)
        #: the app's queue shards (``WORKER_QUEUE_SHARDS``): claimed from in turn, each job
        #: finished in its own; the home store has the rest (health, heartbeat-side keys)
        self.shards = shards = store if isinstance(store, Shards) else Shards([store])
        self.store = shards.home
        self.instance_id = instance_id
        self.config = config
        timeouts = [j.timeout_s or config.job_timeout_s for j in jobs] or [config.job_timeout_s]
        self.totals = {"complete": 0, "failed": 0, "retried": 0, "lost": 0}
        self.claims = Claims(
            shards,
            clock,
            self.hooks,
            instance_id=instance_id,
            doubt_s=config.doubt_s,
            queues=with_lanes(config.queues),
        )
        self.guard = self.claims.guard
        self.completer = Completer(
            shards, clock, self.claims.running, self.guard, self.totals,
            instance_id=instance_id, metrics=metrics, retention=config.retention,
        )  # fmt: skip
        self.executor = Executor(
            jobs, self.hooks, context, shards, serializer, clock, self.guard, self.completer,
            instance_id=instance_id, config=config, dead=dead, metrics=metrics,
        )  # fmt: skip
        self.wakeups = Wakeups(  # room: the fetcher's free slots (it is built next)
            shards,
            clock,
            room=lambda: self.fetch.shared_free() > 0,
            duty_room=lambda: self.fetch.shared_free() > 0 or self.fetch.duty_free() > 0,
        )
        self.fetch = Fetcher(
            shards, clock, self.claims, self.completer, self.executor, self.wakeups,
            instance_id=instance_id, config=config, in_progress_ttl_ms=ms(max(timeouts) + 10),
        )  # fmt: skip
        self._summary_at = clock.monotonic()
        self._summary_totals = dict(self.totals)
        self._health_at = -HEALTH_EVERY_S
        #: the last "cannot reach Redis" line (monotonic) and the failed rounds since
        self._warned_at, self._retries = -1.0, 0
        #: Burst mode: set once the queues had nothing due and nothing ran (then it drains).
        self.emptied = asyncio.Event()

    @property
    def running(self) -> dict[str, Run]:
        """The runs in progress, by job id."""
        return self.claims.running

    @property
    def in_flight(self) -> int:
        return len(self.claims.running)

    # -- the loop -----------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        if not self.jobs:
            raise RuntimeError("the app registers no tasks nor jobs on a schedule")
        done = asyncio.Event()  # the claim checker outlives `stop`: it serves the drain too
        checker = asyncio.create_task(self.claims.check(done), name="consumer:claims")
        listener = asyncio.create_task(self.wakeups.listen(stop), name="consumer:wake")
        fetch, completer = self.fetch, self.completer
        backoff = 0.0
        try:
            while not stop.is_set():
                self.wakeups.event.clear()
                try:
                    claimed = await fetch.claim_round() if await fetch.should_claim() else 0
                    self._count_figures()
                    if completer.pending:
                        await completer.flush()
                    now = self.clock.monotonic()
                    self.health.ok(now)
                    await self._housekeeping(now)
                    backoff = 0.0
                    if self.config.burst and not claimed and await fetch.nothing_left():
                        self.emptied.set()
                        break
                except (RedisError, OSError, TimeoutError) as exc:
                    # Redis away: running jobs go on (their ends are written later); no new
                    # work; liveness fails once this lasts longer than the SLA.
                    backoff = min(max(backoff * 2, 0.1), 2.0)
                    self._unreachable(exc, backoff)
                    await self.clock.wait(stop, backoff)
                    continue
                await self.clock.wait((stop, self.wakeups.event), fetch.next_delay(claimed))
        finally:
            listener.cancel()
            try:
                await self._drain()
            finally:
                done.set()
                checker.cancel()
                await asyncio.gather(checker, listener, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await self.store.clear_health(self.instance_id)

    def _count_figures(self) -> None:
        """The runs' figures noted since the last round, into the metrics (once a round)."""
        if self.executor.figures is not None:
            self.executor.figures.apply()

    def _unreachable(self, exc: BaseException, backoff: float) -> None:
        """One warning line per failed round, at most one a second (the retries between are
        counted in the next line): a lost wake-up subscription makes the consumer look at
        once, so the first retries come fast."""
        now = self.clock.monotonic()
        self._retries += 1
        if now - self._warned_at < 1.0:
            return
        log.warning(
            "consumer cannot reach Redis; retrying",
            error=f"{type(exc).__name__}: {exc}",
            retry_in_s=backoff,
            retries=self._retries,
        )
        self._warned_at, self._retries = now, 0

    async def loop_blocked(self, store: Store, lag_s: float) -> None:
        """Called by the loop watchdog, in its thread, while the event loop is blocked: record
        the ends of the runs that finished before the block (:meth:`Completer.loop_blocked`)."""
        # the watchdog's one connection serves every shard on one server; on a Cluster the
        # other shards' ends fail here and wait for the loop (sent again, same tokens)
        await self.completer.loop_blocked(
            self.shards.with_clients([store.redis] * self.shards.n), lag_s
        )

    async def _drain(self) -> None:
        """Stop claiming (the loop has ended); wait up to the shutdown timeout for every job that
        started, writing their ends as they come; cancel the rest (they run again)."""
        timeout = self.config.shutdown_timeout_s
        log.info("consumer draining", in_flight=self.in_flight, timeout_s=timeout)
        self.fetch.give_back_unconfirmed()
        completer, running = self.completer, self.claims.running
        deadline = self.clock.monotonic() + timeout
        while running and self.clock.monotonic() < deadline:
            tasks = [r.task for r in running.values() if r.task is not None]
            remaining = deadline - self.clock.monotonic()
            await asyncio.wait(tasks, timeout=max(0.0, min(0.5, remaining)))
            self._count_figures()
            await completer.flush_quietly()
        late = [r.task for r in running.values() if r.task is not None]
        if late:
            log.warning("shutdown timeout: cancelling jobs; they run again", cancelled=len(late))
            for t in late:
                t.cancel()
            await asyncio.wait(late, timeout=5)
        self._count_figures()
        # Ends not written (or not confirmed) yet: a few more tries, bounded (a Redis that is
        # away, or a failover in progress, must not hold the shutdown up).
        until = self.clock.monotonic() + FINAL_FLUSH_S
        while completer.pending and self.clock.monotonic() < until:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(completer.flush_quietly(), until - self.clock.monotonic())
            if completer.pending:
                await self.clock.sleep(0.3)
        if self.claims.in_doubt and self.clock.monotonic() < until:
            # a claim whose reply was lost just before the stop: give its jobs back now (a
            # process that deregisters is never reaped; they would wait for their markers)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.fetch.release_unknown(), until - self.clock.monotonic())

    # -- housekeeping -------------------------------------------------------------------------
    async def _housekeeping(self, now: float) -> None:
        self.health.extra.update(in_flight=self.in_flight, **self.totals)
        if now - self._summary_at >= SUMMARY_EVERY_S:
            self._summarize(now)
        if now - self._health_at >= HEALTH_EVERY_S:
            self._health_at = now
            t = self.totals
            at = dt.datetime.fromtimestamp(self.clock.time(), dt.UTC)
            text = (
                f"{at:%b-%d %H:%M:%S} j_complete={t['complete']} "
                f"j_failed={t['failed']} j_retried={t['retried']} j_ongoing={self.in_flight}"
            )
            with contextlib.suppress(Exception):
                await self.store.set_health(self.instance_id, text, ms(HEALTH_EVERY_S + 1))

    def _summarize(self, now: float) -> None:
        """One INFO line per minute with what the consumer did (per-job lines are DEBUG)."""
        delta = {k: v - self._summary_totals[k] for k, v in self.totals.items()}
        if any(delta.values()):
            log.info(
                "consumer summary",
                window_s=round(now - self._summary_at),
                in_flight=self.in_flight,
                **delta,
            )
        self._summary_totals = dict(self.totals)
        self._summary_at = now
