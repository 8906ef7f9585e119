"""Heartbeat (instance records, data-loss detection), the orphan reaper, dead letters, the
health endpoints and the role wiring, each on its own (fakeredis and the real server)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import make_mocked_request

from harness import FixedLease
from worker.app import App
from worker.consumer.dead import DeadLetters
from worker.core.clock import FakeClock, RedisClock, ms
from worker.core.component import Health
from worker.core.errors import LeadershipLost
from worker.core.metrics import Metrics
from worker.duties.reaper import OrphanReaper
from worker.duties.registry import CLOCK_SYNC_S, RECORD_EVERY_S, Heartbeat, WriteWitness
from worker.runtime.health import HealthServer
from worker.runtime.roles import SPECS, plan
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("t:")


def new_reaper(r: Any, lease: FixedLease, clock: FakeClock, **kw: Any) -> OrphanReaper:
    """An orphan reaper over ``r``: the store it reads and the fenced store it writes."""
    store = Store(r, KEYS)
    return OrphanReaper(store, FencedStore(store, lease), clock, **kw)


NOW_S = 1_700_000_000.0


class View:
    """A ProcessView with fixed answers."""

    def __init__(self, components: dict[str, dict[str, Any]] | None = None) -> None:
        self.ready = True
        self.shutting_down = False
        self.components = components or {}
        self.unready: list[str] = []
        self.warned: list[str] = []

    def describe(self) -> dict[str, Any]:
        return {"components": ["consumer"], "is_leader": False, "in_flight": 2, "ready": self.ready}

    def identity(self) -> dict[str, Any]:
        return {"instance_id": "i-1", "role": "consumer"}

    def component_health(self) -> dict[str, dict[str, Any]]:
        return self.components

    def unready_reasons(self) -> list[str]:
        return self.unready

    def warnings(self) -> list[str]:
        return self.warned


def heartbeat(r: Any, clock: FakeClock, instance: str = "i-1") -> Heartbeat:
    return Heartbeat(
        Store(r, KEYS), View(), clock, instance_id=instance, instance_name="n", role="consumer",
        interval_s=2, metrics=Metrics(),
    )  # fmt: skip


# -- heartbeat ------------------------------------------------------------------------------------


async def test_heartbeat_writes_an_expiring_record_and_deregisters(r: Any) -> None:
    hb = heartbeat(r, FakeClock(NOW_S))
    assert await hb.tick() == 2
    rec = json.loads(await r.get(KEYS.instance("i-1")))
    assert rec["id"] == "i-1" and rec["role"] == "consumer" and rec["in_flight"] == 2
    assert rec["heartbeat_ms"] == NOW_S * 1000
    assert 0 < await r.pttl(KEYS.instance("i-1")) <= ms(hb.record_every_s * 2.5)  # 2.5 records
    # the score is the server's clock, not this host's (years off here)
    server_ms = await Store(r, KEYS).server_time_ms()
    assert abs(await r.zscore(KEYS.instances, "i-1") - server_ms) < 5_000
    assert hb.witness.since(hb.clock.monotonic()) is not None
    await hb.deregister()
    assert await r.exists(KEYS.instance("i-1")) == 0
    assert await r.zscore(KEYS.instances, "i-1") is None


async def test_heartbeat_notices_redis_losing_its_data_once_per_loss(r: Any) -> None:
    clock = FakeClock(NOW_S)
    a, b = heartbeat(r, clock, "a"), heartbeat(r, clock, "b")
    await a.tick()
    await b.tick()
    assert a.data_losses == b.data_losses == 0
    await r.flushall()  # a restart without persistence
    await a.tick()  # a notices and writes a new marker...
    await b.tick()  # ...b notices too: the marker it saw is gone
    assert a.data_losses == b.data_losses == 1
    await a.tick()
    assert a.data_losses == 1  # once per loss
    assert a.health.extra["data_losses"] == 1
    assert a.metrics is not None and a.metrics.data_loss._value.get() == 1


async def test_a_steady_heartbeat_is_one_script_of_four_commands(redis_url: str) -> None:
    """The idle cost: the boot marker is read on the first beat and after
    the record and the score were both gone (a data loss looks like that), not on every beat."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        hb = heartbeat(r, FakeClock(NOW_S))
        await hb.tick()
        before = await r.info("commandstats")
        for _ in range(3):
            await hb.tick()
        after = await r.info("commandstats")
        calls = {
            k.removeprefix("cmdstat_"): v["calls"] - before.get(k, {"calls": 0})["calls"]
            for k, v in after.items()
        }
        calls = {k: v for k, v in calls.items() if v and k != "info"}
        assert calls == {"evalsha": 3, "time": 3, "set": 3, "zadd": 3}, calls
        assert hb.marker is not None and hb.data_losses == 0
    finally:
        await r.aclose()


