"""The demo does what its docstring and the README claim: its SIM-card duties, run for real.

The slow test runs ``python -m worker`` with the demo app (an ``all`` process and a
``consumer``) against the test server with small ``DEMO_*`` knobs and checks, on the demo's
Redis keys: cards loaded once (and not again by a new leader), each card polled about every
``DEMO_POLL_EVERY_S`` seconds, periodic jobs ticking (the resets on their real cron cadence),
a config change broadcast reaching every process and changing the polling, resets once per
period, and the report line. The fast tests pin the schedules and the config format.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from statistics import mean
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, client_call, wait_until
from worker import demo
from worker.core.ids import LockValue
from worker.core.schedule import Cron

N_CARDS = 60
EVERY_S = 3.0
DEMO_ENV = {
    "DEMO_CARDS": str(N_CARDS),
    "DEMO_BATCH": "25",
    "DEMO_POLL_EVERY_S": str(EVERY_S),
    "DEMO_REPORT_EVERY_S": "2",
}
SHANGHAI = ZoneInfo("Asia/Shanghai")


# ---------------------------------------------------------------------------------------------
# What the demo declares
# ---------------------------------------------------------------------------------------------


def test_the_demo_declares_seed_002s_duties() -> None:
    app = demo.app
    assert set(app.periodics) == {
        "order_expire",
        "alert_check",
        "data_cleanup",
        "daily_traffic_flush",
        "package_activation_check",
        "daily_usage_reset",
        "monthly_usage_reset",
        "yearly_usage_reset",
        "demo_report",
    }
    assert {"poll_card", "set_poll_interval", "activate_package"} <= set(app.tasks)
    assert list(app.initializers) == ["load_cards"] and list(app.pollers) == ["cards"]
    assert [(h.topic, h.fn) for h in app.broadcasts] == [("poll-config", demo.apply_poll_config)]
    assert demo.load_poll_config in app.startup_hooks


@pytest.mark.parametrize(
    ("job", "after", "expected"),
    [
        # 00:00 Shanghai is 16:00 UTC the day before
        ("daily_usage_reset", "2026-03-14 12:00", "2026-03-15 00:00"),
        ("monthly_usage_reset", "2026-03-14 12:00", "2026-04-01 00:00"),
        ("yearly_usage_reset", "2026-03-14 12:00", "2027-01-01 00:00"),
        ("daily_traffic_flush", "2026-03-14 12:00", "2026-03-15 03:00"),
        ("data_cleanup", "2026-03-14 12:00", "2026-03-15 04:00"),
    ],
)
def test_resets_and_flushes_run_on_their_cron_cadence_in_shanghai(
    job: str, after: str, expected: str
) -> None:
    p = demo.app.periodics[job]
    assert isinstance(p.schedule, Cron)
    at = dt.datetime.fromisoformat(after).replace(tzinfo=SHANGHAI)
    nxt = p.schedule.next(int(at.timestamp() * 1000))
    assert dt.datetime.fromtimestamp(nxt / 1000, SHANGHAI) == dt.datetime.fromisoformat(
        expected
    ).replace(tzinfo=SHANGHAI)
    if job.endswith("usage_reset"):
        assert p.catch_up == "latest"  # after an outage: one reset, not one per missed period


def test_usage_periods_are_named_in_shanghai_time() -> None:
    tick = dt.datetime(2026, 2, 28, 16, 0, tzinfo=dt.UTC)  # 2026-03-01 00:00 in Shanghai
    assert demo.usage_period("daily", tick) == "2026-03-01"
    assert demo.usage_period("monthly", tick) == "2026-03"
    assert demo.usage_period("yearly", tick) == "2026"


def test_poll_config_round_trips() -> None:
    config = demo.PollConfig.from_hash({b"version": b"3", b"iot": b"5.0", b"standard": b"30"})
    assert config.version == 3 and config.interval("iot") == 5.0
    assert config.interval("vehicle") == demo.POLL_EVERY_S  # a type not configured yet
    assert demo.PollConfig.from_data(config.data()) == config


# ---------------------------------------------------------------------------------------------
# The demo, run for real
# ---------------------------------------------------------------------------------------------


def hash_ints(r: redis_sync.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(float(v)) for k, v in r.hgetall(key).items()}


def applied(r: redis_sync.Redis, prefix: str, name: str) -> int | None:
    """The config version the process named ``name`` applied (its instance id is name-…)."""
    for instance, version in hash_ints(r, f"{prefix}demo:config-applied").items():
        if instance.startswith(f"{name}-"):
            return version
    return None


def leader_name(r: redis_sync.Redis, prefix: str) -> str | None:
    lock = LockValue.parse(r.get(f"{prefix}leader"))
    if lock is None:
        return None
    for raw in r.mget(
        [f"{prefix}instance:{i.decode()}" for i in r.zrange(f"{prefix}instances", 0, -1)]
    ):
        record = json.loads(raw) if raw else {}
        if record.get("is_leader") and record.get("epoch") == lock.epoch:
            return str(record.get("name"))
    return None


def last_midnights(now: dt.datetime) -> dict[str, int]:
    """The latest daily, monthly and yearly reset instants at ``now`` (epoch ms)."""
    local = now.astimezone(SHANGHAI).replace(hour=0, minute=0, second=0, microsecond=0)
    return {
        "daily_usage_reset": int(local.timestamp() * 1000),
        "monthly_usage_reset": int(local.replace(day=1).timestamp() * 1000),
        "yearly_usage_reset": int(local.replace(month=1, day=1).timestamp() * 1000),
    }


def reports(*procs: WorkerProc) -> list[dict[str, Any]]:
    return [e for p in procs for e in p.events() if e.get("event") == "demo report"]


@pytest.mark.slow
def test_the_demo_does_what_it_claims(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    run_demo(spawn, rsync, redis_url, spawn.prefix)  # type: ignore[attr-defined]


def run_demo(
    spawn: Spawn,
    rsync: redis_sync.Redis,
    redis_url: str,
    prefix: str,
    env: dict[str, str | None] | None = None,
) -> None:
    """The demo, run for real with ``spawn`` on ``redis_url`` under key ``prefix``; ``rsync``
    reads the app's keys (tests/system/test_cluster.py runs it on a Redis Cluster)."""
    demo_env = {**DEMO_ENV, "WORKER_KEY_PREFIX": prefix, **(env or {})}

    def key(name: str) -> str:
        return f"{prefix}demo:{name}"

    started = dt.datetime.now(dt.UTC)
    main = spawn("all", name="all-1", app="worker.demo:app", env=demo_env)
    consumer = spawn("consumer", name="consumer-1", app="worker.demo:app", env=demo_env)

    # The initializer loaded the cards once, in batches, each batch cached and queued.
    wait_until(
        lambda: rsync.hget(f"{prefix}init:load_cards", "done") == b"1",
        timeout=30,
        what="the initializer to finish",
    )
    init = {k.decode(): v.decode() for k, v in rsync.hgetall(f"{prefix}init:load_cards").items()}
    # three batches of 25, 25 and 10, then the final checkpoint
    assert (init["version"], init["items"], init["batches"]) == ("cards-v2", "60", "4")
    cache = {k.decode(): json.loads(v) for k, v in rsync.hgetall(key("cards")).items()}
    assert len(cache) == N_CARDS
    assert {c["type"] for c in cache.values()} == set(demo.CARD_TYPES)
    assert hash_ints(rsync, key("stats"))["cards_read"] == N_CARDS

    # Every process loaded the config at start (version 1, DEMO_POLL_EVERY_S for every type).
    assert hash_ints(rsync, key("poll-config")) == {
        "version": 1,
        "standard": 3,
        "iot": 3,
        "vehicle": 3,
    }
    wait_until(lambda: applied(rsync, prefix, "consumer-1") == 1, timeout=10, what="config")
    assert applied(rsync, prefix, "all-1") == 1

    # Each card is polled about every DEMO_POLL_EVERY_S seconds.
    wait_until(
        lambda: len(hash_ints(rsync, key("polls"))) == N_CARDS,
        timeout=2 * EVERY_S + 10,
        what="every card polled once",
    )
    window = 6.0  # two polls per card expected
    before = hash_ints(rsync, key("polls"))
    time.sleep(window)
    after = hash_ints(rsync, key("polls"))
    deltas = [after[c] - before[c] for c in cache]
    assert window / EVERY_S * 0.6 <= mean(deltas) <= window / EVERY_S * 1.1, deltas
    assert min(deltas) >= 1 and max(deltas) <= window / EVERY_S + 2, deltas

    # A config change is broadcast to every process, which polls iot cards faster from then on.
    assert client_call(redis_url, prefix, "enqueue", "set_poll_interval", "iot", 1)
    for name in ("all-1", "consumer-1"):
        wait_until(lambda n=name: applied(rsync, prefix, n) == 2, timeout=10, what=f"{name}: v2")
    assert hash_ints(rsync, key("poll-config"))["iot"] == 1
    before = hash_ints(rsync, key("polls"))
    time.sleep(6.0)  # iot cards polled ~6 times, the others ~2
    after = hash_ints(rsync, key("polls"))
    iot = [after[c] - before[c] for c, card in cache.items() if card["type"] == "iot"]
    other = [after[c] - before[c] for c, card in cache.items() if card["type"] != "iot"]
    assert mean(iot) >= 1.4 * mean(other), (iot, other)

    # Periodic jobs tick: every job has a recorded last tick, the resets at their last
    # midnight in Shanghai (daily, 1st of the month, 1 January); the 10 s check ran.
    last = hash_ints(rsync, f"{prefix}periodic:last")
    assert set(last) == set(demo.app.periodics)
    now = dt.datetime.now(dt.UTC)
    for job in ("daily_usage_reset", "monthly_usage_reset", "yearly_usage_reset"):
        assert last[job] in {last_midnights(started)[job], last_midnights(now)[job]}, job
    wait_until(
        lambda: hash_ints(rsync, key("stats")).get("packages_activated"),
        timeout=15,
        what="package activation",
    )

    # A reset runs once per period however often it is started (mutex + ctx.once).
    jobs = [client_call(redis_url, prefix, "enqueue", "daily_usage_reset") for _ in range(3)]
    assert all(jobs)
    wait_until(
        lambda: all(rsync.exists(f"arq:result:{j}") for j in jobs), timeout=15, what="resets"
    )
    assert hash_ints(rsync, key("stats")).get("daily_resets") == 1
    today = demo.usage_period("daily", dt.datetime.now(dt.UTC))
    assert rsync.exists(f"{prefix}once:usage-reset:daily:{today}")

    # The report line, from whichever consumer ran it.
    report = wait_until(lambda: reports(main, consumer), timeout=10, what="a demo report")[-1]
    assert report["cards_cached"] == N_CARDS and report["cards_polled"] > 0
    assert report["poll_config_version"] in (1, 2) and "queue_depth" in report

    # A new leader does not load the cards again, and applies the current config at start.
    assert main.terminate() == 0, main.log()
    successor = spawn("all", name="all-2", app="worker.demo:app", env=demo_env)
    wait_until(lambda: leader_name(rsync, prefix) == "all-2", timeout=30, what="a new leader")
    assert applied(rsync, prefix, "all-2") == 2
    polled = sum(hash_ints(rsync, key("polls")).values())
    wait_until(
        lambda: sum(hash_ints(rsync, key("polls")).values()) > polled + N_CARDS // 2,
        timeout=15,
        what="polling under the new leader",
    )
    assert hash_ints(rsync, key("stats"))["cards_read"] == N_CARDS
    init_now = {
        k.decode(): v.decode() for k, v in rsync.hgetall(f"{prefix}init:load_cards").items()
    }
    assert (init_now["items"], init_now["batches"]) == ("60", "4")
    for p in (consumer, successor):
        assert p.terminate() == 0, p.log()
    for p in (main, consumer, successor):
        assert "Traceback" not in p.log(), p.log()
