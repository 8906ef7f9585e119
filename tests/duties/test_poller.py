"""PollingScheduler (fenced dispatch of due items) and BoundPoller (client-side scheduling)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest

from harness import FixedLease
from harness.arqfmt import deserialize_job
from worker.app import App
from worker.client import Client
from worker.core.clock import FakeClock
from worker.core.errors import LeadershipLost
from worker.core.ids import JobIds
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.duties.poller import PollingScheduler
from worker.polls import PollerDef
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("t:")
KEYS_ids = JobIds("t:")
LOCK = "5:mine"
NOW = 1_700_000_000_000


async def snapshot(r: Any) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for k in sorted(await r.keys("*")):
        t = (await r.type(k)).decode()
        if t == "string":
            out[k] = await r.get(k)
        elif t == "hash":
            out[k] = await r.hgetall(k)
        else:
            out[k] = await r.zrange(k, 0, -1, withscores=True)
    return out


def make_app(shards: int = 2, batch_size: int = 100) -> App:
    app = App("t")

    @app.task
    async def poll_card(ctx: Any, item: str) -> None: ...

    app.poller("cards", task="poll_card", shards=shards, batch_size=batch_size, busy_defer_s=2)
    return app


def scheduler(r: Any, p: PollerDef, clock: FakeClock, lock: str | None = LOCK) -> PollingScheduler:
    store = Store(r, KEYS)
    return PollingScheduler(p, store, FencedStore(store, FixedLease(lock)), msgpack_dumps, clock)


def client(r: Any, app: App, clock: FakeClock) -> Client:
    return Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, clock=clock)


async def queue_items(r: Any) -> Counter[str]:
    """How many queued jobs carry each item (decoded from the arq job records)."""
    out: Counter[str] = Counter()
    for jid in await r.zrange(KEYS.queue, 0, -1):
        raw = await r.get(K.ARQ_JOB + jid.decode())
        out[deserialize_job(raw, deserializer=msgpack_loads).args[0]] += 1
    return out


async def test_dispatches_due_items_only_one_job_each(r: Any) -> None:
    app = make_app()
    clock = FakeClock(NOW / 1000)
    cards = client(r, app, clock).poller("cards")
    await cards.schedule("a", delay=-5)
    await cards.schedule("b")  # due exactly now
    await cards.schedule("c", delay=10)
    await r.set(KEYS.leader, LOCK)
    s = scheduler(r, app.pollers["cards"], clock)

    assert await s.tick() == app.pollers["cards"].interval_s
    assert await queue_items(r) == Counter({"a": 1, "b": 1})
    expected_ids = {KEYS_ids.poll("cards", "a", NOW - 5000), KEYS_ids.poll("cards", "b", NOW)}
    assert {j.decode() for j in await r.zrange(KEYS.queue, 0, -1)} == expected_ids
    raw = await r.get(K.ARQ_JOB + KEYS_ids.poll("cards", "a", NOW - 5000))
    job = deserialize_job(raw, deserializer=msgpack_loads)
    assert (job.function, list(job.args), job.kwargs) == ("poll_card", ["a"], {})
    assert s.dispatched_total == 2
    assert await cards.backlog() == [
        {"shard": sh, "waiting": int(sh == app.pollers["cards"].shard_of("c")), "due": 0}
        for sh in range(2)
    ]

    await s.tick()  # nothing new is due
    assert await queue_items(r) == Counter({"a": 1, "b": 1})

    clock.advance(10)
    await s.tick()
    assert await queue_items(r) == Counter({"a": 1, "b": 1, "c": 1})


async def test_item_with_live_job_is_deferred_never_in_flight_twice(r: Any) -> None:
    app = make_app(shards=1)
    clock = FakeClock(NOW / 1000)
    cards = client(r, app, clock).poller("cards")
    await r.set(KEYS.leader, LOCK)
    s = scheduler(r, app.pollers["cards"], clock)

    await cards.schedule("a")
    await s.tick()
    first = KEYS_ids.poll("cards", "a", NOW)
    assert await r.exists(K.ARQ_JOB + first)

    # the job (still queued or running) reschedules its item before it finished
    clock.advance(1)
    await cards.schedule("a")
    for _ in range(3):
        await s.tick()
    assert await queue_items(r) == Counter({"a": 1})
    shard = KEYS.poll_shard("cards", 0)
    assert await r.zscore(shard, "a") == NOW + 1000 + 2000  # pushed back by busy_defer_s

    # the first job finishes (arq deletes its job key, keeps a result); item goes out again
    await r.delete(K.ARQ_JOB + first)
    await r.zrem(KEYS.queue, first)
    await r.set(K.ARQ_RESULT + first, b"done")
    clock.advance(2)
    await s.tick()
    second = KEYS_ids.poll("cards", "a", NOW + 3000)
    assert [j.decode() for j in await r.zrange(KEYS.queue, 0, -1)] == [second]
    assert await r.hget(KEYS.poll_inflight("cards"), "a") == second.encode()


async def test_full_batches_drain_without_delay(r: Any) -> None:
    app = make_app(shards=1, batch_size=3)
    p = app.pollers["cards"]
    clock = FakeClock(NOW / 1000)
    cards = client(r, app, clock).poller("cards")
    assert await cards.schedule_many([f"i{n}" for n in range(7)], delay=-1) == 7
    await r.set(KEYS.leader, LOCK)
    s = scheduler(r, p, clock)
    assert await s.tick() == 0.0
    assert await r.zcard(KEYS.queue) == 3
    assert await s.tick() == 0.0
    assert await s.tick() == p.interval_s
    assert sum((await queue_items(r)).values()) == 7
    assert await r.zcard(KEYS.poll_shard("cards", 0)) == 0


async def test_one_full_shard_is_enough_to_come_back_at_once(r: Any) -> None:
    app = make_app(shards=2, batch_size=2)
    p = app.pollers["cards"]
    clock = FakeClock(NOW / 1000)
    items = [f"i{n}" for n in range(40)]
    in_0 = [i for i in items if p.shard_of(i) == 0][:3]
    in_1 = [i for i in items if p.shard_of(i) == 1][:1]
    await client(r, app, clock).poller("cards").schedule_many(in_0 + in_1, delay=-1)
    await r.set(KEYS.leader, LOCK)
    s = scheduler(r, p, clock)
    assert await s.tick() == 0.0  # shard 0 was full
    assert await s.tick() == p.interval_s
    assert set(await queue_items(r)) == set(in_0 + in_1)


@pytest.mark.parametrize("lock", [None, "5:other", "6:mine"])
async def test_fenced_refusal_raises_and_writes_nothing(r: Any, lock: str | None) -> None:
    app = make_app()
    clock = FakeClock(NOW / 1000)
    await client(r, app, clock).poller("cards").schedule_many(["a", "b", "c"], delay=-1)
    if lock is not None:
        await r.set(KEYS.leader, lock)
    before = await snapshot(r)
    with pytest.raises(LeadershipLost):
        await scheduler(r, app.pollers["cards"], clock).tick()
    assert await snapshot(r) == before


async def test_not_leading_raises(r: Any) -> None:
    app = make_app()
    clock = FakeClock(NOW / 1000)
    await client(r, app, clock).poller("cards").schedule("a", delay=-1)
    with pytest.raises(LeadershipLost):
        await scheduler(r, app.pollers["cards"], clock, lock=None).tick()


# ---------------------------------------------------------------------------------------------
# BoundPoller via Client
# ---------------------------------------------------------------------------------------------


async def test_bound_poller_schedule_variants(r: Any) -> None:
    app = make_app(shards=4)
    p = app.pollers["cards"]
    clock = FakeClock(NOW / 1000)
    cards = client(r, app, clock).poller("cards")
    assert cards.name == "cards"

    await cards.schedule("x", delay=30)
    assert await r.zscore(cards.shard_key("x"), "x") == NOW + 30_000
    assert cards.shard_key("x") == KEYS.poll_shard("cards", p.shard_of("x"))

    # rescheduling moves the item rather than duplicating it
    await cards.schedule("x", at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    assert await r.zscore(cards.shard_key("x"), "x") == 1_893_456_000_000
    await cards.schedule("x", at=1234.5)
    assert await r.zscore(cards.shard_key("x"), "x") == 1_234_500
    assert sum(s["waiting"] for s in await cards.backlog()) == 1

    with pytest.raises(ValueError, match="timezone-aware"):
        await cards.schedule("x", at=dt.datetime(2030, 1, 1))


async def test_bound_poller_schedule_many_remove_backlog(r: Any) -> None:
    app = make_app(shards=4)
    p = app.pollers["cards"]
    clock = FakeClock(NOW / 1000)
    cards = client(r, app, clock).poller("cards")

    items = [f"card-{n}" for n in range(20)]
    assert await cards.schedule_many(items[:10], delay=-1) == 10
    assert await cards.schedule_many({i: NOW / 1000 + 60 for i in items[5:20]}) == 10
    assert await cards.schedule_many([]) == 0
    for i in items:
        assert await r.zscore(KEYS.poll_shard("cards", p.shard_of(i)), i) is not None

    backlog = await cards.backlog()
    assert [b["shard"] for b in backlog] == [0, 1, 2, 3]
    assert sum(b["waiting"] for b in backlog) == 20
    assert sum(b["due"] for b in backlog) == 5  # items 0-4; 5-9 were moved to later
    for b in backlog:
        shard_items = [i for i in items if p.shard_of(i) == b["shard"]]
        assert b["waiting"] == len(shard_items)
        assert b["due"] == len([i for i in shard_items if i in items[:5]])

    assert await cards.remove("card-0") is True
    assert await cards.remove("card-0") is False
    assert await cards.remove("never") is False
    assert sum(b["waiting"] for b in await cards.backlog()) == 19


async def test_client_without_app_has_no_pollers(r: Any) -> None:
    c = Client(r, keys=KEYS, serialize=msgpack_dumps)
    with pytest.raises(RuntimeError, match="app"):
        c.poller("cards")
    with pytest.raises(KeyError):
        client(r, make_app(), FakeClock()).poller("nope")


async def test_a_paused_poller_dispatches_nothing(r: Any) -> None:
    await r.set(KEYS.leader, LOCK)
    app = make_app()
    clock = FakeClock(NOW / 1000)
    await client(r, app, clock).poller("cards").schedule_many(["a", "b"])
    store = Store(r, KEYS)
    await store.pause("poller:cards")
    s = scheduler(r, app.pollers["cards"], clock)
    await s.tick()
    assert await queue_items(r) == Counter()
    await store.resume("poller:cards")
    await s.tick()
    assert await queue_items(r) == Counter({"a": 1, "b": 1})
