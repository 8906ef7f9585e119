"""Role -> components, as data: one table that both ``plan`` and the build read.

Every row names a component (or one per app item: a poller, an initializer, a service), the
roles that run it, the group it belongs to and how to build it. :func:`plan` prints the table
for a role without touching Redis; :func:`build` makes the components from the same rows, so
the printed plan and what runs cannot drift. This module and the CLI are the only places that
know roles.

Groups: ``infra`` (heartbeat, health server) and ``work`` (consumer, broadcast listener,
per-process services) run in every process for its whole life; ``leadership`` holds the
elector, whose listener (:class:`~worker.leadership.maintainer.LeaderWork`) starts the
``singletons`` group while it holds the lease and stops it on losing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from redis.asyncio import Redis

from worker.app import App
from worker.client import Client
from worker.consumer.config import ConsumerConfig
from worker.consumer.consumer import Consumer
from worker.consumer.dead import DeadLetters
from worker.consumer.limits import LimitsHook
from worker.context import Context
from worker.core.clock import Clock, ms
from worker.core.component import Backoff, Component, Group
from worker.core.hooks import UserHooks
from worker.core.jobdefs import JobHook, duty_lane, with_lanes
from worker.core.metrics import Metrics
from worker.core.serializer import Deserialize, Serialize
from worker.core.views import ProcessView
from worker.duties.backlog import NAME as BACKLOG_NAME
from worker.duties.backlog import QueueMetrics
from worker.duties.broadcast import NAME as BROADCAST_NAME
from worker.duties.broadcast import BroadcastListener
from worker.duties.checks import NAME as CHECKS_NAME
from worker.duties.checks import HealthChecks
from worker.duties.initializer import Initializer, InitializerDef
from worker.duties.keyed import KeyedService
from worker.duties.outbox import NAME as OUTBOX_NAME
from worker.duties.outbox import OutboxRelay
from worker.duties.periodic import NAME as PERIODIC_NAME
from worker.duties.periodic import PeriodicEnqueuer, TickHook
from worker.duties.poller import InflightHook, PollingScheduler
from worker.duties.reaper import REAP_EVERY_S, OrphanReaper
from worker.duties.registry import Heartbeat, WriteWitness
from worker.duties.schedules import NAME as SCHEDULES_NAME
from worker.duties.schedules import ScheduleEnqueuer
from worker.duties.services import Service, ServiceDef
from worker.duties.unannounced import NAME as UNANNOUNCED_NAME
from worker.duties.unannounced import UnannouncedJobs
from worker.duties.workflows import WorkflowHook
from worker.leadership.base import NAME as LEADER_NAME
from worker.leadership.base import Leadership, LeaderTiming
from worker.leadership.elector import LeaderElector
from worker.leadership.maintainer import LeaderWork
from worker.leadership.static import StaticLeader
from worker.polls import PollerDef
from worker.runtime.health import HealthServer
from worker.runtime.watchdog import NAME as WATCHDOG_NAME
from worker.runtime.watchdog import LoopWatchdog, blocked_threshold_s
from worker.settings import ROLES, Role, Settings
from worker.storage.jobs import Retention
from worker.storage.sharded import Shards
from worker.storage.store import FencedStore, Store
from worker.sync import SyncThreads, SyncThreadsHook
from worker.tracing import Tracing

GroupName = Literal["infra", "work", "leadership", "singletons"]
EVERY: frozenset[Role] = frozenset(ROLES)
LEADERS: frozenset[Role] = frozenset({"all", "leader"})


@dataclass
class Wiring:
    """What factories build components from (explicit dependencies, no settings lookups
    beyond each component's own slice)."""

    settings: Settings
    app: App
    instance_id: str
    clock: Clock
    metrics: Metrics
    serializer: tuple[Serialize, Deserialize]
    redis: Redis
    client: Client
    process: ProcessView
    #: The consumer's queue shards (home first) on connections of its own.
    consumer_shards: Callable[[], Shards]
    #: A connection of its own for the broadcast listener's blocking reads.
    broadcast_redis: Callable[[], Redis]
    leader_store: Callable[[], Store]
    singletons: Group
    #: The loop watchdog's store, on a connection of its own (called in the watchdog's thread).
    watchdog_store: Callable[[], Store]
    #: ``run --burst``: the consumer exits once no job is due (see ``ConsumerConfig.burst``).
    burst: bool = False
    leadership: Leadership | None = None
    fenced: FencedStore | None = None
    #: Built by :func:`build`: the consumer, read by the loop watchdog.
    consumer: Component | None = None
    #: Built right after the leadership, so user code gets the lease (``ctx.is_leading()``).
    context: Context = field(init=False)
    #: The heartbeat's record of accepted writes, read by the orphan reaper.
    writes: WriteWitness = field(default_factory=WriteWitness)

    @property
    def store(self) -> Store:
        return self.client.store

    @property
    def tracing(self) -> Tracing | None:
        """``WORKER_TRACING=otel``: the process's spans (the client's), else ``None``."""
        return self.client.tracing

    def fence(self) -> FencedStore:
        assert self.fenced is not None, "singletons are built after the leadership"
        return self.fenced


Items = Callable[[App, Settings], Iterable[tuple[str, Any]]]
Factory = Callable[[Wiring, Any], Component]


@dataclass(frozen=True)
class Spec:
    """One row of the table: components named by ``items``, run by ``roles``, in ``group``."""

    roles: frozenset[Role]
    group: GroupName
    items: Items
    build: Factory


def one(name: str, when: Callable[[App, Settings], bool] = lambda a, s: True) -> Items:
    """Items of a single-component row, present when ``when`` holds."""
    return lambda app, s: [(name, None)] if when(app, s) else []


# -- factories ----------------------------------------------------------------------------------


def _heartbeat(w: Wiring, _: Any) -> Component:
    s = w.settings
    return Heartbeat(
        w.store,
        w.process,
        w.clock,
        instance_id=w.instance_id,
        instance_name=s.instance_name,
        role=s.role,
        interval_s=s.heartbeat_interval_s,
        metrics=w.metrics,
        app=w.app.name,
        witness=w.writes,
    )


def _health(w: Wiring, _: Any) -> Component:
    s = w.settings
    return HealthServer(
        w.process,
        w.metrics,
        w.clock,
        host=s.health_host,
        port=s.health_port,
        strict=s.health_port_explicit,
        allowed=s.health_allowed_hosts,
    )


def _checks(w: Wiring, _: Any) -> Component:
    return HealthChecks(list(w.app.health_checks.values()), w.context, w.clock, w.metrics)


def _watchdog(w: Wiring, _: Any) -> Component:
    s = w.settings
    threshold = blocked_threshold_s(
        s.loop_blocked_s,
        renew_deadline_s=s.leader_renew_deadline_s,
        orphan_stale_s=s.orphan_stale_s,
        heartbeat_s=s.heartbeat_interval_s,
    )

    def actions() -> list[object]:
        # the ends first: once the lease is dropped, a new leader's orphan reaper comes sooner
        return [c for c in (w.consumer, w.leadership) if c is not None]

    return LoopWatchdog(
        actions, w.watchdog_store, metrics=w.metrics, threshold_s=threshold, clock=w.clock
    )


def _consumer(w: Wiring, _: Any) -> Component:
    s = w.settings
    config = ConsumerConfig(
        concurrency=s.concurrency,
        duty_slots=s.duty_slots,
        poll_delay_s=s.poll_delay_s,
        idle_poll_max_s=s.idle_poll_max_s,
        idle_poll_subscribed_s=s.idle_poll_subscribed_s,
        job_timeout_s=s.job_timeout_s,
        max_tries=s.max_tries,
        keep_result_s=s.keep_result_s,
        shutdown_timeout_s=s.shutdown_timeout_s,
        holds_ttl_s=max(s.job_timeout_s + 60, s.orphan_stale_s * 3),
        max_payload_bytes=s.max_payload_bytes,
        queues=consumer_queues(w.app, s),
        fair=tuple(q for q in w.app.fair_queues() if q in consumer_queues(w.app, s)),
        flow_weights=tuple(w.app.flow_weights.items()),
        # well inside the orphan bound: a consumer doubts its claims before they can be reaped
        doubt_s=max(0.2, min(5.0, s.orphan_stale_s / 2)),
        burst=w.burst,
        retention=Retention(s.failures_keep, ms(s.failures_keep_s), s.done_keep),
    )
    # the features' per-job hooks (worker.core.jobdefs.JobHook), called in this order for every job
    shards = w.consumer_shards()
    store = shards.home
    # tracing first: its span wraps the run and every other hook's steps
    hooks: list[JobHook] = [w.tracing.hook()] if w.tracing is not None else []
    hooks += [
        SyncThreadsHook(w.context.threads, w.clock),  # first to admit: it needs no Redis
        LimitsHook(store, w.clock),
        TickHook(w.store, list(w.app.periodics), w.clock, instance_id=w.instance_id),
        WorkflowHook(
            store,
            w.app.jobs(),
            w.serializer,
            w.clock,
            keep_result_s=s.keep_result_s,
            metrics=w.metrics,
        ),
    ]
    if w.app.pollers:
        hooks.append(InflightHook(w.store, w.app.pollers, w.clock))
    if w.app.job_start_hooks or w.app.job_end_hooks:
        timeout = s.job_hook_timeout_s
        hooks.append(UserHooks(w.app.job_start_hooks, w.app.job_end_hooks, timeout_s=timeout))
    dead = DeadLetters(
        w.store,
        w.clock,
        instance_id=w.instance_id,
        max_entries=s.dead_letter_max,
        keep_bytes=s.dead_letter_payload_bytes,
        metrics=w.metrics,
        shards=w.client.shards,
    )
    return Consumer(
        w.app.jobs(),
        hooks,
        w.context,
        shards,
        w.serializer,
        w.clock,
        instance_id=w.instance_id,
        config=config,
        dead=dead,
        metrics=w.metrics,
    )


def _broadcast(w: Wiring, _: Any) -> Component:
    return BroadcastListener(
        w.app.broadcasts,
        w.context,
        w.store.with_redis(w.broadcast_redis()),
        w.serializer[1],
        w.clock,
        metrics=w.metrics,
        max_bytes=w.settings.max_broadcast_bytes,
    )


def _process_service(w: Wiring, sv: ServiceDef) -> Component:
    if sv.cardinality == "per_process":
        return Service(sv, w.context, w.clock)
    s = w.settings
    return KeyedService(
        sv,
        w.context,
        w.store,
        w.clock,
        instance_id=w.instance_id,
        lease_ttl_s=s.leader_ttl_s,
        renew_interval_s=s.leader_renew_interval_s,
        renew_deadline_s=s.leader_renew_deadline_s,
        stop_grace_s=s.stop_grace_s,
    )


def _leadership(w: Wiring, _: Any) -> Component:
    s = w.settings
    leader: Leadership
    if s.leader_election == "static":
        leader = StaticLeader(w.store, w.clock, ttl_s=s.leader_ttl_s, metrics=w.metrics)
    else:
        timing = LeaderTiming(
            s.leader_ttl_s,
            s.leader_renew_interval_s,
            s.leader_renew_deadline_s,
            s.leader_poll_interval_s,
        )
        leader = LeaderElector(
            w.leader_store(),
            timing,
            w.clock,
            stop_grace_s=s.stop_grace_s,
            metrics=w.metrics,
            instance=s.instance_name,
        )
    # the election starts and stops nothing itself: the leader-only work listens to it
    leader.listen(LeaderWork(w.singletons, stop_grace_s=s.stop_grace_s))
    return leader


def _initializer(w: Wiring, init: InitializerDef) -> Component:
    poller = w.app.pollers.get(init.poller) if init.poller else None
    return Initializer(init, poller, w.context, w.fence(), w.clock, w.metrics)


def _poller(w: Wiring, p: PollerDef) -> Component:
    queue = w.app.queue_of(p.task)
    if w.settings.duty_slots:
        queue = duty_lane(queue)  # poll jobs wait for no user job (the consumers' duty slots)
    return PollingScheduler(
        p, w.store, w.fence(), w.serializer[0], w.clock, w.metrics, queue, tracing=w.tracing
    )


def _periodic(w: Wiring, _: Any) -> Component:
    jobs = list(w.app.periodics.values())
    if w.settings.duty_slots:  # ticks wait for no user job: each goes to its queue's duty lane
        jobs = [replace(p, queue=duty_lane(p.queue)) for p in jobs]
    return PeriodicEnqueuer(
        jobs,
        w.store,
        w.fence(),
        w.serializer[0],
        w.clock,
        w.metrics,
        tracing=w.tracing,
    )


def _schedules(w: Wiring, _: Any) -> Component:
    queues = {task: w.app.queue_of(task) for task in w.app.tasks}
    fenced = w.fence()
    return ScheduleEnqueuer(queues, fenced.store, fenced, w.serializer[0], w.clock, w.metrics)


def _outbox(w: Wiring, _: Any) -> Component:
    queues = {task: w.app.queue_of(task) for task in w.app.tasks}
    dsn = w.settings.outbox_dsn
    assert dsn is not None
    put = (w.store, w.fence(), queues, w.serializer[0], w.clock, w.metrics)
    return OutboxRelay(dsn.get_secret_value(), *put)


def _reaper(w: Wiring, _: Any) -> Component:
    s = w.settings
    return OrphanReaper(
        w.store,
        w.fence(),
        w.clock,  # it reads the server's TIME itself: heartbeat scores are on that clock
        stale_s=s.orphan_stale_s,
        # one look per 2 s at most: the reap bound is the stale age plus this, whatever the
        # (idle-cheap, long) heartbeat interval
        interval_s=min(s.heartbeat_interval_s, REAP_EVERY_S),
        metrics=w.metrics,
        queues=with_lanes(w.app.queue_names()),
        witness=w.writes,
        # the other queue shards, fenced by token (the lease is in another hash slot)
        shards=[FencedStore(shard, w.fence().leader) for shard in w.client.shards.stores[1:]],
    )


def _backlog(w: Wiring, _: Any) -> Component:
    return QueueMetrics(
        w.store, w.app.queue_names(), w.clock, w.metrics, shards=w.client.shards.stores
    )


def _unannounced(w: Wiring, _: Any) -> Component:
    return UnannouncedJobs(
        w.client.shards.stores,
        with_lanes(w.app.queue_names()),  # a lane job parked by a consumer that died, too
        w.clock,
        interval_s=w.settings.unannounced_look_s,
    )


def _singleton_service(w: Wiring, sv: ServiceDef) -> Component:
    return Service(sv, w.context, w.clock, leader=w.leadership)


# -- the table ----------------------------------------------------------------------------------

SPECS: tuple[Spec, ...] = (
    Spec(EVERY, "infra", one("heartbeat"), _heartbeat),
    Spec(EVERY, "infra", one("health-server", lambda a, s: bool(s.health_port)), _health),
    Spec(EVERY, "infra", one(CHECKS_NAME, lambda a, s: bool(a.health_checks)), _checks),
    Spec(EVERY, "infra", one(WATCHDOG_NAME), _watchdog),
    Spec(EVERY, "work", one("consumer"), _consumer),
    Spec(EVERY, "work", one(BROADCAST_NAME, lambda a, s: bool(a.broadcasts)), _broadcast),
    Spec(
        EVERY,
        "work",
        lambda app, s: [
            (f"service:{sv.name}", sv)
            for sv in app.services.values()
            if sv.cardinality in ("per_process", "per_key")
        ],
        _process_service,
    ),
    Spec(LEADERS, "leadership", one(LEADER_NAME), _leadership),
    Spec(
        LEADERS,
        "singletons",
        lambda app, s: [(f"initializer:{i.name}", i) for i in app.initializers.values()],
        _initializer,
    ),
    Spec(
        LEADERS,
        "singletons",
        lambda app, s: [(f"poller:{p.name}", p) for p in app.pollers.values()],
        _poller,
    ),
    Spec(LEADERS, "singletons", one(PERIODIC_NAME, lambda a, s: bool(a.periodics)), _periodic),
    Spec(LEADERS, "singletons", one(SCHEDULES_NAME, lambda a, s: bool(a.tasks)), _schedules),
    Spec(LEADERS, "singletons", one(OUTBOX_NAME, lambda a, s: bool(s.outbox_dsn)), _outbox),
    Spec(LEADERS, "singletons", one("orphan-reaper"), _reaper),
    Spec(LEADERS, "singletons", one(BACKLOG_NAME), _backlog),
    Spec(
        LEADERS,
        "singletons",
        one(UNANNOUNCED_NAME, lambda a, s: s.unannounced_look_s > 0),
        _unannounced,
    ),
    Spec(
        LEADERS,
        "singletons",
        lambda app, s: [
            (f"service:{sv.name}", sv)
            for sv in app.services.values()
            if sv.cardinality == "singleton"
        ],
        _singleton_service,
    ),
)

#: Build order: the elector first, since the singletons' fenced store reads its lease.
GROUP_ORDER: tuple[GroupName, ...] = ("leadership", "singletons", "infra", "work")


@dataclass
class Plan:
    """Which components a role runs; computed without touching Redis."""

    role: str
    enabled: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            f"role: {self.role}",
            f"enabled: {', '.join(self.enabled) or '-'}",
            f"disabled: {', '.join(self.disabled) or '-'}",
        ]


