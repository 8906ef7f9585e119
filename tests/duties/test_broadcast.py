"""Broadcasts: the script, the listener (catch-up, start, gaps, retries, loops), the API.

Listener tests run one :class:`BroadcastListener` per simulated process on fakeredis AND the
real server (``r``); real processes with a dropped connection are in
``tests/system/test_broadcast_processes.py``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from harness import eventually
from worker.app import App
from worker.client import Client
from worker.context import Context
from worker.core.clock import SystemClock
from worker.core.errors import ConfigError
from worker.core.metrics import Metrics
from worker.core.serializer import json_dumps, json_loads, msgpack_dumps, msgpack_loads
from worker.core.topics import publish
from worker.duties import broadcast as B
from worker.duties.broadcast import BroadcastListener
from worker.runtime import roles
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")


@pytest.fixture(autouse=True)
def short_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listeners notice ``stop`` within 0.1 s (one blocking read), so tests stop quickly."""
    monkeypatch.setattr(B, "BLOCK_MS", 100)


class FlakyStore(Store):
    """A store whose broadcast reads fail while ``down`` (a dropped connection)."""

    down = False
    failures = 0

    async def broadcast_read(self, cursors: Any, *, count: int, block_ms: int) -> Any:
        if self.down:
            self.failures += 1
            raise RedisConnectionError("connection dropped (test)")
        return await super().broadcast_read(cursors, count=count, block_ms=block_ms)


class ListenerProc:
    """One simulated process: its context (client origin = its instance id) and listener."""

    def __init__(self, r: Any, app: App, instance: str, *, metrics: Metrics | None = None) -> None:
        clock = SystemClock()
        client = Client(r, keys=KEYS, serialize=msgpack_dumps, origin=instance)
        self.ctx = Context(
            settings=Settings.model_construct(key_prefix=client.keys.prefix),
            redis=r,
            client=client,
            clock=clock,
            instance_id=instance,
        )
        self.store = FlakyStore(r, KEYS)
        self.listener = BroadcastListener(
            app.broadcasts, self.ctx, self.store, msgpack_loads, clock, metrics=metrics
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.listener.run(self._stop))
        topics = len(self.listener.topic_of)
        await eventually(lambda: len(self.listener.cursors) == topics, "listener synced")

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, 5)


def recording_app(*topics: str, **opts: Any) -> tuple[App, list[tuple[str, str, Any]]]:
    """An app whose handler of each topic records ``(instance, topic, data)``."""
    app = App("t")
    seen: list[tuple[str, str, Any]] = []
    for topic in topics:

        async def handler(ctx: Context, data: Any, topic: str = topic) -> None:
            seen.append((ctx.instance_id, topic, data))

        app.on_broadcast(topic, **opts)(handler)
    return app, seen


def count(metrics: Metrics, topic: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "worker_broadcasts_total", {"topic": topic, "outcome": outcome}
    )
    return value or 0.0


# ---------------------------------------------------------------------------------------------
# The script and the store
# ---------------------------------------------------------------------------------------------


async def test_script_numbers_messages_and_caps_the_history(r: Any) -> None:
    store = Store(r, KEYS)
    seqs = [
        (await store.broadcast("pricing", b"p%d" % i, origin="i-1", chain=(), history=3))[1]
        for i in range(5)
    ]
    assert seqs == [1, 2, 3, 4, 5]
    assert await r.xlen(KEYS.broadcast("pricing")) == 3
    entries = await store.broadcast_read({KEYS.broadcast("pricing"): "0-0"}, count=10, block_ms=1)
    assert [(e.seq, e.payload, e.origin, e.chain) for e in entries] == [
        (3, b"p2", "i-1", ()),
        (4, b"p3", "i-1", ()),
        (5, b"p4", "i-1", ()),
    ]
    newest = await store.broadcast_newest([KEYS.broadcast("pricing"), KEYS.broadcast("none")])
    last = newest[KEYS.broadcast("pricing")]
    assert last is not None and last.seq == 5 and last.entry_id == entries[-1].entry_id
    assert newest[KEYS.broadcast("none")] is None
    # the newest entry survives any cap, so numbering goes on after trimming
    _, seq = await store.broadcast("pricing", b"x", origin="i-2", chain=("a", "b"), history=1)
    assert seq == 6 and await r.xlen(KEYS.broadcast("pricing")) == 1
    (only,) = await store.broadcast_read(
        {KEYS.broadcast("pricing"): entries[-1].entry_id}, count=10, block_ms=1
    )
    assert only.chain == ("a", "b") and only.origin == "i-2"


