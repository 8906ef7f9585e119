"""Queue shards (``WORKER_QUEUE_SHARDS=3``) on a real 3-master Redis Cluster: one app's jobs
spread over the three masters, real worker processes drain every shard exactly once, ticks stay
once per instant in the home shard, a ``shard_key`` keeps a key's jobs in one shard, a unique
key stays one job; a shard's fence refuses a stale leader's token (script level).

One cluster for the module (its start is the cost).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from redis.crc import key_slot

from harness import FixedLease, Spawn, wait_until
from harness.timings import FAST_ENV
from harness.topology import Cluster
from tests.system.test_cluster import cluster, key_prefix, redis_url
from worker.client import Client
from worker.core.errors import LeadershipLost, ShardFenced
from worker.core.ids import shard_index
from worker.storage.keys import Keys
from worker.storage.shards import shard_prefixes, slot_of_prefix
from worker.storage.store import FencedStore, open_store

pytestmark = pytest.mark.slow

__all__ = ["cluster", "key_prefix", "redis_url"]  # fixtures used here

N = 3


def node_of(cluster: Cluster, prefix: str) -> redis_sync.Redis:
    """A client on the master serving ``prefix``'s slot."""
    return cluster.owner(key_slot(f"{prefix}queue".encode())).client()


async def enqueue_all(url: str, prefix: str) -> dict[str, list[str | None]]:
    """Enqueue, before any consumer runs: 60 plain jobs, 6 with one shard_key, a unique key
    twice; return the ids per kind."""
    client = await Client.connect(url, key_prefix=prefix, queue_shards=N)
    try:
        plain = [await client.enqueue("record", f"p{i}") for i in range(60)]
        keyed = [await client.enqueue("record", f"k{i}", shard_key="cust-7") for i in range(6)]
        unique = [
            await client.enqueue("record", "u", unique_key="once"),
            await client.enqueue("record", "u", unique_key="once"),
        ]
        return {"plain": plain, "keyed": keyed, "unique": unique}
    finally:
        await client.close()


def test_one_app_spreads_over_three_masters_and_drains_once(
    spawn: Spawn, cluster: Cluster, redis_url: str, key_prefix: str
) -> None:
    prefixes = shard_prefixes(key_prefix, N)
    nodes = [node_of(cluster, p) for p in prefixes]
    ports = {n.connection_pool.connection_kwargs["port"] for n in nodes}
    assert len(ports) == N, "each shard on its own master"
    ids = asyncio.run(enqueue_all(redis_url, key_prefix))
    # spread by id: every master holds a third of the plain jobs, in its own shard's queue
    per_shard = [n.zcard(f"{p}queue") for n, p in zip(nodes, prefixes, strict=True)]
    assert all(c >= 15 for c in per_shard), per_shard
    for n, p, queued in zip(nodes, prefixes, per_shard, strict=True):
        assert len(n.keys(f"arq:job:{p}*")) == queued  # arq's records beside their queue
    # one shard_key: one shard; a unique key: one job
    assert len({shard_index(j or "", prefixes) for j in ids["keyed"]}) == 1
    assert ids["unique"][0] is not None and ids["unique"][1] is None
    home = nodes[0]
    env = {"WORKER_QUEUE_SHARDS": str(N)}
    spawn("all", name="a1", env=env)
    spawn("consumer", name="c1", env=env)
    want = {f"p{i}" for i in range(60)} | {f"k{i}" for i in range(6)} | {"u"}
    ledger = f"{key_prefix}ledger:records"

    def drained() -> bool:
        return set(x.decode() for x in home.hkeys(ledger)) >= want

    wait_until(drained, timeout=60, what="every shard drained")
    wait_until(lambda: home.hlen(f"{key_prefix}ledger:ticks") >= 3, timeout=30, what="ticks")
    records = {k.decode(): int(v) for k, v in home.hgetall(ledger).items()}
    assert records == dict.fromkeys(want, 1), "each job exactly once"
    assert set(home.hvals(f"{key_prefix}ledger:ticks")) == {b"1"}, "each tick once"
    # ticks are the home shard's (the duties enqueue there); the other shards' queues empty
    for n, p in zip(nodes[1:], prefixes[1:], strict=True):
        wait_until(lambda n=n, p=p: n.zcard(f"{p}queue") == 0, timeout=20, what=f"{p} drained")
    tick_ids = [j.decode() for j in home.zrange(f"{key_prefix}queue", 0, -1)]
    assert all(j.startswith(f"{key_prefix}periodic:") for j in tick_ids), tick_ids
    for n in nodes:
        n.close()


