"""``Client.enqueue_many`` (and ``ctx.enqueue_many``, ``SyncClient.enqueue_many``): a batch per
round trip with the semantics of ``enqueue`` per job: ids in order, ``None`` for an id taken in
Redis or earlier in the batch, unique keys, queues, deferral, chunking, unknown names refused
before anything is sent. On fakeredis and on the real server (the ``r`` fixture), plus a real
consumer process running a batch."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.arqfmt import deserialize_job_raw, expires_extra_ms
from tests.consumer.test_consumer_integration import start_consumer
from worker.app import App
from worker.bulk import JobSpec
from worker.client import Client
from worker.context import JobContext
from worker.core.clock import FakeClock
from worker.core.errors import UnknownTask
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.storage import keys as K

KEYS = K.Keys("t:")
NOW_S = 1_700_000_000.0
NOW = int(NOW_S * 1000)


def make_app() -> App:
    app = App("t")

    async def noop(ctx: JobContext, *args: Any, **kwargs: Any) -> None: ...

    app.task(name="send")(noop)
    app.task(name="report", queue="slow")(noop)
    return app


@pytest.fixture
def client(r: Any) -> Client:
    return Client(r, keys=KEYS, serialize=msgpack_dumps, app=make_app(), clock=FakeClock(NOW_S))


class Counting:
    """Counts the script calls (round trips) a client makes, by wrapping its store's eval."""

    def __init__(self, client: Client) -> None:
        self.calls = 0
        original = client.store._eval

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await original(*args, **kwargs)

        client.store._eval = counted  # type: ignore[method-assign]


async def record(r: Any, job_id: str) -> dict[str, Any]:
    raw = await r.get(f"arq:job:{job_id}")
    assert raw is not None, f"no job record for {job_id}"
    f, args, kwargs, _try, enqueue_ms = deserialize_job_raw(raw, deserializer=msgpack_loads)
    return {"f": f, "args": tuple(args), "kwargs": kwargs, "et": enqueue_ms}


async def test_ids_in_order_records_as_enqueue_writes_them_one_round_trip(
    client: Client, r: Any
) -> None:
    calls = Counting(client)
    jobs = [("send", (i,), {"to": f"u{i}"}) for i in range(10)]
    ids = await client.enqueue_many(jobs)
    assert calls.calls == 1
    assert len(ids) == 10 and all(i is not None for i in ids) and len(set(ids)) == 10
    assert all(i.startswith(KEYS.prefix) for i in ids if i)  # the app's slot and ACL patterns
    queued = [m.decode() for m in await r.zrange(KEYS.queue, 0, -1)]
    assert sorted(queued) == sorted(i for i in ids if i)
    for n, jid in enumerate(ids):
        assert jid is not None
        rec = await record(r, jid)
        assert rec == {"f": "send", "args": (n,), "kwargs": {"to": f"u{n}"}, "et": NOW}
        assert await r.zscore(KEYS.queue, jid) == NOW
        assert 0 < await r.pttl(f"arq:job:{jid}") <= expires_extra_ms
    # the same record enqueue() writes for the same job
    one = await client.enqueue("send", 0, to="u0")
    assert one is not None
    assert await r.get(f"arq:job:{one}") == await r.get(f"arq:job:{ids[0]}")


async def test_duplicates_in_the_batch_and_in_redis_are_none_like_enqueue(
    client: Client, r: Any
) -> None:
    taken = await client.enqueue("send", "old", job_id="t:fixed")
    assert taken == "t:fixed"
    ids = await client.enqueue_many(
        [
            JobSpec("send", ("a",), job_id="t:fixed"),  # exists in Redis
            JobSpec("send", ("b",), unique_key="k1"),
            JobSpec("send", ("c",), unique_key="k1"),  # an earlier job of the batch took it
            JobSpec("send", ("d",), job_id="t:new"),
            JobSpec("send", ("e",), job_id="t:new"),
            ("send", ("f",)),
        ]
    )
    assert ids[0] is None
    assert ids[1] == client.unique_job_id("k1") and ids[2] is None
    assert ids[3] == "t:new" and ids[4] is None
    assert ids[5] is not None
    assert (await record(r, "t:fixed"))["args"] == ("old",)  # not overwritten
    assert (await record(r, client.unique_job_id("k1")))["args"] == ("b",)
    assert (await record(r, "t:new"))["args"] == ("d",)
    assert await r.zcard(KEYS.queue) == 4
    # a unique key taken by the batch refuses a later enqueue() too, and the reverse
    assert await client.enqueue("send", "x", unique_key="k1") is None
    await client.enqueue("send", "y", unique_key="k2")
    assert await client.enqueue_many([JobSpec("send", ("z",), unique_key="k2")]) == [None]


