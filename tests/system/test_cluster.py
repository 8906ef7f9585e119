"""Redis Cluster: the demo and the fault tests, again, on a 3-node cluster (``valkey-server
--cluster-enabled yes``, 3 primaries, slots split evenly).

Every key of one app shares a hash slot: the key prefix is a hash tag (``{t…}:``), job ids the
framework makes start with it (so arq's ``arq:job:<id>`` keys land in the slot too), and each
process talks to the one primary serving that slot (``redis+cluster://``,
worker/storage/connection.py).
So the tests here are the single-server ones, run with ``redis_url`` a ``redis+cluster://`` URL
naming the three nodes, a hash-tagged ``key_prefix`` and ``rsync`` a client on the node
serving the app's slot. A job id outside the slot (a plain arq client that did not pass
``_job_id=client.new_job_id()``) is dead-lettered, not a crash of the claim script.

The primary failover of the slot's node (3 primaries with 2 replicas each, the node SIGKILLed
at the worst moments) is in tests/system/test_failover.py.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import pytest
import redis as redis_sync
from redis.crc import key_slot

from harness import CliRun, Spawn, client_call, wait_until
from harness.topology import Cluster
from tests.duties.test_poll_outcomes import (
    test_an_item_whose_job_record_was_lost_is_put_back as test_cluster_lost_poll_job_item_put_back,
)
from tests.system.test_clock_skew import (
    test_skewed_and_jumping_host_clocks_neither_lose_double_nor_advance_ticks_or_poll_items as test_cluster_clock_skew,  # noqa: E501
)
from tests.system.test_demo import run_demo
from tests.system.test_faults import (
    test_initializer_once_per_cluster_resumes_after_sigkill as test_cluster_initializer_resumes_after_sigkill,  # noqa: E501
)
from tests.system.test_faults import (
    test_sigkill_leader_new_epoch_and_missed_ticks_caught_up as test_cluster_sigkill_leader_missed_ticks_caught_up,  # noqa: E501
)
from tests.system.test_faults import (
    test_sigstop_leader_past_ttl_is_fenced_and_steps_down as test_cluster_sigstop_leader_is_fenced,
)

pytestmark = pytest.mark.slow

__all__ = [
    "test_cluster_clock_skew",
    "test_cluster_initializer_resumes_after_sigkill",
    "test_cluster_lost_poll_job_item_put_back",
    "test_cluster_sigkill_leader_missed_ticks_caught_up",
    "test_cluster_sigstop_leader_is_fenced",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(masters=3, replicas=0) as c:
        yield c


@pytest.fixture
def key_prefix() -> str:
    return f"{{t{uuid.uuid4().hex[:6]}}}:"


@pytest.fixture
def redis_url(cluster: Cluster) -> str:
    return cluster.url()


@pytest.fixture
def rsync(cluster: Cluster, key_prefix: str) -> Iterator[redis_sync.Redis]:
    node = cluster.owner(key_slot(f"{key_prefix}queue".encode()))
    client = node.client()
    yield client
    client.close()


def test_the_demo_on_a_cluster(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, key_prefix: str
) -> None:
    run_demo(spawn, rsync, redis_url, key_prefix)


def test_apps_live_in_their_own_slots_and_a_foreign_job_id_is_dead_lettered(
    spawn: Spawn,
    cluster: Cluster,
    rsync: redis_sync.Redis,
    redis_url: str,
    key_prefix: str,
    cli: CliRun,
) -> None:
    consumer = spawn("consumer", name="consumer")
    wait_until(lambda: rsync.zcard(f"{key_prefix}instances") == 1, timeout=30, what="start")
    job = client_call(redis_url, key_prefix, "enqueue", "record", "k1")
    assert job is not None and job.startswith(key_prefix)  # arq's keys share the slot
    wait_until(
        lambda: rsync.hget(f"{key_prefix}ledger:records", "k1") == b"1", timeout=20, what="run"
    )
    # A plain arq client's random id: its arq:job:<id> is in another slot; the claim script
    # takes it off the queue without touching it and the consumer sets it aside.
    rsync.zadd(f"{key_prefix}queue", {"plain-arq-id": 0})
    wait_until(
        lambda: rsync.hexists(f"{key_prefix}dead:jobs", "plain-arq-id"),
        timeout=20,
        what="the foreign id dead-lettered",
    )
    assert rsync.zcard(f"{key_prefix}queue") == 0
    assert client_call(redis_url, key_prefix, "enqueue", "record", "k2")
    wait_until(
        lambda: rsync.hget(f"{key_prefix}ledger:records", "k2") == b"1", timeout=20, what="run"
    )
    assert consumer.alive()
    # the command line reads the app through the same slot-pinned connection
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": key_prefix}
    done = cli("status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["instances"], done.stdout
    # Nothing the framework wrote anywhere in the cluster lacks a hash tag (an untagged key
    # would be in some other slot: a cross-slot error waiting to happen)
    untagged = []
    for node in cluster.masters:
        with node.client() as c:
            untagged += [k.decode() for k in c.keys("*") if not re.search(rb"\{[^}]+\}", k)]
    assert not untagged, untagged
    mine = [k.decode() for k in rsync.keys(f"*{key_prefix[:-1]}*")]
    assert any(":instance:" in k for k in mine) and any(k.startswith("arq:") for k in mine)
    assert {key_slot(k.encode()) for k in mine} == {key_slot(key_prefix.encode())}


async def test_status_names_the_primary_serving_each_queue_shard(
    cluster: Cluster, cli: CliRun
) -> None:
    """Each shard of ``{shop}:`` (3 shards) lands on its own primary of a 3-primary cluster
    made like ``redis-cli --cluster create``; the read model names it and the doctor agrees."""
    import redis.asyncio as aioredis

    from worker.app import App
    from worker.ops import doctor, snapshot
    from worker.storage import keys as K
    from worker.storage.shards import shard_prefixes, slot_of_prefix
    from worker.storage.store import Store

    prefixes = shard_prefixes("{shop}:", 3)
    owners = [cluster.owner(slot_of_prefix(p)) for p in prefixes]
    clients = [aioredis.Redis(host="127.0.0.1", port=node.port) for node in owners]
    try:
        stores = [Store(c, K.Keys(p)) for c, p in zip(clients, prefixes, strict=True)]
        await clients[1].zadd(f"{prefixes[1]}queue", {f"{prefixes[1]}j": 0})
        app = App("shop")
        snap = await snapshot.read(stores[0], app, checks=False, shards=stores)
        assert [s.node for s in snap.shards] == [f"127.0.0.1:{node.port}" for node in owners]
        assert len({s.node for s in snap.shards}) == 3 and snap.cluster_masters == 3
        assert [s.depth for s in snap.shards] == [0, 1, 0]
        assert doctor.judge(snap, app, doctor.Limits()).check("shards").status == "ok"
        # the command line, through its connection per shard
        env = {
            "WORKER_REDIS_URL": cluster.url(),
            "WORKER_KEY_PREFIX": "{shop}:",
            "WORKER_QUEUE_SHARDS": "3",
            "WORKER_APP": "harness.apps.ledger:app",
        }
        done = cli("status", "--json", env=env)
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)["shards"]
        assert [(s["node"], s["depth"]) for s in shown] == [
            (f"127.0.0.1:{node.port}", depth) for node, depth in zip(owners, (0, 1, 0), strict=True)
        ]
    finally:
        for c in clients:
            await c.aclose()
