"""The outbox relay across a Redis failover: orders committed in PostgreSQL all along while the
Sentinel primary is SIGKILLed mid-relay and a replica promoted; real ``python -m worker``
processes (examples/outbox, the WAIT policy ``auto``: one replica confirms each move). Every
committed order runs its receipt exactly once: no row lost (a move the replicas did not
confirm leaves its rows), none twice (a row moved again finds its id)."""

from __future__ import annotations

import threading
import time

import pytest

from harness import Spawn, wait_until
from harness.postgres import Postgres
from harness.topology import SentinelSet
from tests.outbox.test_outbox import env_for, order, outbox_rows, prepare, receipts
from tests.system.sentinel_url import on_sentinels, sentinels

__all__ = ["on_sentinels", "sentinels"]  # the fixtures: 1 replica, Sentinels, a 2 s detection
# a primary killed and a replica promoted on time bounds (Sentinel down-after, Cluster node
# timeout): the failover tests take their turns on one xdist worker, not four at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("failover")]

APP = "outbox.app:app"
#: Orders committed, one every ``EVERY_S``: the kill lands in the middle.
ORDERS, EVERY_S = 150, 0.04


def test_orders_committed_across_a_failover_each_run_once(
    spawn: Spawn, postgres: Postgres, sentinels: SentinelSet
) -> None:
    dsn = prepare(postgres, "outbox_failover")
    procs = [spawn("all", name=n, app=APP, env=env_for(dsn)) for n in ("a", "b")]
    order(dsn, 0)
    wait_until(lambda: 0 in receipts(dsn), 60, 0.1, what="a first receipt")

    def produce() -> None:
        for n in range(1, ORDERS + 1):
            order(dsn, n)
            time.sleep(EVERY_S)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_until(lambda: len(receipts(dsn)) > ORDERS // 4, 60, 0.05, what="relaying")
        old = sentinels.kill_primary()  # mid-relay: orders keep committing
        sentinels.wait_failover(old, 30)
    finally:
        producer.join(60)
    every = set(range(ORDERS + 1))
    wait_until(lambda: set(receipts(dsn)) == every, 90, 0.2, what="every receipt")
    time.sleep(1.0)
    counts = receipts(dsn)
    assert {n: c for n, c in counts.items() if c != 1} == {}, [p.log()[-2000:] for p in procs]
    assert outbox_rows(dsn) == []