async def test_queues_and_deferral_per_job(client: Client, r: Any) -> None:
    until = dt.datetime.fromtimestamp(NOW_S + 3600, dt.UTC)
    ids = await client.enqueue_many(
        [
            ("report", (1,)),  # the task's declared queue
            JobSpec("send", (2,), queue="other"),
            JobSpec("send", (3,), defer_by=30),
            JobSpec("send", (4,), defer_until=until),
        ]
    )
    a, b, c, d = ids
    assert await r.zscore(KEYS.queue_of("slow"), a) == NOW
    assert await r.zscore(KEYS.queue_of("other"), b) == NOW
    assert await r.zscore(KEYS.queue, c) == NOW + 30_000
    assert await r.zscore(KEYS.queue, d) == NOW + 3_600_000
    # a deferred job's record outlives its due time, as with enqueue()
    assert await r.pttl(f"arq:job:{d}") > 3_600_000


async def test_chunks_bound_each_round_trip(client: Client, r: Any) -> None:
    calls = Counting(client)
    ids = await client.enqueue_many([("send", (i,)) for i in range(25)], chunk_size=10)
    assert calls.calls == 3
    assert len(ids) == 25 and None not in ids
    assert await r.zcard(KEYS.queue) == 25
    # a duplicate across chunks is still refused
    again = await client.enqueue_many(
        [JobSpec("send", (), job_id="t:x"), *[("send", ())] * 9, JobSpec("send", (), job_id="t:x")],
        chunk_size=10,
    )
    assert again[0] == "t:x" and again[-1] is None and None not in again[1:-1]
    with pytest.raises(ValueError, match="chunk_size"):
        await client.enqueue_many([("send", ())], chunk_size=0)


async def test_unknown_task_or_bad_item_refused_before_anything_is_sent(
    client: Client, r: Any
) -> None:
    jobs: list[Any] = [("send", (i,)) for i in range(1000)] + [("sned", ())]
    with pytest.raises(UnknownTask, match="sned"):
        await client.enqueue_many(jobs, chunk_size=100)
    with pytest.raises(ValueError, match="unique_key or job_id"):
        await client.enqueue_many([JobSpec("send", unique_key="a", job_id="t:a")])
    with pytest.raises(TypeError, match="JobSpec"):
        await client.enqueue_many(["send"])  # type: ignore[list-item]
    assert await r.zcard(KEYS.queue) == 0
    assert await client.enqueue_many([]) == []


async def test_checking_a_large_batch_yields_to_the_event_loop_between_chunks(
    client: Client, r: Any
) -> None:
    """The jobs are made specs and checked a chunk at a time, the loop running other tasks in
    between (a leader's lease renewal while a task hands 200,000 jobs to ``ctx.enqueue_many``):
    a task started beside the call runs before the refusal at the end of the batch."""
    turns = 0

    async def beside() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(beside())
    await asyncio.sleep(0)
    started = turns
    jobs: list[Any] = [("send", (i,)) for i in range(2000)] + [("sned", ())]
    with pytest.raises(UnknownTask, match="sned"):
        await client.enqueue_many(jobs, chunk_size=100)
    other.cancel()
    assert turns - started >= 10  # a turn per chunk of 100 at least
    assert await r.zcard(KEYS.queue) == 0


async def test_ctx_enqueue_many_goes_through_the_workers_client(client: Client, r: Any) -> None:
    from worker.context import Context
    from worker.settings import Settings

    ctx = Context(
        settings=Settings.model_construct(key_prefix=client.keys.prefix),
        redis=r,
        client=client,
        clock=client.clock,
        instance_id="i-1",
    )
    ids = await ctx.enqueue_many([("send", (1,)), ("send", (2,))])
    assert len(ids) == 2 and await r.zcard(KEYS.queue) == 2


