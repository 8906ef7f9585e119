"""Run-time schedules (``client.schedules``): validation, the stored records, and the leader's
:class:`ScheduleEnqueuer` on fakeredis and the real server with a :class:`FakeClock`."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from harness import CliRun, FixedLease
from harness.arqfmt import deserialize_job
from harness.docpages import python_block
from harness.fakes import utc_ms
from worker import App
from worker.client import Client
from worker.core import malformed as M
from worker.core.clock import FakeClock
from worker.core.errors import ConfigError, UnknownTask
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.duties.schedules import ScheduleEnqueuer
from worker.storage import keys as K
from worker.storage.schedules import DueScheduleTicks
from worker.storage.store import FencedStore, Store
from worker.sync_client import SyncClient

PREFIX = "s:"
KEYS = K.Keys(PREFIX)
LOCK = "3:mine"
MIN = 60_000
T0 = 28_333_334 * MIN  # on the minute grid

app = App("sched")


@app.task
async def report(ctx: Any, tenant: str, *, fmt: str = "pdf") -> None:
    return None


@app.task(queue="slow")
async def rebuild(ctx: Any) -> None:
    return None


@app.periodic(every=60)
async def code_tick(ctx: Any) -> None:
    return None


def client_of(r: Any) -> Client:
    return Client(r, keys=KEYS, serialize=msgpack_dumps, app=app, clock=FakeClock(T0 / 1000))


async def enqueuer(r: Any, clock: FakeClock, lock: str = LOCK) -> ScheduleEnqueuer:
    """The enqueuer of a leader holding ``lock`` (set in Redis: the script checks it)."""
    await r.set(KEYS.leader, lock)
    fenced = FencedStore(Store(r, KEYS), FixedLease(lock))
    queues = {t: app.queue_of(t) for t in app.tasks}
    return ScheduleEnqueuer(queues, fenced.store, fenced, msgpack_dumps, clock)


async def queued(r: Any, queue: str = "default") -> list[str]:
    return [m.decode() for m in await r.zrange(KEYS.queue_of(queue), 0, -1)]


async def run(e: ScheduleEnqueuer, clock: FakeClock, seconds: float, step: float = 1.0) -> None:
    """Drive the enqueuer's loop by hand: one tick per ``step`` of fake time."""
    for _ in range(round(seconds / step)):
        await e.tick()
        clock.advance(step)


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"cron": "0 7 * * *", "every": 60}, "exactly one"),
        ({}, "exactly one"),
        ({"cron": "0 7 * *"}, "5-field"),
        ({"cron": "0 7 * * *", "tz": "Mars/Olympus"}, "time zone"),
        ({"every": 0.5}, "at least 1 s"),
        ({"every": 60, "tz": "Europe/Paris"}, "only with cron"),
        ({"every": 60, "catch_up": "some"}, "catch_up"),
        ({"every": 60, "catch_up_limit": 0}, "catch_up_limit"),
        ({"every": 60, "overlap": "queue"}, "overlap"),
        ({"every": 60, "when": dt.date(2024, 1, 1)}, "JSON data"),
    ],
)
async def test_upsert_refuses_a_bad_definition(fake_arq: Any, kwargs: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        await client_of(fake_arq).schedules.upsert("nightly", "report", "acme", **kwargs)
    assert await fake_arq.keys("*") == []


async def test_upsert_refuses_an_unknown_task_and_a_bad_name(fake_arq: Any) -> None:
    schedules = client_of(fake_arq).schedules
    with pytest.raises(UnknownTask, match="did you mean 'report'"):
        await schedules.upsert("nightly", "reprt", every=60)
    with pytest.raises(UnknownTask):  # a periodic job is not a task a schedule may run
        await schedules.upsert("nightly", "code_tick", every=60)
    with pytest.raises(ConfigError, match="schedule name"):
        await schedules.upsert("a:b", "report", every=60)
    bare = Client(fake_arq, keys=KEYS, serialize=msgpack_dumps)
    with pytest.raises(ConfigError, match="app="):
        await bare.schedules.upsert("nightly", "report", every=60)
    assert await fake_arq.keys("*") == []


async def test_upsert_get_list_remove(r: Any) -> None:
    schedules = client_of(r).schedules
    a = await schedules.upsert(
        "acme", "report", "acme", cron="0 7 * * *", tz="Europe/Paris", fmt="csv"
    )
    b = await schedules.upsert("b", "rebuild", every=dt.timedelta(minutes=5), overlap="skip")
    assert b.version > a.version > 0
    got = await schedules.get("acme")
    assert got == a and got.args == ("acme",) and got.kwargs == {"fmt": "csv"}
    assert [s.name for s in await schedules.list()] == ["acme", "b"]
    changed = await schedules.upsert("acme", "report", "acme", cron="0 8 * * *")
    assert changed.version > b.version and (await schedules.get("acme")) == changed
    assert await schedules.remove("acme") is True
    assert await schedules.remove("acme") is False
    assert await schedules.get("acme") is None and [s.name for s in await schedules.list()] == ["b"]


@pytest.mark.parametrize(
    "record",
    [
        b"not json",
        b"[1, 2]",
        b'{"task": "report"}',
        b'{"args":[],"catch_up":"all","catch_up_limit":10,"cron":"0 7 * *","every_s":null,'
        b'"kwargs":{},"overlap":"allow","task":"report","tz":"UTC"}',
        b'{"args":[],"catch_up":"all","catch_up_limit":1e999,"cron":null,"every_s":60,'
        b'"kwargs":{},"overlap":"allow","task":"report","tz":"UTC"}',
        b"[" * 100_000,
    ],
)
async def test_a_malformed_record_is_skipped_logged_once_and_counted(
    fake_arq: Any, record: bytes
) -> None:
    schedules = client_of(fake_arq).schedules
    await schedules.upsert("good", "report", "x", every=60)
    bad = f"bad-{abs(hash(record)) % 10**9}"  # a new entry for each case: each logged once
    await fake_arq.hset(KEYS.schedules, bad, record)
    await fake_arq.hset(KEYS.schedule_versions, bad, 99)
    before = M.SKIPPED["schedule"]
    assert [s.name for s in await schedules.list()] == ["good"]
    assert [s.name for s in await schedules.list()] == ["good"]
    assert M.SKIPPED["schedule"] == before + 1  # once, however often it is read
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(fake_arq, clock)
    await run(e, clock, 121)
    assert len(await queued(fake_arq)) == 2 and list(e.specs) == ["good"]


async def test_a_stored_schedule_of_a_task_the_app_lacks_is_skipped(fake_arq: Any) -> None:
    await client_of(fake_arq).schedules.upsert("gone", "report", "x", every=60)
    clock = FakeClock(T0 / 1000 + 1)
    await fake_arq.set(KEYS.leader, LOCK)
    fenced = FencedStore(Store(fake_arq, KEYS), FixedLease(LOCK))
    e = ScheduleEnqueuer({"rebuild": "slow"}, fenced.store, fenced, msgpack_dumps, clock)
    await run(e, clock, 121)
    assert e.specs == {} and await queued(fake_arq) == []


# -- the enqueuer -----------------------------------------------------------------------------


async def test_ticks_are_enqueued_once_with_deterministic_ids_and_arguments(r: Any) -> None:
    await client_of(r).schedules.upsert("acme", "report", "acme", every=60, fmt="csv")
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 180)
    # the first tick due at the start was before the schedule's time: from the next one
    assert await queued(r) == [f"{PREFIX}schedule:acme:{T0 + k * MIN}" for k in (1, 2, 3)]
    raw = await r.get(f"arq:job:{PREFIX}schedule:acme:{T0 + MIN}")
    job = deserialize_job(raw, deserializer=msgpack_loads)
    assert (job.function, list(job.args), job.kwargs) == ("report", ["acme"], {"fmt": "csv"})
    # a second leader over the same ticks (a failover overlap) enqueues nothing again
    clock2 = FakeClock(T0 / 1000 + 1)
    await run(await enqueuer(r, clock2, lock=LOCK), clock2, 180)
    assert len(await queued(r)) == 3


