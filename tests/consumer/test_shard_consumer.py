"""Queue shards in one process (fakeredis and the real server): a consumer reads every shard
fairly (a full first shard does not starve the others), finishes each job in its own shard, and
an abort reaches a job in a shard other than home; with one shard, the keys and ids are today's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from harness import eventually, wait_until
from harness.ports import free_port
from worker.app import App
from worker.client import Client
from worker.consumer.claims import Claims
from worker.consumer.config import ConsumerConfig
from worker.consumer.consumer import Consumer
from worker.consumer.dead import DeadLetters
from worker.consumer.limits import LimitsHook
from worker.context import Context, JobContext
from worker.core.clock import SystemClock
from worker.core.ids import shard_index
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.settings import Settings
from worker.storage.keys import Keys
from worker.storage.sharded import Shards
from worker.storage.store import open_shards

PREFIX = "{f}:"


def sharded(r: Any, n: int, app: App, instance: str = "i-1") -> tuple[Client, Consumer]:
    keys = Keys(PREFIX)
    shards = Shards(open_shards(r, keys, None, n))
    client = Client(r, keys=keys, serialize=msgpack_dumps, app=app, shards=shards)
    ctx = Context(
        Settings.model_construct(key_prefix=client.keys.prefix), r, client, SystemClock(), instance
    )
    cfg = ConsumerConfig(
        concurrency=2,
        poll_delay_s=0.01,
        idle_poll_max_s=0.02,
        queues=("default",),
        shutdown_timeout_s=2,
    )
    dead = DeadLetters(shards.home, SystemClock(), instance_id=instance, shards=shards)
    limits = LimitsHook(shards.home, SystemClock())  # as the wiring: limits in the home slot
    consumer = Consumer(
        app.jobs(), [limits], ctx, shards, (msgpack_dumps, msgpack_loads), SystemClock(),
        instance_id=instance, config=cfg, dead=dead,
    )  # fmt: skip
    return client, consumer


async def test_every_shard_is_read_in_turn_and_each_job_ends_in_its_own(r: Any) -> None:
    app = App("fair")
    order: list[str] = []

    @app.task
    async def note(ctx: JobContext, key: str) -> None:
        order.append(key)

    client, consumer = sharded(r, 2, app)
    prefixes = client.shards.prefixes
    stores = client.shards.stores
    big, small = (
        next(k for k in map(str, range(99)) if client.shards.for_key(k) is s) for s in stores
    )
    # the first shard read (home, without rotation every round) full: 40 jobs; the other: 4
    first = [await client.enqueue("note", f"a{i}", shard_key=big) for i in range(40)]
    second = [await client.enqueue("note", f"b{i}", shard_key=small) for i in range(4)]
    assert len({shard_index(j or "", prefixes) for j in first}) == 1
    assert {shard_index(j or "", prefixes) for j in second} != {
        shard_index(first[0] or "", prefixes)
    }
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        for _ in range(300):
            if len(order) == 44:
                break
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert sorted(order) == sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(4)])
    # not all 40 of the first shard before the other's 4: the rounds alternate shards
    assert max(order.index(f"b{i}") for i in range(4)) < 20, order
    # each job ended in its own shard: arq's results beside its id, stats per shard
    for jid in (*first, *second):
        assert await r.exists(f"arq:result:{jid}")
    for p in prefixes:
        assert await r.keys(f"{p}stats:*"), f"no throughput counted in {p}"


def test_one_shard_is_todays_layout() -> None:
    shards = Shards(open_shards(object(), Keys("worker:"), None, 1))  # type: ignore[arg-type]
    assert shards.n == 1 and shards.prefixes == ("worker:",)
    assert shards.of("anything") is shards.home is shards.next() is shards.for_key("k")
    assert shards.home.ids.random().startswith("worker:") and len(shards.home.ids.random()) == 39
    assert shards.channels() == ["worker:wake"]


async def test_an_abort_reaches_a_job_in_another_shard(r: Any) -> None:
    app = App("abort")
    started = asyncio.Event()

    @app.task
    async def hang(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    client, consumer = sharded(r, 3, app)
    key = next(
        f"k{i}" for i in range(99) if client.shards.for_key(f"k{i}") is client.shards.stores[2]
    )
    jid = await client.enqueue("hang", shard_key=key)
    assert jid is not None and shard_index(jid, client.shards.prefixes) == 2
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await asyncio.wait_for(started.wait(), 10)
        assert jid in consumer.running
        await client.abort(jid)
        await asyncio.to_thread(
            wait_until, lambda: jid not in consumer.running, 15, 0.05, "aborted"
        )
        # handled there: the run's FINISH (written after the run left ``running``) removes it
        for _ in range(300):
            if await r.zscore(f"{client.shards.prefixes[2]}abort", jid) is None:
                break
            await asyncio.sleep(0.05)
        assert await r.zscore(f"{client.shards.prefixes[2]}abort", jid) is None
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_max_concurrency_holds_across_shards_and_consumers(r: Any) -> None:
    app = App("limited")
    now = {"running": 0, "most": 0, "runs": 0}

    @app.task(max_concurrency=1)
    async def one_at_a_time(ctx: JobContext) -> None:
        now["running"] += 1
        now["most"] = max(now["most"], now["running"])
        await asyncio.sleep(0.02)
        now["running"] -= 1
        now["runs"] += 1

    client, first = sharded(r, 3, app, "i-1")
    _, second = sharded(r, 3, app, "i-2")
    ids = [await client.enqueue("one_at_a_time") for _ in range(4)]
    assert len({shard_index(j or "", client.shards.prefixes) for j in ids}) == 3
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in (first, second)]
    try:
        # a job put back for the limit is announced (FINISH sets the wake marker), so this
        # takes well under a second; the bound is for a loaded box, and ends once all ran
        await eventually(lambda: now["runs"] == 4, within=60, what="the 4 jobs, one at a time")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert now == {"running": 0, "most": 1, "runs": 4}


async def test_a_shard_out_of_reach_does_not_stop_the_others(r: Any) -> None:
    """Shard 2's master away (a connection that cannot connect): the consumer's rounds still
    claim and finish the jobs of shards 0 and 1, and idle it still looks at their heads."""
    app = App("partial")
    done: list[str] = []

    @app.task
    async def note(ctx: JobContext, key: str) -> None:
        done.append(key)

    keys = Keys(PREFIX)
    gone = aioredis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.2)
    shards = Shards(open_shards(r, keys, None, 3, [r, r, gone]))
    client = Client(
        r, keys=keys, serialize=msgpack_dumps, app=app, shards=Shards(shards.stores[:2])
    )
    _, consumer = sharded(r, 3, app)
    consumer = Consumer(
        app.jobs(), [], consumer.executor.context, shards, (msgpack_dumps, msgpack_loads),
        SystemClock(), instance_id="i-1", config=consumer.config,
        dead=DeadLetters(shards.home, SystemClock(), instance_id="i-1", shards=shards),
    )  # fmt: skip
    for i in range(6):
        assert await client.enqueue("note", f"j{i}")
    assert await shards.queue_head(("default",)) is not None  # the reachable ones answer
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        for _ in range(250):
            if len(done) == 6:
                break
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await gone.aclose()
    assert sorted(done) == [f"j{i}" for i in range(6)]


async def test_a_lost_claim_reply_on_a_shard_out_of_reach_is_given_back_once_it_answers(
    r: Any,
) -> None:
    """A claim on shard 2 ran (and was replicated) but its reply was lost as that shard's master
    died: the next round gives back what we hold unknowingly on every shard. Shard 2 failing
    over does not answer then: the consumer stays in doubt and asks again, so the parked jobs
    come back once it answers (before, the doubt ended with the shards that answered, and the
    jobs stayed parked until their markers expired: 11 acknowledged jobs never ran in the
    shard-failover test)."""
    app = App("doubt")

    @app.task
    async def note(ctx: JobContext, key: str) -> None:
        return None

    client, _ = sharded(r, 3, app)
    shards = client.shards
    for i in range(6):
        assert await client.enqueue("note", f"j{i}")
    far = shards.stores[2]
    lost = await far.claim(
        "i-1", "i-1/7", now_ms=await server_now(r), limit=5, in_progress_ttl_ms=300_000,
        holds_ttl_ms=300_000, max_payload=1 << 20, retry_ttl_ms=60_000, queues=("default",),
    )  # fmt: skip
    assert lost.jobs, "shard 2 had jobs to claim"
    parked = {c.job_id for c in lost.jobs}
    claims = Claims(shards, SystemClock(), [], instance_id="i-1", doubt_s=1.0, queues=("default",))
    claims.in_doubt = True
    real = far.release_own

    async def failing_over(*args: Any, **kwargs: Any) -> int:
        raise aioredis.ConnectionError("shard 2's master is failing over")

    far.release_own = failing_over  # type: ignore[method-assign]
    await claims.release_unknown(())
    assert claims.in_doubt  # shard 2 did not answer: still in doubt
    now = await server_now(r)
    assert all(s > now for s in [await r.zscore(far.keys.queue, j) for j in parked])  # parked
    far.release_own = real  # type: ignore[method-assign]
    await claims.release_unknown(())
    assert not claims.in_doubt
    now = await server_now(r)
    assert all(s <= now for s in [await r.zscore(far.keys.queue, j) for j in parked])  # due


async def server_now(r: Any) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000
