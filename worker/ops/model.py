"""The cluster's read model: what :func:`worker.ops.snapshot.read` fills in and ``status``, the
doctor and the console read (the instances, queues, shards, each duty kind's state), and what the
operator side reads of an app's declarations (:class:`Declared`).

Plain data, apart from reading it: the views and checks that only look at a snapshot import
this module, not the reader (which knows the store and every duty kind).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.core.ids import LockValue
from worker.core.schedule_spec import ScheduleSpec


class Declared(Protocol):
    """What the operator side reads of an app's declarations (:class:`worker.app.App` is one):
    its name, its queues and fair queues, its dependency checks."""

    @property
    def name(self) -> str: ...
    @property
    def health_checks(self) -> Mapping[str, Any]: ...
    def queue_names(self) -> list[str]: ...
    def fair_queues(self) -> tuple[str, ...]: ...


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