async def test_the_task_queue_is_used(fake_arq: Any) -> None:
    await client_of(fake_arq).schedules.upsert("rb", "rebuild", every=60)
    clock = FakeClock(T0 / 1000 + 1)
    await run(await enqueuer(fake_arq, clock), clock, 61)
    assert await queued(fake_arq, "slow") == [f"{PREFIX}schedule:rb:{T0 + MIN}"]


async def test_a_change_takes_effect_at_the_next_tick_without_repeating_or_losing_one(
    r: Any,
) -> None:
    schedules = client_of(r).schedules
    await schedules.upsert("acme", "report", "acme", every=60)
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 120)  # ticks T0+1m, T0+2m
    await schedules.upsert("acme", "report", "acme", every=30)  # now every 30 s
    await run(e, clock, 60)  # T0+2m30s, T0+3m
    await schedules.upsert("acme", "report", "acme", cron="*/2 * * * *")
    await run(e, clock, 240)  # even minutes: T0+4m, T0+6m (T0 is an even minute)
    ticks = sorted(int(j.rpartition(":")[2]) - T0 for j in await queued(r))
    assert ticks == [60_000, 120_000, 150_000, 180_000, 240_000, 360_000]


async def test_a_removed_schedule_never_ticks_again_not_even_a_planned_tick(r: Any) -> None:
    schedules = client_of(r).schedules
    spec = await schedules.upsert("acme", "report", "acme", every=60)
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 60)
    assert len(await queued(r)) == 1
    # a tick planned on the definition read before the removal reaches the script after it
    job = await r.get(f"arq:job:{PREFIX}schedule:acme:{T0 + MIN}")
    planned = DueScheduleTicks("acme", spec.version, T0 + 2 * MIN, [], "default", T0 + MIN, False)
    await schedules.remove("acme")
    from worker.storage.jobs import NewJob

    tick = NewJob(f"{PREFIX}schedule:acme:{T0 + 2 * MIN}", job, T0 + 2 * MIN)
    (out,) = await e.fenced.enqueue_schedule_ticks([planned._replace(ticks=[tick])], 1000)
    assert out.stale and out.enqueued == 0
    # and a change makes the old version's plan stale the same way
    new = await schedules.upsert("acme", "report", "acme", every=60)
    (out,) = await e.fenced.enqueue_schedule_ticks([planned._replace(ticks=[tick])], 1000)
    assert out.stale and new.version != spec.version
    await schedules.remove("acme")
    await run(e, clock, 300)
    assert len(await queued(r)) == 1


