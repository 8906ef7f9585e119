"""Jobs nobody announced: a plain arq client writes the record and a ``ZADD``
and publishes nothing, so an idle fleet, whose consumers look at the queue themselves only every
30 s, would leave its job waiting up to that long. The leader looks at the queue heads every
0.5 s and announces a job due for longer than 0.25 s that nobody took: on a real idle fleet of
two ``--role all`` processes with the default timings, 20 jobs ``arq``'s own client enqueued at
random moments each start within 1.5 s (p99 reported), each announced at most once, while 20
jobs the framework's client announced cost no announcement of the leader's (the messages on the
wake channel, heard by the test)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import random
import time
import uuid

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import Spawn, wait_until
from harness.timings import FAST_ENV
from worker.client import Client
from worker.core import codec
from worker.core.clock import FakeClock, ms
from worker.core.serializer import get_serializer
from worker.duties.unannounced import UnannouncedJobs
from worker.storage.keys import Keys

pytestmark = pytest.mark.timeout(90)

APP = "harness.apps.idle:app"
#: the framework's defaults for every timing (the fast test timings unset)
DEFAULTS: dict[str, str | None] = {
    k: None for k in FAST_ENV if k.endswith("_S") and k != "WORKER_DRAIN_DELAY_S"
}
JOBS = 20


def heard(sub: redis_sync.client.PubSub) -> int:
    """Messages the test's own subscription to the wake channel received since last asked."""
    n = 0
    while (msg := sub.get_message(timeout=0.2)) is not None:
        n += msg["type"] == "message"
    return n


async def enqueue_at_random_moments(enqueue: object) -> None:
    rng = random.Random(26)
    for _ in range(JOBS):
        await asyncio.sleep(rng.uniform(0.1, 0.5))
        await enqueue("stamp", time.time())  # type: ignore[operator]


async def with_arq(redis_url: str, prefix: str) -> None:
    """arq's own client (``enqueue_job``: no announcement); without arq installed, its two
    writes made here (the record, the queue entry), as any producer written from
    docs/protocol.md that does not announce."""
    ser, de = get_serializer("msgpack")
    if importlib.util.find_spec("arq") is None:
        r = aioredis.Redis.from_url(redis_url)

        async def enqueue(fn: str, *args: object) -> None:
            jid, now = uuid.uuid4().hex, ms(time.time())
            async with r.pipeline(transaction=True) as pipe:
                pipe.set(codec.JOB_KEY_PREFIX + jid, codec.encode_job(fn, args, {}, now, ser))
                pipe.zadd(Keys(prefix).queue, {jid: now})
                await pipe.execute()

        try:
            await enqueue_at_random_moments(enqueue)
        finally:
            await r.aclose()
        return
    from arq.connections import RedisSettings, create_pool

    pool = await create_pool(
        RedisSettings.from_dsn(redis_url),
        default_queue_name=Keys(prefix).queue,
        job_serializer=ser,
        job_deserializer=de,
    )
    try:
        await enqueue_at_random_moments(pool.enqueue_job)
    finally:
        await pool.aclose()


async def with_client(redis_url: str, prefix: str) -> None:
    client = await Client.connect(redis_url, key_prefix=prefix)
    try:
        await enqueue_at_random_moments(client.enqueue)
    finally:
        await client.close()


def starts(r: redis_sync.Redis, key: str, n: int) -> list[float]:
    wait_until(lambda: r.llen(key) >= n, 10, what=f"{n} jobs started (they wait unannounced)")
    return sorted(float(x) for x in r.lrange(key, 0, -1))


def test_jobs_a_plain_arq_client_enqueued_on_an_idle_fleet_start_within_a_second(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    key = f"{prefix}idle:starts"
    spawn("all", name="a1", app=APP, env=DEFAULTS)
    spawn("all", name="a2", app=APP, env=DEFAULTS)
    wait_until(lambda: rsync.exists(f"{prefix}leader"), 60, what="a leader")
    time.sleep(3.0)  # idle: the start-up looks are done, the next own look is 30 s away

    sub = rsync.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(Keys(prefix).wake)
    heard(sub)

    # announced by their producer (one PUBLISH each): the leader adds no announcement
    asyncio.run(with_client(redis_url, prefix))
    announced = starts(rsync, key, JOBS)
    time.sleep(1.0)  # a late head would be announced within 0.75 s
    assert heard(sub) == JOBS, "the leader announced jobs already announced"
    assert announced[-1] < 0.5, announced
    rsync.delete(key)

    # unannounced (arq's own client): the leader announces each, once
    asyncio.run(with_arq(redis_url, prefix))
    waited = starts(rsync, key, JOBS)
    time.sleep(1.0)
    assert 1 <= heard(sub) <= JOBS
    sub.close()
    p50, p99 = waited[len(waited) // 2], waited[math.ceil(0.99 * len(waited)) - 1]
    print(f"plain arq jobs on an idle fleet, enqueue to start: p50 {p50:.3f} s, p99 {p99:.3f} s")
    assert waited[-1] <= 1.5, waited


class FakeShard:
    """A shard's store as the look sees it: each queue's head, and what was announced."""

    def __init__(self) -> None:
        self.head: dict[str, tuple[str, int] | None] = {}
        self.announced: list[int] = []
        self.duty: list[int] = []  # announced on the duty marker
        self.looks = 0

    async def heads(self, queues: list[str]) -> list[tuple[str, int] | None]:
        self.looks += 1
        return [self.head.get(q) for q in queues]

    async def announce(self, due_ms: int, *, duty: bool = False) -> None:
        (self.duty if duty else self.announced).append(due_ms)


async def test_a_late_head_is_announced_once_per_shard_and_a_fresh_one_not_at_all() -> None:
    clock = FakeClock()
    now = ms(clock.time())
    home, other = FakeShard(), FakeShard()
    look = UnannouncedJobs([home, other], ["default", "mail"], clock, interval_s=0.5)  # type: ignore[list-item]

    home.head = {"default": ("a", now - 1000), "mail": ("m", now - 2000)}
    other.head = {"default": ("b", now - 100)}  # due 0.1 s ago: being claimed, not late
    assert await look.tick() == 0.5
    assert (home.announced, other.announced) == ([now - 2000], [])  # one PUBLISH, the earliest
    assert (home.looks, other.looks) == (1, 1)  # one look per shard (a ZRANGE per queue)

    clock.advance(0.5)
    await look.tick()  # the same late heads: every consumer busy, or none serves the queue
    assert (home.announced, other.announced) == ([now - 2000], [now - 100])  # b is late now
    home.head["default"] = ("c", now - 300)  # the backlog moved: its new head is announced
    clock.advance(0.5)
    await look.tick()
    assert home.announced == [now - 2000, now - 300] and other.announced == [now - 100]


async def test_a_late_duty_lane_head_is_announced_on_the_duty_marker() -> None:
    """A late head in a duty lane (a tick a consumer that died had claimed) goes to the duty
    marker, which a consumer whose shared slots are all busy waits on too; a queue's late head
    to the wake marker, each once."""
    clock = FakeClock()
    now = ms(clock.time())
    shard = FakeShard()
    look = UnannouncedJobs([shard], ["default:duty", "default"], clock, interval_s=0.5)  # type: ignore[list-item]
    shard.head = {"default:duty": ("t", now - 1000), "default": ("a", now - 2000)}
    await look.tick()
    assert (shard.duty, shard.announced) == ([now - 1000], [now - 2000])
    clock.advance(0.5)
    await look.tick()
    assert (shard.duty, shard.announced) == ([now - 1000], [now - 2000])
