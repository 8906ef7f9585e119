"""The outbox relay across a Redis failover: orders committed in PostgreSQL all along while the
Sentinel primary is SIGKILLed mid-relay and a replica promoted; real ``python -m worker``
processes (examples/outbox, the WAIT policy ``auto``: one replica confirms each move). Every
committed order runs its receipt exactly once: no row lost (a move the replicas did not
confirm leaves its rows), none twice (a row moved again finds its id)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Spawn, wait_until
from tests.postgres import Postgres
from tests.test_outbox import env_for, order, outbox_rows, prepare, receipts
from tests.topology import SentinelSet

pytestmark = pytest.mark.slow

APP = "outbox.app:app"
#: Orders committed, one every ``EVERY_S``: the kill lands in the middle.
ORDERS, EVERY_S = 150, 0.04


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """1 primary + 1 replica + 3 Sentinels, failure detected after 2 s."""
    with SentinelSet(replicas=1, down_after_ms=2000, failover_timeout_ms=3000) as s:
        yield s


@pytest.fixture
def redis_url(sentinels: SentinelSet) -> str:
    """Overrides conftest's: ``spawn`` starts its processes on the Sentinel set."""
    return sentinels.url()


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