async def test_read_blocks_until_a_message_arrives(r: Any) -> None:
    store = Store(r, KEYS)
    key = KEYS.broadcast("t")
    reader = asyncio.create_task(store.broadcast_read({key: "0-0"}, count=10, block_ms=3000))
    await asyncio.sleep(0.2)
    assert not reader.done()
    await store.broadcast("t", b"hello", origin="o", chain=(), history=10)
    (entry,) = await asyncio.wait_for(reader, 2)
    assert entry.payload == b"hello"


# ---------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------


async def test_every_process_handles_each_message_once_in_order(r: Any) -> None:
    app, seen = recording_app("pricing", "config")
    procs = [ListenerProc(r, app, f"i-{n}") for n in range(3)]
    for p in procs:
        await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    assert web.origin.startswith("client-")
    assert await web.broadcast("pricing", {"v": 1}) == 1
    assert await web.broadcast("pricing", {"v": 2}) == 2
    # a process's own broadcast reaches its own handlers too (it is a replica like the others)
    assert await procs[0].ctx.broadcast("config", ["a", 1]) == 1
    expected = {
        (f"i-{n}", topic, repr(data))
        for n in range(3)
        for topic, data in [("pricing", {"v": 1}), ("pricing", {"v": 2}), ("config", ["a", 1])]
    }
    await eventually(lambda: len(seen) >= 9, "9 handler runs")
    await asyncio.sleep(0.3)  # nothing more arrives
    for p in procs:
        await p.stop()
    assert len(seen) == 9 and {(i, t, repr(d)) for i, t, d in seen} == expected
    for n in range(3):
        mine = [d for i, t, d in seen if i == f"i-{n}" and t == "pricing"]
        assert mine == [{"v": 1}, {"v": 2}]
    entries = await Store(r, KEYS).broadcast_read(
        {KEYS.broadcast("config"): "0-0"}, count=5, block_ms=1
    )
    assert entries[0].origin == "i-0"


async def test_a_starting_process_gets_the_newest_message_only(r: Any) -> None:
    app = App("t")
    latest: list[Any] = []
    none: list[Any] = []

    @app.on_broadcast("pricing")
    async def on_latest(ctx: Context, data: Any) -> None:
        latest.append(data)

    @app.on_broadcast("pricing", on_start="none")
    async def on_none(ctx: Context, data: Any) -> None:
        none.append(data)

    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    for v in (1, 2, 3):
        await web.broadcast("pricing", v)
    p = ListenerProc(r, app, "i-1")
    await p.start()
    await eventually(lambda: latest == [3], "the newest message")
    await web.broadcast("pricing", 4)
    await eventually(lambda: latest == [3, 4] and none == [4], "the next message")
    await p.stop()


async def test_a_reconnecting_process_catches_up_on_what_it_missed(r: Any) -> None:
    app, seen = recording_app("pricing")
    metrics = Metrics(CollectorRegistry())
    p = ListenerProc(r, app, "i-1", metrics=metrics)
    await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    await web.broadcast("pricing", 1)
    await eventually(lambda: len(seen) == 1, "the first message")
    p.store.down = True  # the connection drops; messages are sent meanwhile
    await eventually(lambda: p.store.failures >= 2, "the listener noticing")
    await web.broadcast("pricing", 2)
    await web.broadcast("pricing", 3)
    await asyncio.sleep(0.2)
    assert len(seen) == 1
    p.store.down = False
    await eventually(lambda: len(seen) == 3, "the catch-up")
    await asyncio.sleep(0.3)
    await p.stop()
    assert [d for _, _, d in seen] == [1, 2, 3]
    assert count(metrics, "pricing", "received") == 3
    assert count(metrics, "pricing", "handled") == 3
    assert count(metrics, "pricing", "missed") == 0
    # a restarted component (same process) also resumes from its cursor
    await web.broadcast("pricing", 4)
    await p.start()
    await eventually(lambda: len(seen) == 4, "the message sent while stopped")
    await p.stop()
    assert [d for _, _, d in seen] == [1, 2, 3, 4]


