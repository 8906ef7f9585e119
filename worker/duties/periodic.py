"""Periodic jobs, whole: their definition, the leader's tick enqueuer and ``ctx.tick``.

No "last run" lives in memory (a ``lastDailyReset`` variable): the last enqueued tick of each
job is in Redis, so a new leader knows exactly which ticks nobody enqueued and catches them up
per the job's policy. Ticks are enqueued by a fenced script as jobs with deterministic ids
``<prefix>periodic:<name>:<tick ms>``: two leaders overlapping for a moment, or a paused leader
waking up, cannot enqueue a tick twice. A consumer running a tick learns its instant from the
job id (:class:`TickHook`), so ``ctx.tick`` is the scheduled time, not the run time.

Health means progress: the same hook records how each run ended, cluster-wide, in one hash
(``<prefix>periodic:runs``: the last success and failure, since when it fails), one script
call per run's end. ``status`` shows it; the leader's enqueuer exports the age of each job's
last success (``worker_periodic_last_success_age_seconds``) and, for jobs declared with
``max_staleness``, reports a stale job in ``/status``, the probes' bodies and
``worker_periodic_stale``, without failing a probe (see :mod:`worker.runtime.health`); ``doctor``
fails on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from worker.core import codec
from worker.core.clock import Clock, ms, on_server_time
from worker.core.component import LoopComponent
from worker.core.ids import JobIds
from worker.core.jobdefs import DEFAULT_QUEUE, JobDef, JobHook, Outcome, TaskFn
from worker.core.metrics import Metrics
from worker.core.schedule import Schedule
from worker.core.schedule_spec import ScheduleSpec
from worker.core.serializer import Serialize
from worker.storage.jobs import NewJob
from worker.storage.periodic import DueTicks, PeriodicRuns, TickOutcome
from worker.storage.store import FencedStore, Store, same_store
from worker.tracing import Batch, Tracing

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
    seconds, whatever the policy. ``max_staleness_s`` (optional): the last success may be at
    most this old (see :func:`freshness`).
    """

    name: str
    fn: TaskFn
    schedule: Schedule
    catch_up: CatchUp = "all"
    catch_up_limit: int = 10
    timeout_s: float | None = None
    catch_up_window_s: float | None = None
    queue: str = DEFAULT_QUEUE
    max_staleness_s: float | None = None

    def job(self) -> JobDef:
        """What a consumer runs for each tick: the function, noting the class of the error it
        raises for :class:`TickHook` (a hook sees only the outcome)."""
        fn = self.fn

        @functools.wraps(fn)
        async def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(ctx, *args, **kwargs)
            except Exception as exc:
                _note(ctx, type(exc).__name__)
                raise
            except asyncio.CancelledError:
                _note(ctx, CANCELLED)
                raise

        return JobDef(self.name, run, timeout_s=self.timeout_s, queue=self.queue)


#: The error recorded for a run that failed by cancellation (its timeout, or an abort).
CANCELLED = "timeout or abort"
#: Key of the run's error note in its ctx (set by :class:`TickHook`, filled by ``job()``).
ERROR_NOTE = "_periodic_error"


class _ErrorNote:
    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: str | None = None

    def __repr__(self) -> str:
        return f"<periodic error note {self.error!r}>"


def _note(ctx: object, error: str) -> None:
    note = ctx.get(ERROR_NOTE) if isinstance(ctx, Mapping) else None
    if isinstance(note, _ErrorNote):
        note.error = error


@dataclass(frozen=True)
class Freshness:
    """How recently a periodic job succeeded: seconds since its last success ended, seconds
    since its first failure after that (``None`` when not failing), and whether that is beyond
    its ``max_staleness``."""

    success_age_s: float | None
    failing_for_s: float | None
    stale: bool

    def explain(self, limit_s: float | None) -> str:
        if self.success_age_s is not None:
            text = f"last success {self.success_age_s:.0f}s ago"
        elif self.failing_for_s is not None:
            text = f"no success recorded, failing for {self.failing_for_s:.0f}s"
        else:
            text = "no run recorded yet"
        return text + (f" (max_staleness {limit_s:g}s)" if limit_s is not None else "")


