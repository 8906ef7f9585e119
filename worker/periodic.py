"""Periodic jobs, whole: their definition, the leader's tick enqueuer and ``ctx.tick``.

No "last run" lives in memory (seed 002's ``lastDailyReset``): the last enqueued tick of each
job is in Redis, so a new leader knows exactly which ticks nobody enqueued and catches them up
per the job's policy. Ticks are enqueued by a fenced script as jobs with deterministic ids
``<prefix>periodic:<name>:<tick ms>``: two leaders overlapping for a moment, or a paused leader
waking up, cannot enqueue a tick twice. A consumer running a tick learns its instant from the
job id (:class:`TickHook`), so ``ctx.tick`` is the scheduled time, not the run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from arq.constants import expires_extra_ms

from worker.client import Client
from worker.clock import Clock, ms
from worker.component import LoopComponent
from worker.ids import JobIds
from worker.jobs import JobDef, Outcome, TaskFn
from worker.keys import DEFAULT_QUEUE
from worker.metrics import Metrics
from worker.schedule import Schedule
from worker.serializer import Serialize, job_payload
from worker.store import FencedStore, NewJob, TickOutcome

log = structlog.get_logger("worker.periodic")

CatchUp = Literal["skip", "latest", "all"]
NAME = "periodic"
#: A tick enqueued later than this after its instant counts as caught up, not on time.
ON_TIME_MS = 5_000
#: Upper bound on the enqueuer's sleep, so it notices leadership changes and stays live.
MAX_SLEEP_S = 1.0


@dataclass(frozen=True)
class PeriodicDef:
    """A job the leader enqueues once per tick; any consumer runs it.

    ``catch_up`` decides what a new leader does with ticks nobody enqueued (leader down, a
    failover): ``all`` enqueues each, oldest first, at most ``catch_up_limit`` of the most
    recent; ``latest`` enqueues only the newest missed tick; ``skip`` enqueues none.
    ``catch_up_window_s`` (optional) additionally drops missed ticks older than that many
    seconds, whatever the policy.
    """

    name: str
    fn: TaskFn
    schedule: Schedule
    catch_up: CatchUp = "all"
    catch_up_limit: int = 10
    timeout_s: float | None = None
    catch_up_window_s: float | None = None
    queue: str = DEFAULT_QUEUE

    def job(self) -> JobDef:
        """What a consumer runs for each tick."""
        return JobDef(self.name, self.fn, timeout_s=self.timeout_s, queue=self.queue)


def plan_ticks(job: PeriodicDef, last_ms: int | None, now_ms: int) -> tuple[list[int], int]:
    """Which ticks to enqueue now, and the tick to record as last (pure; no Redis).

    Returns ``(ticks, advance_to)``: ``ticks`` ascending; ``advance_to`` is the newest due
    tick, recorded even when the policy skips it, so skipped ticks are never revisited.
    """
    latest = job.schedule.latest(now_ms)
    if last_ms is None:
        # Never recorded: a new job, or Redis lost its data. A tick already due may have run
        # before the loss (its job and result went with the data), so start with the next one.
        return [], latest
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


class PeriodicEnqueuer(LoopComponent):
    """Enqueues due ticks of every periodic job (leader only), all jobs due at an instant in
    one fenced script call.

    The last tick per job is read from Redis when leadership starts (another leader may have
    advanced it) and every ``REFRESH_S``; in between the enqueuer knows what it recorded
    itself (only the lease holder writes it, and the script re-checks). It sleeps until the
    next tick is due, so a tick is enqueued within milliseconds of its instant.
    """

    #: How often the recorded last ticks are read back from Redis while leading.
    REFRESH_S = 30.0

    def __init__(
        self,
        jobs: Sequence[PeriodicDef],
        store: FencedStore,
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(NAME, clock, sla_s=30.0)
        self.jobs = list(jobs)
        self.store = store
        self.serialize = serialize
        self.metrics = metrics
        self._last: dict[str, int] = {}
        self._next: dict[str, int] = {}  # name -> next tick after the recorded last one
        self._read_at = float("-inf")

    async def setup(self) -> None:
        self._read_at = float("-inf")  # a new term: read the state again

    async def tick(self) -> float:
        if not self.jobs:
            return 60.0
        now_ms = ms(self.clock.time())
        if self.clock.monotonic() - self._read_at >= self.REFRESH_S:
            self._last = await self.store.store.periodic_last()
            self._next.clear()
            self._read_at = self.clock.monotonic()
        due: list[tuple[PeriodicDef, list[int], int]] = []
        for job in self.jobs:
            if self._next.get(job.name, -1) > now_ms:
                continue  # nothing due yet (known without asking the schedule)
            ticks, advance_to = plan_ticks(job, self._last.get(job.name), now_ms)
            if ticks or advance_to > self._last.get(job.name, -1):
                due.append((job, ticks, advance_to))
            else:
                self._next[job.name] = job.schedule.next(max(advance_to, now_ms))
        if due:
            await self._enqueue(due, now_ms)
        next_due = min(self._next.get(j.name) or j.schedule.next(now_ms) for j in self.jobs)
        # wake 1 ms after the instant: asyncio timers may fire up to a millisecond early
        return max(0.001, min(MAX_SLEEP_S, (next_due + 1 - ms(self.clock.time())) / 1000))

    async def _enqueue(self, due: list[tuple[PeriodicDef, list[int], int]], now_ms: int) -> None:
        batch = [
            (
                job.name,
                advance_to,
                [
                    NewJob(
                        self.store.ids.periodic(job.name, t),
                        job_payload(job.name, (), {}, now_ms, self.serialize),
                        t,
                    )
                    for t in ticks
                ],
                job.queue,
            )
            for job, ticks, advance_to in due
        ]
        outcomes = await self.store.enqueue_ticks(batch, expires_extra_ms)
        for (job, ticks, advance_to), out in zip(due, outcomes, strict=True):
            self._last[job.name] = max(advance_to, self._last.get(job.name, -1))
            self._next[job.name] = job.schedule.next(self._last[job.name])
            self._record(job, ticks, out, now_ms)

    def _record(self, job: PeriodicDef, ticks: list[int], out: TickOutcome, now_ms: int) -> None:
        late = min(sum(1 for t in ticks if now_ms - t > ON_TIME_MS), out.enqueued)
        if self.metrics is not None:
            m = self.metrics.ticks
            m.labels(job.name, "enqueued").inc(out.enqueued)
            m.labels(job.name, "deduplicated").inc(out.duplicate)
            m.labels(job.name, "caught_up").inc(late)
            m.labels(job.name, "skipped").inc(out.skipped)
        if out.enqueued:
            log.debug("ticks enqueued", job=job.name, ticks=ticks, enqueued=out.enqueued)
        if late:
            log.info("missed ticks caught up", job=job.name, caught_up=late)
        if out.duplicate:
            log.info("tick already enqueued elsewhere", job=job.name, deduplicated=out.duplicate)


class TickHook:
    """Consumer hook: a periodic job's ``ctx.tick`` comes from its job id."""

    def __init__(self, ids: JobIds, names: Sequence[str]) -> None:
        self.ids = ids
        self.names = frozenset(names)

    def context(self, job_id: str) -> Mapping[str, Any]:
        parsed = self.ids.parse_periodic(job_id)
        if parsed is None or parsed[0] not in self.names:
            return {}
        return {"tick_ms": parsed[1]}

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        return None


async def trigger(client: Client, job: PeriodicDef) -> str | None:
    """Run periodic ``job`` once now, outside its schedule (``python -m worker trigger``):
    a job like a tick at this instant (``ctx.tick`` is now), in the job's queue; its recorded
    last tick does not move. Returns the job id, or ``None`` if one for this instant exists."""
    now_ms = ms(client.clock.time())
    job_id = client.store.ids.periodic(job.name, now_ms)
    return await client.enqueue(job.name, job_id=job_id, queue=job.queue)
