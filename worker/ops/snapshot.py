"""The one read model of a cluster: what ``status``, ``doctor`` and the console show, read once.

:func:`read` takes a :class:`ClusterSnapshot` through the store's read-only methods ("now" being
the Redis server's clock); :mod:`worker.ops.status` shapes it into its table and JSON,
:mod:`worker.ops.doctor` judges it, and the console does both with the same snapshot on every poll.
``checks=False`` leaves out what only the doctor's checks need (the epoch counter and lease
state, holds sets by ``SCAN``, the primary's replicas).

With queue shards (``WORKER_QUEUE_SHARDS`` > 1, ``shards`` the store of each, home first) the
queues' figures are read from every shard: ``queues`` and ``dead_letters`` are the totals, as
with one shard, and ``shards`` keeps each shard's own (its prefix, hash slot and, on a Redis
Cluster, the primary serving that slot), what ``status`` prints per shard and the doctor's
``shards`` check judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.app import App
from worker.core.clock import Clock, ms, on_server_time
from worker.core.ids import LockValue
from worker.core.jobdefs import duty_lane
from worker.core.schedule_spec import ScheduleSpec
from worker.duties import kinds
from worker.storage.server import read_attached, read_eviction_policy, read_slot_owners
from worker.storage.shards import slot_of_prefix
from worker.storage.store import Store


@dataclass
class Instance:
    """A registered instance: its last heartbeat (the server's clock, ms) and record (``None``
    once expired: it missed about 2.5 heartbeats)."""

    id: str
    heartbeat_ms: int
    record: dict[str, Any] | None

    @property
    def name(self) -> str:
        return str((self.record or {}).get("name") or self.id)

    @property
    def offset_ms(self) -> float | None:
        value = (self.record or {}).get("clock_offset_ms")
        return float(value) if isinstance(value, int | float) else None

    def age_s(self, now_ms: int) -> float:
        """Seconds since its last heartbeat, on the server's clock."""
        return (now_ms - self.heartbeat_ms) / 1000


@dataclass(frozen=True)
class QueueState:
    """One queue: ``name`` as the app declares it, ``key`` its sorted set, jobs in it
    (``depth``), due and unclaimed (``due``) and the oldest score (``head_ms``)."""

    name: str
    key: str
    depth: int
    due: int
    head_ms: int | None


@dataclass(frozen=True)
class FlowState:
    """A fair queue's flow keys: how many are active (jobs waiting to be moved into the queue)
    and the backlog of the next :data:`FLOWS_SHOWN` to be served, over every shard."""

    active: int
    backlog: dict[str, int]


#: Flow keys of a fair queue whose backlog a snapshot reads (in the order they are served).
FLOWS_SHOWN = 20


@dataclass(frozen=True)
class ShardState:
    """One queue shard: its ``index`` (0: the home), key ``prefix``, hash ``slot``, the
    ``node`` (``host:port``) serving that slot on a Redis Cluster (``None``: not a cluster, or
    no node claims it), its own ``queues`` and dead letters."""

    index: int
    prefix: str
    slot: int
    node: str | None
    queues: list[QueueState]
    dead_letters: int
    #: the shard's fence as written (``None``: none; home has none), see ``fenced.TOKEN_FENCE``
    fence: str | None = None

    @property
    def depth(self) -> int:
        return sum(q.depth for q in self.queues)

    @property
    def due(self) -> int:
        return sum(q.due for q in self.queues)


@dataclass
class ClusterSnapshot:
    """Everything the cluster's views show and the doctor judges, read once."""

    now_ms: int
    prefix: str
    lock: LockValue | None
    lock_pttl_ms: int
    instances: list[Instance]
    policy: str | None
    policy_source: str
    queues: list[QueueState]
    dead_letters: int
    paused: set[str] = field(default_factory=set)
    #: each fair queue's flow keys (``@app.task(fair=True)``), see :mod:`worker.storage.fair`
    flows: dict[str, FlowState] = field(default_factory=dict)
    #: each duty kind's state (kind name -> what its ``Kind.read`` returned), see
    #: :mod:`worker.duties.kinds`
    duties: dict[str, Any] = field(default_factory=dict)
    #: run-time schedules (``client.schedules``), their newest planned tick and overlap skips
    schedules: dict[str, ScheduleSpec] = field(default_factory=dict)
    schedule_last: dict[str, int] = field(default_factory=dict)
    schedule_overlaps: dict[str, int] = field(default_factory=dict)
    # -- what only the doctor's checks read (``checks=True``) --
    #: the counter, or its text when it is not an epoch (written by someone else)
    epoch_counter: int | str | None = None
    lease_state: dict[str, str] = field(default_factory=dict)
    holds: dict[str, int] = field(default_factory=dict)
    #: replicas attached to the primary (``INFO replication``; ``None``: not readable)
    attached_replicas: int | None = None
    #: each queue shard's own figures, home first (empty: one shard, today's layout)
    shards: list[ShardState] = field(default_factory=list)
    #: the primaries of the Redis Cluster (``CLUSTER SLOTS``; 0: not a cluster), read with shards
    cluster_masters: int = 0
    #: channels of this prefix listened on from another database of the server (``None``:
    #: not readable), see ``SubscriptionOps.neighbour_channels``
    neighbours: list[str] | None = field(default_factory=list)

    @property
    def live(self) -> list[Instance]:
        return [i for i in self.instances if i.record is not None]

    @property
    def queue_head_ms(self) -> int | None:
        """The earliest score over every queue."""
        heads = [q.head_ms for q in self.queues if q.head_ms is not None]
        return min(heads) if heads else None