async def test_messages_trimmed_while_away_are_counted_and_the_latest_handled(r: Any) -> None:
    app, seen = recording_app("pricing")
    metrics = Metrics(CollectorRegistry())
    p = ListenerProc(r, app, "i-1", metrics=metrics)
    await p.start()
    store = Store(r, KEYS)
    await publish(store, msgpack_dumps, "pricing", 1, origin="web", history=2)
    await eventually(lambda: len(seen) == 1, "the first message")
    await p.stop()
    for v in range(2, 7):  # 5 messages, only 2 kept
        await publish(store, msgpack_dumps, "pricing", v, origin="web", history=2)
    await p.start()
    await eventually(lambda: len(seen) == 3, "the kept messages")
    await p.stop()
    assert [d for _, _, d in seen] == [1, 5, 6]
    assert count(metrics, "pricing", "missed") == 3


async def test_a_topic_that_began_again_is_read_from_its_start(r: Any) -> None:
    app, seen = recording_app("pricing")
    p = ListenerProc(r, app, "i-1")
    await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    await web.broadcast("pricing", "before")
    await eventually(lambda: len(seen) == 1, "the first message")
    await p.stop()
    # Redis lost the stream; the new one's ids lie before the cursor (another server's clock)
    key = KEYS.broadcast("pricing")
    await r.delete(key)
    for n, v in ((1, "after-1"), (2, "after-2")):
        payload = msgpack_dumps({"data": v})
        await r.xadd(key, {"seq": n, "origin": "web", "chain": "", "data": payload}, id=f"5-{n}")
    await p.start()
    await eventually(lambda: len(seen) == 3, "the new stream")
    await p.stop()
    assert [d for _, _, d in seen] == ["before", "after-1", "after-2"]


async def test_a_topic_that_lost_its_newest_messages_is_read_on_not_again(r: Any) -> None:
    """A failover to a replica that missed the newest entries: the stream is the one this
    process read, shorter. What it kept was handled already (not again); new messages are."""
    app, seen = recording_app("pricing")
    p = ListenerProc(r, app, "i-1")
    await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    for v in ("m1", "m2", "m3"):
        await web.broadcast("pricing", v)
    await eventually(lambda: len(seen) == 3, "three messages")
    await p.stop()
    key = KEYS.broadcast("pricing")
    newest = (await r.xrevrange(key, "+", "-", count=1))[0][0]
    await r.xdel(key, newest)  # the replica never got m3
    before = p.listener.cursors[key]
    await p.start()
    await eventually(lambda: p.listener.cursors[key] != before, "the cursor placed again")
    await web.broadcast("pricing", "m4")  # numbered 3 again on the new primary
    await eventually(lambda: len(seen) == 4, "the new message")
    await asyncio.sleep(0.2)
    await p.stop()
    assert [d for _, _, d in seen] == ["m1", "m2", "m3", "m4"]


async def test_json_serializer(r: Any) -> None:
    app, seen = recording_app("pricing")
    clock = SystemClock()
    client = Client(r, keys=KEYS, serialize=json_dumps, origin="i-1")
    ctx = Context(Settings.model_construct(key_prefix=client.keys.prefix), r, client, clock, "i-1")
    listener = BroadcastListener(app.broadcasts, ctx, Store(r, KEYS), json_loads, clock)
    stop = asyncio.Event()
    task = asyncio.create_task(listener.run(stop))
    await eventually(lambda: listener.cursors, "synced")
    await ctx.broadcast("pricing", {"a": [1, 2]})
    await eventually(lambda: seen == [("i-1", "pricing", {"a": [1, 2]})], "the message")
    stop.set()
    await task