async def test_the_heartbeat_score_is_the_server_clock_where_the_write_lands(
    redis_url: str,
) -> None:
    """Every beat's score is the server's ``TIME`` read in the script that writes it, never a
    time the process dated before sending (a starved process, a connection being made: the
    score would be as old as that wait, tests/system/test_heartbeat_lag.py). The process's copy
    of the
    server's clock gets a new sample from each whole record (its reply carries that TIME)."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        host = FakeClock(NOW_S)
        clock = RedisClock(host)
        hb = heartbeat(r, host)
        hb.server_clock = clock
        await hb.tick()  # the first beat reads TIME: the offset, and the clock's sample
        assert hb.clock_offset is not None and clock.synced
        before = await r.info("commandstats")
        host.advance(RECORD_EVERY_S)  # the record is due again: the whole beat
        await hb.tick()
        after = await r.info("commandstats")
        calls = {
            k.removeprefix("cmdstat_"): v["calls"] - before.get(k, {"calls": 0})["calls"]
            for k, v in after.items()
        }
        assert {k: v for k, v in calls.items() if v and k != "info"} == {
            "evalsha": 1, "time": 1, "set": 1, "zadd": 1
        }  # fmt: skip
        score = await r.zscore(KEYS.instances, "i-1")
        assert abs(score - await server_ms(r)) < 50  # the server's clock at the write
        assert abs(ms(clock.time()) - ms(NOW_S + RECORD_EVERY_S)) > 1000  # not the copy's
        host.advance(CLOCK_SYNC_S)
        before = await r.info("commandstats")
        await hb.tick()
        after = await r.info("commandstats")
        assert after["cmdstat_time"]["calls"] == before["cmdstat_time"]["calls"] + 1
    finally:
        await r.aclose()


async def test_between_records_a_beat_moves_the_score_only_and_a_lost_score_brings_the_record(
    redis_url: str,
) -> None:
    """The idle cost without a longer orphan bound: beats between two writes
    of the record are one ``TOUCH`` each (``ZADD XX`` at the server's ``TIME``, one round
    trip); a beat that finds the score gone (the reaper took
    it, or Redis lost its data) writes the whole record at once, and the data loss is seen."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        host = FakeClock(NOW_S)
        clock = RedisClock(host)
        hb = heartbeat(r, host)
        hb.server_clock = clock
        await hb.tick()  # the first beat: the whole record, TIME read (the host's offset)
        host.advance(4)
        await hb.tick()  # the second: the whole record again, now with that offset in it
        assert json.loads(await r.get(KEYS.instance("i-1")))["clock_offset_ms"] is not None
        record_ttl = await r.pttl(KEYS.instance("i-1"))
        host.advance(hb.record_every_s / 5)
        await hb.tick()  # the first TOUCH loads its script
        before = await r.info("commandstats")
        for _ in range(3):
            host.advance(hb.record_every_s / 5)
            await hb.tick()
        after = await r.info("commandstats")
        calls = {
            k.removeprefix("cmdstat_"): v["calls"] - before.get(k, {"calls": 0})["calls"]
            for k, v in after.items()
        }
        # a ZSCORE only where two beats fell in one millisecond (ZADD CH counted no change)
        assert {k: v for k, v in calls.items() if v and k not in ("info", "zscore")} == {
            "evalsha": 3, "time": 3, "zadd": 3
        }, calls  # fmt: skip
        score = await r.zscore(KEYS.instances, "i-1")
        assert abs(score - await server_ms(r)) < 50  # the score moved with each beat
        assert hb.record_every_s == min(RECORD_EVERY_S, 5 * 2)  # 5 beats of 2 s
        assert record_ttl > ms(hb.record_every_s * 2)  # the record outlives two record periods
        hb.process.ready = False  # type: ignore[attr-defined]  # what the record says changed:
        host.advance(4)
        await hb.tick()  # ...the whole record at the next beat
        assert json.loads(await r.get(KEYS.instance("i-1")))["ready"] is False
        await r.zrem(KEYS.instances, "i-1")  # reaped while alive
        host.advance(4)
        await hb.tick()
        assert await r.zscore(KEYS.instances, "i-1") is not None
        assert json.loads(await r.get(KEYS.instance("i-1")))["id"] == "i-1"
        await r.flushall()  # a restart without persistence: score, record and marker gone
        host.advance(4)
        await hb.tick()
        assert hb.data_losses == 1
        assert await r.get(KEYS.instance("i-1")) is not None
    finally:
        await r.aclose()


