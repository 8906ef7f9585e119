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

from harness import Spawn, wait_until
from harness.probes import http_get, problem_report
from harness.topology import SentinelSet
from tests.system.sentinel_url import on_sentinels, sentinels
from tests.system.test_refused_writes import (
    BACK_WITHIN_S,
    ITEMS,
    first_start_after,
    logged,
    mid_flight,
    ospawn,
    schedule_items,
    start_processes,
    starts,
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
        schedule_items(primary, prefix)
    wait_until(
        lambda: len({i for i, _ in starts(lsync, prefix)}) == len(ITEMS), 20, what="every item ran"
    )
    time.sleep(1.0)  # into the cycle: jobs start all the time
    old = sentinels.kill_primary()
    killed_at = time.time()
    caught = mid_flight(lsync, prefix, killed_at)
    sentinels.wait_failover(old, 30)
    promoted_at = time.time()
    settle = promoted_at + BACK_WITHIN_S + 1
    while time.time() < settle and len(first_start_after(lsync, prefix, promoted_at)) < len(ITEMS):
        time.sleep(0.2)
    back = first_start_after(lsync, prefix, promoted_at)
    late = sorted(set(ITEMS) - {i for i, s in back.items() if s <= BACK_WITHIN_S})
    figures = {
        "s from kill to promotion (seen by the test)": round(promoted_at - killed_at, 2),
        "items mid-flight at the kill": len(caught),
        "items back within 15 s of the promotion": len(ITEMS) - len(late),
        "slowest item back (s after the promotion)": round(max(back.values(), default=-1), 2),
        "'could not settle poll item' lines": logged(ospawn, "could not settle poll item"),
        "'job failed' lines": logged(ospawn, "job failed"),
    }
    problems = []
    if late:
        problems.append(f"{len(late)} items not run within 15 s of the promotion: {late[:8]}")
    if not caught:
        problems.append("no poll job was mid-flight at the kill (test is vacuous)")
    not_live = [n for n, port in ports.items() if http_get(port, "/healthz")[0] != 200]
    if not_live:
        problems.append(f"/healthz not 200 after the failover on {not_live}")
    print(problem_report("poll jobs through a Sentinel failover", problems, figures))
    assert not problems, problem_report("poll jobs through a Sentinel failover", problems, figures)
