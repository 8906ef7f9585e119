"""Run-time schedules (``client.schedules``): the leader's tick enqueuer and backfill.

The guarantees are those of ``@app.periodic`` (:mod:`worker.duties.periodic`): ticks on the
server's clock, one job per tick cluster-wide (deterministic ids
``<prefix>schedule:<name>:<tick ms>``, a fenced script), the last planned tick in Redis so a
new leader catches missed ticks up per the schedule's policy, DST as a code schedule's cron.
What differs is that the set changes while the leader runs: each loop costs one ``GET`` of the
change counter, and the schedules are read again only when it moved. The tick script enqueues
only for the definition version the tick was planned with, so a schedule removed or changed
between the read and the enqueue is not ticked on its old definition; the state (last planned
tick) is the schedule's, not the version's, so a changed cron neither repeats nor loses a tick.

The operator's controls are a code schedule's: a paused schedule (``schedule:<name>`` in the
paused set) has its ticks skipped, not caught up on resume; :func:`trigger` runs one now; a
run's ``ctx.tick`` is its tick's instant, from its job id (:class:`ScheduleTickHook`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from worker.client import Client
from worker.core import codec
from worker.core import malformed as M
from worker.core.clock import Clock, ms, on_server_time
from worker.core.component import LoopComponent
from worker.core.errors import ConfigError
from worker.core.jobdefs import JobHook
from worker.core.metrics import Metrics
from worker.core.schedule_spec import ScheduleSpec
from worker.core.serializer import Serialize
from worker.duties.periodic import MAX_SLEEP_S, ON_TIME_MS, plan_ticks
from worker.storage.jobs import NewJob
from worker.storage.schedules import DueScheduleTicks, ScheduleOutcome
from worker.storage.store import FencedStore, Store

log = structlog.get_logger("worker.schedules")

NAME = "schedules"
#: The kind of a run-time schedule in the paused set and the audit log (``schedule:<name>``).
KIND = "schedule"
#: Schedules per tick script call (many due at one instant: several calls).
BATCH = 500


class ScheduleEnqueuer(LoopComponent):
    """Enqueues the due ticks of every run-time schedule (leader only), all due at an instant
    in one fenced script call; re-reads the schedules when their change counter moved."""

    #: How often the recorded last ticks are read back from Redis while leading.
    REFRESH_S = 30.0

    def __init__(
        self,
        tasks: Mapping[str, str],
        store: Store,
        fenced: FencedStore,
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:
        """``tasks``: the app's task names -> their queues (a schedule of another task is
        skipped as malformed)."""
        super().__init__(NAME, clock, sla_s=30.0)
        self.tasks = dict(tasks)
        self.store = store
        self.fenced = fenced
        self.serialize = serialize
        self.metrics = metrics
        self.specs: dict[str, ScheduleSpec] = {}
        self._gen = -2  # never a counter's value: read at the first loop
        self._last: dict[str, int] = {}
        self._next: dict[str, int] = {}  # name -> its next tick after the recorded last one
        self._read_at = float("-inf")

    async def setup(self) -> None:
        self._gen, self._read_at = -2, float("-inf")  # a new term: read everything again
        self.specs, self._next = {}, {}

    async def _refresh(self) -> None:
        store = self.store
        gen = await store.schedules_gen()
        stale_state = self.clock.monotonic() - self._read_at >= self.REFRESH_S
        if gen != self._gen or gen < 0:
            old, specs = self.specs, await store.schedules_read(self.specs)
            self.specs = {n: s for n, s in specs.items() if self._known(s)}
            for name in [n for n in self._next if _changed(n, old, self.specs)]:
                del self._next[name]  # removed or changed: plan it again
            self._gen, stale_state = gen, True
        if stale_state:
            last = await store.schedule_state()
            for name in [n for n in self._next if last.get(n) != self._last.get(n)]:
                del self._next[name]  # recorded elsewhere meanwhile: plan it again
            self._last, self._read_at = last, self.clock.monotonic()

    def _known(self, spec: ScheduleSpec) -> bool:
        if spec.task in self.tasks:
            return True
        M.skip("schedule", self.store.keys.schedules, spec.name, f"unknown task {spec.task!r}")
        return False

    async def tick(self) -> float:
        await self._refresh()
        now_ms = ms(self.clock.time())
        due = []
        for spec in self.specs.values():
            if self._next.get(spec.name, -1) > now_ms:
                continue  # nothing due yet (known without asking the schedule)
            ticks, advance_to = plan_ticks(spec, self._last.get(spec.name), now_ms)
            if spec.overlap == "skip":
                ticks = ticks[-1:]  # a catch-up of several would overlap itself
            if ticks or advance_to > self._last.get(spec.name, -1):
                due.append(self._due(spec, ticks, advance_to, now_ms))
            else:
                self._next[spec.name] = spec.schedule.next(max(advance_to, now_ms))
        for i in range(0, len(due), BATCH):
            if await self._enqueue(due[i : i + BATCH]):
                return 0.001  # something changed under the plan: read again, plan anew now
        next_due = min(self._next.values(), default=now_ms + ms(MAX_SLEEP_S))
        # wake 1 ms after the instant; at least every MAX_SLEEP_S to see changes
        return max(0.001, min(MAX_SLEEP_S, (next_due + 1 - ms(self.clock.time())) / 1000))

    def _due(
        self, spec: ScheduleSpec, ticks: list[int], advance_to: int, now_ms: int
    ) -> DueScheduleTicks:
        jobs = [
            NewJob(
                self.store.ids.schedule(spec.name, t),
                codec.encode_job(spec.task, spec.args, spec.kwargs, now_ms, self.serialize),
                t,
            )
            for t in ticks
        ]
        known = self._last.get(spec.name, -1)
        queue = self.tasks[spec.task]
        return DueScheduleTicks(
            spec.name, spec.version, advance_to, jobs, queue, known, spec.overlap == "skip"
        )

    async def _enqueue(self, due: list[DueScheduleTicks]) -> bool:
        """Enqueue; ``True`` when a schedule changed or Redis went back meanwhile."""
        outcomes = await self.fenced.enqueue_schedule_ticks(due, codec.EXPIRES_EXTRA_MS)
        replan = False
        for d, out in zip(due, outcomes, strict=True):
            if out.stale or out.rolled_back:
                replan = True
                continue
            self._last[d.name] = max(d.advance_to, self._last.get(d.name, -1))
            self._next[d.name] = self.specs[d.name].schedule.next(self._last[d.name])
            self._record(d, out)
        if replan:
            self._gen, self._read_at = -2, float("-inf")
        return replan

    def _record(self, d: DueScheduleTicks, out: ScheduleOutcome) -> None:
        now_ms = ms(self.clock.time())
        late = min(sum(1 for t in d.ticks if now_ms - t.score_ms > ON_TIME_MS), out.enqueued)
        if self.metrics is not None:
            m = self.metrics.ticks
            m.labels(f"schedule:{d.name}", "enqueued").inc(out.enqueued)
            m.labels(f"schedule:{d.name}", "deduplicated").inc(out.duplicate)
            m.labels(f"schedule:{d.name}", "caught_up").inc(late)
            m.labels(f"schedule:{d.name}", "skipped").inc(out.skipped + out.overlapped)
        if out.overlapped:
            log.info("tick skipped: previous run not ended", schedule=d.name)
        if late:
            log.info("missed ticks caught up", schedule=d.name, caught_up=late)


def _changed(name: str, old: Mapping[str, ScheduleSpec], new: Mapping[str, ScheduleSpec]) -> bool:
    return name not in old or name not in new or old[name].version != new[name].version


async def backfill(client: Client, name: str, from_ms: int, to_ms: int) -> tuple[int, int]:
    """Enqueue every tick of schedule ``name`` in ``[from_ms, to_ms]`` not enqueued before
    (deterministic ids: a tick already enqueued, or whose result is kept, is not enqueued
    again). Returns ``(enqueued, ticks in the range)``. At most 10 000 ticks per call."""
    spec = await client.schedules.get(name)
    if spec is None:
        raise ConfigError(f"no schedule named {name!r}")
    await on_server_time(client.clock, client.store.server_time_ms)
    if to_ms > ms(client.clock.time()):
        raise ConfigError("backfill: the range must end in the past")
    ticks = spec.schedule.ticks(from_ms - 1, to_ms, 10_001)
    if len(ticks) > 10_000:
        raise ConfigError(f"backfill: more than 10000 ticks in the range ({spec.describe()})")
    done = 0
    for t in ticks:
        job_id = client.store.ids.schedule(name, t)
        # not enqueue(): a schedule's kwargs may be named like enqueue's own options
        put = (spec.task, spec.args, spec.kwargs, job_id, client.queue_for(spec.task), 0.0, None)
        if await client._put(client.store, *put):
            done += 1
    return done, len(ticks)


async def trigger(client: Client, name: str) -> str | None:
    """Run schedule ``name`` once now, outside its ticks: a job like a tick at this instant
    (``ctx.tick`` is now); its recorded last tick does not move. Returns the job id, or
    ``None`` if one for this instant exists. :class:`ConfigError` if there is no such schedule."""
    spec = await client.schedules.get(name)
    if spec is None:
        raise ConfigError(f"no schedule named {name!r}")
    await on_server_time(client.clock, client.store.server_time_ms)
    job_id = client.store.ids.schedule(name, ms(client.clock.time()))
    put = (spec.task, spec.args, spec.kwargs, job_id, client.queue_for(spec.task), 0.0, None)
    return job_id if await client._put(client.store, *put) else None


class ScheduleTickHook(JobHook):
    """Consumer hook: a run-time schedule's run learns its tick (``ctx.tick``) from its job id
    ``<prefix>schedule:<name>:<tick ms>``; any other job costs one string comparison."""

    def __init__(self, prefix: str) -> None:
        self.id_prefix = f"{prefix}schedule:"

    def context(self, job_id: str) -> Mapping[str, Any]:
        head = self.id_prefix or ""
        name, sep, tick = job_id[len(head) :].rpartition(":")
        if not job_id.startswith(head) or not sep or not name or not tick.isdigit():
            return {}
        return {"tick_ms": int(tick)}