def freshness(job: PeriodicDef, runs: PeriodicRuns | None, now_ms: int) -> Freshness:
    """Judge ``job``'s recorded runs at ``now_ms`` (pure). Stale: the last success is older
    than ``max_staleness``, or, with no success on record, the job has failed for longer. A
    job that never ran is not stale here (``doctor``'s schedule check judges its ticks)."""
    ok = runs.success if runs is not None else None
    since = runs.failing_since_ms if runs is not None else None
    age = max(0.0, (now_ms - int(ok["at_ms"])) / 1000) if ok and "at_ms" in ok else None
    failing = max(0.0, (now_ms - since) / 1000) if since is not None else None
    limit = job.max_staleness_s
    ref = age if age is not None else failing
    return Freshness(age, failing, limit is not None and ref is not None and ref > limit)


def plan_ticks(
    job: PeriodicDef | ScheduleSpec, last_ms: int | None, now_ms: int
) -> tuple[list[int], int]:
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
    #: How often the recorded run ends (last success per job) are read while leading.
    RUNS_REFRESH_S = 5.0

    def __init__(
        self,
        jobs: Sequence[PeriodicDef],
        store: Store,
        fenced: FencedStore,
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__(NAME, clock, sla_s=30.0)
        self.jobs = list(jobs)
        #: reads (the recorded ticks and run ends); the fenced store makes the leader's writes
        self.store = same_store(store, fenced)
        self.fenced = fenced
        self.serialize = serialize
        self.metrics = metrics
        self.tracing = tracing
        self._last: dict[str, int] = {}
        self._next: dict[str, int] = {}  # name -> next tick after the recorded last one
        self._read_at = float("-inf")
        self._runs: dict[str, PeriodicRuns] = {}
        self._runs_at = float("-inf")

    async def setup(self) -> None:
        self._read_at = float("-inf")  # a new term: read the state again
        self._runs_at = float("-inf")

    async def teardown(self) -> None:
        # not leading any more: another process exports the freshness now
        self.health.warnings = []
        if self.metrics is not None:
            for job in self.jobs:
                for gauge in (self.metrics.periodic_success_age, self.metrics.periodic_stale):
                    with contextlib.suppress(KeyError):
                        gauge.remove(job.name)

    async def report_freshness(self, now_ms: int) -> None:
        """Read the recorded run ends (every ``RUNS_REFRESH_S``); export each job's last
        success age and staleness, and warn about stale jobs."""
        if self.clock.monotonic() - self._runs_at >= self.RUNS_REFRESH_S:
            self._runs = await self.store.periodic_runs()
            self._runs_at = self.clock.monotonic()
        warnings = []
        for job in self.jobs:
            f = freshness(job, self._runs.get(job.name), now_ms)
            if f.stale:
                warnings.append(f"periodic {job.name}: stale, {f.explain(job.max_staleness_s)}")
            if self.metrics is None:
                continue
            if f.success_age_s is not None:
                self.metrics.periodic_success_age.labels(job.name).set(f.success_age_s)
            if job.max_staleness_s is not None:
                self.metrics.periodic_stale.labels(job.name).set(1 if f.stale else 0)
        self.health.warnings = warnings

    async def tick(self) -> float:
        if not self.jobs:
            return 60.0
        now_ms = ms(self.clock.time())
        await self.report_freshness(now_ms)
        if self.clock.monotonic() - self._read_at >= self.REFRESH_S:
            self._last = await self.store.periodic_last()
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
        if due and await self._enqueue(due, now_ms):
            return 0.001  # Redis went back: read the recorded ticks again and plan anew now
        next_due = min(self._next.get(j.name) or j.schedule.next(now_ms) for j in self.jobs)
        # wake 1 ms after the instant: asyncio timers may fire up to a millisecond early
        return max(0.001, min(MAX_SLEEP_S, (next_due + 1 - ms(self.clock.time())) / 1000))

    async def _enqueue(self, due: list[tuple[PeriodicDef, list[int], int]], now_ms: int) -> bool:
        """Enqueue the planned ticks; ``True`` when Redis was found behind what this enqueuer
        knows it recorded (:meth:`_rolled_back`), nothing being written for those jobs."""
        spans = self.tracing.batch() if self.tracing is not None else None
        batch = [
            DueTicks(
                job.name,
                advance_to,
                [self._tick_job(job, t, now_ms, spans) for t in ticks],
                job.queue,
                self._last.get(job.name, -1),
            )
            for job, ticks, advance_to in due
        ]
        with spans.send() if spans is not None else contextlib.nullcontext():
            outcomes = await self.fenced.enqueue_ticks(batch, codec.EXPIRES_EXTRA_MS)
        behind = []
        for (job, ticks, advance_to), out in zip(due, outcomes, strict=True):
            if out.rolled_back:
                behind.append(job.name)
                continue
            self._last[job.name] = max(advance_to, self._last.get(job.name, -1))
            self._next[job.name] = job.schedule.next(self._last[job.name])
            self._record(job, ticks, out, now_ms)
        if behind:
            self._rolled_back(behind)
        return bool(behind)

    def _tick_job(self, job: PeriodicDef, tick: int, now_ms: int, spans: Batch | None) -> NewJob:
        job_id = self.store.ids.periodic(job.name, tick)
        extra = None
        if spans is not None:  # tracing on: the tick's own PRODUCER span, in its record
            epoch = self.fenced.leader.epoch
            extra = spans.create(job.name, job_id, job.queue, tick_ms=tick, epoch=epoch)
        return NewJob(
            job_id, codec.encode_job(job.name, (), {}, now_ms, self.serialize, extra=extra), tick
        )

    def _rolled_back(self, names: list[str]) -> None:
        """Redis's recorded last tick of ``names`` is behind the one this enqueuer recorded
        and had confirmed: Redis lost confirmed writes while this process kept the lease (a
        failover to a replica that missed them: a primary deposed while still serving, a
        replica promoted without the newest writes). The ticks enqueued in those writes went
        with them. Trusting the memory would skip past them for good; instead the state is
        read again and the lost ticks are enqueued per each job's ``catch_up`` (a tick that
        already ran on the lost writes may then run again: at-least-once, like any job whose
        record a failover lost)."""
        known = {name: self._last.get(name) for name in names}
        log.error(
            "REDIS WENT BACK: the recorded last tick of periodic job(s) is behind what this "
            "leader recorded and had confirmed (a failover lost confirmed writes); reading the "
            "state again and catching the lost ticks up per catch_up",
            jobs=known,
        )
        if self.metrics is not None:
            for name in names:
                self.metrics.periodic_rollbacks.labels(name).inc()
        self._read_at = float("-inf")
        for name in names:
            self._next.pop(name, None)

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


class TickHook(JobHook):
    """Consumer hook: a periodic job's ``ctx.tick`` comes from its job id, and how each of its
    runs ended (success, or failure with the error's class; not a retry: it runs again) is
    recorded cluster-wide with one script call (:meth:`Store.periodic_result`)."""

    #: Runs begun but not ended kept at most (ends always follow; this only bounds a leak).
    MAX_OPEN = 10_000

    def __init__(
        self, store: Store, names: Sequence[str], clock: Clock, *, instance_id: str = ""
    ) -> None:
        self.store = store
        self.ids: JobIds = store.ids
        self.names = frozenset(names)
        self.clock = clock
        self.instance_id = instance_id
        self._open: dict[str, tuple[str, int, _ErrorNote]] = {}

    def concerns(self, job: JobDef) -> bool:
        return job.name in self.names  # a periodic job runs under its own name

    def context(self, job_id: str) -> Mapping[str, Any]:
        parsed = self.ids.parse_periodic(job_id)
        if parsed is None or parsed[0] not in self.names:
            return {}
        note = _ErrorNote()
        if len(self._open) >= self.MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[job_id] = (parsed[0], parsed[1], note)
        return {"tick_ms": parsed[1], ERROR_NOTE: note}

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        run = self._open.pop(job_id, None)
        if run is None or outcome == "retry":
            return
        name, tick_ms, note = run
        at_ms = ms(self.clock.time())
        record: dict[str, Any] = {"at_ms": at_ms, "tick_ms": tick_ms, "instance": self.instance_id}
        if outcome == "failure":
            record["error"] = note.error or CANCELLED
        await self.store.periodic_result(name, outcome, record, at_ms)


async def trigger(client: Any, job: PeriodicDef) -> str | None:
    """Run periodic ``job`` once now through ``client`` (a :class:`worker.client.Client`), outside
    its schedule (``python -m worker trigger``): a job like a tick at this instant (``ctx.tick``
    is now), in its queue; its last tick does not move. Returns its id (``None``: one exists)."""
    await on_server_time(client.clock, client.store.server_time_ms)
    now_ms = ms(client.clock.time())
    job_id: str = client.store.ids.periodic(job.name, now_ms)
    enqueued: str | None = await client.enqueue(job.name, job_id=job_id, queue=job.queue)
    return enqueued