async def test_a_touch_in_the_same_millisecond_still_finds_the_instance(redis_url: str) -> None:
    """``ZADD XX CH`` counts no change when the score is already this millisecond's: two beats
    in one ms must not read as "not registered" (a whole record for nothing; a merged test saw
    its command counts off by it)."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        store = Store(r, KEYS)
        await r.zadd(KEYS.instances, {"i-1": 0})
        touched = [await store.touch_heartbeat("i-1") for _ in range(200)]
        assert all(touched), touched.count(False)
        await r.zrem(KEYS.instances, "i-1")
        assert await store.touch_heartbeat("i-1") is False
        assert await r.zscore(KEYS.instances, "i-1") is None  # XX: never added
    finally:
        await r.aclose()


# -- orphan reaper --------------------------------------------------------------------------------


async def server_ms(r: Any) -> int:
    return round(await Store(r, KEYS).server_time_ms())


async def test_reaper_releases_only_stale_instances_claims(r: Any) -> None:
    """Judged on the server's clock: this host's (FakeClock, years behind) does not matter."""
    clock = FakeClock(NOW_S)
    now_ms = await server_ms(r)
    await r.set(KEYS.leader, "5:me")
    await r.zadd(KEYS.instances, {"dead": now_ms - 20_000, "alive": now_ms - 1_000})
    await r.zadd(KEYS.queue, {"j-dead": now_ms + 300_000, "j-alive": now_ms + 300_000})
    await r.sadd(KEYS.holds("dead"), "j-dead")
    await r.sadd(KEYS.holds("alive"), "j-alive")
    await r.set(K.ARQ_IN_PROGRESS + "j-dead", "dead/3")
    await r.set(K.ARQ_IN_PROGRESS + "j-alive", "alive/1")
    metrics = Metrics()
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=10, interval_s=2,
        metrics=metrics, settle_s=0,
    )  # fmt: skip
    assert await reaper.tick() == 2
    assert await r.exists(K.ARQ_IN_PROGRESS + "j-dead") == 0
    assert abs(await r.zscore(KEYS.queue, "j-dead") - now_ms) < 5_000  # due now
    assert await r.get(K.ARQ_IN_PROGRESS + "j-alive") == b"alive/1"
    assert await r.zrange(KEYS.instances, 0, -1) == [b"alive"]
    assert metrics.orphans._value.get() == 1


async def test_reaper_judges_silence_only_while_redis_was_reachable(r: Any) -> None:
    """After a (re)start, or a gap in its own ticks (frozen, or hung through a failover), the
    reaper reaps nobody until Redis has been reachable for stale_s: an outage silences every
    heartbeat at once, and live consumers' claims must not be handed out meanwhile."""
    clock = FakeClock(NOW_S)
    now_ms = await server_ms(r)
    await r.set(KEYS.leader, "5:me")
    await r.zadd(KEYS.instances, {"gone": now_ms - 60_000, "cut-off": now_ms - 20_000})
    await r.zadd(KEYS.queue, {"j": now_ms + 300_000})
    await r.sadd(KEYS.holds("cut-off"), "j")
    await r.set(K.ARQ_IN_PROGRESS + "j", "cut-off/1")
    reaper = new_reaper(r, FixedLease("5:me"), clock, stale_s=10, interval_s=2)
    await reaper.setup()
    for _ in range(4):  # 8 s: not settled yet
        await reaper.tick()
        assert await r.zcard(KEYS.instances) == 2
        clock.advance(2)
        await r.zadd(KEYS.instances, {"cut-off": await server_ms(r)})  # it is back
    clock.advance(2)
    await reaper.tick()  # settled: only the instance that stayed silent is reaped
    assert await r.zrange(KEYS.instances, 0, -1) == [b"cut-off"]
    assert await r.get(K.ARQ_IN_PROGRESS + "j") == b"cut-off/1"
    # a gap in the reaper's own ticks (a hung call, a freeze) starts the wait again
    await r.zadd(KEYS.instances, {"gone-2": await server_ms(r) - 60_000})
    clock.advance(6)
    await reaper.tick()
    assert b"gone-2" in await r.zrange(KEYS.instances, 0, -1)


