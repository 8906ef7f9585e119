"""``worker doctor``: every check on a healthy cluster seeded in Redis, then each broken state
(fakeredis and the real server); rendering and JSON."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from worker.app import App
from worker.ops import doctor
from worker.storage import keys as K
from worker.storage.store import Store
from worker.version import __version__

KEYS = K.Keys("t:")
NOW = 1_700_000_030_000
LIMITS = doctor.Limits(stale_s=10, max_skew_s=1, max_lag_s=60, tick_grace_s=30)


def make_app() -> App:
    app = App("shop")

    @app.task
    async def poll_card(ctx: Any, item: str) -> None: ...

    @app.periodic(every=60, max_staleness=600)
    async def order_expire(ctx: Any) -> None: ...

    @app.periodic(every=10)
    async def sync(ctx: Any) -> None: ...

    app.poller("cards", task="poll_card", shards=2)
    return app


async def register(
    r: Any, iid: str, name: str, role: str, *, age_ms: int = 500, **extra: Any
) -> None:
    """An instance's heartbeat as the registry writes it (record + score), ``age_ms`` ago."""
    record = {
        "id": iid,
        "name": name,
        "role": role,
        "version": __version__,
        "heartbeat_ms": NOW - age_ms,
        "is_leader": False,
        "epoch": None,
        "ready": True,
        "unready": [],
        "clock_offset_ms": 0.0,
        "clock_rtt_ms": 0.4,
        **extra,
    }
    await Store(r, KEYS).heartbeat(iid, record, 60_000, NOW - age_ms)


async def seed_healthy(r: Any, app: App) -> None:
    await r.set(KEYS.leader, "4:tok", px=8000)
    await r.set(KEYS.leader_epoch, 4)
    await r.hset(KEYS.leader_state, mapping={"epoch": 4, "renewed_ms": NOW - 400, "released": ""})
    await register(r, "leader-1-aaa", "leader-1", "leader", is_leader=True, epoch=4, lease_age_s=12)
    await register(r, "consumer-1-bbb", "consumer-1", "consumer", age_ms=900, clock_offset_ms=3.0)
    for job in app.periodics.values():
        await r.hset(KEYS.periodic_state, job.name, job.schedule.latest(NOW))
    store = Store(r, KEYS)
    await store.periodic_result(
        "order_expire", "success", {"at_ms": NOW - 20_000, "tick_ms": NOW - 30_000}, NOW - 20_000
    )
    p = app.pollers["cards"]
    await r.zadd(KEYS.poll_shard("cards", 0), {"a": NOW - 1_000})
    await r.zadd(KEYS.poll_shard("cards", 1), {"b": NOW + 10_000})
    await r.zadd(KEYS.queue, {"job-1": NOW - 500, "job-2": NOW + 60_000})
    await r.sadd(KEYS.holds("consumer-1-bbb"), "job-9")
    assert p.shards == 2


async def diagnose(r: Any, app: App, limits: doctor.Limits = LIMITS) -> doctor.Report:
    return await doctor.diagnose(r, KEYS, app, limits=limits, now_ms=NOW)