def plan(role: Role, app: App, settings: Settings) -> Plan:
    """Role -> component names. Every role consumes; only leader/all campaign and run
    singletons."""
    out = Plan(role)
    for spec in SPECS:
        names = [name for name, _ in spec.items(app, settings)]
        (out.enabled if role in spec.roles else out.disabled).extend(names)
    return out


def build(w: Wiring) -> dict[GroupName, list[Component]]:
    """Build every component of the settings' role from :data:`SPECS`, by group."""
    role = w.settings.role
    groups: dict[GroupName, list[Component]] = {g: [] for g in GROUP_ORDER}
    for group in GROUP_ORDER:
        for spec in SPECS:
            if spec.group != group or role not in spec.roles:
                continue
            for name, item in spec.items(w.app, w.settings):
                component = spec.build(w, item)
                assert component.name == name, (component.name, name)
                if isinstance(component, Consumer):
                    w.consumer = component
                groups[group].append(component)
        if group == "leadership":
            if groups["leadership"]:
                leader = groups["leadership"][0]
                assert isinstance(leader, Leadership)
                w.leadership = leader
                w.fenced = FencedStore(w.store, leader)
            s = w.settings
            w.context = Context(
                s, w.redis, w.client, w.clock, w.instance_id, leader=w.leadership,
                threads=sync_threads(s, w.metrics),
            )  # fmt: skip
    w.singletons.components.extend(groups["singletons"])
    return groups


def sync_threads(settings: Settings, metrics: Metrics) -> SyncThreads:
    """The process's one pool for plain ``def`` jobs, its load exported."""
    threads = SyncThreads(settings.sync_threads)
    metrics.sync_threads_busy.set_function(lambda: float(threads.busy))
    metrics.sync_threads_stuck.set_function(lambda: float(threads.stuck))
    return threads


def consumer_queues(app: App, settings: Settings) -> tuple[str, ...]:
    """The queues a consumer takes jobs from, highest priority first: ``WORKER_QUEUES``, else
    every queue the app uses."""
    chosen = [q.strip() for q in settings.queues.split(",") if q.strip()]
    return tuple(chosen or app.queue_names())


def restart_backoff(settings: Settings) -> Callable[[], Backoff]:
    """The supervisor's backoff factory for ``settings``."""
    return lambda: Backoff(settings.restart_backoff_base_s, settings.restart_backoff_cap_s)
