"""The periodic enqueuer: the leader enqueues one arq job per tick of each periodic job.

No "last run" lives in memory (seed 002's ``lastDailyReset``): the last enqueued tick of each
job is in Redis, so a new leader knows exactly which ticks nobody enqueued and catches them up
per the job's policy. Ticks are enqueued by a fenced script as jobs with deterministic ids
``<prefix>periodic:<name>:<tick ms>``: two leaders overlapping for a moment, or a paused leader
waking up, cannot enqueue a tick twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog
from arq.connections import ArqRedis
from arq.constants import expires_extra_ms

from worker import keys as K
from worker.app import PeriodicDef
from worker.clock import Clock, ms
from worker.component import LoopComponent
from worker.fence import run_fenced
from worker.metrics import Metrics
from worker.serializer import Serialize, job_payload

log = structlog.get_logger("worker.periodic")

#: A tick enqueued later than this after its instant counts as caught up, not on time.
ON_TIME_MS = 5_000
#: On a job's very first run anywhere, a tick at most this old is still enqueued.
FIRST_RUN_LOOKBACK_MS = 1_500
#: Upper bound on the enqueuer's sleep, so it notices leadership changes and stays live.
MAX_SLEEP_S = 1.0


class PeriodicEnqueuer(LoopComponent):
    """Enqueues due ticks of every periodic job (leader only)."""

    name = "periodic"
    sla_s = 30.0

    def __init__(
        self,
        *,
        jobs: Sequence[PeriodicDef],
        redis: ArqRedis,
        keys: K.Keys,
        lock_value: Callable[[], str | None],
        serialize: Serialize,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(clock)
        self.jobs = list(jobs)
        self.redis = redis
        self.keys = keys
        self.lock_value = lock_value
        self.serialize = serialize
        self.metrics = metrics
        self._script = redis.register_script(K.ENQUEUE_TICKS)

    def plan(self, job: PeriodicDef, last_ms: int | None, now_ms: int) -> tuple[list[int], int]:
        """Which ticks to enqueue now, and the tick to record as last (pure; no Redis).

        Returns ``(ticks, advance_to)``: ``ticks`` ascending; ``advance_to`` is the newest due
        tick, recorded even when the policy skips it, so skipped ticks are never revisited.
        """
        latest = job.schedule.latest(now_ms)
        if last_ms is None:  # never ran anywhere: start now, with a tick that is just due
            return ([latest] if now_ms - latest <= FIRST_RUN_LOOKBACK_MS else []), latest
        if latest <= last_ms:
            return [], last_ms
        if job.catch_up == "all":
            ticks = job.schedule.ticks(last_ms, now_ms, job.catch_up_limit)
        elif job.catch_up == "latest":
            ticks = [latest]
        else:  # skip: only a tick that is on time
            ticks = [latest] if now_ms - latest <= ON_TIME_MS else []
        if job.catch_up_window_s is not None:
            oldest = now_ms - max(ms(job.catch_up_window_s), ON_TIME_MS)
            ticks = [t for t in ticks if t >= oldest]
        return ticks, latest

    async def tick(self) -> float:
        if not self.jobs:
            return 60.0
        now_ms = ms(self.clock.time())
        raw = await self.redis.hgetall(self.keys.periodic_state)
        state = {k.decode(): int(v) for k, v in raw.items()}
        for job in self.jobs:
            ticks, advance_to = self.plan(job, state.get(job.name), now_ms)
            if ticks or advance_to > state.get(job.name, -1):
                await self._enqueue(job, ticks, advance_to, now_ms)
        next_due = min(job.schedule.next(now_ms) for job in self.jobs)
        return max(0.01, min(MAX_SLEEP_S, (next_due - ms(self.clock.time())) / 1000))

    async def _enqueue(
        self, job: PeriodicDef, ticks: list[int], advance_to: int, now_ms: int
    ) -> None:
        args: list[str | int | bytes] = [
            job.name,
            K.ARQ_JOB,
            K.ARQ_RESULT,
            expires_extra_ms,
            advance_to,
        ]
        for t in ticks:
            args += [
                t,
                self.keys.periodic_job_id(job.name, t),
                job_payload(job.name, (), {}, now_ms, self.serialize),
            ]
        keys = [self.keys.leader, self.keys.periodic_state, self.keys.queue]
        enqueued, dup, skipped = await run_fenced(self._script, self.lock_value(), keys, args)
        late = sum(1 for t in ticks if now_ms - t > ON_TIME_MS)
        if self.metrics is not None:
            m = self.metrics.ticks
            m.labels(job.name, "enqueued").inc(enqueued)
            m.labels(job.name, "deduplicated").inc(dup)
            m.labels(job.name, "caught_up").inc(min(late, enqueued))
            m.labels(job.name, "skipped").inc(skipped)
        if enqueued:
            log.debug("ticks enqueued", job=job.name, ticks=ticks, enqueued=enqueued)
        if late and enqueued:
            log.info("missed ticks caught up", job=job.name, caught_up=min(late, enqueued))
        if dup:
            log.info("tick already enqueued elsewhere", job=job.name, deduplicated=dup)