def statuses(report: doctor.Report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


async def test_a_healthy_cluster_passes_every_check(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    report = await diagnose(r, app)
    st = statuses(report)
    # fakeredis cannot tell its eviction policy (a warning); the real server says noeviction
    assert st.pop("eviction") in ("ok", "warn")
    assert set(st.values()) == {"ok"}, [c for c in report.checks if c.status != "ok"]
    assert report.ok
    leader = report.check("leader")
    assert leader.data["instance"] == "leader-1" and leader.data["epoch"] == 4
    assert "leader-1 leads: epoch 4" in leader.summary and "renewed 0.4s ago" in leader.summary
    assert report.check("clock-skew").data["spread_ms"] == 3.0
    assert report.check("pollers").data["lag_s"] == {"cards": 1.0}
    assert report.check("queue-lag").data["lag_s"] == 0.5
    text = doctor.render(report)
    assert "✗" not in text and "✓ leader" in text and "failed" in text.splitlines()[-1]
    as_json = json.loads(json.dumps(report.to_json()))
    assert as_json["ok"] is True and as_json["failed"] == []
    assert {c["name"] for c in as_json["checks"]} == {c.name for c in report.checks}


async def test_no_leader_fails(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.delete(KEYS.leader)
    report = await diagnose(r, app)
    assert report.check("leader").status == "fail"
    assert "no leader" in report.check("leader").summary
    assert report.check("leader").details == [
        "instances still reporting leadership: leader-1 (epoch 4)"
    ]
    assert not report.ok
    assert "✗ leader" in doctor.render(report)
    assert report.to_json()["failed"] == ["leader"]


async def test_no_leader_says_for_how_long_and_how_many_candidates_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.delete(KEYS.leader)
    await r.hset(KEYS.leader_state, "renewed_ms", NOW - 42_000)
    check = (await diagnose(r, app)).check("leader")
    assert check.status == "fail" and "no leader for 42.0s" in check.summary
    assert "1 live candidates cannot acquire it" in check.summary
    assert check.data["candidates"] == ["leader-1"]
    await r.hset(KEYS.leader_state, "renewed_ms", "1e+400")  # unreadable: no duration, no crash
    check = (await diagnose(r, app)).check("leader")
    assert check.status == "fail" and "no leader:" in check.summary


@pytest.mark.parametrize("counter", ["1e+20", "99999999999999999999", "100000000000000"])
async def test_a_malformed_epoch_counter_fails_epochs_without_a_crash(r: Any, counter: str) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.set(KEYS.leader_epoch, counter)
    check = (await diagnose(r, app)).check("epochs")
    assert check.status == "fail" and "not an epoch the framework issues" in check.summary


async def test_neighbours_fail_when_the_prefix_is_listened_on_from_another_database(
    r: Any,
) -> None:
    app = make_app()
    await seed_healthy(r, app)
    assert (await diagnose(r, app)).check("neighbours").status == "ok"
    ours, theirs, other = r.pubsub(), r.pubsub(), r.pubsub()
    try:
        await ours.subscribe(KEYS.leader_channel, KEYS.wake)  # this app: no neighbour
        await other.subscribe("t:wakeful", "tx:wake@db2")  # another prefix: no neighbour
        assert (await diagnose(r, app)).check("neighbours").status == "ok"
        await theirs.subscribe("t:leader:released@db2")  # the same prefix in database 2
        check = (await diagnose(r, app)).check("neighbours")
        assert check.status == "fail" and check.details == ["listening on t:leader:released@db2"]
    finally:
        for p in (ours, theirs, other):
            await p.aclose()
    snap = dataclasses.replace(await doctor.gather(r, KEYS, app, now_ms=NOW), neighbours=None)
    assert doctor.judge(snap, app, LIMITS).check("neighbours").status == "warn"


async def test_a_lock_nobody_reports_and_two_claimants_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.set(KEYS.leader, "5:other", px=8000)
    await r.set(KEYS.leader_epoch, 5)
    report = await diagnose(r, app)
    assert report.check("leader").status == "fail"
    assert "no live instance reports leading" in report.check("leader").summary
    assert report.check("epochs").status == "fail"  # leader-1 still says epoch 4
    await register(r, "leader-2-ccc", "leader-2", "leader", is_leader=True, epoch=5)
    report = await diagnose(r, app)
    assert "2 live instances report leading" in report.check("leader").summary
    await r.persist(KEYS.leader)
    assert "no expiry" in (await diagnose(r, app)).check("leader").summary


async def test_an_epoch_above_the_counter_fails(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.set(KEYS.leader_epoch, 3)
    check = (await diagnose(r, app)).check("epochs")
    assert check.status == "fail" and "above the epoch counter (3)" in check.summary
    await r.delete(KEYS.leader_epoch)
    assert (await diagnose(r, app)).check("epochs").status == "fail"


async def test_an_evicting_redis_fails_unless_allowed(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    snap = await doctor.gather(r, KEYS, app, now_ms=NOW)
    evicting = dataclasses.replace(snap, policy="allkeys-lru")
    check = doctor.judge(evicting, app, LIMITS).check("eviction")
    assert check.status == "fail" and "allkeys-lru" in check.summary
    allowed = dataclasses.replace(LIMITS, allow_eviction=True)
    assert doctor.judge(evicting, app, allowed).check("eviction").status == "warn"
    good = dataclasses.replace(snap, policy="noeviction")
    assert doctor.judge(good, app, LIMITS).check("eviction").status == "ok"


async def test_durability_fails_without_the_replicas_the_policy_counts_on(r: Any) -> None:
    from worker.core.redisurl import Replication

    app = make_app()
    await seed_healthy(r, app)
    snap = dataclasses.replace(await doctor.gather(r, KEYS, app, now_ms=NOW), attached_replicas=0)
    assert doctor.judge(snap, app, LIMITS).check("durability").status == "ok"  # no WAIT
    auto = dataclasses.replace(LIMITS, replication=Replication(1, 500, adaptive=True))
    check = doctor.judge(snap, app, auto).check("durability")
    assert check.status == "fail" and "go on unconfirmed" in check.summary
    strict = dataclasses.replace(LIMITS, replication=Replication(1, 500))
    check = doctor.judge(snap, app, strict).check("durability")
    assert check.status == "fail" and "NotReplicated" in check.summary
    one = dataclasses.replace(snap, attached_replicas=1)
    assert doctor.judge(one, app, auto).check("durability").status == "ok"
    assert doctor.judge(one, app, strict).check("durability").status == "ok"


async def test_stale_instances_are_listed(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await register(r, "consumer-2-ddd", "consumer-2", "consumer", age_ms=15_000)
    await r.zadd(KEYS.instances, {"consumer-3-eee": NOW - 3_000})  # record expired
    check = (await diagnose(r, app)).check("heartbeats")
    assert check.status == "fail"
    assert "2 of 4 registered instances stopped heartbeating" in check.summary
    assert check.details == [
        "consumer-2 (consumer-2-ddd): last heartbeat 15.0s ago",
        "consumer-3-eee (consumer-3-eee): last heartbeat 3.0s ago, record expired",
    ]
    # the sorted set emptied (a reaper misjudging live instances): their records still count
    await r.delete(KEYS.instances)
    check = (await diagnose(r, app)).check("heartbeats")
    assert check.data["registered"] == 3 and check.data["stale"] == ["consumer-2-ddd"]
    await r.delete(*await r.keys(KEYS.instance("*")))
    assert "no instance is registered" in (await diagnose(r, app)).check("heartbeats").summary


async def test_mixed_versions_and_a_foreign_app_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await register(r, "consumer-2-ddd", "consumer-2", "consumer", version="0.0.1")
    check = (await diagnose(r, app)).check("versions")
    assert check.status == "fail" and "version 0.0.1: consumer-2" in check.details
    await register(r, "consumer-2-ddd", "consumer-2", "consumer", app="billing")
    await register(r, "consumer-1-bbb", "consumer-1", "consumer", app="billing")
    await register(r, "leader-1-aaa", "leader-1", "leader", app="billing", is_leader=True, epoch=4)
    check = (await diagnose(r, app)).check("versions")
    assert check.status == "fail" and "'billing'" in check.summary and "'shop'" in check.summary


async def test_clock_skew_fails_only_beyond_the_bound(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await register(r, "consumer-2-ddd", "consumer-2", "consumer", clock_offset_ms=-1500.0)
    check = (await diagnose(r, app)).check("clock-skew")
    assert check.status == "fail" and check.data["spread_ms"] == 1503.0
    assert check.details == ["consumer-2 (consumer-2-ddd): -1500 ms ± 0 ms"]
    # the same spread measured over slow round trips may be within the limit: not proven
    await register(
        r, "consumer-2-ddd", "consumer-2", "consumer", clock_offset_ms=-1500.0, clock_rtt_ms=1200
    )
    assert (await diagnose(r, app)).check("clock-skew").status == "ok"
    # one instance alone (the leader) 30 s off the Redis clock: no spread, still a failure
    await r.delete(KEYS.instances, *await r.keys(KEYS.instance("*")))
    await register(r, "leader-1-aaa", "leader-1", "leader", clock_offset_ms=-30_000.0)
    check = (await diagnose(r, app)).check("clock-skew")
    assert check.status == "fail" and check.data["spread_ms"] == 0
    assert check.details == ["leader-1 (leader-1-aaa): -30000 ms ± 0 ms"]
    # instances that never measured (first heartbeat, older versions): a warning
    for i in ("leader-1-aaa", "consumer-1-bbb", "consumer-2-ddd"):
        await register(r, i, i, "consumer", clock_offset_ms=None)
    assert (await diagnose(r, app)).check("clock-skew").status == "warn"


async def test_failing_dependency_checks_fail_readiness(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await register(
        r, "consumer-1-bbb", "consumer-1", "consumer", ready=False, unready=["check db: OSError"]
    )
    check = (await diagnose(r, app)).check("readiness")
    assert check.status == "fail" and check.details == ["consumer-1: check db: OSError"]


async def test_overdue_periodic_jobs_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.hset(KEYS.periodic_state, "order_expire", NOW - 120_000)  # two ticks behind
    await r.hdel(KEYS.periodic_state, "sync")
    check = (await diagnose(r, app)).check("periodic-schedule")
    assert check.status == "fail" and "2 of 2 periodic jobs" in check.summary
    assert check.details[0].startswith("order_expire: last tick")
    assert check.details[1] == "sync: no tick ever recorded (no leader has run this job)"
    # a tick due a moment ago is not overdue yet
    latest = app.periodics["order_expire"].schedule.latest(NOW)
    await r.hset(KEYS.periodic_state, "order_expire", latest - 60_000)
    await r.hset(KEYS.periodic_state, "sync", app.periodics["sync"].schedule.latest(NOW))
    grace = dataclasses.replace(LIMITS, tick_grace_s=3600)
    assert (await diagnose(r, app, grace)).check("periodic-schedule").status == "ok"


async def test_periodic_staleness_and_failures(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    store = Store(r, KEYS)
    # a failure after the last success, within max_staleness: a warning naming the error
    failure = {"at_ms": NOW - 5_000, "tick_ms": NOW - 10_000, "instance": "c1", "error": "OSError"}
    await store.periodic_result("order_expire", "failure", failure, NOW - 5_000)
    check = (await diagnose(r, app)).check("periodic-success")
    assert check.status == "warn" and "OSError" in check.details[0]
    # the last success older than max_staleness (600 s): fails
    old = {"at_ms": NOW - 700_000, "tick_ms": NOW - 720_000}
    await store.periodic_result("order_expire", "success", old, NOW - 700_000)
    await store.periodic_result("order_expire", "failure", failure, NOW - 5_000)
    check = (await diagnose(r, app)).check("periodic-success")
    assert check.status == "fail"
    assert check.details[0].startswith("order_expire: last success 700s ago (max_staleness 600s)")
    # never succeeded, failing for longer than max_staleness: fails too
    await r.delete(KEYS.periodic_runs)
    await store.periodic_result("order_expire", "failure", failure, NOW - 900_000)
    await store.periodic_result("order_expire", "failure", failure, NOW - 5_000)
    check = (await diagnose(r, app)).check("periodic-success")
    assert check.status == "fail" and "failing for 900s" in check.details[0]


async def test_lagging_pollers_and_queue_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.zadd(KEYS.poll_shard("cards", 1), {"c": NOW - 90_000})
    await r.zadd(KEYS.queue, {"job-0": NOW - 120_000})
    report = await diagnose(r, app)
    assert report.check("pollers").status == "fail"
    assert report.check("pollers").details == ["cards: oldest due item waits 90s"]
    assert report.check("queue-lag").status == "fail"
    assert "120s" in report.check("queue-lag").summary


async def test_dead_letters_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.zadd(KEYS.dead, {"d1": NOW - 1, "d2": NOW - 2})
    check = (await diagnose(r, app)).check("dead-letters")
    assert check.status == "fail" and check.summary.startswith("2 dead-lettered jobs")


async def test_holds_of_unregistered_instances_fail(r: Any) -> None:
    app = make_app()
    await seed_healthy(r, app)
    await r.sadd(KEYS.holds("gone-1-fff"), "job-3", "job-4")
    check = (await diagnose(r, app)).check("orphaned-holds")
    assert check.status == "fail" and check.details == ["gone-1-fff: 2 jobs"]


def test_holds_owner_parses_ids_with_colons() -> None:
    assert KEYS.holds_owner(KEYS.holds("a:b-123")) == "a:b-123"
    assert KEYS.holds_owner(KEYS.instance("a")) is None
    assert KEYS.holds_owner("t:instance::jobs") is None


@pytest.mark.parametrize("name", [c.__name__ for c in doctor.CHECKS])
def test_every_check_is_documented(name: str) -> None:
    fn = next(c for c in doctor.CHECKS if c.__name__ == name)
    assert fn.__doc__, name
