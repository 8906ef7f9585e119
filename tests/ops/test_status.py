"""``worker status``: collect() on a seeded Redis, render(), and no secrets anywhere."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from worker.app import App
from worker.cli import cluster
from worker.core.clock import FakeClock
from worker.core.errors import ConfigError
from worker.duties.registry import Heartbeat
from worker.ops import status
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")
NOW_S = 1_700_000_030.0  # 2023-11-14T22:13:50Z
NOW = int(NOW_S * 1000)
SECRET = "s3cr3t-pw"


def make_app() -> App:
    app = App("shop")

    @app.task
    async def poll_card(ctx: Any, item: str) -> None: ...

    @app.periodic(every=60)
    async def order_expire(ctx: Any) -> None: ...

    @app.periodic(cron="0 0 * * *", tz="Asia/Shanghai")
    async def daily_reset(ctx: Any) -> None: ...

    app.poller("cards", task="poll_card", shards=2)

    @app.initializer(version="v2", poller="cards")
    async def load_cards(ctx: Any, cursor: str | None) -> AsyncIterator[Any]:
        yield "c", None

    @app.initializer(version="v1")
    async def never_ran(ctx: Any, cursor: str | None) -> AsyncIterator[Any]:
        yield "c", None

    return app


async def heartbeat(r: Any, clock: FakeClock, iid: str, name: str, role: str, **extra: Any) -> None:
    class View:
        ready = True
        shutting_down = False

        def describe(self) -> dict[str, Any]:
            return {"components": ["consumer"], "in_flight": 0, **extra}

        def identity(self) -> dict[str, Any]:
            return {}

        def component_health(self) -> dict[str, dict[str, Any]]:
            return {}

    hb = Heartbeat(
        Store(r, KEYS), View(), clock, instance_id=iid, instance_name=name, role=role, interval_s=2
    )
    await hb.tick()
    await r.zadd(KEYS.instances, {iid: int(clock.time() * 1000)})  # as if the server's clock


async def seed(r: Any) -> App:
    app = make_app()
    await heartbeat(
        r,
        FakeClock(NOW_S - 1.0),
        "leader-1-aaa",
        "leader-1",
        "leader",
        is_leader=True,
        epoch=4,
        lease_age_s=12.5,
    )
    await heartbeat(
        r,
        FakeClock(NOW_S - 0.5),
        "consumer-1-bbb",
        "consumer-1",
        "consumer",
        is_leader=False,
        epoch=None,
        in_flight=3,
    )
    # a process that died: its record expired, its heartbeat entry remains
    await r.zadd(KEYS.instances, {"consumer-9-zzz": NOW - 60_000})

    await r.set(KEYS.leader, "4:tok", px=8000)
    await r.zadd(KEYS.queue, {"j1": NOW - 10, "j2": NOW, "j3": NOW + 60_000})
    await r.hset(KEYS.periodic_state, "order_expire", NOW - 50_000)  # 22:13:00Z
    await r.hset(KEYS.periodic_enqueued, "order_expire", NOW - 50_000)
    # planned through its previous slot (midnight in Shanghai, 6 h ago) but never enqueued
    await r.hset(KEYS.periodic_state, "daily_reset", NOW - 6 * 3_600_000)

    p = app.pollers["cards"]
    items = {"a": NOW - 5, "b": NOW - 1, "c": NOW + 10_000}
    for item, due in items.items():
        await r.zadd(KEYS.poll_shard("cards", p.shard_of(item)), {item: due})
    # two items were dispatched earlier: d's job is still queued/running, e's finished
    await r.hset(KEYS.poll_inflight("cards"), mapping={"d": "job-d", "e": "job-e"})
    await r.set(K.ARQ_JOB + "job-d", b"x", px=60_000)
    await r.set(K.ARQ_RESULT + "job-e", b"done", px=60_000)

    await r.hset(
        KEYS.init_state("load_cards"),
        mapping={"version": "v2", "done": 1, "batches": 4, "items": 100, "cursor": "c4"},
    )
    await r.zadd(KEYS.dead, {"dead-1": NOW - 1})
    return app


async def test_collect_reports_the_cluster(r: Any) -> None:
    app = await seed(r)
    st = await status.collect(r, KEYS, app, FakeClock(NOW_S))
    assert st["at"] == "2023-11-14T22:13:50+00:00"

    by_id = {i["id"]: i for i in st["instances"]}
    assert set(by_id) == {"leader-1-aaa", "consumer-1-bbb", "consumer-9-zzz"}
    leader = by_id["leader-1-aaa"]
    assert (leader["name"], leader["role"], leader["alive"], leader["heartbeat_age_s"]) == (
        "leader-1",
        "leader",
        True,
        1.0,
    )
    assert by_id["consumer-1-bbb"]["in_flight"] == 3
    assert by_id["consumer-9-zzz"]["alive"] is False
    assert by_id["consumer-9-zzz"]["heartbeat_age_s"] == 60.0

    assert st["leader"]["held"] is True
    assert st["leader"]["epoch"] == 4
    assert st["leader"]["instance"] == "leader-1"
    assert st["leader"]["lease_age_s"] == 12.5
    assert 0 < st["leader"]["ttl_remaining_s"] <= 8.0

    assert st["queue"] == {"name": "t:queue", "depth": 3, "due": 2}
    periodic = {p["name"]: p for p in st["periodic"]}
    assert periodic["order_expire"]["last_tick"] == "2023-11-14T22:13:00+00:00"
    assert periodic["order_expire"]["last_tick_age_s"] == 50.0
    assert periodic["order_expire"]["next_tick"] == "2023-11-14T22:14:00+00:00"
    assert periodic["order_expire"]["schedule"] == "every 60s"
    assert periodic["daily_reset"]["last_tick"] is None  # never ran: not "6 h ago"
    assert periodic["daily_reset"]["last_tick_age_s"] is None
    assert periodic["daily_reset"]["next_tick"] == "2023-11-15T16:00:00+00:00"  # 00:00 +08

    (cards,) = st["pollers"]
    assert (cards["name"], cards["task"], cards["waiting"], cards["due"]) == (
        "cards",
        "poll_card",
        3,
        2,
    )
    assert sum(s["waiting"] for s in cards["shards"]) == 3
    assert cards["in_flight"] == 1  # only d's job still exists

    inits = {i["name"]: i for i in st["initializers"]}
    assert inits["load_cards"] == {
        "name": "load_cards",
        "version": "v2",
        "stored_version": "v2",
        "done": True,
        "batches": 4,
        "items": 100,
        "cursor": "c4",
    }
    assert inits["never_ran"]["done"] is False and inits["never_ran"]["stored_version"] is None
    assert st["dead_letters"] == 1
    json.dumps(st)  # JSON-serializable as `status --json` prints it


async def test_initializer_done_for_an_older_version_is_not_done(r: Any) -> None:
    app = make_app()
    await r.hset(KEYS.init_state("load_cards"), mapping={"version": "v1", "done": 1})
    st = await status.collect(r, KEYS, app, FakeClock(NOW_S))
    init = next(i for i in st["initializers"] if i["name"] == "load_cards")
    assert (init["done"], init["stored_version"], init["version"]) == (False, "v1", "v2")


async def test_render_contains_the_key_facts(r: Any) -> None:
    app = await seed(r)
    text = status.render(await status.collect(r, KEYS, app, FakeClock(NOW_S)))
    assert "leader: leader-1  epoch 4" in text
    assert "queue t:queue: 3 jobs (2 due)" in text
    assert "dead letters: 1" in text
    lines = text.splitlines()

    def row(first: str) -> str:
        return next(line for line in lines if line.startswith(first + " "))

    assert "leader" in row("leader-1") and "yes (epoch 4)" in row("leader-1")
    assert "STALE" in row("consumer-9-zzz") and "STALE" not in row("consumer-1")
    assert "2023-11-14T22:13:00+00:00" in row("order_expire")
    assert "2023-11-14T22:14:00+00:00" in row("order_expire")
    assert "never" in row("daily_reset")
    assert row("cards").split()[:4] == ["cards", "poll_card", "3", "2"]
    assert row("load_cards").split() == ["load_cards", "v2", "yes", "4", "100", "c4"]


async def test_render_without_leader_or_anything(r: Any) -> None:
    st = await status.collect(r, KEYS, App("empty"), FakeClock(NOW_S))
    assert st["leader"] == {"held": False}
    text = status.render(st)
    assert "leader: none" in text
    assert "queue t:queue: 0 jobs (0 due)" in text


@pytest.fixture
def password_server(redis_url: str, rsync: redis_sync.Redis) -> Any:
    """The real server with ``requirepass`` on for one test (turned off again after)."""
    rsync.config_set("requirepass", SECRET)
    authed = redis_sync.Redis.from_url(redis_url, password=SECRET)
    try:
        yield redis_url.replace("redis://", f"redis://:{SECRET}@")
    finally:
        authed.config_set("requirepass", "")
        authed.close()


async def test_status_command_never_prints_the_password(
    password_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    app = make_app()
    seeded = aioredis.Redis.from_url(password_server)
    try:
        await seed(seeded)
    finally:
        await seeded.aclose()
    settings = Settings.model_construct(redis_url=password_server, key_prefix="t:")
    for as_json in (True, False):
        assert await cluster.show_status(settings, app, as_json=as_json) == 0
        out = capsys.readouterr()
        assert "leader-1" in out.out
        assert SECRET not in out.out + out.err

    wrong = password_server.replace(SECRET, SECRET + "-wrong")
    with pytest.raises(ConfigError) as info:
        await cluster.show_status(
            Settings.model_construct(redis_url=wrong, key_prefix="t:"), app, as_json=True
        )
    assert "WORKER_REDIS_URL: authentication failed for user 'default'" in str(info.value)
    assert SECRET not in str(info.value)
    assert "\n" not in str(info.value)


async def test_per_key_service_owners(r: Any) -> None:
    app = await seed(r)

    @app.service(cardinality="per_key", keys=["box-1", "box-2", "box-3"])
    async def mailbox(ctx: Any, stop: Any, key: str) -> None: ...

    await r.zadd(KEYS.service_members("mailbox"), {"leader-1-aaa": NOW, "consumer-1-bbb": NOW})
    await r.set(KEYS.service_lease("mailbox", "box-1"), "leader-1-aaa", px=10_000)
    await r.set(KEYS.service_lease("mailbox", "box-2"), "consumer-1-bbb", px=10_000)
    data = await status.collect(r, KEYS, app, FakeClock(NOW_S))
    (svc,) = data["per_key_services"]
    assert svc == {
        "name": "mailbox",
        "processes": 2,
        "keys": {"box-1": "leader-1", "box-2": "consumer-1"},  # box-3: not running anywhere
    }
    text = status.render(data)
    assert "per_key service mailbox: 2 keys running on 2 processes" in text
    assert "box-2" in text and "consumer-1" in text


def test_render_shows_the_eviction_policy() -> None:
    base: dict[str, Any] = {
        "at": "2023-11-14T22:13:50+00:00",
        "leader": {"held": False},
        "queue": {"name": "t:queue", "depth": 0, "due": 0},
        "dead_letters": 0,
        "instances": [],
        "periodic": [],
        "pollers": [],
        "initializers": [],
    }

    def line(policy: str | None, allowed: bool) -> str:
        from worker.runtime.preflight import NOEVICTION, eviction_verdict

        rd = {
            "maxmemory_policy": policy,
            "ok": policy == NOEVICTION,
            "eviction_allowed": allowed,
            "verdict": eviction_verdict(policy, allowed),
        }
        text = status.render({**base, "redis": rd})
        return next(ln for ln in text.splitlines() if ln.startswith("redis: "))

    assert line("noeviction", False) == "redis: maxmemory-policy noeviction"
    assert line("allkeys-lru", True) == (
        "redis: maxmemory-policy allkeys-lru (eviction allowed by WORKER_ALLOW_EVICTION)"
    )
    assert "VIOLATES" in line("volatile-lru", False)
    assert line(None, False).startswith("redis: maxmemory-policy unknown")


async def test_collect_reads_the_policy(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        data = await status.collect(client, KEYS, App("empty"), FakeClock(NOW_S))
    finally:
        await client.aclose()
    assert data["redis"]["maxmemory_policy"] == "noeviction"
    assert data["redis"]["ok"] is True
    assert "redis: maxmemory-policy noeviction" in status.render(data)
