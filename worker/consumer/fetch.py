"""The fetch loop's rounds: when to claim, one claim round, and how long to wait after it.

An idle consumer looks at the head of its queues (one command) unless a wake-up or an
announced due time says to claim; a busy one claims every ``poll_delay_s``. One ``CLAIM``
takes a batch (in-progress markers, try counters, payloads, the holds set for orphan
recovery). With a WAIT policy a batch whose claim the replicas did not confirm waits unstarted
(:attr:`Fetcher.unconfirmed`) until a later check confirms it with its claim tokens unchanged;
a claim round trip that failed marks the claims in doubt, given back before the next round.

Duty lanes (:data:`worker.core.jobdefs.DUTY_LANE`: the leader's ticks and poll jobs) come first
in every claim, and have slots of their own: ``duty_slots`` beside the ``concurrency`` shared
ones. A duty job takes a free duty slot first, else a shared one; a user job only a shared one.
While every shared slot is busy the loop claims nothing (no command), except when it took a
shard's duty marker (``<prefix>wakeup:duty``, :mod:`worker.consumer.wakeups`): then one claim of
that shard's lanes only, into the free duty slots, which passes the marker on when it fills
them. So a duty job waits for no user job, and the user's path sends nothing more.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import structlog
from redis.exceptions import RedisError

from worker.consumer.claims import Claims, Run
from worker.consumer.completer import Completer
from worker.consumer.config import MAX_CLAIM, RETRY_TTL_MS, ConsumerConfig
from worker.consumer.executor import Executor
from worker.consumer.wakeups import Wakeups
from worker.core.clock import Clock, ms
from worker.core.jobdefs import is_duty_lane, with_lanes
from worker.storage.claims import FOREIGN, Claimed
from worker.storage.jobs import Finish
from worker.storage.sharded import Shards
from worker.storage.store import Store

log = structlog.get_logger("worker.consumer")


class Fetcher:
    """Owns the batch held unconfirmed (:attr:`unconfirmed`, :attr:`unconfirmed_token`) and the
    claim tokens' numbering; starts each claimed job as a task in :attr:`Claims.running`."""

    def __init__(
        self,
        store: Shards,
        clock: Clock,
        claims: Claims,
        completer: Completer,
        executor: Executor,
        wakeups: Wakeups,
        *,
        instance_id: str,
        config: ConsumerConfig,
        in_progress_ttl_ms: int,
    ) -> None:
        self.store = store
        self.clock = clock
        self.claims = claims
        self.running = claims.running
        self.completer = completer
        self.executor = executor
        self.wakeups = wakeups
        self.instance_id = instance_id
        self.config = config
        self.in_progress_ttl_ms = in_progress_ttl_ms
        #: claimed, but the replicas have not confirmed the claim yet: not started (one batch)
        self.unconfirmed: list[Claimed] = []
        self.unconfirmed_token = ""
        self.unconfirmed_store = store.home  # the queue shard the held batch was claimed from
        self._seq = itertools.count(1)
        #: what the claims read, highest priority first: every queue's duty lane, then the queues
        self.queues = with_lanes(config.queues)
        self.lanes = self.queues[: len(config.queues)]
        #: runs of duty lane jobs in :attr:`running` (they fill the duty slots first)
        self.duty_running = 0
        self._lanes_looked = -1.0  # the last lanes-only look, a marker unreadable (monotonic)

    def shared_free(self) -> int:
        """Shared slots free: ``concurrency`` less the user runs and the duty runs beyond the
        duty slots."""
        c, duty = self.config, self.duty_running
        return c.concurrency - (len(self.running) - duty) - max(0, duty - c.duty_slots)

    def duty_free(self) -> int:
        """Duty slots free (only duty lane jobs may take them)."""
        return max(0, self.config.duty_slots - self.duty_running)

    def next_delay(self, claimed: int) -> float:
        """``poll_delay_s`` while busy; idle, until the next announced due time, at most
        ``idle_poll_max_s``, or ``idle_poll_subscribed_s`` while every wake marker is waited on
        (the fallback for jobs nobody announced while no leader announces them)."""
        c, w = self.config, self.wakeups
        if claimed or self.running or self.unconfirmed or self.completer.resend:
            return c.poll_delay_s
        idle = c.idle_poll_subscribed_s if w.subscribed else c.idle_poll_max_s
        delay = max(idle, c.poll_delay_s)
        if w.next_due is not None:
            delay = min(delay, max(0.0, (w.next_due - ms(self.clock.time())) / 1000))
        return delay

    async def should_claim(self) -> bool:
        """Claim when busy, woken by an enqueue, or an announced due time came; an idle
        consumer otherwise looks at the head of its queues only (one command each; the duty
        lanes too only while a wake marker cannot be read, or just after)."""
        now = ms(self.clock.time())
        w = self.wakeups
        if self.running or w.woken or self.unconfirmed or self.claims.in_doubt or self.config.burst:
            w.woken = False
            return True
        if w.next_due is not None and w.next_due <= now:
            w.next_due = None
            return True
        lanes = w.look_lanes or not w.subscribed  # lane jobs are announced: see Wakeups
        due = await self.store.queue_head(self.queues if lanes else self.config.queues)
        w.look_lanes = False
        if due is not None and due <= now:
            return True
        if due is not None:
            w.next_due = due if w.next_due is None else min(w.next_due, due)
        # a fair queue's flow keys hold jobs not moved yet (due or not: at worst an empty claim)
        return bool(self.config.fair) and await self.store.fair_waiting(self.config.fair)

    async def nothing_left(self) -> bool:
        """Burst mode: nothing runs, no end waits to be written, no job is due."""
        if self.running or self.completer.ended:
            return False
        if self.config.fair and await self.store.fair_waiting(self.config.fair):
            return False
        due = await self.store.queue_head(self.queues)
        return due is None or due > ms(self.clock.time())

    async def claim_round(self) -> int:
        """Claim and start a batch (or confirm the held one); how many jobs started. With
        queue shards, one claim per shard while there is room, starting one shard further at
        each round (a full first shard does not starve the others)."""
        if self.claims.in_doubt:
            await self.claims.release_unknown(self._known())
        if self.unconfirmed:
            return await self._confirm_claims()
        started, failed = 0, None
        for store in self.store.rotation():
            if self.unconfirmed or (self.shared_free() <= 0 and self.duty_free() <= 0):
                break
            if self.store.n == 1:
                return await self._claim_shard(store, 0)
            try:
                started += await self._claim_shard(store, self.store.stores.index(store))
            except (RedisError, OSError, TimeoutError) as exc:
                failed = failed or exc  # this shard's master away (a failover): the others go on
        if failed is not None and not started:
            raise failed
        return started

    async def _claim_shard(self, store: Store, shard: int) -> int:
        """One shard's claims: into the shared slots (lanes first), then, while a duty job
        announced due was left unclaimed, its lanes alone into the duty slots."""
        started, now, drained = 0, ms(self.clock.time()), False
        free = min(self.shared_free(), MAX_CLAIM)
        if free > 0:
            n = await self._claim(store, free, self.queues)
            started += n
            drained = n < free and not self.unconfirmed  # no due lane job left unclaimed
            if drained:
                self.wakeups.duty_claimed(shard, now)
        if drained or self.unconfirmed or not self._duty_due(shard, now):
            return started
        free = min(self.duty_free(), MAX_CLAIM)
        n = await self._claim(store, free, self.lanes) if free > 0 else 0
        started += n
        if self.unconfirmed:
            return started
        if n < free:
            self.wakeups.duty_claimed(shard, now)
        elif self.duty_free() > 0:
            self.wakeups.again()  # a full batch and duty room left: there may be more due
        elif self.wakeups.duty_pending(shard, now):  # no room for the rest: the next one's turn
            self.wakeups.pass_on(store, duty=True)
            self.wakeups.duty_claimed(shard, now)
        return started

    def _full(self, store: Store) -> None:
        """A claim into the shared slots filled its batch: more may be due now."""
        if self.shared_free() > 0:
            self.wakeups.again()  # room left: claim again at once
        else:
            self.wakeups.pass_on(store)  # none: the next consumer waiting takes the turn

    def _duty_due(self, shard: int, now_ms: int) -> bool:
        """A duty job of ``shard`` may wait for a duty slot: one was announced, or (the
        marker unreadable, no announcement heard) every ``idle_poll_max_s``."""
        if self.wakeups.duty_pending(shard, now_ms):
            return True
        if self.wakeups.subscribed:
            return False
        now = self.clock.monotonic()
        if now - self._lanes_looked < self.config.idle_poll_max_s:
            return False
        self._lanes_looked = now
        return True

    async def _claim(self, store: Store, free: int, queues: Sequence[str]) -> int:
        """One ``CLAIM`` of up to ``free`` jobs from ``queues`` of one shard; how many
        started."""
        token = f"{self.instance_id}/{next(self._seq)}"
        sent = self.clock.monotonic()
        for queue in self.config.fair if queues is not self.lanes else ():
            now = ms(self.clock.time())  # fair jobs moved in, round-robin across flow keys
            await store.fair_move(queue, now, free, dict(self.config.flow_weights))
        try:
            claims = await store.claim(
                self.instance_id,
                token,
                now_ms=ms(self.clock.time()),
                limit=free,
                in_progress_ttl_ms=self.in_progress_ttl_ms,
                holds_ttl_ms=ms(self.config.holds_ttl_s),
                max_payload=self.config.max_payload_bytes,
                retry_ttl_ms=RETRY_TTL_MS,
                queues=queues,
            )
        except BaseException:
            # The script may have run and its reply been lost (a dropped connection, a primary
            # that failed over after replicating it): jobs claimed in our name that no run of
            # ours will finish. Give them back before claiming again.
            self.claims.in_doubt = True
            raise
        self.claims.guard.confirmed(sent)
        if claims.stale:
            log.warning(
                "stale in-progress markers (without a TTL: taken over; outliving any job: cut "
                "to the marker TTL)",
                markers=claims.stale,
                marker_ttl_s=self.in_progress_ttl_ms / 1000,
            )
        if claims.jobs and not claims.replicated:
            self.unconfirmed, self.unconfirmed_token = claims.jobs, token
            self.unconfirmed_store = store
            log.warning(
                "claimed jobs not confirmed by the replicas (WORKER_REDIS_WAIT_REPLICAS); "
                "holding them unstarted until they are",
                jobs=len(claims.jobs),
            )
            return 0
        self.start(claims.jobs, token)
        if claims.jobs and len(claims.jobs) == free and queues is not self.lanes:
            self._full(store)
        if claims.aborts_pending:
            await self.claims.abort_requested()
        return len(claims.jobs)

    def _known(self) -> set[str]:
        return {*(c.job_id for c in self.unconfirmed), *self.completer.known()}

    async def release_unknown(self) -> None:
        """Give back the jobs claimed in our name in a round trip whose reply was lost."""
        await self.claims.release_unknown(self._known())

    def start(self, jobs: Sequence[Claimed], token: str) -> None:
        """Start each claimed job as a task of its own."""
        now = self.clock.monotonic()  # the batch starts at once
        loop = asyncio.get_running_loop()
        for job in jobs:
            run = self.running[job.job_id] = Run(job.job_id, token, started=now)
            run.duty = is_duty_lane(job.queue)
            self.duty_running += run.duty
            run.ended = job.size == FOREIGN  # never claimed: no claim to check (another slot)
            if job.aborted:  # its abort was pending at the claim (e.g. taken over): never run
                run.aborted = True
                log.info("abort requested; the job is not run", job_id=job.job_id)
            run.task = loop.create_task(self._run(job, run), name=f"job:{job.job_id}")

    async def _run(self, claimed: Claimed, run: Run) -> None:
        try:
            await self.executor.run(claimed, run)
        finally:
            self.running.pop(claimed.job_id, None)
            self.duty_running -= run.duty
            self.wakeups.poke()

    async def _confirm_claims(self) -> int:
        """Check a batch whose claim the replicas did not confirm: once they have every write
        so far, start the jobs still claimed with its token (a failover may have lost some:
        those were never ours on the new primary and are not run)."""
        held, token = self.unconfirmed, self.unconfirmed_token
        sent = self.clock.monotonic()
        held_in = self.unconfirmed_store
        tokens, replicated = await held_in.confirm_claims([c.job_id for c in held])
        self.claims.guard.confirmed(sent)
        if not replicated:
            return 0
        self.unconfirmed = []
        kept = [c for c, now in zip(held, tokens, strict=True) if now == token]
        if len(kept) < len(held):
            log.warning(
                "claims lost before the replicas confirmed them (a failover?); those jobs were "
                "not run and stay queued",
                lost=len(held) - len(kept),
            )
        log.info("held claims confirmed by the replicas; starting", jobs=len(kept))
        self.start(kept, token)
        return len(kept)

    def give_back_unconfirmed(self) -> None:
        """Drain: the held batch never started; give it back, its try with it."""
        for c in self.unconfirmed:
            finish = Finish(
                "defer", c.job_id, self.unconfirmed_token, score_ms=c.score_ms, queue=c.queue
            )
            self.completer.end(finish)
        self.unconfirmed = []