async def test_overlap_skip_skips_a_tick_while_the_previous_run_has_not_ended(r: Any) -> None:
    await client_of(r).schedules.upsert("rb", "report", "x", every=60, overlap="skip")
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 180)  # nothing consumes: the first tick's job stays, 2 skipped
    assert await queued(r) == [f"{PREFIX}schedule:rb:{T0 + MIN}"]
    assert await e.store.schedule_overlaps() == {"rb": 2}
    await r.delete(f"arq:job:{PREFIX}schedule:rb:{T0 + MIN}")  # that run ended
    await run(e, clock, 60)
    assert len(await queued(r)) == 2


async def test_a_new_leader_catches_up_missed_ticks_per_policy(r: Any) -> None:
    schedules = client_of(r).schedules
    await schedules.upsert("all", "report", "a", every=60, catch_up="all", catch_up_limit=3)
    await schedules.upsert("latest", "report", "b", every=60, catch_up="latest")
    await schedules.upsert("skip", "report", "c", every=60, catch_up="skip")
    clock = FakeClock(T0 / 1000 + 1)
    await run(await enqueuer(r, clock), clock, 60)  # one tick each; then the leader dies
    clock.advance(10 * 60)  # 10 ticks missed, no leader
    clock.advance(30)
    await run(await enqueuer(r, clock, lock="4:next"), clock, 1)
    names = [j.split(":")[2] for j in await queued(r)]
    assert (names.count("all"), names.count("latest"), names.count("skip")) == (1 + 3, 1 + 1, 1)