def test_a_stale_token_is_refused_by_a_shard_once_a_newer_leader_raised_its_fence(
    cluster: Cluster, key_prefix: str
) -> None:
    shard = shard_prefixes(key_prefix, N)[1]
    node = cluster.owner(slot_of_prefix(shard))

    async def scenario() -> None:
        redis = aioredis.Redis(host="127.0.0.1", port=node.port)
        try:
            store = open_store(redis, Keys(shard), None)
            old, new = FixedLease("7:old"), FixedLease("8:new")
            assert await FencedStore(store, old).raise_fence() == 7
            assert await FencedStore(store, old).reap_shard("gone", 1, ["default"]) == 0
            assert await FencedStore(store, new).raise_fence() == 8  # the new leader, first
            with pytest.raises(ShardFenced, match="below the shard fence 8"):
                await FencedStore(store, old).reap_shard("gone", 1, ["default"])
            # a shard's fence alone proves no loss (someone may have written it): the orphan
            # reaper checks the lease at home before stepping down (test_hostile_leadership)
            assert not old.losses and not new.losses
            with pytest.raises(LeadershipLost):
                await FencedStore(store, FixedLease("3:older")).raise_fence()
            assert int(await redis.get(Keys(shard).fence) or 0) == 8  # never goes back
        finally:
            await redis.aclose()

    asyncio.run(scenario())


async def enqueue_slow(url: str, prefix: str, seconds: float) -> list[str]:
    """One slow job in each shard (a shard_key that meets it)."""
    client = await Client.connect(url, key_prefix=prefix, queue_shards=N)
    try:
        out = []
        for store in client.shards.stores:
            key = next(k for k in map(str, range(99)) if client.shards.for_key(k) is store)
            jid = await client.enqueue("slow_job", seconds, shard_key=key)
            assert jid is not None and client.shards.of(jid) is store
            out.append(jid)
        return out
    finally:
        await client.close()


def test_a_dead_consumers_claims_in_every_shard_are_reaped_under_the_fence(
    spawn: Spawn, cluster: Cluster, redis_url: str, key_prefix: str
) -> None:
    prefixes = shard_prefixes(key_prefix, N)
    home = node_of(cluster, key_prefix)
    env = {"WORKER_QUEUE_SHARDS": str(N)}
    c1 = spawn("consumer", name="c1", env=env)
    ids = asyncio.run(enqueue_slow(redis_url, key_prefix, 3.0))
    started = f"{key_prefix}ledger:slow-started"
    wait_until(lambda: home.hlen(started) == N, timeout=30, what="c1 runs one job per shard")
    c1.kill()  # mid-run: its claims stay in each shard's holds set and markers
    spawn("all", name="a1", env=env)
    # the leader raised every other shard's fence to its epoch before reaping there
    lease = wait_until(lambda: home.get(f"{key_prefix}leader"), timeout=30, what="a leader")
    epoch = int(lease.split(b":")[0])
    for p in prefixes[1:]:
        shard = node_of(cluster, p)
        wait_until(lambda s=shard, p=p: s.get(f"{p}fence") is not None, timeout=20, what="fence")
        assert int(shard.get(f"{p}fence") or 0) == epoch
        shard.close()
    # re-queued at once by the reaper (not at their markers' expiry, minutes away), run again
    done = f"{key_prefix}ledger:slow-done"
    wait_until(lambda: home.hlen(done) == N, timeout=40, what="every shard's job reaped and run")
    assert {k.decode() for k in home.hkeys(done)} == set(ids)
    assert {int(v) for v in home.hvals(started)} == {2}  # killed once, run again once
    home.close()


