"""The per-shard read model (``WORKER_QUEUE_SHARDS`` > 1): ``status``, ``doctor``, the console's
queues and the backlog metric read every shard, show the totals as with one shard and each
shard's part; one shard shows exactly what it showed before."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis as redis_sync

from harness import CliRun
from worker.app import App
from worker.core.clock import FakeClock
from worker.core.metrics import Metrics
from worker.duties.backlog import QueueMetrics
from worker.ops import doctor, snapshot, status
from worker.ops.doctor.work import check_shards
from worker.ops.snapshot import ShardState
from worker.storage import keys as K
from worker.storage.shards import shard_prefixes, slot_of_prefix
from worker.storage.store import open_shards

PREFIX = "{shop}:"
NOW_S = 1_800_000_000.0
NOW = int(NOW_S * 1000)


def make_app() -> App:
    app = App("shop")

    @app.task
    async def noop(ctx: Any) -> None: ...

    @app.task(queue="high")
    async def urgent(ctx: Any) -> None: ...

    return app


async def fill(r: Any) -> None:
    """Shard 0: 2 due + 1 later; shard 1: 1 due in high; shard 2: 3 due (one older) + a dead."""
    k = [K.Keys(p) for p in shard_prefixes(PREFIX, 3)]
    await r.zadd(k[0].queue, {f"{k[0].prefix}a": NOW - 1_000, f"{k[0].prefix}b": NOW})
    await r.zadd(k[0].queue, {f"{k[0].prefix}c": NOW + 60_000})
    await r.zadd(k[1].queue_of("high"), {f"{k[1].prefix}h": NOW - 2_000})
    await r.zadd(k[2].queue, {f"{k[2].prefix}{i}": NOW - 5_000 * (i == 0) for i in range(3)})
    await r.zadd(k[2].dead, {f"{k[2].prefix}dead": NOW - 1})


async def test_snapshot_totals_and_per_shard_figures(r: Any) -> None:
    await fill(r)
    app = make_app()
    stores = open_shards(r, K.Keys(PREFIX), None, 3)
    snap = await snapshot.read(stores[0], app, now_ms=NOW, checks=False, shards=stores)
    by_name = {q.name: q for q in snap.queues}
    assert (by_name["default"].depth, by_name["default"].due) == (6, 5)
    assert by_name["default"].head_ms == NOW - 5_000  # the oldest over every shard
    assert by_name["default"].key == f"{PREFIX}queue"  # the home's key, as with one shard
    assert (by_name["high"].depth, by_name["high"].due) == (1, 1)
    assert snap.dead_letters == 1
    assert [(s.index, s.prefix, s.depth, s.due, s.dead_letters) for s in snap.shards] == [
        (0, PREFIX, 3, 2, 0),
        (1, shard_prefixes(PREFIX, 3)[1], 1, 1, 0),
        (2, shard_prefixes(PREFIX, 3)[2], 3, 3, 1),
    ]
    assert [s.slot for s in snap.shards] == [slot_of_prefix(p) for p in shard_prefixes(PREFIX, 3)]
    assert {s.node for s in snap.shards} == {None}  # not a cluster
    doc = status.view(snap, app)
    assert [(s["shard"], s["depth"], s["due"]) for s in doc["shards"]] == [
        (0, 3, 2),
        (1, 1, 1),
        (2, 3, 3),
    ]
    assert doc["shards"][2]["oldest_due_age_s"] == 5.0
    assert doc["shards"][1]["queues"]["high"] == {"depth": 1, "due": 1}
    text = status.render(doc)
    assert "SHARD" in text and shard_prefixes(PREFIX, 3)[2] in text
    # not a cluster: the doctor warns (the shards share one server), it does not fail
    report = doctor.judge(snap, app, doctor.Limits())
    assert report.check("shards").status == "warn"


async def test_one_shard_reads_as_before(r: Any) -> None:
    await fill(r)
    app = make_app()
    store = open_shards(r, K.Keys(PREFIX), None, 1)[0]
    plain = await snapshot.read(store, app, now_ms=NOW, checks=False)
    one = await snapshot.read(store, app, now_ms=NOW, checks=False, shards=(store,))
    assert plain == one and one.shards == []
    doc = status.view(one, app)
    assert "shards" not in doc and "SHARD" not in status.render(doc)
    assert [(q.depth, q.due) for q in one.queues] == [(3, 2), (0, 0), (0, 0), (0, 0)]  # home only
    assert [q.name for q in one.queues][2:] == ["default:duty", "high:duty"]  # the duty lanes
    assert "shards" not in [c.name for c in doctor.judge(one, app, doctor.Limits()).checks]


def shard(i: int, node: str | None) -> ShardState:
    return ShardState(i, f"p{i}", 100 * i, node, [], 0)


def snap_with(shards: list[ShardState], masters: int) -> snapshot.ClusterSnapshot:
    return snapshot.ClusterSnapshot(
        NOW, PREFIX, None, -2, [], "noeviction", "CONFIG GET", [], 0,
        shards=shards, cluster_masters=masters,
    )  # fmt: skip


def test_the_shards_check_names_shards_sharing_a_primary() -> None:
    app, limits = make_app(), doctor.Limits()
    ok = check_shards(
        snap_with([shard(0, "a:1"), shard(1, "b:1"), shard(2, "c:1")], 3), app, limits
    )
    assert ok.status == "ok"
    shared = [shard(0, "a:1"), shard(1, "a:1"), shard(2, "c:1")]
    bad = check_shards(snap_with(shared, 3), app, limits)
    assert bad.status == "fail" and "reshard" in bad.summary
    assert bad.details == ["a:1 serves shards 0, 1 (slots 0, 100)"]
    few = check_shards(snap_with(shared, 2), app, limits)  # fewer primaries than shards
    assert few.status == "warn" and "2 primaries" in few.summary


async def test_the_backlog_metric_has_a_shard_series_only_with_shards(r: Any) -> None:
    await fill(r)
    stores = open_shards(r, K.Keys(PREFIX), None, 3)
    metrics = Metrics()
    component = QueueMetrics(
        stores[0], ["default", "high"], FakeClock(NOW_S), metrics, shards=stores
    )
    await component.tick()
    sample = metrics.registry.get_sample_value
    assert sample("worker_queue_backlog", {"queue": "default"}) == 5  # the total, as before
    assert sample("worker_queue_jobs", {"queue": "default"}) == 6
    assert [
        sample("worker_queue_shard_backlog", {"queue": "default", "shard": str(i)})
        for i in range(3)
    ] == [2, 0, 3]
    assert sample("worker_queue_shard_backlog", {"queue": "high", "shard": "1"}) == 1
    await component.teardown()
    assert sample("worker_queue_shard_backlog", {"queue": "default", "shard": "2"}) is None
    single = Metrics()
    await QueueMetrics(stores[0], ["default"], FakeClock(NOW_S), single, shards=stores[:1]).tick()
    assert single.registry.get_sample_value("worker_queue_backlog", {"queue": "default"}) == 2
    shard_series = [
        s for m in single.registry.collect() if m.name == "worker_queue_shard_backlog"
        for s in m.samples
    ]  # fmt: skip
    assert shard_series == []


@pytest.mark.slow
def test_status_and_doctor_commands_print_the_shards(
    rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefixes = shard_prefixes(PREFIX, 3)
    for i, p in enumerate(prefixes):
        rsync.zadd(f"{p}queue", {f"{p}j{k}": 0 for k in range(i + 1)})
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": PREFIX,
        "WORKER_QUEUE_SHARDS": "3",
        "WORKER_APP": "harness.apps.ledger:app",
    }
    done = cli("status", "--json", env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["queue"]["depth"] == 6
    assert [(s["prefix"], s["depth"]) for s in data["shards"]] == [
        (p, i + 1) for i, p in enumerate(prefixes)
    ]
    table = cli("status", env=env)
    assert table.returncode == 0 and "SHARD" in table.stdout, table.stderr
    checked = cli("doctor", "--json", env=env)
    shards = next(c for c in json.loads(checked.stdout)["checks"] if c["name"] == "shards")
    assert shards["status"] == "warn", shards
    one = cli("status", "--json", env={**env, "WORKER_QUEUE_SHARDS": "1"})
    assert "shards" not in json.loads(one.stdout) and json.loads(one.stdout)["queue"]["depth"] == 1


async def test_the_jobs_listing_pages_through_every_shard(r: Any) -> None:
    """``worker jobs``/the console's Jobs view with 3 shards: every queued job once, shard by
    shard, pages of at most ``limit`` with a cursor; one shard lists only its own."""
    from worker.core.serializer import job_payload, msgpack_dumps
    from worker.ops import jobsview

    stores = open_shards(r, K.Keys(PREFIX), None, 3)
    expected = []
    for s, store in enumerate(stores):
        p = store.keys.prefix
        for i in range(7 + s):
            job_id = f"{p}j{i:03d}"
            await r.set(K.ARQ_JOB + job_id, job_payload("noop", [i], {}, NOW, msgpack_dumps))
            await r.zadd(store.keys.queue, {job_id: NOW - 1_000 + i})
            expected.append(job_id)
    seen: list[str] = []
    cursor = None
    for _ in range(20):
        page = await jobsview.list_jobs(
            stores[0], state="queued", limit=4, cursor=cursor, now_ms=NOW, shards=stores
        )
        assert len(page.items) <= 4
        seen += [j.job_id for j in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == expected  # each once: the home's earliest first, then each shard's
    home = await jobsview.list_jobs(stores[0], state="queued", limit=50, now_ms=NOW)
    assert [j.job_id for j in home.items] == expected[:7]


async def test_the_console_overview_carries_each_shard(redis_url: str, rsync: Any) -> None:
    """The console's overview (the Queues view's Backlog per shard table) with 3 shards:
    per-shard backlog beside the totals, throughput summed over the shards' counters."""
    from worker.client import Client
    from worker.web import api

    prefixes = shard_prefixes(PREFIX, 3)
    for i, p in enumerate(prefixes):
        rsync.zadd(f"{p}queue", {f"{p}j{k}": 0 for k in range(i + 1)})
    client = await Client.connect(redis_url, key_prefix=PREFIX, queue_shards=3)
    try:
        view = await api.overview(api.ConsoleState(client, make_app()))
    finally:
        await client.close()
    cluster = view["cluster"]
    assert [(s["shard"], s["prefix"], s["depth"]) for s in cluster["shards"]] == [
        (i, p, i + 1) for i, p in enumerate(prefixes)
    ]
    default = next(q for q in cluster["queues"] if q["queue"] == "default")
    assert default["depth"] == 6 and len(default["throughput"]) > 0