# -- DST: as for a code schedule's cron -------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "start", "expected"),
    [
        # spring forward (2024-03-10): 02:30 does not exist, that day's run is at 03:00 EDT
        (
            "30 2 * * *",
            utc_ms(2024, 3, 9, 0),
            [utc_ms(2024, 3, 9, 7, 30), utc_ms(2024, 3, 10, 7), utc_ms(2024, 3, 11, 6, 30)],
        ),
        # fall back (2024-11-03): 01:30 comes twice, it runs once (the first)
        (
            "30 1 * * *",
            utc_ms(2024, 11, 2, 0),
            [utc_ms(2024, 11, 2, 5, 30), utc_ms(2024, 11, 3, 5, 30), utc_ms(2024, 11, 4, 6, 30)],
        ),
    ],
    ids=["spring-forward", "fall-back"],
)
async def test_dst_days_tick_once_per_day_at_the_tenants_hour(
    fake_arq: Any, cron: str, start: int, expected: list[int]
) -> None:
    await client_of(fake_arq).schedules.upsert("t", "report", "x", cron=cron, tz="America/New_York")
    clock = FakeClock(start / 1000)
    await run(await enqueuer(fake_arq, clock), clock, 3 * 86400, step=300)
    assert [int(j.rpartition(":")[2]) for j in await queued(fake_arq)] == expected


def test_the_sync_client_has_the_same_schedules(redis_url: str) -> None:
    with SyncClient.connect(redis_url, key_prefix=PREFIX, app=app) as client:
        spec = client.schedules.upsert("acme", "report", "acme", cron="0 7 * * *", fmt="csv")
        assert spec.version > 0 and client.schedules.get("acme") == spec
        assert client.schedules.list() == [spec]
        with pytest.raises(UnknownTask):
            client.schedules.upsert("x", "nope", every=60)
        assert client.schedules.remove("acme") and client.schedules.list() == []


def test_the_cli_adds_shows_lists_backfills_and_removes(cli: CliRun, redis_url: str) -> None:
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": "cs:",
        "WORKER_APP": "harness.apps.sched:app",
    }
    add = cli("schedule", "add", "acme", "stamp", "--cron", "0 7 * * *", "--tz", "Europe/Paris",
              "--args", '["acme"]', "--overlap", "skip", env=env)  # fmt: skip
    assert add.returncode == 0 and "stamp(\"acme\") cron '0 7 * * *' Europe/Paris" in add.stdout
    bad = cli("schedule", "add", "x", "nope", "--every", "60", env=env)
    assert bad.returncode == 2 and "unknown task 'nope'" in bad.stderr, bad.stderr
    (listed,) = json.loads(cli("schedule", "list", "--json", env=env).stdout)
    assert listed["name"] == "acme" and listed["args"] == ["acme"] and listed["overlap"] == "skip"
    shown = json.loads(cli("schedule", "show", "acme", "--json", env=env).stdout)
    assert shown["tz"] == "Europe/Paris" and shown["overlaps_skipped"] == 0
    fill = ["schedule", "backfill", "acme", "--from", "2024-03-01", "--to", "2024-03-04T23:00"]
    first = cli(*fill, env=env)
    assert first.returncode == 0 and "4 ticks in the range, 4 enqueued" in first.stdout, first
    assert "4 ticks in the range, 0 enqueued" in cli(*fill, env=env).stdout  # each once
    assert cli("schedule", "rm", "acme", env=env).returncode == 0
    assert cli("schedule", "rm", "acme", env=env).returncode == 1
    assert cli("schedule", "show", "acme", env=env).returncode == 1


