"""The store of a process: every per-concern part composed into :class:`Store` and
:class:`FencedStore`, and :func:`open_store`, the one way the framework builds one."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from worker.core.redisurl import Replication
from worker.storage.broadcast import BroadcastOps
from worker.storage.claims import ClaimOps
from worker.storage.coalesce import CoalesceOps
from worker.storage.dataset import DatasetOps
from worker.storage.dead import DeadOps
from worker.storage.election import ElectionOps
from worker.storage.enqueue import EnqueueOps
from worker.storage.failures import RecordOps
from worker.storage.fair import FairOps
from worker.storage.initializer import FencedInitializerOps, InitializerOps
from worker.storage.inspect_jobs import InspectJobOps
from worker.storage.jobs import JobOps
from worker.storage.keys import Keys
from worker.storage.limits import LimitOps
from worker.storage.operators import OperatorOps
from worker.storage.outbox import FencedOutboxOps
from worker.storage.periodic import FencedPeriodicOps, PeriodicOps
from worker.storage.poller import FencedPollerOps, PollerOps
from worker.storage.registry import FencedRegistryOps, RegistryOps
from worker.storage.schedules import FencedScheduleOps, ScheduleOps
from worker.storage.shards import shard_prefixes
from worker.storage.subscriptions import SubscriptionOps
from worker.storage.wake import WakeOps
from worker.storage.workflows import WorkflowOps


class Store(
    ElectionOps,
    DatasetOps,
    ClaimOps,
    JobOps,
    WorkflowOps,  # before EnqueueOps: it enqueues the steps through it
    EnqueueOps,
    FairOps,
    RecordOps,
    PeriodicOps,
    PollerOps,
    InitializerOps,
    RegistryOps,
    LimitOps,
    DeadOps,
    BroadcastOps,
    OperatorOps,
    InspectJobOps,
    SubscriptionOps,
    ScheduleOps,
    WakeOps,
    CoalesceOps,
):
    """Every unfenced Redis operation of the framework, one part per concern (see
    :mod:`worker.storage`); build it with :func:`open_store`."""


class FencedStore(
    FencedPeriodicOps,
    FencedPollerOps,
    FencedInitializerOps,
    FencedRegistryOps,
    FencedScheduleOps,
    FencedOutboxOps,
):
    """The writes only the leader may make, over a :class:`Store` and a
    :class:`~worker.core.views.LeaderView` (see :mod:`worker.storage.fenced`)."""

    store: Store


def same_store(store: Store, fenced: FencedStore) -> Store:
    """``store``, checked to hold the keys ``fenced`` writes: a leader-only duty is given the
    store it reads and the fenced store it writes side by side, never one through the other."""
    if store.keys.prefix != fenced.keys.prefix:
        raise ValueError(
            f"the fenced store writes {fenced.keys.prefix!r}, the store reads {store.keys.prefix!r}"
        )
    return store


def open_store(redis: Redis, keys: Keys, replication: Replication | None) -> Store:
    """The process's store over ``redis``: always with the app's WAIT policy (``None`` only
    where the settings have none to give, e.g. a bare test client)."""
    return Store(redis, keys, replication)


def open_shards(
    redis: Redis,
    keys: Keys,
    replication: Replication | None,
    n: int,
    clients: Sequence[Redis] | None = None,
) -> tuple[Store, ...]:
    """One :class:`Store` per queue shard (``WORKER_QUEUE_SHARDS``), home first, each over the
    key names of its shard's prefix (see :mod:`worker.storage.shards`): over ``redis`` alone,
    or over ``clients``, one per shard (home first: on Redis Cluster each shard's slot is
    served by its own connection, :func:`worker.storage.connection.connect_shards`). With ``n == 1``
    the only one is the home store over ``keys``."""
    prefixes = shard_prefixes(keys.prefix, n)
    conns = list(clients) if clients is not None else [redis] * n
    if len(conns) != n:
        raise ValueError(f"{n} shards need {n} clients, got {len(conns)}")
    rest = (
        open_store(c, Keys(p), replication) for c, p in zip(conns[1:], prefixes[1:], strict=True)
    )
    return (open_store(conns[0], keys, replication), *rest)