def test_throughput_series_are_summed_minute_by_minute_over_the_shards() -> None:
    from worker.web.api import _summed

    one = {"default": [(0, 1, 0), (60_000, 2, 1)]}
    two = {"default": [(0, 3, 1), (60_000, 0, 0)]}
    assert _summed([one]) is one
    assert _summed([one, two]) == {"default": [(0, 4, 1), (60_000, 2, 1)]}


async def test_done_and_failed_listings_merge_every_shard_newest_first(r: Any) -> None:
    """``worker jobs --state done|failed`` with 3 shards: each shard's recent successes and
    failures merged newest first, paged by time; the failure record read in the job's shard."""
    from harness.arqfmt import serialize_result
    from worker.core.serializer import msgpack_dumps
    from worker.ops import jobsview

    stores = open_shards(r, K.Keys(PREFIX), None, 3)
    done = []
    for i in range(9):  # round robin over the shards, finished 1 ms apart
        store = stores[i % 3]
        job_id, ok, at = f"{store.keys.prefix}e{i}", i != 4, NOW - 100 + i
        raw = serialize_result(
            "noop", (i,), {}, 1, NOW - 500, ok, 1 if ok else ValueError("bad"), NOW - 200, at,
            "r", store.keys.queue, job_id=job_id, serializer=msgpack_dumps,
        )  # fmt: skip
        assert raw is not None
        await r.set(K.ARQ_RESULT + job_id, raw)
        await r.zadd(store.keys.done if ok else store.keys.failures, {job_id: at})
        if ok:
            done.append(job_id)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await jobsview.list_jobs(
            stores[0], state="done", limit=3, cursor=cursor, now_ms=NOW, shards=stores
        )
        seen += [j.job_id for j in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == done[::-1]  # every shard's, newest first, each once
    failed = await jobsview.list_jobs(stores[0], state="failed", now_ms=NOW, shards=stores)
    assert [j.job_id for j in failed.items] == [f"{stores[1].keys.prefix}e4"]


async def test_the_running_listing_reads_every_shards_holds(r: Any) -> None:
    """``worker jobs --state running`` with 3 shards: a live instance's holds in every shard
    (its claims are held where its jobs are), by id; one shard sees only its own."""
    from worker.core.serializer import job_payload, msgpack_dumps
    from worker.ops import jobsview

    stores = open_shards(r, K.Keys(PREFIX), None, 3)
    await r.zadd(stores[0].keys.instances, {"c-1": NOW})
    running = []
    for s, store in enumerate(stores):
        job_id = f"{store.keys.prefix}run{s}"
        await r.set(K.ARQ_JOB + job_id, job_payload("noop", [s], {}, NOW, msgpack_dumps))
        await r.set(K.ARQ_IN_PROGRESS + job_id, "c-1:tok")
        await r.zadd(store.keys.queue, {job_id: NOW + 300_000})  # parked at its claim's expiry
        await r.sadd(store.keys.holds("c-1"), job_id)
        running.append(job_id)
    page = await jobsview.list_jobs(stores[0], state="running", now_ms=NOW, shards=stores)
    assert sorted(j.job_id for j in page.items) == sorted(running)
    assert {j.instance for j in page.items} == {"c-1"}
    home = await jobsview.list_jobs(stores[0], state="running", now_ms=NOW)
    assert [j.job_id for j in home.items] == running[:1]