async def read(
    store: Store,
    app: App,
    clock: Clock | None = None,
    *,
    now_ms: int | None = None,
    checks: bool = True,
    shards: Sequence[Store] = (),
) -> ClusterSnapshot:
    """Read the cluster behind ``store`` for ``app`` (read-only). "Now" is ``now_ms`` when
    given (tests), else ``clock`` synced to the server (a client's), else the server's
    ``TIME``. ``shards``: every queue shard's store, home (``store``) first, when there are
    more than one (see module docstring)."""
    if now_ms is None and clock is None:
        now_ms = round(await store.server_time_ms())
    elif now_ms is None and clock is not None:
        await on_server_time(clock, store.server_time_ms)  # due times are on the server's clock
        now_ms = ms(clock.time())
    assert now_ms is not None
    keys = store.keys
    names = app.queue_names()
    names += [duty_lane(q) for q in names]  # then each queue's duty lane (ticks, poll jobs)
    per_shard = [await _queues(s, names, now_ms) for s in shards] if len(shards) > 1 else []
    queues = _merged(per_shard) if per_shard else (await _queues(store, names, now_ms))[0]
    lock, pttl = await store.read_lock()
    policy, source = await read_eviction_policy(store.redis)
    snap = ClusterSnapshot(
        now_ms=now_ms,
        prefix=keys.prefix,
        lock=lock,
        lock_pttl_ms=pttl,
        instances=[Instance(i, hb, rec) for i, hb, rec in await store.instances()],
        policy=policy,
        policy_source=source,
        schedules=await store.schedules_read(),
        schedule_last=await store.schedule_state(),
        schedule_overlaps=await store.schedule_overlaps(),
        queues=queues,
        dead_letters=sum(d for _, d in per_shard) if per_shard else await store.dead_count(),
        paused=await store.paused(),
        flows={q: await _flows(shards or [store], q) for q in app.fair_queues()},
        duties={kind.name: await kind.read(store, app, now_ms) for kind in kinds.KINDS},
    )
    if checks:
        snap.epoch_counter, snap.lease_state = await store.lease_counters()
        snap.holds = await store.holds_sets()
        snap.attached_replicas = await read_attached(store.redis)
        snap.neighbours = await store.neighbour_channels()
    if per_shard:
        owners = await read_slot_owners(store.redis)
        snap.cluster_masters = len({addr for _, _, addr in owners})
        fences = [None, *[await s.read_fence() for s in shards[1:]]]
        snap.shards = _shards(shards, per_shard, owners, fences)
    return snap


async def _queues(store: Store, names: list[str], now_ms: int) -> tuple[list[QueueState], int]:
    """One shard's queues (in the app's order) and its dead letters."""
    keys = store.keys
    depths = await store.queue_depths(names, now_ms)
    heads = await store.queue_heads([keys.queue_of(n) for n in names])
    queues = [
        QueueState(n, keys.queue_of(n), all_, due, head)
        for n, (due, all_), head in zip(names, depths, heads, strict=True)
    ]
    return queues, await store.dead_count()


async def _flows(stores: Sequence[Store], queue: str) -> FlowState:
    """Fair ``queue``'s flow keys over every shard (a key's jobs are in its shard)."""
    active, backlog = 0, dict[str, int]()
    for store in stores:
        n, shown = await store.fair_backlog(queue, FLOWS_SHOWN)
        active += n
        for flow in shown:
            backlog[flow.flow_key] = backlog.get(flow.flow_key, 0) + flow.jobs
    return FlowState(active, backlog)


def _merged(per_shard: list[tuple[list[QueueState], int]]) -> list[QueueState]:
    """Each queue over every shard: depths and due summed, the earliest head, the home's key."""
    out = []
    for i, home in enumerate(per_shard[0][0]):
        same = [qs[i] for qs, _ in per_shard]
        heads = [q.head_ms for q in same if q.head_ms is not None]
        out.append(
            QueueState(
                home.name,
                home.key,
                sum(q.depth for q in same),
                sum(q.due for q in same),
                min(heads) if heads else None,
            )
        )
    return out


def _shards(
    stores: Sequence[Store],
    per_shard: list[tuple[list[QueueState], int]],
    owners: list[tuple[int, int, str]],
    fences: Sequence[str | None] = (),
) -> list[ShardState]:
    out = []
    for i, (store, (queues, dead)) in enumerate(zip(stores, per_shard, strict=True)):
        slot = slot_of_prefix(store.keys.prefix)
        node = next((addr for lo, hi, addr in owners if lo <= slot <= hi), None)
        fence = fences[i] if i < len(fences) else None
        out.append(ShardState(i, store.keys.prefix, slot, node, queues, dead, fence))
    return out