async def test_the_docs_example_reports_each_tenant_at_its_own_hour(fake_arq: Any) -> None:
    code = python_block("schedules", "Schedules at run time")
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/schedules.md", "exec"), scope)
    docs_app = scope["app"]
    start = utc_ms(2024, 3, 30, 0)  # Paris springs forward on the 31st
    client = Client(
        fake_arq, keys=KEYS, serialize=msgpack_dumps, app=docs_app, clock=FakeClock(start / 1000)
    )
    await scope["tenant_saved"](client, "acme", "Europe/Paris")
    await scope["tenant_saved"](client, "zeta", "Asia/Tokyo", hour=6)
    clock = FakeClock(start / 1000)
    fenced = FencedStore(Store(fake_arq, KEYS), FixedLease(LOCK))
    await fake_arq.set(KEYS.leader, LOCK)
    queues = {t: docs_app.queue_of(t) for t in docs_app.tasks}
    e = ScheduleEnqueuer(queues, fenced.store, fenced, msgpack_dumps, clock)
    ran: dict[str, Any] = {}

    async def consume(seconds: float) -> None:  # a consumer runs each job: its run ends
        for _ in range(round(seconds / 600)):
            await e.tick()
            for key in await fake_arq.keys("arq:job:*"):
                ran[key.decode().rpartition(":schedule:")[2]] = await fake_arq.get(key)
                await fake_arq.delete(key)
            clock.advance(600)

    await consume(2 * 86400)
    await scope["tenant_deleted"](client, "zeta")
    await consume(86400)
    ticks = sorted(n.replace(":", "@") for n in ran)
    assert ticks == sorted([
        f"report-acme@{utc_ms(2024, 3, 30, 6)}",  # 07:00 CET
        f"report-acme@{utc_ms(2024, 3, 31, 5)}",  # 07:00 CEST
        f"report-acme@{utc_ms(2024, 4, 1, 5)}",
        f"report-zeta@{utc_ms(2024, 3, 30, 21)}",  # 06:00 JST on the 31st
        f"report-zeta@{utc_ms(2024, 3, 31, 21)}",  # then removed
    ])  # fmt: skip
    job = deserialize_job(ran[f"report-acme:{utc_ms(2024, 3, 30, 6)}"], deserializer=msgpack_loads)
    assert (job.function, list(job.args), job.kwargs) == ("tenant_report", ["acme"], {"fmt": "csv"})


@pytest.mark.parametrize("last", [b"1e300", b"soon", b"-5"])
async def test_a_malformed_last_tick_does_not_stop_a_schedule(r: Any, last: bytes) -> None:
    await client_of(r).schedules.upsert("acme", "report", "acme", every=60)
    await r.hset(KEYS.schedule_state, "acme", last)
    clock = FakeClock(T0 / 1000 + 1)
    await run(await enqueuer(r, clock), clock, 180)
    assert len(await queued(r)) >= 2


async def test_status_and_the_console_list_them_beside_code_schedules(fake_arq: Any) -> None:
    from worker.ops import status

    await client_of(fake_arq).schedules.upsert("acme", "report", "acme", every=60, overlap="skip")
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(fake_arq, clock)
    await run(e, clock, 180)  # the first run never ends: 2 ticks skipped
    doc = await status.collect(fake_arq, KEYS, app, clock)
    (row,) = doc["schedules"]
    assert row["name"] == "acme" and row["task"] == "report" and row["overlaps_skipped"] == 2
    assert row["last_tick_ms"] == T0 + 3 * MIN and row["next_tick_ms"] == T0 + 4 * MIN
    assert [p["name"] for p in doc["periodic"]] == ["code_tick"]  # the code schedule beside
    line = next(x for x in status.render(doc).splitlines() if x.startswith("acme "))
    assert line.split()[:4] == ["acme", "report", "every", "60s"] and line.split()[-1] == "2"


async def test_after_a_change_the_leader_reads_only_the_changed_definitions(r: Any) -> None:
    schedules = client_of(r).schedules
    for n in range(3):
        await schedules.upsert(f"s{n}", "report", str(n), every=60)
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await e.tick()
    calls: list[int] = []
    hmget = r.hmget

    async def counting(key: str, names: list[Any]) -> Any:
        calls.append(len(names))
        return await hmget(key, names)

    r.hmget = counting
    await schedules.upsert("s1", "report", "one", every=120)
    clock.advance(1)
    await e.tick()
    assert calls == [1] and e.specs["s1"].args == ("one",) and len(e.specs) == 3
    clock.advance(1)
    await e.tick()  # nothing changed: not even the versions are read
    assert calls == [1]
