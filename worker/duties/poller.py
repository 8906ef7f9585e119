"""Pollers, the leader's side: the dispatcher and the consumer hook that settles an item when
its job ends (the definition, shard math and client-side writes are :mod:`worker.polls`).

Each poller keeps its items in ``shards`` sorted sets scored by due time. Anyone schedules an
item (:class:`BoundPoller`); the leader's :class:`PollingScheduler` dispatches due items, two
round trips per batch: read the due items (read-only), then one fenced script that re-checks
each item is still due, removes it from its shard and writes an arq-compatible job for it.
While an item's previous job exists (queued or running) the item stays in its shard, pushed
back, so it is never in flight twice. Job payloads are built in Python, so every serializer
works and the record format is exactly arq's.

An item leaves the poller only when the app says so: a job that succeeds settles its item (the
task reschedules it, or it is done); a job that fails for good (raised, used up its retries,
aborted) puts its item back, due ``failure_delay_s`` later (:class:`InflightHook`); a job that
ended without reporting (dead-lettered before it ran, its consumer dead, its record lost) is
found by the leader's sweep of the in-flight hash, which puts the item back the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from worker.core import codec
from worker.core.clock import Clock, SystemClock, ms, on_server_time
from worker.core.component import LoopComponent
from worker.core.dutykinds import Kind, RowContext, Snapshot, lag, table
from worker.core.ids import JobIds, duty
from worker.core.jobdefs import JobDef, JobHook, Outcome
from worker.core.kindcolumns import Cell, Column, duration, field
from worker.core.metrics import Metrics
from worker.core.outage import RIDE_OUT_S, ride_out
from worker.core.serializer import Serialize
from worker.core.verdict import Check, Limits, num
from worker.polls import PollerDef
from worker.storage.jobs import NewJob
from worker.storage.keys import DEFAULT_QUEUE
from worker.storage.store import FencedStore, Store, same_store
from worker.tracing import Batch, Tracing

T = TypeVar("T")

log = structlog.get_logger("worker.poller")

#: How long the leader's sweep sees an in-flight entry whose job record is gone before it puts
#: the item back (at least 3 poll intervals): the consumer that ran the job reports within it.
SWEEP_GRACE_S = 10.0
#: Why a failed job's item was not put back (``poller.POLL_REQUEUE``'s answers).
REQUEUE_SKIPPED = {0: "rescheduled by the app", -1: "removed by the app", -2: "another job"}


class PollingScheduler(LoopComponent):
    """Dispatches one poller's due items (leader only)."""

    def __init__(
        self,
        poller: PollerDef,
        store: Store,
        fenced: FencedStore,
        serialize: Serialize,
        clock: Clock,
        metrics: Metrics | None = None,
        queue: str = DEFAULT_QUEUE,
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__(f"poller:{poller.name}", clock, sla_s=max(30.0, poller.interval_s * 10))
        self.poller = poller
        self.tracing = tracing
        self.queue = queue  # the poller task's queue
        #: reads (due items, ended in-flight jobs); the fenced store makes the leader's writes
        self.store = same_store(store, fenced)
        self.fenced = fenced
        self.serialize = serialize
        self.metrics = metrics
        self.dispatched_total = 0
        self.swept_total = 0
        self._sweep_cursor = 0
        self._sweep_at = 0.0
        self._suspects: dict[tuple[str, str], float] = {}  # (item, job id) -> first seen
        self._seen: set[tuple[str, str]] = set()  # suspects seen again in this HSCAN pass

    async def tick(self) -> float:
        """Dispatch up to one batch per shard; come back at once while a shard is full."""
        more = False
        for shard in range(self.poller.shards):
            n = await self.dispatch_shard(shard)
            more = more or n >= self.poller.batch_size
        if self.clock.monotonic() >= self._sweep_at:
            self._sweep_at = self.clock.monotonic() + self.poller.interval_s
            await self.sweep()
        return 0.0 if more else self.poller.interval_s

    async def sweep(self) -> int:
        """One step through the in-flight hash: an entry whose job record is gone, seen so for
        :data:`SWEEP_GRACE_S` (the consumer that ran it has reported by then), names a job that
        ended without reporting; its item is put back unless the app rescheduled or removed it.
        Returns how many items were put back."""
        p = self.poller
        cursor, ended = await self.store.inflight_ended(p.name, self._sweep_cursor, p.batch_size)
        now = self.clock.monotonic()
        ripe: list[tuple[str, str, str]] = []
        for entry in ended:
            first = self._suspects.setdefault(entry, now)
            self._seen.add(entry)
            if now - first >= max(SWEEP_GRACE_S, 3 * p.interval_s):
                ripe.append(
                    (entry[0], entry[1], self.store.keys.poll_shard(p.name, p.shard_of(entry[0])))
                )
        self._sweep_cursor = cursor
        if cursor == 0:  # a full pass: forget suspects that were not seen again
            self._suspects = {e: t for e, t in self._suspects.items() if e in self._seen}
            self._seen = set()
        if not ripe:
            return 0
        for item, job_id, _ in ripe:
            self._suspects.pop((item, job_id), None)
        due = ms(self.clock.time() + p.failure_delay_s)
        back, _ = await self.fenced.poll_sweep(p.name, ripe, due)
        if back:
            log.warning(
                "poll items whose job ended unreported are back in their shards",
                poller=p.name,
                items=back,
                due_in_s=p.failure_delay_s,
            )
        self.swept_total += back
        self.health.extra["swept"] = self.swept_total
        if self.metrics is not None:
            self.metrics.dispatched.labels(p.name, "swept").inc(back)
        return back

    async def dispatch_shard(self, shard: int) -> int:
        """Dispatch one batch of due items from ``shard``; return how many items were read."""
        p = self.poller
        shard_key = self.store.keys.poll_shard(p.name, shard)
        now_ms = ms(self.clock.time())
        due = await self.store.due_items(shard_key, now_ms, p.batch_size)
        if not due:
            return 0
        spans = self.tracing.batch() if self.tracing is not None else None
        items = [(item, self._job(item, score, now_ms, spans)) for item, score in due]
        with spans.send() if spans is not None else contextlib.nullcontext():
            out = await self.fenced.dispatch(
                p.name,
                shard_key,
                now_ms,
                ms(p.busy_defer_s),
                items,
                codec.EXPIRES_EXTRA_MS,
                self.queue,
                paused=duty(KIND_NAME, p.name),
            )
        self.dispatched_total += out.dispatched
        self.health.extra["dispatched"] = self.dispatched_total
        if self.metrics is not None:
            m = self.metrics.dispatched
            m.labels(p.name, "dispatched").inc(out.dispatched)
            m.labels(p.name, "in_flight").inc(out.in_flight)
            m.labels(p.name, "duplicate").inc(out.duplicate)
        return len(due)

    def _job(self, item: str, score: int, now_ms: int, spans: Batch | None) -> NewJob:
        p = self.poller
        job_id = self.store.ids.poll(p.name, item, score)
        extra = None
        if spans is not None:  # tracing on: the item's own PRODUCER span, in its record
            extra = spans.create(p.task, job_id, self.queue, epoch=self.fenced.leader.epoch)
        return NewJob(
            job_id, codec.encode_job(p.task, (item,), {}, now_ms, self.serialize, extra=extra)
        )


class InflightHook(JobHook):
    """Consumer hook: settle a poll item once its job ended. Success forgets the item's in-flight
    entry (the task rescheduled it, or it is done); a failure for good puts the item back, due
    the poller's ``failure_delay_s`` later; a retry leaves it in flight. A Redis outage is
    ridden out (up to ``ride_out_s``); after that the leader's sweep settles the item."""

    def __init__(
        self,
        store: Store,
        pollers: Mapping[str, PollerDef],
        clock: Clock | None = None,
        *,
        ride_out_s: float = RIDE_OUT_S,
    ) -> None:
        self.store = store
        self.ids: JobIds = store.ids
        self.pollers = dict(pollers)
        self.clock: Clock = clock or SystemClock()
        self.ride_out_s = ride_out_s

    def concerns(self, job: JobDef) -> bool:
        return any(p.task == job.name for p in self.pollers.values())  # a poll item's task

    async def ended(self, job_id: str, args: Sequence[Any], outcome: Outcome) -> None:
        if outcome == "retry":
            return
        parsed = self.ids.parse_poll(job_id)
        if parsed is None or parsed[0] not in self.pollers:
            return  # enqueued directly, not by a poller
        p = self.pollers[parsed[0]]
        item = str(args[0]) if args else parsed[1]
        try:
            if outcome == "success":
                await ride_out(
                    lambda: self.store.inflight_clear(p.name, item, job_id),
                    self.clock,
                    "poll item settle",
                    bound_s=self.ride_out_s,
                )
                return
            put = await ride_out(
                lambda: self._requeue(p, item, job_id),
                self.clock,
                "poll item requeue",
                bound_s=self.ride_out_s,
            )
            log.debug(
                "poll job failed; item due again" if put == 1 else "poll job failed",
                poller=p.name,
                item=item,
                job_id=job_id,
                due_in_s=p.failure_delay_s if put == 1 else None,
                kept=REQUEUE_SKIPPED.get(put),
            )
        except Exception as exc:  # the leader's sweep settles the item later
            log.warning("could not settle poll item", job_id=job_id, error=str(exc))

    async def _requeue(self, p: PollerDef, item: str, job_id: str) -> int:
        """Put the item of a job that failed for good back, due ``failure_delay_s`` on."""
        shard_key = self.store.keys.poll_shard(p.name, p.shard_of(item))
        await on_server_time(self.clock, self.store.server_time_ms)
        due = ms(self.clock.time() + p.failure_delay_s)
        return await self.store.poll_requeue(shard_key, p.name, item, job_id, due)


# -- the operator side's view of pollers (see worker.core.dutykinds) ---------------------------
@dataclass(frozen=True)
class PollerState:
    """One poller: per shard ``(waiting, due)`` and oldest score, and jobs in flight."""

    shards: list[tuple[int, int]]
    heads: list[int | None]
    in_flight: int


async def _read(store: Store, app: Any, now_ms: int) -> dict[str, PollerState]:
    out = {}
    for p in app.pollers.values():
        keys = [store.keys.poll_shard(p.name, s) for s in range(p.shards)]
        out[p.name] = PollerState(
            shards=await store.shard_backlog(keys, now_ms),
            heads=await store.queue_heads(keys),
            in_flight=await store.poll_in_flight(p.name),
        )
    return out


def _rows(state: dict[str, PollerState], app: Any, at: RowContext) -> list[dict[str, Any]]:
    return [_row(state[p.name], p.name, p.task, at) for p in app.pollers.values()]


def _row(state: PollerState, name: str, task: str, at: RowContext) -> dict[str, Any]:
    shards: list[dict[str, Any]] = [
        {"shard": s, "waiting": w, "due": d, "lag_s": lag(head, at.now_ms)}
        for s, ((w, d), head) in enumerate(zip(state.shards, state.heads, strict=True))
    ]
    lags = [s["lag_s"] for s in shards if s["lag_s"] is not None]
    return {
        "name": name,
        "task": task,
        "paused": at.is_paused(KIND_NAME, name),
        "in_flight": state.in_flight,
        "waiting": sum(s["waiting"] for s in shards),
        "due": sum(s["due"] for s in shards),
        "lag_s": max(lags) if lags else None,
        "shards": shards,
    }


def _render(rows: list[dict[str, Any]], at: str) -> list[str]:
    if not rows:
        return []
    head = ["POLLER", "TASK", "WAITING", "DUE", "IN FLIGHT", "PER SHARD (due)"]
    cells = [
        [
            p["name"] + (" (PAUSED)" if p.get("paused") else ""),
            p["task"],
            p["waiting"],
            p["due"],
            p["in_flight"],
            " ".join(str(s["due"]) for s in p["shards"]),
        ]
        for p in rows
    ]
    return ["", *table(head, cells)]


def check_pollers(snap: Snapshot, app: Any, limits: Limits) -> Check:
    """No poller's oldest due item has waited longer than ``max_lag_s``."""
    if not app.pollers:
        return Check("pollers", "ok", "no pollers declared")
    lags: dict[str, float] = {}
    for name, state in snap.duties[KIND_NAME].items():
        heads = state.heads
        due = [h for h in heads if h is not None and h <= snap.now_ms]
        lags[name] = (snap.now_ms - min(due)) / 1000 if due else 0.0
    behind = {n: lag for n, lag in lags.items() if lag > limits.max_lag_s}
    worst = max(lags.values(), default=0.0)
    data = {"lag_s": {n: round(v, 1) for n, v in lags.items()}, "limit_s": limits.max_lag_s}
    if behind:
        return Check(
            "pollers",
            "fail",
            f"{num(len(behind), 'poller')} lagging more than {limits.max_lag_s:g}s (no leader "
            "dispatching, or consumers too few for the item rate)",
            [f"{n}: oldest due item waits {v:.0f}s" for n, v in sorted(behind.items())],
            data,
        )
    return Check(
        "pollers",
        "ok",
        f"{num(len(lags), 'poller')} keeping up (oldest due item {worst:.1f}s; limit "
        f"{limits.max_lag_s:g}s)",
        data=data,
    )


KIND_NAME = "poller"


def _oldest(row: dict[str, Any], now: int) -> Cell:
    lag_s = row.get("lag_s")
    return Cell(duration(lag_s), "warn" if lag_s is not None and lag_s > 60 else "")


COLUMNS = (
    Column("poller", lambda r, now: r["name"]),
    field("task"),
    Column("items", lambda r, now: r["waiting"], "num"),
    Column("due now", lambda r, now: r["due"], "num"),
    Column("oldest due", _oldest),
    field("in_flight", "num"),
    Column(
        "per shard (items / due)",
        lambda r, now: "  ".join(f"{s['waiting']}/{s['due']}" for s in r["shards"]),
        "shards",
    ),
)


KIND = Kind(
    name=KIND_NAME,
    noun="poller",
    plural="pollers",
    status_key="pollers",
    declared=lambda app: app.pollers,
    read=_read,
    rows=_rows,
    render=_render,
    pause_effect="items wait",
    checks=(check_pollers,),
    columns=COLUMNS,
)
