"""The console's HTTP API on the real server: the guard (token, same origin, JSON), what the
views read back from Redis, and that each action has its effect in Redis and is logged.

The browser tests (tests/web/test_web_browser.py) drive the same API through the page.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer

from harness.apps.ledger import app as ledger
from worker.client import Client
from worker.consumer.dead import DeadLetters
from worker.core.clock import FakeClock, ms
from worker.core.errors import ConfigError
from worker.core.serializer import get_serializer, job_payload
from worker.storage import keys as K
from worker.storage.jobs import Finish
from worker.web import create_app

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}", "X-Worker-Operator": "ada"}
PREFIX = "web:"
HOSTILE = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>'


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Client]:
    c = await Client.connect(redis_url, key_prefix=PREFIX, app=ledger)
    yield c
    await c.close()


async def _http(client: Client, **kwargs: Any) -> TestClient[Any, Any]:
    console = create_app(client, ledger, redis_url="redis://u:pw@example:6379/0", **kwargs)
    http: TestClient[Any, Any] = TestClient(TestServer(console))
    await http.start_server()
    return http


@pytest.fixture
async def http(client: Client) -> AsyncIterator[TestClient[Any, Any]]:
    h = await _http(client, token=TOKEN)
    yield h
    await h.close()


_SET_ASIDE = FakeClock(start=time.time() - 3600)


async def _dead(client: Client, job_id: str, payload: bytes, **kw: Any) -> None:
    """Set a job aside, each a millisecond after the previous one (newest last)."""
    _SET_ASIDE.advance(0.001)
    letters = DeadLetters(client.store, _SET_ASIDE, instance_id="i-1")
    await letters.set_aside(job_id, kw.pop("reason", "unknown function 'x'"), "unknown",
                            payload, len(payload), **kw)  # fmt: skip


# -- the guard ------------------------------------------------------------------------------------


async def test_the_page_is_public_the_api_needs_the_token(http: TestClient[Any, Any]) -> None:
    page = await http.get("/")
    assert page.status == 200 and "worker console" in await page.text()
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    assert (await http.get("/static/app.js")).status == 200
    assert (await http.get("/static/../app.py")).status == 404
    assert (await http.get("/api/overview")).status == 401
    assert (await http.get("/api/overview", headers={"Authorization": "Bearer nope"})).status == 401
    ok = await http.get("/api/overview", headers=AUTH)
    assert ok.status == 200 and ok.headers["Cache-Control"] == "no-store"
    assert (await http.get("/api/overview", headers={"X-Worker-Token": TOKEN})).status == 200


async def test_actions_need_the_token_json_and_the_same_origin(
    http: TestClient[Any, Any], client: Client
) -> None:
    body = {"kind": "periodic", "name": "tick"}
    assert (await http.post("/api/pause", json=body)).status == 401
    bad = {**AUTH, "Origin": "https://evil.example"}
    assert (await http.post("/api/pause", json=body, headers=bad)).status == 403
    cross = {**AUTH, "Sec-Fetch-Site": "cross-site"}
    assert (await http.post("/api/pause", json=body, headers=cross)).status == 403
    form = await http.post("/api/pause", data={"kind": "periodic", "name": "tick"}, headers=AUTH)
    assert form.status == 415
    assert await client.store.paused() == set()  # none of them did anything
    host = f"http://{http.host}:{http.port}"
    same = await http.post("/api/pause", json=body, headers={**AUTH, "Origin": host})
    assert same.status == 200 and (await same.json())["ok"] is True
    assert await client.store.paused() == {"periodic:tick"}


async def test_a_console_without_a_token_is_read_only_and_only_when_asked(client: Client) -> None:
    with pytest.raises(ConfigError, match="WORKER_WEB_TOKEN"):
        create_app(client, ledger, token=None)
    http = await _http(client, token=None, view_needs_token=False)
    try:
        assert (await http.get("/api/overview")).status == 200
        refused = await http.post("/api/pause", json={"kind": "periodic", "name": "tick"})
        assert refused.status == 403 and "WORKER_WEB_TOKEN" in (await refused.json())["error"]
    finally:
        await http.close()


def test_the_command_refuses_to_start_without_a_token(cli: Any, redis_url: str) -> None:
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_APP": "harness.apps.ledger:app"}
    out = cli("web", "--port", "0", env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "WORKER_WEB_TOKEN" in out.stderr and "--no-auth" in out.stderr
    short = cli("web", env={**env, "WORKER_WEB_TOKEN": "short"})
    assert short.returncode == 2 and "WORKER_WEB_TOKEN" in short.stderr
    assert "short" not in short.stderr  # a secret is never echoed


# -- what it shows --------------------------------------------------------------------------------


async def test_the_overview_reads_what_redis_holds(
    http: TestClient[Any, Any], client: Client
) -> None:
    store, keys = client.store, client.keys
    won = await store.acquire("tok", 10_000, instance="leader-1")
    await store.heartbeat(
        "id-1",
        {"id": "id-1", "name": "leader-1", "app": "ledger", "role": "leader", "version": "9",
         "is_leader": True, "epoch": 1, "lease_age_s": 3.0, "in_flight": 2,
         "components": ["leader-election", "consumer"], "health": {"consumer": "ok"}},
        10_000,
        ms(client.clock.time()),
    )  # fmt: skip
    await store.pause("poller:items")
    now = ms(client.clock.time())
    await client.redis.hset(keys.periodic_state, "tick", now - 1000)
    await client.redis.hset(keys.periodic_enqueued, "tick", now - 1000)
    await client.redis.zadd(keys.poll_shard("items", 0), {"a": now - 5000, "b": now + 60_000})
    for jid in ("j1", "j2"):
        await client.redis.zadd(keys.queue, {jid: now - 2000})
        await client.redis.set(K.ARQ_IN_PROGRESS + jid, "me/1")
    await store.finish("me", [Finish("done", "j1", "me/1"), Finish("failed", "j2", "me/1")],
                       now_ms=now)  # fmt: skip
    await client.redis.zadd(keys.queue, {"waiting": now - 3000})
    await _dead(client, "d1", b"x")

    data = await (await http.get("/api/overview", headers=AUTH)).json()
    assert data["redis_url"] == "redis://u:***@example:6379/0"
    cluster = data["cluster"]
    assert cluster["leader"]["held"] and cluster["leader"]["epoch"] == won.lock.epoch  # type: ignore[union-attr]
    (inst,) = cluster["instances"]
    assert (inst["name"], inst["in_flight"], inst["health"]) == ("leader-1", 2, {"consumer": "ok"})
    periodic = {p["name"]: p for p in cluster["periodic"]}
    assert periodic["tick"]["catch_up"] == "all" and not periodic["tick"]["paused"]
    assert periodic["tick"]["last_tick"] is not None
    (poller,) = cluster["pollers"]
    assert poller["paused"] and poller["waiting"] == 2 and poller["due"] == 1
    assert 4.0 <= poller["lag_s"] <= 10.0
    queue, lane = cluster["queues"]  # the queue, then its duty lane (ticks, poll jobs)
    assert lane["name"] == "web:queue:default:duty" and lane["depth"] == 0
    assert queue["depth"] == 1 and 2.0 <= queue["oldest_due_age_s"] <= 10.0
    assert (queue["done_last_hour"], queue["failed_last_hour"]) == (1, 1)
    assert len(queue["throughput"]) == 60 and queue["throughput"][-1][1:] == [1, 1]
    assert cluster["dead_letters"] == 1
    assert [(h["epoch"], h["reason"], h["instance"]) for h in data["history"]] == [
        (won.lock.epoch, "first", "leader-1")  # type: ignore[union-attr]
    ]
    assert data["doctor"]["failed"]  # a dead letter, a stale tick...: the banner says so
    assert any(b["text"].startswith("doctor:") for b in data["banners"])


async def test_a_periodic_job_that_never_ran_has_no_last_tick(
    http: TestClient[Any, Any], client: Client
) -> None:
    """A fresh cluster's first leader records each job's previous slot as planned and enqueues
    from the next one: that slot is no tick that ran (the console said "last enqueued tick 11h
    ago" for a daily job on a cluster a minute old). Ages come with the server's "now"."""
    from harness import FixedLease
    from worker.duties.periodic import PeriodicEnqueuer
    from worker.storage.store import FencedStore

    lock = (await client.store.acquire("tok", 10_000, instance="leader-1")).lock
    assert lock is not None
    fenced = FencedStore(client.store, FixedLease(str(lock)))
    serialize = get_serializer("msgpack")[0]
    enqueuer = PeriodicEnqueuer(
        list(ledger.periodics.values()), client.store, fenced, serialize, client.clock
    )
    await enqueuer.tick()  # a new leader on a fresh cluster: the slot before now is planned
    assert "tick" in await client.store.periodic_last()

    data = await (await http.get("/api/overview", headers=AUTH)).json()
    (tick,) = data["cluster"]["periodic"]
    assert (tick["last_tick"], tick["last_tick_ms"], tick["last_tick_age_s"]) == (None, None, None)
    server_ms = round(await client.store.server_time_ms())
    assert abs(data["now_ms"] - server_ms) < 2000  # the page computes ages against this
    assert data["now_ms"] < tick["next_tick_ms"] <= data["now_ms"] + 1000

    await client.clock.sleep(1.1)  # the next tick is due: now one is enqueued
    await enqueuer.tick()
    data = await (await http.get("/api/overview", headers=AUTH)).json()
    (tick,) = data["cluster"]["periodic"]
    assert tick["last_tick_ms"] is not None and 0 <= tick["last_tick_age_s"] < 2
    assert (await client.store.periodic_enqueued())["tick"] == tick["last_tick_ms"]


async def test_the_overview_draws_each_kind_s_table_the_outbox_relay_too(
    http: TestClient[Any, Any], client: Client
) -> None:
    """The page draws every duty kind's table from ``duties`` (the kinds' columns): the
    outbox relay's row with its rows waiting, oldest row, error and a Pause/Resume."""
    from worker.duties import kinds

    report = {"at_ms": ms(time.time()), "waiting": 7, "more": True, "oldest_age_s": 12.5,
              "error": "db gone", "interval_s": 1.0, "token": "t"}  # fmt: skip
    await client.store.outbox_report(report, 60_000, "outbox:relay")
    await client.store.pause("outbox:relay")
    data = await (await http.get("/api/overview", headers=AUTH)).json()
    tables = {t["kind"]: t for t in data["duties"]}
    assert list(tables) == [k.name for k in kinds.KINDS if k.columns]
    assert {"periodic", "poller", "initializer", "outbox"} <= set(tables)
    assert tables["periodic"]["triggerable"] and not tables["poller"]["triggerable"]
    relay = tables["outbox"]
    assert (relay["id"], relay["pausable"], relay["triggerable"]) == ("outbox", True, False)
    (row,) = relay["rows"]
    assert (row["name"], row["paused"]) == ("relay", True)
    cells = {h: c for h, c in zip(relay["headers"], row["cells"], strict=True)}
    assert cells["rows waiting"]["text"] == "7+" and cells["oldest row"]["text"] == "12s"
    assert cells["error"]["text"] == "db gone" and "bad" in cells["error"]["class"]
    assert cells["reported"]["text"].endswith(" ago")
    resumed = await http.post("/api/resume", json={"kind": "outbox", "name": "relay"}, headers=AUTH)
    assert (await resumed.json())["ok"] is True
    data = await (await http.get("/api/overview", headers=AUTH)).json()
    (relay,) = [t for t in data["duties"] if t["kind"] == "outbox"]
    assert relay["rows"][0]["paused"] is False
    (entry, *_) = data["audit"]
    assert (entry["action"], entry["target"], entry["via"]) == ("resume", "outbox:relay", "web")


async def test_no_leader_is_a_banner(http: TestClient[Any, Any]) -> None:
    data = await (await http.get("/api/overview", headers=AUTH)).json()
    assert data["banners"][0]["level"] == "error"
    assert "No leader holds the lock" in data["banners"][0]["text"]


async def test_dead_letters_page_by_page_and_payloads_as_text(
    http: TestClient[Any, Any], client: Client
) -> None:
    ser, _ = get_serializer("msgpack")
    for n in range(7):
        await _dead(client, f"d{n}", job_payload("send", (n,), {}, 0, ser), task="send", tries=3)
    hostile = job_payload("evil", (HOSTILE,), {}, 0, ser)
    await _dead(client, "hostile", hostile)  # no task recorded: read from the payload
    await _dead(client, "garbage", b"\xff\xfe" + HOSTILE.encode())
    page = await (await http.get("/api/dead?page=1&size=4", headers=AUTH)).json()
    assert (page["total"], page["pages"], page["page"]) == (9, 3, 1)
    assert [r["job_id"] for r in page["items"]][:2] == ["garbage", "hostile"]  # newest first
    assert all("payload_b64" not in r for r in page["items"])
    assert page["items"][1]["task"] == "evil" and page["items"][0]["task"] is None
    last = await (await http.get("/api/dead?page=99&size=4", headers=AUTH)).json()
    assert last["page"] == 3 and [r["job_id"] for r in last["items"]] == ["d0"]
    assert [r["tries"] for r in last["items"]] == [3]

    detail = await (await http.get("/api/dead/hostile", headers=AUTH)).json()
    assert detail["preview"]["format"] == "msgpack"
    assert HOSTILE in json.loads(detail["preview"]["text"])["a"]
    raw = await (await http.get("/api/dead/garbage", headers=AUTH)).json()
    assert raw["preview"]["format"] == "raw" and raw["preview"]["text"].startswith("\\xff\\xfe")
    assert (await http.get("/api/dead/nope", headers=AUTH)).status == 404


async def test_a_job_of_a_hash_tagged_prefix_opens(redis_url: str) -> None:
    """Every id of a Cluster or sharded app starts with ``{tag}:``: the page asks for it
    percent-encoded (``encodeURIComponent``) and the route takes it."""
    tagged = await Client.connect(redis_url, key_prefix="{webtag}:", app=ledger)
    http = await _http(tagged, token=TOKEN)
    try:
        jid = await tagged.enqueue("record", "braced", defer_by=600)
        assert jid is not None and jid.startswith("{webtag}:")
        ser, _ = get_serializer("msgpack")
        dead_id = "{webtag}:dead/1"
        await _dead(tagged, dead_id, job_payload("send", (1,), {}, 0, ser))
        for path, want in (("jobs", jid), ("dead", dead_id)):
            resp = await http.get(f"/api/{path}/{quote(want, safe='')}", headers=AUTH)
            assert resp.status == 200, (path, await resp.text())
            assert (await resp.json())["job_id"] == want
    finally:
        await http.close()
        await tagged.close()


async def test_a_pickled_payload_is_never_unpickled(client: Client) -> None:
    boom = base64.b64decode(  # pickle of os.system("echo pwned"): must stay bytes
        "gASVIwAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAtlY2hvIHB3bmVklIWUUpQu"
    )
    await _dead(client, "pickled", boom)
    http = await _http(client, token=TOKEN, serializer="pickle")
    try:
        detail = await (await http.get("/api/dead/pickled", headers=AUTH)).json()
        assert detail["preview"]["format"] == "raw" and detail["task"] is None
    finally:
        await http.close()


# -- actions ---------------------------------------------------------------------------------------


async def test_dead_letter_actions_requeue_and_purge(
    http: TestClient[Any, Any], client: Client
) -> None:
    for n in range(5):
        await _dead(client, f"d{n}", b"payload-%d" % n)
    out = await (await http.post("/api/dead/requeue", json={"ids": ["d1"]}, headers=AUTH)).json()
    assert out["ok"] and out["details"]["results"] == {"requeued": 1}
    assert await client.redis.zscore(client.keys.queue, "d1") is not None
    assert await client.redis.get(K.ARQ_JOB + "d1") == b"payload-1"
    again = await (await http.post("/api/dead/requeue", json={"ids": ["d1"]}, headers=AUTH)).json()
    assert not again["ok"] and again["details"]["not_requeued"] == {"d1": "missing"}
    out = await (
        await http.post("/api/dead/purge", json={"ids": ["d2", "d3"]}, headers=AUTH)
    ).json()
    assert out["ok"] and out["message"] == "purged 2 dead-lettered jobs"
    assert await client.store.dead_count() == 2
    out = await (await http.post("/api/dead/requeue", json={"all": True}, headers=AUTH)).json()
    assert out["details"]["results"] == {"requeued": 2} and await client.store.dead_count() == 0
    for n in range(3):
        await _dead(client, f"e{n}", b"p")
    out = await (await http.post("/api/dead/purge", json={"all": True}, headers=AUTH)).json()
    assert out["message"] == "purged 3 dead-lettered jobs" and await client.store.dead_count() == 0
    bad = await http.post("/api/dead/purge", json={"ids": []}, headers=AUTH)
    assert bad.status == 400
    audit = await client.store.audit_log(10)
    assert [a["action"] for a in audit] == ["purge", "requeue", "purge", "requeue", "requeue"]
    assert {(a["who"], a["via"]) for a in audit} == {("ada", "web")}
    assert all(a["remote"] and a["at_ms"] > 0 for a in audit)


async def test_trigger_pause_resume_and_their_refusals(
    http: TestClient[Any, Any], client: Client
) -> None:
    out = await (
        await http.post("/api/periodic/trigger", json={"name": "tick"}, headers=AUTH)
    ).json()
    assert out["ok"]
    job_id = out["details"]["job"]
    assert job_id.startswith(f"{PREFIX}periodic:tick:")
    assert await client.redis.zscore(client.keys.queue, job_id) is not None
    nope = await (await http.post("/api/periodic/trigger", json={"name": "x"}, headers=AUTH)).json()
    assert not nope["ok"] and nope["message"] == "no periodic job 'x'"
    for kind, name in (("periodic", "tick"), ("poller", "items")):
        body = {"kind": kind, "name": name}
        assert (await (await http.post("/api/pause", json=body, headers=AUTH)).json())["ok"]
        assert f"{kind}:{name}" in await client.store.paused()
        assert (await (await http.post("/api/resume", json=body, headers=AUTH)).json())["ok"]
        assert f"{kind}:{name}" not in await client.store.paused()
    unknown = {"kind": "poller", "name": "tick"}
    assert not (await (await http.post("/api/pause", json=unknown, headers=AUTH)).json())["ok"]
    assert (
        await http.post("/api/pause", json={"kind": "x", "name": "tick"}, headers=AUTH)
    ).status == 400


async def test_pause_and_resume_a_queue_and_every_queue(
    http: TestClient[Any, Any], client: Client
) -> None:
    for body, entry in (({"name": "default"}, "queue:default"), ({"all": True}, "queue:*")):
        body = {"kind": "queue", **body}
        out = await (await http.post("/api/pause", json=body, headers=AUTH)).json()
        assert out["ok"] and out["target"] == entry and out["details"] == {"changed": True}
        assert entry in await client.store.paused()
        overview = await (await http.get("/api/overview", headers=AUTH)).json()
        paused = {q["queue"]: q["paused"] for q in overview["cluster"]["queues"]}
        # a queue's pause leaves its duty lane flowing (ticks, poll jobs); --all pauses it too
        assert paused == {"default": True, "default:duty": entry == "queue:*"}
        assert (await (await http.post("/api/resume", json=body, headers=AUTH)).json())["ok"]
        assert entry not in await client.store.paused()
    audit = await client.store.audit_log(10)
    assert [(a["action"], a["target"]) for a in audit][:2] == [
        ("resume", "queue:*"),
        ("pause", "queue:*"),
    ]
    nameless = await http.post("/api/pause", json={"kind": "queue"}, headers=AUTH)
    assert nameless.status == 400


async def test_handoff_needs_a_leader_and_a_standby(
    http: TestClient[Any, Any], client: Client
) -> None:
    store = client.store
    none = await (await http.post("/api/leader/handoff", json={}, headers=AUTH)).json()
    assert not none["ok"] and none["message"] == "no leader holds the lease"
    won = await store.acquire("tok", 10_000, instance="a")
    alone = await (await http.post("/api/leader/handoff", json={}, headers=AUTH)).json()
    assert not alone["ok"] and "no live standby" in alone["message"]
    assert await client.redis.exists(client.keys.leader_handoff) == 0
    record = {"id": "b", "name": "b", "components": ["leader-election"], "is_leader": False}
    await store.heartbeat("b", record, 10_000, ms(client.clock.time()))
    out = await (await http.post("/api/leader/handoff", json={}, headers=AUTH)).json()
    assert out["ok"] and out["details"] == {"epoch": won.lock.epoch, "standbys": ["b"]}  # type: ignore[union-attr]
    assert await client.redis.get(client.keys.leader_handoff) == str(won.lock.epoch).encode()  # type: ignore[union-attr]


def test_a_preview_is_rendered_only_up_to_its_cut() -> None:
    """A payload nested 190 deep (~20 MB of indented JSON in full) previews in a few KB (one
    nested 500 deep is over the decode budget: shown as bytes); raw bytes say when they were
    cut, even when escaping makes them longer."""
    from worker.web.api import preview

    inner: Any = [7] * 30_000
    for depth in range(500):
        inner = [inner]
        if depth == 190:
            within = inner
    ser, _ = get_serializer("msgpack")
    shown = preview(job_payload("deep", (within,), {}, 0, ser), "msgpack", limit=1000)
    assert shown["format"] == "msgpack" and shown["truncated"] and len(shown["text"]) == 1000
    deep = preview(job_payload("deep", (inner,), {}, 0, ser), "msgpack", limit=1000)
    assert deep["format"] == "raw" and deep["truncated"] and len(deep["text"]) == 1000
    raw = preview(b"\xff" * 600, "msgpack", limit=1000)  # 2,400 characters escaped
    assert raw["format"] == "raw" and raw["truncated"] and len(raw["text"]) == 1000
    assert preview(b"\xff\xfe", "msgpack")["truncated"] is False


async def test_the_overview_reads_the_cluster_once_per_poll(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.web import api

    reads: list[str] = []
    instances, holds = client.store.instances, client.store.holds_sets

    async def counted_instances() -> Any:
        reads.append("instances")
        return await instances()

    async def counted_holds() -> Any:
        reads.append("holds")
        return await holds()

    monkeypatch.setattr(client.store, "instances", counted_instances)
    monkeypatch.setattr(client.store, "holds_sets", counted_holds)
    state = api.ConsoleState(client, ledger)
    first = await api.overview(state)  # the doctor is due: the snapshot carries its part
    second = await api.overview(state)  # within 5 s: the doctor's last verdict, no holds read
    assert reads == ["instances", "holds", "instances"]
    assert first["doctor"] == second["doctor"]
    assert set(second["cluster"]) >= {"instances", "leader", "queues", "periodic", "pollers"}
