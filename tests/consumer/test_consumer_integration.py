"""The consumer against a real server and real processes: dead letters, plain-arq producers
and arq's own per-instance health check."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import msgpack
import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, ledger, wait_until
from harness.apps.ledger import app as ledger_app
from harness.arqfmt import JobStatus, require_arq
from worker.bulk import JobSpec
from worker.client import Client
from worker.core.clock import ms
from worker.core.serializer import get_serializer, job_payload
from worker.storage import keys as K

pytestmark = pytest.mark.timeout(120)


def dead_record(r: redis_sync.Redis, prefix: str, job_id: str) -> dict[str, Any] | None:
    keys = K.Keys(prefix)
    if r.zscore(keys.dead, job_id) is None:
        return None
    raw = r.hget(keys.dead_jobs, job_id)
    return json.loads(raw) if raw else None


def enqueue(
    url: str, prefix: str, function: str, *args: Any, knows_app: bool = True, **kwargs: Any
) -> str:
    async def go() -> str | None:
        app = ledger_app if knows_app else None  # without: any name, as a plain arq client
        client = await Client.connect(url, app=app, key_prefix=prefix)
        try:
            return await client.enqueue(function, *args, **kwargs)
        finally:
            await client.close()

    job_id = asyncio.run(go())
    assert job_id is not None
    return job_id


def start_consumer(spawn: Spawn, rsync: redis_sync.Redis, name: str = "c1") -> WorkerProc:
    proc = spawn("consumer", name=name)
    keys = K.Keys(spawn.prefix)  # type: ignore[attr-defined]
    wait_until(
        lambda: any(m.decode().startswith(f"{name}-") for m in rsync.zrange(keys.instances, 0, -1)),
        30,
        what=f"{name} to register",
    )
    return proc


@pytest.mark.slow
def test_malformed_payloads_dead_lettered_and_consumer_goes_on(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    consumer = start_consumer(spawn, rsync)
    enqueue(redis_url, prefix, "record", "before")

    garbage = {
        f"{prefix}garbage-bytes": b"\xc1\xff not msgpack at all \x00",
        f"{prefix}garbage-list": msgpack.packb([1, 2, 3]),  # valid msgpack, not a job record
    }
    now = ms(time.time())
    for job_id, raw in garbage.items():
        rsync.set(K.ARQ_JOB + job_id, raw, px=600_000)
        rsync.zadd(keys.queue, {job_id: now})
    enqueue(redis_url, prefix, "record", "after")

    for job_id, raw in garbage.items():
        rec = wait_until(
            lambda j=job_id: dead_record(rsync, prefix, j), 30, what=f"{job_id} dead-lettered"
        )
        assert rec["job_id"] == job_id
        assert base64.b64decode(rec["payload_b64"]) == raw
        assert "malformed" in rec["reason"], rec
        assert rec["instance"].startswith("c1-")
        # the consumer lets go of it (its end is recorded in the round after the set-aside):
        # no longer queued or stored as a job
        wait_until(
            lambda j=job_id: rsync.zscore(keys.queue, j) is None, 10, what=f"{job_id} unqueued"
        )
        assert not rsync.exists(K.ARQ_JOB + job_id)

    wait_until(
        lambda: ledger(rsync, prefix, "records") == {"before": 1, "after": 1},
        30,
        what="the jobs around the garbage to run",
    )
    enqueue(redis_url, prefix, "record", "later")
    wait_until(
        lambda: ledger(rsync, prefix, "records").get("later") == 1,
        30,
        what="a job after the garbage to run",
    )
    assert rsync.zcard(keys.dead) == len(garbage)
    assert consumer.alive()


@pytest.mark.slow
def test_unknown_function_dead_lettered(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    consumer = start_consumer(spawn, rsync)
    job_id = enqueue(redis_url, prefix, "no_such_function", 7, knows_app=False, flag="x")
    enqueue(redis_url, prefix, "record", "after-unknown")

    rec = wait_until(lambda: dead_record(rsync, prefix, job_id), 30, what="dead-lettering")
    assert "no_such_function" in rec["reason"], rec
    payload = msgpack.unpackb(base64.b64decode(rec["payload_b64"]), raw=False)
    assert payload["f"] == "no_such_function"
    assert payload["a"] == [7]
    assert payload["k"] == {"flag": "x"}
    wait_until(
        lambda: ledger(rsync, prefix, "records").get("after-unknown") == 1,
        30,
        what="the next job to run",
    )
    assert consumer.alive()


@pytest.mark.slow
async def test_plain_arq_client_enqueues_work(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    require_arq()
    from arq.connections import RedisSettings, create_pool

    prefix = spawn.prefix  # type: ignore[attr-defined]
    start_consumer(spawn, rsync)
    ser, de = get_serializer("msgpack")
    pool = await create_pool(
        RedisSettings.from_dsn(redis_url),
        default_queue_name=f"{prefix}queue",
        job_serializer=ser,
        job_deserializer=de,
    )
    try:
        job = await pool.enqueue_job("slow_job", 0.1)
        assert job is not None
        assert await job.result(timeout=30, poll_delay=0.1) == "done"
        assert await job.status() == JobStatus.complete
        info = await job.result_info()
        assert info is not None and info.success and list(info.args) == [0.1]
        assert ledger(rsync, prefix, "slow-done") == {job.job_id: 1}

        kw = await pool.enqueue_job("record", key="plain-kwargs", _job_id="plain-1")
        assert kw is not None
        assert await pool.enqueue_job("record", key="plain-kwargs", _job_id="plain-1") is None
        await kw.result(timeout=30, poll_delay=0.1)

        deferred = await pool.enqueue_job("record", "plain-deferred", _defer_by=1.5)
        assert deferred is not None
        enqueued_at = time.monotonic()
        await deferred.result(timeout=30, poll_delay=0.05)
        assert time.monotonic() - enqueued_at >= 1.2
    finally:
        await pool.aclose()
    assert ledger(rsync, prefix, "records") == {"plain-kwargs": 1, "plain-deferred": 1}


@pytest.mark.slow
# arq's async_check_health closes its pool with redis-py's deprecated close()
@pytest.mark.filterwarnings("ignore:Call to deprecated close:DeprecationWarning")
async def test_arq_health_check_is_per_instance(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    require_arq()
    from arq.connections import RedisSettings
    from arq.worker import async_check_health

    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    c1 = start_consumer(spawn, rsync, "c1")
    c2 = start_consumer(spawn, rsync, "c2")
    ids = {m.decode() for m in rsync.zrange(keys.instances, 0, -1)}
    id1 = next(i for i in ids if i.startswith("c1-"))
    id2 = next(i for i in ids if i.startswith("c2-"))
    settings = RedisSettings.from_dsn(redis_url)

    async def check(instance_id: str) -> int:
        return await async_check_health(settings, health_check_key=keys.arq_health(instance_id))

    for instance_id in (id1, id2):
        deadline = time.monotonic() + 20
        while await check(instance_id) != 0:
            assert time.monotonic() < deadline, f"arq health check of {instance_id} failed"
            await asyncio.sleep(0.2)

    assert c1.terminate() == 0
    assert await check(id2) == 0, "stopping one consumer failed the other's health check"
    assert await check(id1) == 1, "a stopped consumer still passes its health check"
    assert c2.alive()


def _commands(r: redis_sync.Redis) -> int:
    """Every command the server ran (inside scripts too), minus the probes of this helper."""
    stats = r.info("commandstats")
    return sum(int(v.get("calls", 0)) for k, v in stats.items() if k != "cmdstat_info")


@pytest.mark.slow
def test_an_idle_consumer_costs_a_command_a_second_and_wakes_at_once_on_enqueue(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    # heartbeat and claim checks far apart, so the window sees the consumer's own polling only
    env = {"WORKER_HEARTBEAT_INTERVAL_S": "30", "WORKER_ORPHAN_STALE_S": "60"}
    proc = spawn("consumer", name="idle", env=env)
    keys = K.Keys(prefix)
    wait_until(lambda: rsync.zcard(keys.instances) == 1, 30, what="the consumer to register")
    time.sleep(2)
    before, t0 = _commands(rsync), time.monotonic()
    time.sleep(5)
    rate = (_commands(rsync) - before) / (time.monotonic() - t0)
    assert rate <= 1.5, f"an idle consumer costs {rate:.2f} commands/s"

    # an enqueue through the framework wakes it at once (pub/sub), not at its next look
    latencies = []
    for n in range(10):
        sent = time.monotonic()
        enqueue(redis_url, prefix, "record", f"wake-{n}")
        wait_until(lambda n=n: ledger(rsync, prefix, "records").get(f"wake-{n}") == 1, 10)
        latencies.append(time.monotonic() - sent)
        time.sleep(0.3)  # idle again
    assert max(latencies) < 0.5, latencies  # the fallback look is 1 s away
    assert proc.alive()


@pytest.mark.slow
def test_a_plain_arq_enqueue_is_found_by_the_fallback_look(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_IDLE_POLL_MAX_S": "0.5", "WORKER_IDLE_POLL_SUBSCRIBED_S": "0.5"}
    spawn("consumer", name="idle", env=env)
    wait_until(lambda: rsync.zcard(K.Keys(prefix).instances) == 1, 30, what="registration")
    time.sleep(1)
    ser, _ = get_serializer("msgpack")
    jid = "plain-arq-1"  # written as arq's enqueue_job writes it: no announcement
    rsync.set(K.ARQ_JOB + jid, job_payload("record", ("plain",), {}, int(time.time() * 1000), ser))
    rsync.zadd(K.Keys(prefix).queue, {jid: int(time.time() * 1000)})
    sent = time.monotonic()
    wait_until(lambda: ledger(rsync, prefix, "records").get("plain") == 1, 10, what="the job")
    assert time.monotonic() - sent < 0.5 + 1.0


@pytest.mark.slow
def test_no_per_job_log_lines_at_info(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("consumer", name="quiet")
    wait_until(lambda: rsync.zcard(K.Keys(prefix).instances) == 1, 30, what="registration")
    for n in range(20):
        enqueue(redis_url, prefix, "record", f"k{n}")
    wait_until(lambda: len(ledger(rsync, prefix, "records")) == 20, 30, what="20 jobs")
    proc.terminate()
    events = proc.events()
    # arq's two INFO lines per job are DEBUG here: nothing per job at INFO
    assert not [e for e in events if e.get("logger", "").startswith("arq")]
    assert len(events) < 20, [e.get("event") for e in events]


@pytest.mark.slow
def test_dead_letters_listed_and_requeued_after_the_fix(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: Any
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    # An old deployment that does not know `record` yet sets the job aside...
    old = spawn("consumer", name="old", app="harness.apps.minimal:app")
    job_id = enqueue(redis_url, prefix, "record", "late")
    wait_until(lambda: dead_record(rsync, prefix, job_id), 30, what="dead-lettering")
    old.terminate()
    listed = json.loads(cli("dead", "--json", env=env).stdout)
    assert [r["job_id"] for r in listed] == [job_id]
    assert "payload_b64" not in listed[0] and "record" in listed[0]["reason"]

    # ...the fixed deployment runs it once re-queued, with the same id and arguments.
    spawn("consumer", name="new")
    done = cli("dead", "--retry", job_id, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{job_id}: requeued" in done.stdout
    wait_until(lambda: ledger(rsync, prefix, "records").get("late") == 1, 30, what="the re-run")
    assert json.loads(cli("dead", "--json", env=env).stdout) == []
    again = cli("dead", "--retry", job_id, env=env)
    assert again.returncode == 1 and f"{job_id}: missing" in again.stdout


def test_dead_letters_page_by_page_and_a_truncated_payload_is_not_requeued(
    rsync: redis_sync.Redis, redis_url: str, cli: Any
) -> None:
    import asyncio

    import redis.asyncio as aioredis

    from worker.consumer.dead import DeadLetters
    from worker.core.clock import SystemClock
    from worker.storage.store import Store

    prefix = "pages:"
    keys = K.Keys(prefix)

    async def seed() -> None:
        r = aioredis.Redis.from_url(redis_url)
        letters = DeadLetters(Store(r, keys), SystemClock(), instance_id="i", keep_bytes=8)
        for n in range(250):
            await letters.set_aside(f"job-{n:03d}", "malformed payload", "malformed", b"p", 1)
        await asyncio.sleep(0.01)  # newest by time, not only by name
        await letters.set_aside("big", "too large", "oversized", b"0123456789abcdef", 16)
        await r.aclose()

    asyncio.run(seed())
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    last = json.loads(cli("dead", "--json", "--page", "3", env=env).stdout)
    assert len(last) == 51 and last[-1]["job_id"] == "job-000"  # 251 entries: 100, 100, 51
    first = json.loads(cli("dead", "--json", env=env).stdout)
    assert first[0]["job_id"] == "big" and first[0]["truncated"] is True
    assert first[0]["size"] == 16 and len(first[0]["sha256"]) == 64
    refused = cli("dead", "--retry", "big", env=env)
    assert refused.returncode == 1 and "big: truncated" in refused.stdout
    assert rsync.zscore(keys.dead, "big") is not None  # still set aside


@pytest.mark.slow
def test_a_sigkilled_consumers_concurrency_slot_comes_back(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """max_concurrency=1 held by a consumer that is SIGKILLed mid-job: the slot's lease runs
    out (nobody renews it) and the next job starts; never two at once. (The orphan bound is
    long here, so the killed job is not re-run within the test and cannot take the slot.)"""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    slow_reap = {"WORKER_ORPHAN_STALE_S": "300"}
    a = spawn("consumer", name="a", env=slow_reap)
    enqueue(redis_url, prefix, "exclusive", "long", 60)
    wait_until(lambda: rsync.hget(f"{prefix}ledger:exclusive-start", "long"), 30, what="long")
    enqueue(redis_url, prefix, "exclusive", "short", 0.1)
    b = spawn("consumer", name="b", env=slow_reap)
    time.sleep(2)
    assert rsync.hget(f"{prefix}ledger:exclusive-start", "short") is None  # the slot is taken
    a.kill()
    killed = time.monotonic()
    wait_until(
        lambda: rsync.hget(f"{prefix}ledger:exclusive-end", "short"), 40, what="the short job"
    )
    assert time.monotonic() - killed < 10 + 5  # the slot lease, and a claim round
    assert rsync.hget(f"{prefix}ledger:exclusive-end", "long") is None  # killed mid-job
    starts = {
        k.decode(): float(v) for k, v in rsync.hgetall(f"{prefix}ledger:exclusive-start").items()
    }
    ends = {k.decode(): float(v) for k, v in rsync.hgetall(f"{prefix}ledger:exclusive-end").items()}
    if "long" in ends:
        assert ends["long"] <= starts["short"] or starts["long"] >= ends["short"]
    assert b.alive()


@pytest.mark.slow
def test_a_consumer_sigkilled_mid_batch_loses_no_job_and_duplicates_only_its_own(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """600 short jobs, two consumers claiming in batches (concurrency 20 each), a leader to
    reap; one consumer is SIGKILLed while it holds a batch. Every job completes (its arq result
    is written: none lost); a job ran to its end twice only if the killed consumer held it at
    the kill (its run ended, its FINISH never landed): at most its concurrency, 20."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    small = {"WORKER_CONCURRENCY": "20"}

    async def enqueue_all() -> list[str]:
        client = await Client.connect(redis_url, app=ledger_app, key_prefix=prefix)
        try:
            # one round trip: the queue is full at once (one at a time on a loaded box, the
            # consumers ate the jobs as they came and never held a batch of 10)
            specs = [JobSpec("slow_job", (0.2,), job_id=f"{prefix}j{i:03d}") for i in range(600)]
            out = await client.enqueue_many(specs, chunk_size=600)
            assert None not in out
            return [j for j in out if j is not None]
        finally:
            await client.close()

    spawn("leader", name="reaper")
    victim = spawn("consumer", name="victim", env=small)
    survivor = spawn("consumer", name="survivor", env=small)
    keys = K.Keys(prefix)

    def registered() -> bool:
        names = {m.decode().rsplit("-", 1)[0] for m in rsync.zrange(keys.instances, 0, -1)}
        return {"victim", "survivor", "reaper"} <= names

    wait_until(registered, 60, what="both consumers and the leader")
    ids = asyncio.run(enqueue_all())

    def victim_holds_a_batch() -> bool:
        ids = [m.decode() for m in rsync.zrange(keys.instances, 0, -1)]
        victim_id = next((i for i in ids if i.startswith("victim-")), None)
        held = {m.decode() for m in rsync.smembers(keys.holds(victim_id))} if victim_id else set()
        # held AND started: a batch claimed an instant ago has not started a job yet (killed
        # then, its jobs run once, on the survivor, and the kill interrupted nothing)
        running = held & ledger(rsync, prefix, "slow-started").keys()
        return len(running) >= 10 and len(ledger(rsync, prefix, "slow-done")) >= 100

    wait_until(victim_holds_a_batch, 60, interval=0.01, what="the victim mid-batch")
    victim.kill()
    wait_until(
        lambda: len(ledger(rsync, prefix, "slow-done")) == 600, 90, what="every job to complete"
    )
    done = ledger(rsync, prefix, "slow-done")
    assert set(done) == set(ids), "a job never completed"
    twice = [j for j, n in done.items() if n > 1]
    assert len(twice) <= 20, twice
    assert all(n <= 2 for n in done.values())
    started = ledger(rsync, prefix, "slow-started")
    assert sum(started.values()) > 600, "the kill interrupted no job: the test proved nothing"
    wait_until(lambda: sum(rsync.exists(f"arq:result:{j}") for j in ids) == 600, 30, what="results")
    assert survivor.alive()