# ---------------------------------------------------------------------------------------------
# Failing handlers
# ---------------------------------------------------------------------------------------------


async def test_a_failing_handler_is_retried_and_blocks_nobody(
    r: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(B, "RETRY_BASE_S", 0.3)
    app = App("t")
    runs: dict[str, list[Any]] = {"flaky": [], "broken": [], "steady": [], "other": []}
    done: dict[str, float] = {}

    @app.on_broadcast("pricing")
    async def flaky(ctx: Context, data: Any) -> None:
        runs["flaky"].append(data)
        if len(runs["flaky"]) < 3:
            raise RuntimeError("not yet")
        done["flaky"] = time.monotonic()

    @app.on_broadcast("pricing", tries=3)
    async def broken(ctx: Context, data: Any) -> None:
        runs["broken"].append(data)
        raise RuntimeError("always")

    @app.on_broadcast("pricing")
    async def steady(ctx: Context, data: Any) -> None:
        runs["steady"].append(data)
        done.setdefault("steady", time.monotonic())

    @app.on_broadcast("other")
    async def other(ctx: Context, data: Any) -> None:
        runs["other"].append(data)
        done.setdefault("other", time.monotonic())

    metrics = Metrics(CollectorRegistry())
    p = ListenerProc(r, app, "i-1", metrics=metrics)
    await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    sent = time.monotonic()
    await web.broadcast("pricing", 1)
    await web.broadcast("pricing", 2)
    await web.broadcast("other", "x")
    # the healthy handlers are done long before the first retry (0.3 s)
    await eventually(lambda: runs["steady"] == [1, 2] and runs["other"] == ["x"], "steady")
    assert max(done["steady"], done["other"]) - sent < 0.25
    # flaky: 2 failures then success on message 1, then message 2 at once
    await eventually(lambda: runs["flaky"] == [1, 1, 1, 2], "flaky", within=5)
    # broken: 3 runs per message, then given up; message 2 after message 1's give-up
    await eventually(lambda: runs["broken"] == [1, 1, 1, 2, 2, 2], "broken", within=10)
    await eventually(lambda: count(metrics, "pricing", "failed") == 2, "failed counted")
    await p.stop()
    assert count(metrics, "pricing", "received") == 2
    assert count(metrics, "pricing", "handled") == 2 + 2  # flaky and steady, two messages each
    assert count(metrics, "pricing", "retried") == 2 + 4  # flaky twice, broken 2 × 2
    assert count(metrics, "other", "handled") == 1


async def test_an_undecodable_message_fails_without_retries(r: Any) -> None:
    app, seen = recording_app("pricing")
    metrics = Metrics(CollectorRegistry())
    p = ListenerProc(r, app, "i-1", metrics=metrics)
    await p.start()
    await Store(r, KEYS).broadcast("pricing", b"\xc1garbage", origin="x", chain=(), history=5)
    await Client(r, keys=KEYS, serialize=msgpack_dumps).broadcast("pricing", "fine")
    await eventually(lambda: [d for _, _, d in seen] == ["fine"], "the good message")
    await p.stop()
    assert count(metrics, "pricing", "failed") == 1


# ---------------------------------------------------------------------------------------------
# Loops
# ---------------------------------------------------------------------------------------------


async def test_a_handler_cannot_trigger_its_own_topic_again(r: Any) -> None:
    app = App("t")
    sent: dict[str, list[int | None]] = {"echo": [], "a->b": [], "b->a": [], "b->c": []}
    handled: list[str] = []

    @app.on_broadcast("echo")
    async def echo(ctx: Context, data: Any) -> None:
        handled.append("echo")
        sent["echo"].append(await ctx.broadcast("echo", data))

    @app.on_broadcast("a")
    async def on_a(ctx: Context, data: Any) -> None:
        handled.append("a")
        sent["a->b"].append(await ctx.broadcast("b", data))

    @app.on_broadcast("b")
    async def on_b(ctx: Context, data: Any) -> None:
        handled.append("b")
        sent["b->a"].append(await ctx.broadcast("a", data))  # a loop through two topics
        sent["b->c"].append(await ctx.broadcast("c", data))  # a cascade: fine

    procs = [ListenerProc(r, app, "i-1"), ListenerProc(r, app, "i-2")]
    for p in procs:
        await p.start()
    web = Client(r, keys=KEYS, serialize=msgpack_dumps)
    await web.broadcast("echo", 1)
    await web.broadcast("a", 1)
    # each process: echo once; a once; b twice (one b from each process's a handler)
    await eventually(lambda: len(handled) == 2 * (1 + 1 + 2), "the cascade")
    await asyncio.sleep(0.5)
    for p in procs:
        await p.stop()
    assert sorted(handled) == ["a"] * 2 + ["b"] * 4 + ["echo"] * 2
    assert sent["echo"] == [None, None] and sent["b->a"] == [None] * 4
    assert sorted(s or 0 for s in sent["a->b"]) == [1, 2]
    assert sorted(s or 0 for s in sent["b->c"]) == [1, 2, 3, 4]
    store = Store(r, KEYS)
    assert await r.xlen(KEYS.broadcast("echo")) == 1 and await r.xlen(KEYS.broadcast("a")) == 1
    cs = await store.broadcast_read({KEYS.broadcast("c"): "0-0"}, count=10, block_ms=1)
    assert {e.chain for e in cs} == {("a", "b")}
    assert {e.origin for e in cs} == {"i-1", "i-2"}


# ---------------------------------------------------------------------------------------------
# Declaring handlers
# ---------------------------------------------------------------------------------------------


def test_on_broadcast_checks_its_arguments() -> None:
    app = App("t")

    async def fn(ctx: Context, data: Any) -> None: ...

    def sync_fn(ctx: Context, data: Any) -> None: ...

    with pytest.raises(ConfigError, match="topic"):
        app.on_broadcast("a,b")
    with pytest.raises(ConfigError, match="on_start"):
        app.on_broadcast("t", on_start="all")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tries"):
        app.on_broadcast("t", tries=0)
    with pytest.raises(ConfigError, match="async"):
        app.on_broadcast("t")(sync_fn)
    app.on_broadcast("t")(fn)
    app.on_broadcast("t", on_start="none", tries=2)(fn)  # several handlers per topic
    assert [(h.topic, h.on_start, h.tries) for h in app.broadcasts] == [
        ("t", "latest", 5),
        ("t", "none", 2),
    ]


async def test_client_checks_the_topic(r: Any) -> None:
    client = Client(r, keys=KEYS, serialize=msgpack_dumps)
    for bad in ("", "a,b", "a*", "1x"):
        with pytest.raises(ValueError, match="topic"):
            await client.broadcast(bad, 1)


def test_the_broadcast_component_runs_in_every_role_when_handlers_exist() -> None:
    settings = Settings.model_construct()
    app = App("t")
    for role in ("all", "leader", "consumer"):
        plan = roles.plan(role, app, settings)
        assert "broadcast" not in plan.enabled + plan.disabled

    @app.on_broadcast("t")
    async def fn(ctx: Context, data: Any) -> None: ...

    for role in ("all", "leader", "consumer"):
        assert "broadcast" in roles.plan(role, app, settings).enabled


async def test_a_stream_entry_without_a_numeric_seq_is_numbered_past(r: Any) -> None:
    """BROADCAST on a topic whose newest entries are not its own (``seq`` not a whole number):
    the next message is numbered after the newest valid one (numbers never repeat)."""
    store = Store(r, KEYS)
    stream = KEYS.broadcast("pricing")
    assert (await store.broadcast("pricing", b"a", origin="o", chain=(), history=100))[1] == 1
    for bad in ("x", "2.5", "-3"):
        await r.xadd(stream, {"seq": bad, "origin": "?", "chain": "", "data": b"?"})
    assert (await store.broadcast("pricing", b"b", origin="o", chain=(), history=100))[1] == 2
    entries = await store.broadcast_read({stream: "0-0"}, count=100, block_ms=10)
    assert [e.seq for e in entries] == [1, None, None, None, 2]
