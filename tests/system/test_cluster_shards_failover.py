"""A cluster primary SIGKILLed mid-drain under an app whose queue has 3 shards on 3 primaries
(a replica each, promoted): no acknowledged job lost, no tick run twice, ticks back within 10 s
(harness/shard_failover.py; several kills: ``python -m bench cluster --failover``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.realredis import RealRedis
from harness.shard_failover import ShardKill
from harness.topology import Cluster

# a primary killed and a replica promoted on time bounds (Sentinel down-after, Cluster node
# timeout): the failover tests take their turns on one xdist worker, not four at once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("failover")]

#: the shards of the app and the one whose primary is killed: not the home (the lease and
#: the singleton state stay up, the queue loses a third of its shards for the failover); the
#: home's primary killed too is in ``python -m bench cluster --failover``
SHARDS, KILL_SHARD = 3, 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(masters=3, replicas=1, node_timeout_ms=1000) as c:
        yield c


@pytest.fixture(scope="module")
def ledger() -> Iterator[str]:
    with RealRedis() as server:
        yield server.url


def test_a_shard_primary_killed_mid_drain_loses_no_acknowledged_job_and_no_tick(
    cluster: Cluster, ledger: str, tmp_path: Path
) -> None:
    out = ShardKill(cluster, ledger, tmp_path, shards=SHARDS, kill_shard=KILL_SHARD, backlog=3000)
    out.run(bring_back=False)
    result = out.out
    assert 0 < result.ran_before_kill < result.backlog, result.summary()  # killed mid-drain
    assert not result.lost, result.summary()
    assert not result.ticks_twice, result.summary()
    assert result.ticks_back_after_s is not None and result.ticks_back_after_s <= 10, (
        result.summary()
    )
