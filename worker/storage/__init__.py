"""The storage package: the only code that sends Redis commands, one module per concern.

``keys`` names every key; ``base`` holds the client, the WAIT policy and script calls;
``fenced`` the leader's fenced writes; the other modules each own one concern's scripts
(each beside its one caller), their calls and their typed results; ``store`` composes them.
"""

from __future__ import annotations

from worker.storage.broadcast import BroadcastEntry
from worker.storage.claims import FOREIGN, Claimed, Claims
from worker.storage.election import Acquired, LeaderChange, Refused, Renewal
from worker.storage.enqueue import QueuedJob
from worker.storage.fenced import FencedPipeline
from worker.storage.initializer import InitProgress
from worker.storage.jobs import Finish, FinishOutcome, NewJob, Retention
from worker.storage.leases import LEASE_BATCH
from worker.storage.operators import TaskStats
from worker.storage.periodic import DueTicks, PeriodicRuns, TickOutcome
from worker.storage.poller import DispatchOutcome
from worker.storage.registry import Stale
from worker.storage.sharded import Shards
from worker.storage.store import FencedStore, Store, open_shards, open_store

__all__ = [
    "FOREIGN",
    "LEASE_BATCH",
    "Acquired",
    "BroadcastEntry",
    "Claimed",
    "Claims",
    "DispatchOutcome",
    "DueTicks",
    "FencedPipeline",
    "FencedStore",
    "Finish",
    "FinishOutcome",
    "InitProgress",
    "LeaderChange",
    "NewJob",
    "PeriodicRuns",
    "QueuedJob",
    "Refused",
    "Renewal",
    "Retention",
    "Shards",
    "Stale",
    "Store",
    "TaskStats",
    "TickOutcome",
    "open_shards",
    "open_store",
]
