"""Flow keys: where they are written, per-key limits and fair queues, with in-process consumers
on fakeredis and the real server (the real processes are in tests/system/test_fair_processes.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import msgpack
import pytest

from harness import eventually
from tests.consumer.test_consumer import KEYS, Loop, loops
from worker import App, JobContext, JobSpec
from worker.context import Context
from worker.core import codec
from worker.core.clock import SystemClock
from worker.core.errors import InvalidId
from worker.core.serializer import msgpack_dumps
from worker.settings import Settings

__all__ = ["loops"]  # the fixture, shared with test_consumer


def _app() -> App:
    app = App("t")

    @app.task
    async def plain(ctx: JobContext, n: int) -> None:
        pass

    @app.task(flow_key=lambda tenant, n: f"tenant-{tenant}")
    async def keyed(ctx: JobContext, tenant: str, n: int) -> None:
        pass

    return app


async def _record(r: Any, job_id: str) -> dict[str, Any]:
    return dict(msgpack.unpackb(await r.get(codec.JOB_KEY_PREFIX + job_id), raw=False))


def test_a_record_without_a_flow_key_is_arqs_byte_for_byte() -> None:
    plain = codec.encode_job("f", [1], {"x": 2}, 1000, msgpack_dumps)
    assert plain == msgpack_dumps({"t": None, "f": "f", "a": [1], "k": {"x": 2}, "et": 1000})
    keyed = codec.encode_job("f", [1], {}, 1000, msgpack_dumps, flow=codec.JobFlow("t-7"))
    record = msgpack.unpackb(keyed, raw=False)
    assert record["fk"] == "t-7" and codec.job_flow(record).flow_key == "t-7"
    assert codec.job_flow(msgpack.unpackb(plain, raw=False)).flow_key is None


async def test_every_enqueue_path_writes_the_flow_key(r: Any) -> None:
    lp = Loop(r, _app())
    client = lp.client
    given = await client.enqueue("plain", 1, flow_key="t-1")
    default = await client.enqueue("keyed", "a", 2)
    overridden = await client.enqueue("keyed", "a", 3, flow_key="vip")
    none = await client.enqueue("plain", 4)
    many = await client.enqueue_many(
        [JobSpec("plain", (5,), flow_key="t-5"), JobSpec("keyed", ("b", 6)), ("plain", (7,))]
    )
    ids = [given, default, overridden, none, *many]
    assert all(ids)
    found = [codec.job_flow(await _record(r, j)).flow_key for j in ids if j]
    assert found == ["t-1", "tenant-a", "vip", None, "t-5", "tenant-b", None]
    assert "fk" not in await _record(r, none or "")  # no field at all without one
    # ctx.enqueue takes it as its own keyword too (never a task argument)
    context = Context(Settings.model_construct(), r, client, SystemClock(), "i-1")
    via_ctx = await JobContext({}, context).enqueue("plain", 8, flow_key="t-8")
    assert codec.job_flow(await _record(r, via_ctx or "")).flow_key == "t-8"


@pytest.mark.parametrize("bad", ["", "x" * 201, "line\nbreak", 7])
async def test_a_bad_flow_key_is_refused_before_anything_is_sent(r: Any, bad: Any) -> None:
    client = Loop(r, _app()).client
    with pytest.raises(InvalidId):
        await client.enqueue("plain", 1, flow_key=bad)
    with pytest.raises(InvalidId):
        await client.enqueue_many([JobSpec("plain", (1,), flow_key=bad)])
    assert await r.zcard(KEYS.queue) == 0


# -- per-key limits ------------------------------------------------------------------------------


async def test_max_concurrency_per_key_holds_per_key_across_consumers(
    r: Any,
    loops: list[Loop],
) -> None:
    app = App("t")
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    done: list[str] = []

    @app.task(max_concurrency_per_key=2, max_tries=1)  # over the limit: deferred, no try used
    async def per_tenant(ctx: JobContext, tenant: str) -> None:
        running[tenant] = running.get(tenant, 0) + 1
        peak[tenant] = max(peak.get(tenant, 0), running[tenant])
        await asyncio.sleep(0.05)
        running[tenant] -= 1
        done.append(tenant)

    a, b = Loop(r, app, instance="a"), Loop(r, app, instance="b")
    for n in range(24):
        tenant = "x" if n % 2 else "y"
        await a.client.enqueue("per_tenant", tenant, flow_key=tenant)
    loops += [a.start(), b.start()]
    await eventually(lambda: len(done) == 24, within=20, what="every job")
    assert peak == {"x": 2, "y": 2}  # two per key at once, and both keys together
    assert await r.zcard(KEYS.dead) == 0
    assert await r.zcard(KEYS.limit_slots("per_tenant", "x")) == 0


async def test_a_dead_holders_per_key_slot_comes_back_after_its_lease(
    r: Any,
    loops: list[Loop],
) -> None:
    app = App("t")
    done: list[str] = []

    @app.task(max_concurrency_per_key=1)
    async def single(ctx: JobContext) -> None:
        done.append(ctx.job_id)

    now = int(time.time() * 1000)  # a consumer SIGKILLed holding key k's only slot
    await r.zadd(KEYS.limit_slots("single", "k"), {"ghost": now + 400})
    lp = Loop(r, app, slot_lease_s=0.4)
    loops.append(lp.start())
    other = await lp.client.enqueue("single", flow_key="other")
    await eventually(lambda: done == [other], within=5, what="another key runs at once")
    await lp.client.enqueue("single", flow_key="k")
    await asyncio.sleep(0.2)
    assert len(done) == 1  # waiting for the slot
    await eventually(lambda: len(done) == 2, within=5, what="the slot to come back")


async def test_rate_per_key_spreads_one_keys_starts_only(
    r: Any,
    loops: list[Loop],
) -> None:
    app = App("t")
    starts: dict[str, list[float]] = {"slow": [], "fast": []}

    @app.task(rate_per_key="3/s")
    async def limited(ctx: JobContext, key: str) -> None:
        starts[key].append(time.monotonic())

    lp = Loop(r, app)
    for _ in range(6):
        await lp.client.enqueue("limited", "slow", flow_key="slow")
    await lp.client.enqueue("limited", "fast", flow_key="fast")
    await lp.client.enqueue("limited", "fast")  # no flow key: no per-key limit
    loops.append(lp.start())
    await eventually(lambda: len(starts["slow"]) == 6, within=10, what="every start")
    # a burst of 3, then 3 more spread over about a second; the other key was not held back
    assert starts["slow"][-1] - starts["slow"][0] >= 0.8
    assert len(starts["fast"]) == 2 and starts["fast"][-1] < starts["slow"][-1]


# -- fair queues ---------------------------------------------------------------------------------


def _fair_app(order: list[tuple[str, int]], step_s: float = 0.0) -> App:
    app = App("t", flow_weights={"vip": 3})

    @app.task(fair=True, flow_key=lambda key, n: key)
    async def work(ctx: JobContext, key: str, n: int) -> None:
        order.append((key, n))
        await asyncio.sleep(step_s)

    return app


async def test_fair_jobs_wait_per_flow_key_and_run_round_robin_fifo_within_a_key(
    r: Any,
    loops: list[Loop],
) -> None:
    order: list[tuple[str, int]] = []
    lp = Loop(r, _fair_app(order), concurrency=1, fair=("default",))
    await lp.client.enqueue_many([JobSpec("work", ("a", n)) for n in range(30)])
    for n in range(3):
        await lp.client.enqueue("work", "b", n)
        await lp.client.enqueue("work", "c", n)
    assert await r.zcard(KEYS.queue) == 0  # nothing in the queue proper before a consumer moves
    assert await r.zcard(KEYS.fair("default", "a")) == 30
    assert await r.zcard(KEYS.fair("default")) == 3
    loops.append(lp.start())
    await eventually(lambda: len(order) == 36, within=20, what="every job")
    for key in "abc":
        mine = [n for k, n in order if k == key]
        assert mine == sorted(mine)  # FIFO within a key
    # b's and c's jobs did not wait for a's backlog: all of them within the first 12 starts
    assert {k for k, _ in order[12:]} == {"a"}, order[:12]
    assert await r.exists(KEYS.fair("default"), KEYS.fair("default", "a")) == 0


async def test_a_heavier_flow_key_gets_its_weight_in_turns(
    r: Any,
    loops: list[Loop],
) -> None:
    order: list[tuple[str, int]] = []
    lp = Loop(r, _fair_app(order), concurrency=1, fair=("default",), flow_weights=(("vip", 3),))
    await lp.client.enqueue_many([JobSpec("work", (k, n)) for n in range(20) for k in ("a", "vip")])
    loops.append(lp.start())
    await eventually(lambda: len(order) == 40, within=20, what="every job")
    first = [k for k, _ in order[:20]]
    assert 13 <= first.count("vip") <= 17, first  # 3 to 1: 15 of the first 20


async def test_a_quiet_keys_job_waits_about_one_job_per_active_key_not_the_backlog(
    r: Any,
    loops: list[Loop],
) -> None:
    """The bound, short: one key holds 2,000 queued jobs of 10 ms; another enqueues one job
    every 0.2 s; each of those starts within a few jobs' time (one consumer, concurrency 10),
    not after the backlog (20 s). ``python -m bench fair`` runs it with 100,000 jobs."""
    starts: dict[int, float] = {}
    app = App("t")

    @app.task(fair=True)
    async def job(ctx: JobContext, n: int) -> None:
        if n >= 0:
            starts[n] = time.monotonic()
        await asyncio.sleep(0.01)

    lp = Loop(r, app, concurrency=10, fair=("default",))
    for lo in range(0, 2000, 500):
        await lp.client.enqueue_many(
            [JobSpec("job", (-1,), flow_key="heavy") for _ in range(lo, lo + 500)]
        )
    loops.append(lp.start())
    await asyncio.sleep(0.3)
    waits = []
    for n in range(8):
        sent = time.monotonic()
        await lp.client.enqueue("job", n, flow_key="quiet")
        await eventually(lambda n=n: n in starts, within=10, what=f"quiet job {n}")
        waits.append(starts[n] - sent)
        await asyncio.sleep(0.2)
    assert await r.zcard(KEYS.fair("default", "heavy")) > 500  # the backlog still waits
    assert max(waits) < 1.0, waits  # ~10 ms + a claim round; 1 s on a loaded box


async def test_status_shows_a_fair_queues_flow_keys_and_their_backlog(r: Any) -> None:
    from worker.core.clock import FakeClock
    from worker.ops import status

    order: list[tuple[str, int]] = []
    app = _fair_app(order)
    client = Loop(r, app).client
    await client.enqueue_many([JobSpec("work", ("a", n)) for n in range(5)])
    await client.enqueue("work", "b", 0)
    await client.enqueue("work", "x", 0, flow_key="c")  # the given key wins over the default
    data = await status.collect(r, KEYS, app, FakeClock(time.time()))
    (queue,) = [q for q in data["queues"] if "flows" in q]  # not the duty lane beside it
    assert queue["flows"] == {"active": 3, "backlog": {"a": 5, "b": 1, "c": 1}}
    assert "  flow keys: 3 active, waiting: a: 5, b: 1, c: 1" in status.render(data).splitlines()
    assert "flows" not in (await status.collect(r, KEYS, _app(), FakeClock(time.time())))["queue"]


async def test_with_queue_shards_a_flow_keys_jobs_meet_one_shard_and_status_sums_them(
    redis_url: str,
) -> None:
    from worker.client import Client
    from worker.ops import snapshot

    order: list[tuple[str, int]] = []
    app = _fair_app(order)
    prefix = f"{{ff{uuid.uuid4().hex[:6]}}}:"
    client = await Client.connect(redis_url, app=app, key_prefix=prefix, queue_shards=3)
    try:
        keys = [f"k{i}" for i in range(6)]
        await client.enqueue_many([JobSpec("work", (k, n)) for k in keys for n in range(4)])
        stores = client.shards.stores
        for k in keys:  # every job of a key in its key's shard
            held = [await s.redis.zcard(s.keys.fair("default", k)) for s in stores]
            assert sorted(held) == [0, 0, 4] and client.shards.for_key(k) is stores[held.index(4)]
        snap = await snapshot.read(stores[0], app, checks=False, shards=stores)
        assert snap.flows["default"].active == 6
        assert snap.flows["default"].backlog == dict.fromkeys(keys, 4)
    finally:
        await client.close()


@pytest.mark.parametrize("weight", [0, 1.5, "2"])
def test_flow_weights_are_integers_of_at_least_one(weight: Any) -> None:
    from worker.core.errors import ConfigError

    App("t", flow_weights={"vip": 3}).validate()
    with pytest.raises(ConfigError, match="flow_weights"):
        App("t", flow_weights={"vip": weight}).validate()
    with pytest.raises(ConfigError, match="max_concurrency_per_key"):
        App("t").task(max_concurrency_per_key=0)


async def test_the_console_overview_carries_a_fair_queues_flow_keys(redis_url: str) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from worker.client import Client
    from worker.web import create_app

    order: list[tuple[str, int]] = []
    app = _fair_app(order)
    prefix = f"cf{uuid.uuid4().hex[:6]}:"
    client = await Client.connect(redis_url, app=app, key_prefix=prefix)
    http: TestClient[Any, Any] = TestClient(TestServer(create_app(client, app, token="t0k3n")))
    await http.start_server()
    try:
        await client.enqueue_many([JobSpec("work", ("a", n)) for n in range(3)])
        await client.enqueue("work", "<b>", 0)  # shown as text by the page (textContent)
        res = await http.get("/api/overview", headers={"Authorization": "Bearer t0k3n"})
        (queue,) = [q for q in (await res.json())["cluster"]["queues"] if "flows" in q]
        assert queue["flows"] == {"active": 2, "backlog": {"a": 3, "<b>": 1}}
    finally:
        await http.close()
        await client.close()


def test_sync_client_enqueue_takes_the_flow_key(redis_url: str, rsync: Any) -> None:
    from worker import SyncClient

    prefix = f"sc{uuid.uuid4().hex[:6]}:"
    with SyncClient.connect(redis_url, app=_app(), key_prefix=prefix) as sync:
        given = sync.enqueue("plain", 1, flow_key="t-1")
        default = sync.enqueue("keyed", "a", 2)
    for jid, key in ((given, "t-1"), (default, "tenant-a")):
        record = msgpack.unpackb(rsync.get(codec.JOB_KEY_PREFIX + (jid or "")), raw=False)
        assert codec.job_flow(record).flow_key == key


async def test_a_deferred_fair_job_waits_its_turn_in_time_not_the_others(
    r: Any,
    loops: list[Loop],
) -> None:
    order: list[tuple[str, int]] = []
    lp = Loop(r, _fair_app(order), concurrency=1, fair=("default",))
    loops.append(lp.start())
    await lp.client.enqueue("work", "later", 0, defer_by=0.6)
    sent = time.monotonic()
    await lp.client.enqueue_many([JobSpec("work", ("now", n)) for n in range(3)])
    await eventually(lambda: len(order) == 3, within=5, what="the due jobs")
    assert order == [("now", 0), ("now", 1), ("now", 2)]  # not held back by the deferred key
    await eventually(lambda: len(order) == 4, within=5, what="the deferred job")
    assert time.monotonic() - sent >= 0.5 and order[-1] == ("later", 0)


def test_the_manifest_says_which_tasks_are_fair() -> None:
    from worker.manifest import describe, manifest

    order: list[tuple[str, int]] = []
    app = _fair_app(order)
    app.task(name="other")(lambda ctx: None)
    data = manifest(app, written_ms=0)
    assert [t.get("fair") for t in data["tasks"]] == [True, None]  # no field when not fair
    assert describe(data).app.fair_queues() == ("default",)