@pytest.mark.slow
def test_a_real_consumer_runs_a_batch_and_sync_client_enqueues_many(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    from harness.apps.ledger import app as ledger_app
    from worker.sync_client import SyncClient

    prefix = spawn.prefix  # type: ignore[attr-defined]
    start_consumer(spawn, rsync)

    async def go() -> list[str | None]:
        client = await Client.connect(redis_url, app=ledger_app, key_prefix=prefix)
        try:
            jobs = [JobSpec("record", (f"k{i % 150}",), unique_key=f"u{i}") for i in range(300)]
            return await client.enqueue_many(jobs, chunk_size=64)
        finally:
            await client.close()

    ids = asyncio.run(go())
    assert None not in ids
    with SyncClient.connect(redis_url, app=ledger_app, key_prefix=prefix) as sync:
        more = sync.enqueue_many([("record", (f"s{i}",)) for i in range(20)])
    assert None not in more
    records = f"{prefix}ledger:records"

    def all_ran() -> bool:
        counts = {k.decode(): int(v) for k, v in rsync.hgetall(records).items()}
        return len(counts) == 170 and sum(counts.values()) == 320

    wait_until(all_ran, 30, what="the 320 jobs of the batches to run once each")


async def test_the_docs_example_runs(r: Any) -> None:
    from harness.docpages import python_block

    app = App("shop")

    async def noop(ctx: JobContext, *args: Any) -> None: ...

    app.task(name="send_receipt")(noop)
    app.task(name="activate")(noop)
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, clock=FakeClock(NOW_S))
    code = python_block("web-apps", "Many jobs at once")
    scope: dict[str, Any] = {"client": client}
    flags = __import__("ast").PyCF_ALLOW_TOP_LEVEL_AWAIT
    await eval(compile(code, "docs/web-apps.md", "exec", flags=flags), scope)
    assert len(scope["ids"]) == 1000 and None not in scope["ids"]
    assert await r.zcard(KEYS.queue) == 1001 and await r.zcard(KEYS.queue_of("slow")) == 1


async def test_with_queue_shards_each_job_goes_where_enqueue_would_send_it(r: Any) -> None:
    from worker.storage.sharded import Shards
    from worker.storage.store import open_shards

    keys = K.Keys("{t}:")
    stores = open_shards(r, keys, None, 3)
    client = Client(
        r, keys=keys, serialize=msgpack_dumps, app=make_app(), clock=FakeClock(NOW_S),
        shards=Shards(stores),
    )  # fmt: skip
    calls = [Counting_store(s) for s in stores]
    jobs = [JobSpec("send", (i,), unique_key=f"u{i}") for i in range(30)]
    jobs += [JobSpec("send", (i,), shard_key="order-7") for i in range(5)]
    jobs += [JobSpec("send", ("dup",), unique_key="u3"), ("send", ("any",))]
    ids = await client.enqueue_many(jobs)
    assert sum(c.calls for c in calls) == 3  # one script call per shard for the chunk
    for i in range(30):  # the id and shard enqueue() would use for the same unique key
        assert ids[i] == client.unique_job_id(f"u{i}")
    assert ids[35] is None and ids[36] is not None
    by_shard = {s.keys.prefix: {m.decode() for m in await r.zrange(s.keys.queue, 0, -1)}
                for s in stores}  # fmt: skip
    assert sum(map(len, by_shard.values())) == 36
    assert all(len(v) > 0 for v in by_shard.values())  # 30 unique keys spread over all three
    for jid in ids:
        if jid is not None:
            assert jid in by_shard[client.shards.of(jid).keys.prefix]  # its id names its shard
    ordered = {client.shards.of(jid).keys.prefix for jid in ids[30:35] if jid}
    assert len(ordered) == 1  # one shard_key, one shard
    assert await client.enqueue("send", "again", unique_key="u5") is None


class Counting_store:
    def __init__(self, store: Any) -> None:
        self.calls = 0
        original = store._eval

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await original(*args, **kwargs)

        store._eval = counted
