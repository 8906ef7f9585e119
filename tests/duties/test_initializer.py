"""Initializer: once per cluster per version, resumable from its fenced checkpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from harness import FixedLease
from worker.app import App
from worker.client import Client
from worker.context import Context
from worker.core.clock import FakeClock
from worker.core.errors import LeadershipLost
from worker.core.serializer import msgpack_dumps
from worker.duties.initializer import Initializer, InitializerDef
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("t:")
LOCK = "9:mine"
NOW_S = 1_700_000_000.0
DUE_S = 1_800_000_000.0


@pytest.fixture
async def r(r: Any) -> Any:
    """The shared fake/real client (conftest), with this test's process holding the lock."""
    await r.set(KEYS.leader, LOCK)
    return r


class Source:
    """A user initializer: ``batches`` batches of ``per_batch`` items, cursor = batch count."""

    def __init__(self, batches: int = 5, per_batch: int = 3, fail_at: int | None = None) -> None:
        self.batches = batches
        self.per_batch = per_batch
        self.fail_at = fail_at
        self.cursors: list[str | None] = []  # the cursor each run started from
        self.produced: list[int] = []  # every batch number ever yielded
        self.on_batch: Any = None

    async def gen(self, ctx: Context, cursor: str | None) -> AsyncIterator[Any]:
        assert isinstance(ctx, Context)
        self.cursors.append(cursor)
        for b in range(int(cursor) if cursor else 0, self.batches):
            if b == self.fail_at:
                raise RuntimeError("database went away")
            if self.on_batch is not None:
                await self.on_batch(b)
            self.produced.append(b)
            yield str(b + 1), {f"item-{b}-{j}": DUE_S for j in range(self.per_batch)}


def make_app() -> App:
    app = App("t")

    @app.task
    async def poll(ctx: Any, item: str) -> None: ...

    app.poller("cards", task="poll", shards=3)
    return app


def initializer(
    r: Any, source: Source, version: str = "v1", lock: str | None = LOCK
) -> Initializer:
    app = make_app()
    clock = FakeClock(NOW_S)
    ctx = Context(
        settings=Settings.model_construct(key_prefix=KEYS.prefix),
        redis=r,
        client=Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, clock=clock),
        clock=clock,
        instance_id="i-1",
    )
    return Initializer(
        InitializerDef("seed", source.gen, version, poller="cards"),  # type: ignore[arg-type]
        app.pollers["cards"],
        ctx,
        FencedStore(Store(r, KEYS), FixedLease(lock)),
        clock,
    )


async def shard_items(r: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in range(3):
        for item, score in await r.zrange(KEYS.poll_shard("cards", s), 0, -1, withscores=True):
            assert item.decode() not in out
            out[item.decode()] = score
    return out


async def state(r: Any) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (await r.hgetall(KEYS.init_state("seed"))).items()}


def all_items(batches: range) -> set[str]:
    return {f"item-{b}-{j}" for b in batches for j in range(3)}


async def test_runs_to_done_and_writes_items_once(r: Any) -> None:
    src = Source()
    init = initializer(r, src)
    await init.run(asyncio.Event())
    assert src.cursors == [None]
    assert src.produced == [0, 1, 2, 3, 4]
    items = await shard_items(r)
    assert set(items) == all_items(range(5))
    assert set(items.values()) == {DUE_S * 1000}
    p = make_app().pollers["cards"]
    for item in items:
        assert await r.zscore(KEYS.poll_shard("cards", p.shard_of(item)), item) is not None
    st = await state(r)
    assert (st["version"], st["done"], st["cursor"], st["batches"], st["items"]) == (
        "v1",
        "1",
        "5",
        "6",  # 5 batches + the final "done" checkpoint
        "15",
    )
    assert st["epoch"] == "9"
    assert init.health.extra["done"] is True
    assert init.health.iterations == 5


async def test_second_run_same_version_does_nothing(r: Any) -> None:
    await initializer(r, Source()).run(asyncio.Event())
    assert len(await shard_items(r)) == 15
    # consumers took the items of shard 0 meanwhile
    taken = await r.zrange(KEYS.poll_shard("cards", 0), 0, -1)
    assert taken
    await r.zrem(KEYS.poll_shard("cards", 0), *taken)
    items_before = await shard_items(r)

    again = Source()
    init = initializer(r, again)
    await init.run(asyncio.Event())
    assert again.cursors == []  # the generator is not even started
    assert await shard_items(r) == items_before  # removed items are not put back
    assert (await state(r))["done"] == "1"
    assert init.health.extra["done"] is True


async def test_new_version_reruns_from_the_start(r: Any) -> None:
    await initializer(r, Source(), version="v1").run(asyncio.Event())
    src = Source(batches=2)
    await initializer(r, src, version="v2").run(asyncio.Event())
    assert src.cursors == [None]
    assert src.produced == [0, 1]
    st = await state(r)
    assert (st["version"], st["done"], st["cursor"], st["batches"]) == ("v2", "1", "2", "3")


