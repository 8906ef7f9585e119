"""Prometheus metrics of one process, in a registry of its own (served on ``/metrics``)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from worker.core import malformed

Labels = tuple[str, ...]

# Counters and histograms export a `*_created` series each by default: it doubles the series
# for no use here (process start is `worker_info`'s and the scrape's business).
disable_created_metrics()  # type: ignore[no-untyped-call]

#: ``worker_job_wait_seconds``'s buckets: 1 ms (a consumer waiting on an empty queue) to 1 h (a
#: backlog an alert should have caught long before).
WAIT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    1800,
    3600,
)


class Metrics:
    """Every metric the framework exports. Names are prefixed ``worker_``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self._leadership_and_duties(r)
        self._jobs(r)
        self._process(r)

    def _leadership_and_duties(self, r: CollectorRegistry) -> None:
        self.info = Gauge(
            "worker_info",
            "Process identity (value 1). The instance's label is `worker_instance`: Prometheus "
            "sets `instance` to the scrape target itself.",
            ["role", "worker_instance", "version"],
            registry=r,
        )
        self.is_leader = Gauge("worker_leader", "1 while this process holds the lease.", registry=r)
        self.leader_epoch = Gauge(
            "worker_leader_epoch", "Epoch of the lease held (0 when not leading).", registry=r
        )
        self.leaderless = Gauge(
            "worker_leaderless_seconds",
            "How long this leader candidate has found no valid leader (its campaigns failing), "
            "seconds; 0 while one leads. Above the lease TTL: nobody can lead.",
            registry=r,
        )
        self.shard_fenced = Gauge(
            "worker_queue_shards_fenced",
            "Queue shards the leader skips: their fence is above its epoch though it holds the "
            "lease (a fence written by hand or by another program; doctor names them).",
            registry=r,
        )
        self.leader_transitions = Counter(
            "worker_leader_transitions",
            "Leadership acquisitions and losses.",
            ["event"],
            registry=r,
        )
        self.ticks = Counter(
            "worker_periodic_ticks",
            "Periodic ticks by outcome: enqueued, deduplicated, caught_up, skipped.",
            ["periodic", "outcome"],
            registry=r,
        )
        self.periodic_rollbacks = Counter(
            "worker_periodic_rollbacks",
            "Times the leader found a periodic job's recorded last tick behind the one it had "
            "recorded and confirmed (a failover lost confirmed writes); the lost ticks are "
            "enqueued again per catch_up.",
            ["periodic"],
            registry=r,
        )
        self.outbox_rows = Counter(
            "worker_outbox_rows",
            "Outbox rows the leader's relay handled, by outcome: moved (one job each), "
            "duplicate (moved before: its id found), refused (its job could not be encoded).",
            ["outcome"],
            registry=r,
        )
        self.outbox_lag = Gauge(
            "worker_outbox_lag_seconds",
            "Age of the oldest outbox row the relay read in its last round (since its "
            "enqueue, on the database's clock); 0 when the outbox was empty.",
            registry=r,
        )
        self.dispatched = Counter(
            "worker_poll_items",
            "Poll items by outcome: dispatched, in_flight (deferred), duplicate, swept (put back "
            "by the leader after a job that ended unreported).",
            ["poller", "outcome"],
            registry=r,
        )
        self.workflows = Counter(
            "worker_workflows",
            "Workflows ended, by state: done, failed (counted by the consumer that ended them).",
            ["state"],
            registry=r,
        )
        self.init_items = Counter(
            "worker_initializer_items",
            "Items written by initializers.",
            ["initializer"],
            registry=r,
        )

    def _jobs(self, r: CollectorRegistry) -> None:
        self.jobs = Counter(
            "worker_jobs", "Jobs run by this consumer, by outcome.", ["task", "outcome"], registry=r
        )
        self.job_seconds = Histogram(
            "worker_job_duration_seconds",
            "Job run time.",
            ["task"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.job_wait = Histogram(
            "worker_job_wait_seconds",
            "Time from a job's due time (its queue score: the enqueue time unless deferred or "
            "retried later) to its start, on the Redis server's clock. Task names are the app's "
            "(<unknown> for any other).",
            ["queue", "task"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.sync_threads_busy = Gauge(
            "worker_sync_threads_busy",
            "Threads running a plain def job now (stuck ones included), of WORKER_SYNC_THREADS.",
            registry=r,
        )
        self.sync_threads_stuck = Gauge(
            "worker_sync_threads_stuck",
            "Threads still running a plain def job whose run already ended (timed out, aborted): "
            "Python cannot kill a thread. While all are stuck, sync jobs are deferred.",
            registry=r,
        )
        self.dead = Counter(
            "worker_jobs_dead", "Jobs set aside in the dead-letter set.", ["reason"], registry=r
        )
        self.jobs_expired = Counter(
            "worker_jobs_expired",
            "Jobs not started by their deadline (enqueue(..., expires_in=...)): they never ran.",
            ["queue", "task"],
            registry=r,
        )
        self.dead_dropped = Counter(
            "worker_dead_letters_dropped",
            "Oldest dead letters dropped because the set reached WORKER_DEAD_LETTER_MAX.",
            registry=r,
        )
        self.claims_lost = Counter(
            "worker_claims_lost",
            "Runs of this consumer whose job was handed to another consumer meanwhile (after a "
            "pause or partition); they were cancelled and wrote nothing.",
            registry=r,
        )
        self.loop_lag = Histogram(
            "worker_event_loop_lag_seconds",
            "How late the event loop ran the watchdog's beat: time a synchronous call (or CPU "
            "starvation) kept every task of the process waiting.",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.loop_blocks = Counter(
            "worker_event_loop_blocks",
            "Times the event loop was blocked past WORKER_LOOP_BLOCKED_S (the watchdog recorded "
            "the finished runs' ends from its own thread, and dropped the lease past the renew "
            "deadline).",
            registry=r,
        )
        self.broadcasts = Counter(
            "worker_broadcasts",
            "Broadcast messages by topic and outcome: received (read by this process), handled, "
            "retried, failed (a handler gave up, per handler), missed (trimmed from the history "
            "before this process read them), malformed (skipped: its seq is not a number).",
            ["topic", "outcome"],
            registry=r,
        )

    def _process(self, r: CollectorRegistry) -> None:
        self.restarts = Counter(
            "worker_component_restarts",
            "Component restarts after their own errors (Redis failing is not one: worker_ready).",
            ["component"],
            registry=r,
        )
        self.since_ok = Gauge(
            "worker_component_seconds_since_ok",
            "Seconds since the component last completed an iteration.",
            ["component"],
            registry=r,
        )
        self.orphans = Counter(
            "worker_orphan_jobs_released",
            "Jobs of dead consumers made available again.",
            registry=r,
        )
        self.check_up = Gauge(
            "worker_health_check_up",
            "1 while the dependency check's latest run passed, 0 while it fails.",
            ["check"],
            registry=r,
        )
        self.periodic_success_age = Gauge(
            "worker_periodic_last_success_age_seconds",
            "Seconds since the periodic job's last successful run ended, cluster-wide (exported "
            "by the leader; absent until a run succeeded).",
            ["periodic"],
            registry=r,
        )
        self.periodic_stale = Gauge(
            "worker_periodic_stale",
            "1 while the periodic job's last success is older than its max_staleness (exported "
            "by the leader, for jobs that declare max_staleness).",
            ["periodic"],
            registry=r,
        )
        self.queue_backlog = Gauge(
            "worker_queue_backlog",
            "Jobs due and not claimed in the queue, cluster-wide (exported by the leader only: "
            "the signal to autoscale consumers on).",
            ["queue"],
            registry=r,
        )
        self.queue_shard_backlog = Gauge(
            "worker_queue_shard_backlog",
            "Jobs due and not claimed in one queue shard (WORKER_QUEUE_SHARDS > 1 only; the "
            "shards of a queue sum to worker_queue_backlog; exported by the leader only).",
            ["queue", "shard"],
            registry=r,
        )
        self.queue_paused = Gauge(
            "worker_queue_paused",
            "1 while the queue is paused (`worker pause queue:NAME` or --all; its backlog then "
            "reads 0: no consumer would take its jobs), else 0 (exported by the leader only).",
            ["queue"],
            registry=r,
        )
        self.queue_jobs = Gauge(
            "worker_queue_jobs",
            "Jobs in the queue, due or not, claimed or not (exported by the leader only).",
            ["queue"],
            registry=r,
        )
        self.ready = Gauge("worker_ready", "1 while /readyz answers 200.", registry=r)
        self.durability_degraded = Gauge(
            "worker_redis_durability_degraded",
            "1 while the WAIT policy (WORKER_REDIS_WAIT_REPLICAS=auto) finds no replica attached "
            "to the primary: durable writes go on unconfirmed, a failover can lose them.",
            registry=r,
        )
        r.register(_Malformed())
        self.data_loss = Counter(
            "worker_redis_data_loss",
            "Times this process found Redis's boot marker gone (the dataset was lost).",
            registry=r,
        )


class Children:
    """The children of a labelled metric, each looked up once per label values: ``labels()``
    costs more than the count itself, per job (label values are bounded: the app's queues and
    task names)."""

    def __init__(self, metric: Counter | Histogram) -> None:
        self.metric = metric
        self._by: dict[tuple[str, ...], Any] = {}

    def __call__(self, *labels: str) -> Any:
        child = self._by.get(labels)
        if child is None:
            child = self._by[labels] = self.metric.labels(*labels)
        return child


def observe_many(child: Any, values: Sequence[float]) -> None:
    """``child.observe(v)`` for every ``v``, each bucket and the sum counted once: the
    histogram's buckets found by bisection (prometheus_client's own ``observe`` walks them and
    takes a lock per bucket and per sum, per value). A child without the parts this relies on
    observes each value."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets, total = getattr(child, "_buckets", None), getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for v in values:
            child.observe(v)
        return
    counts = [0] * len(bounds)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    total.inc(sum(values))
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


class JobFigures:
    """The consumer's per-job figures (``worker_jobs``, ``worker_job_duration_seconds``,
    ``worker_job_wait_seconds``), noted in plain lists as runs start and end and counted into
    the metrics once per round (:meth:`apply`): a labelled child's ``inc`` or ``observe`` per
    job cost more than the rest of a no-op job's bookkeeping."""

    def __init__(self, metrics: Metrics) -> None:
        self._count, self._seconds = Children(metrics.jobs), Children(metrics.job_seconds)
        self._wait = Children(metrics.job_wait)
        #: (task, outcome, seconds) per run ended; (queue, task, seconds) per run started
        self.runs: list[tuple[str, str, float]] = []
        self.waits: list[tuple[str, str, float]] = []

    def apply(self) -> None:
        """Count what was noted since the last call."""
        runs, self.runs = self.runs, []
        waits, self.waits = self.waits, []
        counts: dict[tuple[str, str], int] = {}
        seconds: dict[str, list[float]] = {}
        for task, outcome, took in runs:
            counts[task, outcome] = counts.get((task, outcome), 0) + 1
            seconds.setdefault(task, []).append(took)
        for labels, n in counts.items():
            self._count(*labels).inc(n)
        for task, values in seconds.items():
            observe_many(self._seconds(task), values)
        waited: dict[Labels, list[float]] = {}
        for queue, task, wait in waits:
            waited.setdefault((queue, task), []).append(wait)
        for where, values in waited.items():
            observe_many(self._wait(*where), values)


class _Malformed(Collector):
    """``worker_malformed_entries{kind}``: :data:`worker.core.malformed.SKIPPED`, read at scrape."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "worker_malformed_entries",
            "Malformed Redis entries this process skipped (each counted once), by what they "
            "should have been: score, broadcast, JSON object, leadership change.",
            labels=["kind"],
        )
        for kind, n in sorted(malformed.SKIPPED.items()):
            family.add_metric([kind], n)
        yield family