async def test_reaper_reaps_nobody_while_its_own_heartbeat_is_refused(r: Any) -> None:
    """Redis at maxmemory refuses every heartbeat, this process's own too, but not the reaper's
    script: while the witness has no unbroken run of accepted writes as long as the settle
    time, silence proves nothing."""
    clock = FakeClock(NOW_S)
    await r.set(KEYS.leader, "5:me")
    await r.zadd(KEYS.instances, {"silent": await server_ms(r) - 60_000})
    witness = WriteWitness(max_gap_s=5)
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=10, interval_s=2,
        settle_s=0, witness=witness,
    )  # fmt: skip
    await reaper.tick()  # nothing written yet
    witness.ok(clock.monotonic())
    witness.failed()  # the heartbeat was refused
    await reaper.tick()
    assert await r.zrange(KEYS.instances, 0, -1) == [b"silent"]
    witness.ok(clock.monotonic())
    clock.advance(6)  # no accepted write for longer than max_gap_s: a hung heartbeat
    await reaper.tick()
    assert await r.zrange(KEYS.instances, 0, -1) == [b"silent"]
    witness.ok(clock.monotonic())  # writes accepted again: silence is evidence again
    await reaper.tick()
    assert await r.zrange(KEYS.instances, 0, -1) == []


async def test_reaper_gives_a_silent_peer_its_own_recent_stall(r: Any) -> None:
    """On a starved box (the CI's two cores under four test workers) the leader's loop and a
    consumer's heartbeat are held up together: a consumer silent a little past the bound right
    after the reaper itself came 1.5 s late is spared; once the reaper's stall is two bounds
    old, the same silence is judged. Before the slack, the consumer's jobs ran twice."""
    clock = FakeClock(NOW_S)
    await r.set(KEYS.leader, "5:me")
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=10, interval_s=2, settle_s=0,
    )  # fmt: skip
    await reaper.tick()
    clock.advance(2 + 1.5)  # the reaper's own tick comes 1.5 s late (below the freeze bound)
    await r.zadd(KEYS.instances, {"starved": await server_ms(r) - 11_000})
    await r.sadd(KEYS.holds("starved"), "j")
    await r.set(K.ARQ_IN_PROGRESS + "j", "starved/1")
    await r.zadd(KEYS.queue, {"j": await server_ms(r) + 300_000})
    await reaper.tick()
    assert reaper.slack_s(clock.monotonic()) == 1.5
    assert await r.zrange(KEYS.instances, 0, -1) == [b"starved"]  # 11 s < 10 + 1.5
    assert await r.get(K.ARQ_IN_PROGRESS + "j") == b"starved/1"
    await r.zadd(KEYS.instances, {"dead": await server_ms(r) - 12_000})
    await reaper.tick()  # silent past the bound and the stall: judged
    assert await r.zrange(KEYS.instances, 0, -1) == [b"starved"]
    for _ in range(11):  # 22 s of punctual ticks: the stall is forgotten
        clock.advance(2)
        await reaper.tick()
    assert reaper.slack_s(clock.monotonic()) == 0
    assert await r.zrange(KEYS.instances, 0, -1) == []
    assert await r.get(K.ARQ_IN_PROGRESS + "j") is None


async def test_a_just_elected_reaper_gives_peers_the_stall_its_heartbeat_shows(r: Any) -> None:
    """A standby elected right after its process thawed from a 2.7 s freeze has no look of its
    own to judge its stall by: the heartbeat's witness has (the beat overdue now, and late beats
    before this leadership). A consumer frozen with it, silent 5.1 s against a 5 s bound, is
    spared; one silent past the bound and the stall is reaped. Before, a freshly elected leader
    reaped the consumer the instant its own loop ran again."""
    clock = FakeClock(NOW_S)
    await r.set(KEYS.leader, "5:me")
    witness = WriteWitness(max_gap_s=5, interval_s=0.5)
    witness.ok(clock.monotonic())
    clock.advance(0.5)
    witness.ok(clock.monotonic())
    clock.advance(2.7)  # frozen: no beat since; the reaper's first look comes now
    now_ms = await server_ms(r)
    await r.zadd(KEYS.instances, {"frozen-too": now_ms - 5_100, "dead": now_ms - 8_000})
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=5, interval_s=0.5, settle_s=0, witness=witness,
    )  # fmt: skip
    await reaper.setup()
    await reaper.tick()
    assert reaper.slack_s(clock.monotonic()) == pytest.approx(2.2)
    assert await r.zrange(KEYS.instances, 0, -1) == [b"frozen-too"]
    clock.advance(0.1)
    witness.ok(clock.monotonic())  # the thawed heartbeat: 2.3 s late, remembered
    assert witness.stall_s(clock.monotonic(), 10) == pytest.approx(2.3)


async def test_reaper_not_leading_writes_nothing(r: Any) -> None:
    await r.zadd(KEYS.instances, {"dead": 1})
    await r.set(KEYS.leader, "6:someone-else")
    lease = FixedLease("5:me")
    reaper = new_reaper(r, lease, FakeClock(NOW_S), stale_s=10, interval_s=2, settle_s=0)
    with pytest.raises(LeadershipLost):
        await reaper.tick()
    assert lease.losses  # the lease was told: it steps down
    assert await r.zrange(KEYS.instances, 0, -1) == [b"dead"]