async def test_crash_mid_way_resumes_without_redoing_finished_batches(r: Any) -> None:
    crashing = Source(fail_at=2)
    with pytest.raises(RuntimeError, match="database went away"):
        await initializer(r, crashing).run(asyncio.Event())
    assert crashing.produced == [0, 1]
    st = await state(r)
    assert (st["done"], st["cursor"], st["batches"], st["items"]) == ("0", "2", "2", "6")
    assert set(await shard_items(r)) == all_items(range(2))

    # a new leader (new process, new epoch) picks it up
    resumed = Source()
    await r.set(KEYS.leader, "10:next")
    await initializer(r, resumed, lock="10:next").run(asyncio.Event())
    assert resumed.cursors == ["2"]
    assert resumed.produced == [2, 3, 4]  # batches 0 and 1 are never produced again
    st = await state(r)
    assert (st["done"], st["cursor"], st["items"], st["epoch"]) == ("1", "5", "15", "10")
    assert set(await shard_items(r)) == all_items(range(5))


async def test_stop_mid_way_leaves_a_resumable_checkpoint(r: Any) -> None:
    stop = asyncio.Event()
    src = Source()

    async def stop_at(b: int) -> None:
        if b == 3:
            stop.set()

    src.on_batch = stop_at
    await initializer(r, src).run(stop)
    st = await state(r)
    assert (st["done"], st["cursor"]) == ("0", "3")  # batch 3 was produced, never written
    assert set(await shard_items(r)) == all_items(range(3))

    resumed = Source()
    await initializer(r, resumed).run(asyncio.Event())
    assert resumed.cursors == ["3"] and resumed.produced == [3, 4]


@pytest.mark.parametrize("lock", [None, "9:other", "10:mine"])
async def test_fenced_refusal_at_start(r: Any, lock: str | None) -> None:
    if lock is None:
        await r.delete(KEYS.leader)
    else:
        await r.set(KEYS.leader, lock)
    src = Source()
    with pytest.raises(LeadershipLost):
        await initializer(r, src).run(asyncio.Event())
    assert src.cursors == []
    assert await r.exists(KEYS.init_state("seed")) == 0
    assert await shard_items(r) == {}


async def test_not_leading_at_start(r: Any) -> None:
    src = Source()
    with pytest.raises(LeadershipLost):
        await initializer(r, src, lock=None).run(asyncio.Event())
    assert src.cursors == []


async def test_leadership_lost_mid_way_writes_no_further_batch(r: Any) -> None:
    src = Source()

    async def usurp(b: int) -> None:
        if b == 2:  # another leader took over while batch 2 was being produced
            await r.set(KEYS.leader, "10:theirs")

    src.on_batch = usurp
    with pytest.raises(LeadershipLost):
        await initializer(r, src).run(asyncio.Event())
    st = await state(r)
    assert (st["done"], st["cursor"], st["batches"]) == ("0", "2", "2")
    assert set(await shard_items(r)) == all_items(range(2))


async def test_items_without_poller_and_own_writes(r: Any) -> None:
    async def own_writes(ctx: Context, cursor: str | None) -> AsyncIterator[Any]:
        yield "a", None
        yield "b", {}

    init = initializer(r, Source())
    init.init = InitializerDef("seed", own_writes, "v1")
    init.poller = None
    await init.run(asyncio.Event())
    st = await state(r)
    assert (st["done"], st["cursor"], st["items"]) == ("1", "b", "0")

    async def stray_items(ctx: Context, cursor: str | None) -> AsyncIterator[Any]:
        yield "a", {"x": 1.0}

    init.init = InitializerDef("seed", stray_items, "v2")
    with pytest.raises(ValueError, match="declares no poller"):
        await init.run(asyncio.Event())


async def test_due_times(r: Any) -> None:
    async def gen(ctx: Context, cursor: str | None) -> AsyncIterator[Any]:
        yield "1", {"now": 0, "later": 1234.5, "none": None}

    init = initializer(r, Source())
    init.init = InitializerDef("seed", gen, "v1", poller="cards")
    await init.run(asyncio.Event())
    assert await shard_items(r) == {
        "now": NOW_S * 1000,
        "later": 1_234_500,
        "none": NOW_S * 1000,
    }


async def test_due_as_a_delay_or_a_datetime(r: Any) -> None:
    import datetime as dt

    async def gen(ctx: Context, cursor: str | None) -> AsyncIterator[Any]:
        yield (
            "1",
            {
                "in-30s": dt.timedelta(seconds=30),
                "at": dt.datetime.fromtimestamp(DUE_S, dt.UTC),
                "now": 0,
            },
        )

    init = initializer(r, Source())
    init.init = InitializerDef("seed", gen, "v1", poller="cards")  # type: ignore[arg-type]
    await init.run(asyncio.Event())
    items = await shard_items(r)
    assert items == {"in-30s": (NOW_S + 30) * 1000, "at": DUE_S * 1000, "now": NOW_S * 1000}
