"""A routine Sentinel failover while poll jobs are mid-flight (harness/apps/outage.py: a 1 s
job that then reschedules its item through ``ctx.poller(...).schedule``), under real
``python -m worker`` processes: every item runs again within 15 s of the promotion.

Before: the jobs running at the kill failed with ``ConnectionError`` inside the framework's
own call, their items could not be put back either ("could not settle poll item"), and the
leader's sweep put them back ``failure_delay_s`` (60 s) later.
"""

from __future__ import annotations

import time

import pytest
import redis as redis_sync

from harness import Spawn
from harness.topology import SentinelSet
from tests.system.sentinel_url import on_sentinels, sentinels
from tests.system.test_refused_writes import (
    assert_rode_it_out,
    every_item_cycling,
    items_back,
    logged,
    mid_flight,
    ospawn,
    start_processes,
)

# a primary killed and a replica promoted on time bounds (Sentinel down-after, Cluster node
# timeout): the failover tests take their turns on one xdist worker, not four at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("failover")]

__all__ = ["on_sentinels", "ospawn", "sentinels"]  # a fixture used here


def test_poll_jobs_mid_flight_ride_out_a_sentinel_failover(
    ospawn: Spawn, sentinels: SentinelSet, lsync: redis_sync.Redis
) -> None:
    """40 poll items cycling under a leader and a consumer (default settings: WAIT ``auto``,
    ``failure_delay_s`` 60 s); the primary SIGKILLed while about half the jobs are mid-flight
    and never back: every item runs again within 15 s of the promotion."""
    prefix = ospawn.prefix  # type: ignore[attr-defined]
    ports = start_processes(
        ospawn, {"leader": "leader", "consumer": "consumer"}, {"WORKER_CONCURRENCY": "60"}
    )
    with sentinels.primary().client() as primary:
        every_item_cycling(primary, lsync, prefix)
    time.sleep(1.0)  # into the cycle: jobs start all the time
    old = sentinels.kill_primary()
    killed_at = time.time()
    caught = mid_flight(lsync, prefix, killed_at)
    sentinels.wait_failover(old, 30)
    promoted_at = time.time()
    back = items_back(lsync, prefix, promoted_at)
    assert_rode_it_out(
        ospawn, "poll jobs through a Sentinel failover", ports, caught, back,
        fault="at the kill", after="the promotion",
        figures={
            "s from kill to promotion (seen by the test)": round(promoted_at - killed_at, 2),
            "'job failed' lines": logged(ospawn, "job failed"),
        },
    )  # fmt: skip