# -- dead letters ---------------------------------------------------------------------------------


async def test_dead_letters_are_bounded_in_count_and_size(r: Any) -> None:
    metrics = Metrics()
    store = Store(r, KEYS)
    letters = DeadLetters(
        store, FakeClock(NOW_S), instance_id="i", max_entries=3, keep_bytes=4, metrics=metrics
    )
    for n in range(5):
        await letters.set_aside(f"j{n}", "malformed payload", "malformed", b"abcdefgh", 8)
    assert await r.zcard(KEYS.dead) == 3 and await r.hlen(KEYS.dead_jobs) == 3
    assert metrics.dead_dropped._value.get() == 2
    rec = json.loads(await r.hget(KEYS.dead_jobs, "j4"))
    assert rec["size"] == 8 and rec["truncated"] is True
    assert rec["sha256"] == hashlib.sha256(b"abcdefgh").hexdigest()
    # a payload left unread in Redis (too large) is digested in chunks, never loaded whole
    big = b"x" * (3 * (1 << 20) + 5)
    await r.set(K.ARQ_JOB + "big", big)
    await letters.set_aside("big", "too large", "oversized", None, len(big))
    rec = json.loads(await r.hget(KEYS.dead_jobs, "big"))
    assert rec["sha256"] == hashlib.sha256(big).hexdigest() and rec["size"] == len(big)


# -- health endpoints -----------------------------------------------------------------------------


async def test_health_endpoints_follow_the_process_view() -> None:
    view = View({"consumer": Health("consumer").snapshot(0.0)})
    server = HealthServer(
        view, Metrics(), FakeClock(), host="127.0.0.1", port=0, bind_and_listen=False
    )
    req = make_mocked_request("GET", "/")
    assert (await server.healthz(req)).status == 200
    assert (await server.readyz(req)).status == 200
    view.ready, view.shutting_down = False, True  # SIGTERM: not ready, still live
    assert (await server.readyz(req)).status == 503
    assert (await server.healthz(req)).status == 200
    looping = Health("service:x", state="running")
    for t in range(5):
        looping.failed(float(t), "RuntimeError: boom")
    view.components["service:x"] = looping.snapshot(5.0)
    resp = await server.healthz(req)
    assert resp.status == 503
    assert json.loads(resp.body)["overdue"] == ["service:x"]  # type: ignore[arg-type]
    status = json.loads((await server.status(req)).body)  # type: ignore[arg-type]
    assert status["instance_id"] == "i-1" and status["in_flight"] == 2


# -- wiring ---------------------------------------------------------------------------------------


def test_plan_and_build_read_the_same_rows() -> None:
    app = App("t")

    @app.task
    async def t(ctx: Any) -> None: ...

    @app.periodic(every=5)
    async def p(ctx: Any) -> None: ...

    app.poller("cards", task="t")

    @app.service(cardinality="per_process")
    async def loop(ctx: Any, stop: Any) -> None: ...

    @app.service()
    async def single(ctx: Any, stop: Any) -> None: ...

    s = Settings.model_construct(health_port=8080)
    consumer = plan("consumer", app, s)
    leader = plan("leader", app, s)
    assert consumer.enabled == [
        "heartbeat", "health-server", "loop-watchdog", "consumer", "service:loop",
    ]  # fmt: skip
    assert consumer.disabled == [
        "leader-election", "poller:cards", "periodic", "schedules", "orphan-reaper",
        "queue-metrics", "unannounced-jobs",
        "service:single",
    ]  # fmt: skip
    assert leader.enabled == consumer.enabled + consumer.disabled and leader.disabled == []
    assert plan("all", app, s).enabled == leader.enabled
    # every row is either for every role or for the leader candidates
    assert {frozenset(spec.roles) for spec in SPECS} == {
        frozenset({"all", "leader", "consumer"}),
        frozenset({"all", "leader"}),
    }


async def test_metrics_carry_no_created_series() -> None:
    metrics = Metrics()
    metrics.jobs.labels("t", "success").inc()
    metrics.job_seconds.labels("t").observe(0.1)
    server = HealthServer(
        View(), metrics, FakeClock(), host="127.0.0.1", port=0, bind_and_listen=False
    )
    body = (await server.metrics(make_mocked_request("GET", "/metrics"))).body
    text = body.decode()  # type: ignore[union-attr]
    assert "worker_jobs_total" in text and "_created" not in text