def test_jobs_written_unannounced_in_every_shard_start_within_a_second_on_an_idle_fleet(
    spawn: Spawn, cluster: Cluster, key_prefix: str
) -> None:
    """What a plain arq client writes (the record, a ``ZADD``, no wake-up) in each shard's
    queue: the leader's look covers every shard (one ``ZRANGE`` each) and announces it."""
    from worker.core.serializer import get_serializer, job_payload
    from worker.storage import keys as K

    prefixes = shard_prefixes(key_prefix, N)
    nodes = [node_of(cluster, p) for p in prefixes]
    defaults: dict[str, str | None] = {
        k: None for k in FAST_ENV if k.endswith("_S") and k != "WORKER_DRAIN_DELAY_S"
    }
    env = {**defaults, "WORKER_QUEUE_SHARDS": str(N)}
    spawn("all", name="a1", app="harness.apps.idle:app", env=env)
    spawn("consumer", name="c1", app="harness.apps.idle:app", env=env)
    wait_until(lambda: nodes[0].exists(f"{key_prefix}leader"), 60, what="a leader")
    time.sleep(3.0)  # idle: the consumers' own next look is 30 s away
    ser, _ = get_serializer("msgpack")
    for i in range(2 * N):
        shard = i % N
        job_id = f"{prefixes[shard]}plain-{i}"
        sent = time.time()
        payload = job_payload("stamp", (sent,), {}, int(sent * 1000), ser)
        nodes[shard].set(K.ARQ_JOB + job_id, payload, px=60_000)
        nodes[shard].zadd(Keys(prefixes[shard]).queue, {job_id: int(sent * 1000)})
        time.sleep(0.3)
    key = f"{key_prefix}idle:starts"
    wait_until(lambda: nodes[0].llen(key) >= 2 * N, 10, what="every shard's job started")
    waited = sorted(float(x) for x in nodes[0].lrange(key, 0, -1))
    assert waited[-1] <= 1.5, waited
    for n in nodes:
        n.close()


def test_coalesced_enqueues_stay_in_their_keys_shard_and_run_there(
    spawn: Spawn, redis_url: str, key_prefix: str
) -> None:
    """Each mode's script and the start gates on a Cluster with queue shards: the key's state,
    the job and its queue in the one slot of the key's shard (no CROSSSLOT), and a keep_last
    key's jobs run there one at a time."""
    from harness.apps.coalesce import app as co_app

    async def enqueue() -> dict[str, list[str | None]]:
        client = await Client.connect(redis_url, app=co_app, key_prefix=key_prefix, queue_shards=N)
        try:
            out: dict[str, list[str | None]] = {}
            for mode, extra in (
                ("replace", {}),
                ("debounce", {"debounce_s": 0.2}),
                ("throttle", {"throttle_s": 60.0}),
            ):
                out[mode] = [
                    await client.enqueue("note", f"{mode}-{k}", i, flow_key=f"{mode}-{k}",
                                         coalesce=mode, defer_by=0.5, **extra)  # type: ignore[arg-type]
                    for k in range(6)
                    for i in range(2)
                ]  # fmt: skip
            out["keep_last"] = [await client.enqueue("latest", f"kl-{k % 3}", k) for k in range(9)]
            for jid, key in zip(out["replace"][::2], range(6), strict=True):
                assert jid is not None
                assert client.shards.of(jid) is client.shards.for_key(f"replace-{key}")
            return out
        finally:
            await client.close()

    ids = asyncio.run(enqueue())
    assert ids["replace"][0::2] == ids["replace"][1::2]  # folded, per key
    assert ids["debounce"][0::2] == ids["debounce"][1::2]
    assert None not in ids["throttle"][0::2] and set(ids["throttle"][1::2]) == {None}
    env = {"WORKER_QUEUE_SHARDS": str(N), "CO_STEP_S": "0.05"}
    spawn("all", name="a1", app="harness.apps.coalesce:app", env=env)
    spawn("consumer", name="c1", app="harness.apps.coalesce:app", env=env)

    async def ended() -> int:  # the app's end hooks write in the home slot
        client = await Client.connect(redis_url, key_prefix=key_prefix, queue_shards=N)
        try:
            return int(await client.redis.hlen(f"{key_prefix}co:ends"))
        finally:
            await client.close()

    expected = 6 + 6 + 6 + len({j for j in ids["keep_last"]})
    wait_until(lambda: asyncio.run(ended()) == expected, 60, what="every coalesced job's end")
