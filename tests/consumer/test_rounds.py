"""The consumer's rounds: a flush sent ahead of the claim, its ends known while on their way."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from harness import eventually
from worker.app import App
from worker.consumer.claims import Claims
from worker.consumer.completer import Completer
from worker.consumer.guard import ClaimGuard
from worker.core.clock import SystemClock
from worker.storage import keys as K
from worker.storage.jobs import Finish
from worker.storage.sharded import Shards
from worker.storage.store import Store

KEYS = K.Keys("t:")
T = 1_700_000_000_000


async def test_ends_on_their_way_keep_their_claims_when_a_lost_claim_is_given_back(
    r: Any,
) -> None:
    """A flush sent ahead is on its way while the claim beside it loses its reply: the release
    of the lost claim's jobs before the next claim keeps the claims of the ends on their way
    (else their jobs would be due again and their FINISH refused: run twice)."""
    store = Store(r, KEYS)
    shards, clock = Shards([store]), SystemClock()
    for jid in ("a1", "a2", "z1"):
        await r.zadd(KEYS.queue, {jid: T})
        await r.set(K.ARQ_JOB + jid, b"p")
    ran = await store.claim(
        "me", "me/1", now_ms=T, limit=2, in_progress_ttl_ms=60_000, holds_ttl_ms=60_000,
        max_payload=1000, retry_ttl_ms=60_000,
    )  # fmt: skip
    assert [c.job_id for c in ran.jobs] == ["a1", "a2"]
    totals = {"complete": 0, "failed": 0, "retried": 0, "lost": 0}
    completer = Completer(shards, clock, {}, ClaimGuard(clock, 1.0), totals, instance_id="me")
    entered, gate = asyncio.Event(), asyncio.Event()
    real = shards.finish

    async def slow_finish(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await gate.wait()  # the reply is on its way
        return await real(*args, **kwargs)

    shards.finish = slow_finish  # type: ignore[method-assign]
    for c in ran.jobs:
        completer.end(Finish("done", c.job_id, "me/1", b"result", 60_000))
    completer.send_ahead(1)
    await asyncio.wait_for(entered.wait(), 5)
    assert not completer.ended and completer.pending is False  # taken by the flush ahead
    # the claim beside it ran on the server, its reply lost: z1 is held in our name, unknown
    lost = await store.claim(
        "me", "me/2", now_ms=T, limit=5, in_progress_ttl_ms=60_000, holds_ttl_ms=60_000,
        max_payload=1000, retry_ttl_ms=60_000,
    )  # fmt: skip
    assert [c.job_id for c in lost.jobs] == ["z1"]
    claims = Claims(shards, clock, [], instance_id="me", doubt_s=1.0, queues=("default",))
    claims.in_doubt = True
    await claims.release_unknown(completer.known())
    assert await r.get(K.ARQ_IN_PROGRESS + "z1") is None  # given back: due again
    assert await r.get(K.ARQ_IN_PROGRESS + "a1") == b"me/1"  # on their way: still ours
    assert await r.get(K.ARQ_IN_PROGRESS + "a2") == b"me/1"
    gate.set()
    await completer.settle(wait=True)
    assert await r.mget([K.ARQ_RESULT + "a1", K.ARQ_RESULT + "a2"]) == [b"result", b"result"]
    assert totals["lost"] == 0 and not completer.known()


async def test_a_claim_reply_lost_beside_a_flush_on_its_way_runs_nothing_twice(
    redis_url: str,
) -> None:
    """The real loop: a claim whose reply is lost while the flush sent ahead beside it is on
    its way (its reply slow) gives back only the lost claim's jobs; every job runs once and
    ends with its result."""
    import redis.asyncio as aioredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    from worker.client import Client
    from worker.consumer.config import ConsumerConfig
    from worker.consumer.consumer import Consumer
    from worker.consumer.dead import DeadLetters
    from worker.context import Context, JobContext
    from worker.core.serializer import msgpack_dumps, msgpack_loads
    from worker.settings import Settings

    r = aioredis.Redis.from_url(redis_url)
    await r.flushall()
    app = App("t")
    runs: Counter[str] = Counter()

    @app.task
    async def note(ctx: JobContext, n: int) -> int:
        runs[ctx.job_id] += 1
        return n

    client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=app)
    clock = SystemClock()
    ctx = Context(Settings.model_construct(key_prefix=KEYS.prefix), r, client, clock, "i-1")
    store = client.store
    cfg = ConsumerConfig(
        concurrency=4, poll_delay_s=0.2, idle_poll_max_s=0.05, idle_poll_subscribed_s=0.05,
        queues=tuple(app.queue_names()),
    )  # fmt: skip
    dead = DeadLetters(store, clock, instance_id="i-1", max_entries=100, keep_bytes=64)
    consumer = Consumer(
        app.jobs(), [], ctx, store, (msgpack_dumps, msgpack_loads), clock,
        instance_id="i-1", config=cfg, dead=dead,
    )  # fmt: skip
    completer, lost = consumer.completer, asyncio.Event()
    real_claim, real_finish = store.claim, store.finish

    async def claim(*args: Any, **kwargs: Any) -> Any:
        out = await real_claim(*args, **kwargs)
        for _ in range(20):  # the runs started last round step, the flush ahead sends
            await asyncio.sleep(0)
        if completer.sending and out.jobs and not lost.is_set():
            lost.set()
            raise RedisConnectionError("the claim's reply was lost")
        return out

    async def finish(*args: Any, **kwargs: Any) -> Any:
        if asyncio.current_task() is completer.ahead and not lost.is_set():
            await asyncio.sleep(0.5)  # on its way past the lost claim and the release
        return await real_finish(*args, **kwargs)

    store.claim = claim  # type: ignore[method-assign]
    store.finish = finish  # type: ignore[method-assign]
    ids: list[str] = []
    for n in range(40):
        job_id = await client.enqueue("note", n)
        assert job_id is not None
        ids.append(job_id)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        await eventually(lambda: len(runs) == 40 and not completer.known(), "40 runs", within=30)
        await asyncio.sleep(0.5)  # a second run of a given-back job would show now
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert lost.is_set(), "no claim reply was lost beside a flush on its way"
    assert set(runs) == set(ids) and set(runs.values()) == {1}, runs
    assert all(await r.mget([K.ARQ_RESULT + j for j in ids]))
    await r.aclose()
