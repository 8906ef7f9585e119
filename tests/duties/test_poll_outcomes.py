"""What happens to a poll item when its job ends: success, failure, retries then dead-letter,
abort, removal by the app, and a job that ended without reporting (its record lost).

Unit tests drive the consumer's end hook and the leader's sweep on fakeredis and the real
server; the process tests run ``python -m worker`` on ``harness/apps/pollfail.py``.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from typing import Any

import pytest
import redis as redis_sync

from harness import FixedLease, Spawn, client_call, wait_until
from worker.core.clock import FakeClock
from worker.core.ids import JobIds
from worker.core.serializer import msgpack_dumps
from worker.duties.poller import SWEEP_GRACE_S, InflightHook, PollingScheduler
from worker.polls import PollerDef, shard_of
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("t:")
IDS = JobIds("t:")
LOCK = "5:mine"
NOW = 1_700_000_000_000
CARDS = PollerDef("cards", "poll_card", shards=1, failure_delay_s=30)
SHARD = KEYS.poll_shard("cards", 0)
INFLIGHT = KEYS.poll_inflight("cards")


async def in_flight(r: Any, item: str, due_ms: int = NOW) -> str:
    """The state right after a dispatch of ``item``: its job exists, the entry names it."""
    job_id = IDS.poll("cards", item, due_ms)
    await r.set(K.ARQ_JOB + job_id, b"payload")
    await r.hset(INFLIGHT, item, job_id)
    return job_id


async def finished(r: Any, job_id: str) -> None:
    """What FINISH does to a job that ended (success or failure): its record is deleted."""
    await r.delete(K.ARQ_JOB + job_id)


def hook(r: Any, clock: FakeClock) -> InflightHook:
    return InflightHook(Store(r, KEYS), {"cards": CARDS}, clock)


async def test_success_settles_the_item_failure_puts_it_back_retry_keeps_it(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    h = hook(r, clock)
    ok, bad, again = [await in_flight(r, i) for i in ("ok", "bad", "again")]

    await h.ended(again, ("again",), "retry")  # it runs again: still in flight
    assert await r.hget(INFLIGHT, "again") == again.encode()
    assert await r.zscore(SHARD, "again") is None

    await h.ended(ok, ("ok",), "success")  # the app rescheduled it or is done with it
    assert await r.hget(INFLIGHT, "ok") is None
    assert await r.zscore(SHARD, "ok") is None

    await h.ended(bad, ("bad",), "failure")
    assert await r.zscore(SHARD, "bad") == NOW + 30_000  # due failure_delay_s later
    # the entry stays: no dispatch while the failed job's record still exists
    assert await r.hget(INFLIGHT, "bad") == bad.encode()


async def test_failure_keeps_what_the_app_decided(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    h = hook(r, clock)
    cards = Store(r, KEYS)
    resched, removed, back = [await in_flight(r, i) for i in ("resched", "removed", "back")]
    await r.zadd(SHARD, {"resched": NOW + 5_000})  # the job rescheduled it, then raised
    assert await cards.unschedule_item(SHARD, "cards", "removed")  # removed while in flight
    assert await cards.unschedule_item(SHARD, "cards", "back")
    await r.zadd(SHARD, {"back": NOW + 7_000})  # ... and scheduled again

    for job_id, item in ((resched, "resched"), (removed, "removed"), (back, "back")):
        await h.ended(job_id, (item,), "failure")
    assert await r.zscore(SHARD, "resched") == NOW + 5_000
    assert await r.zscore(SHARD, "removed") is None
    assert await r.zscore(SHARD, "back") == NOW + 7_000
    # the removal mark stays with the entry, so the leader's sweep does not put it back either
    assert await r.hgetall(KEYS.poll_removed("cards")) == {b"removed": removed.encode()}
    for job_id in (resched, removed, back):
        await finished(r, job_id)
    await r.set(KEYS.leader, LOCK)
    s = sweeper(r, clock)
    await s.sweep()
    clock.advance(SWEEP_GRACE_S)
    assert await s.sweep() == 0
    assert await r.zscore(SHARD, "removed") is None
    assert await r.hlen(KEYS.poll_removed("cards")) == 0  # marks forgotten with their entry
    assert await r.hlen(INFLIGHT) == 0

    # another job carries the item now (dispatched after the first one's record was gone)
    old = await in_flight(r, "moved")
    newer = await in_flight(r, "moved", NOW + 1)
    await h.ended(old, ("moved",), "failure")
    assert await r.zscore(SHARD, "moved") is None
    assert await r.hget(INFLIGHT, "moved") == newer.encode()


async def test_remove_of_an_idle_item_forgets_it(r: Any) -> None:
    store = Store(r, KEYS)
    await r.zadd(SHARD, {"a": NOW})
    job_id = await in_flight(r, "b")
    await finished(r, job_id)  # an entry whose job is gone
    assert await store.unschedule_item(SHARD, "cards", "a")
    assert not await store.unschedule_item(SHARD, "cards", "b")
    assert not await store.unschedule_item(SHARD, "cards", "never")
    assert await r.exists(SHARD, INFLIGHT, KEYS.poll_removed("cards")) == 0


def sweeper(r: Any, clock: FakeClock, lock: str = LOCK) -> PollingScheduler:
    store = Store(r, KEYS)
    return PollingScheduler(
        CARDS, store, FencedStore(store, FixedLease(lock)), msgpack_dumps, clock
    )


async def test_sweep_puts_back_items_whose_job_ended_unreported(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    await r.set(KEYS.leader, LOCK)
    s = sweeper(r, clock)
    store = Store(r, KEYS)
    lost, live, waiting, removed = [
        await in_flight(r, i) for i in ("lost", "live", "waiting", "removed")
    ]
    await store.unschedule_item(SHARD, "cards", "removed")
    for job_id in (lost, waiting, removed):
        await finished(r, job_id)  # dead-lettered before running, record expired, ...
    await r.zadd(SHARD, {"waiting": NOW + 9_000})

    assert await s.sweep() == 0  # first sighting: the consumer may be reporting right now
    clock.advance(SWEEP_GRACE_S - 1)
    assert await s.sweep() == 0
    clock.advance(1)
    assert await s.sweep() == 1
    assert await r.zrange(SHARD, 0, -1, withscores=True) == [
        (b"waiting", NOW + 9_000),
        (b"lost", NOW + (SWEEP_GRACE_S + 30) * 1000),
    ]
    assert await r.hgetall(INFLIGHT) == {b"live": live.encode()}
    assert await r.hlen(KEYS.poll_removed("cards")) == 0


async def test_sweep_ignores_an_entry_settled_during_its_grace(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    await r.set(KEYS.leader, LOCK)
    s = sweeper(r, clock)
    first = await in_flight(r, "a")
    await finished(r, first)
    assert await s.sweep() == 0
    await r.hdel(INFLIGHT, "a")  # the success report lands: the item is done
    clock.advance(SWEEP_GRACE_S)
    assert await s.sweep() == 0
    assert await r.zcard(SHARD) == 0
    # dispatched again meanwhile: the new job's entry is a new suspect, not a ripe one
    second = await in_flight(r, "a", NOW + 1)
    await finished(r, second)
    assert await s.sweep() == 0
    assert await r.hget(INFLIGHT, "a") == second.encode()


async def test_sweep_skips_an_entry_no_dispatch_wrote(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    await r.set(KEYS.leader, LOCK)
    s = sweeper(r, clock)
    await r.hset(INFLIGHT, b"\xff\xfe", b"\xc3\x28")  # not UTF-8
    await finished(r, await in_flight(r, "lost"))
    await s.sweep()
    clock.advance(SWEEP_GRACE_S)
    assert await s.sweep() == 1  # the others are swept as ever
    assert await r.hgetall(INFLIGHT) == {b"\xff\xfe": b"\xc3\x28"}


async def test_sweep_is_fenced(r: Any) -> None:
    clock = FakeClock(NOW / 1000)
    await r.set(KEYS.leader, "6:other")
    s = sweeper(r, clock)
    await finished(r, await in_flight(r, "a"))
    await s.sweep()
    clock.advance(SWEEP_GRACE_S)
    with pytest.raises(Exception, match="FENCED"):
        await s.sweep()
    assert await r.zcard(SHARD) == 0


# -- real processes ---------------------------------------------------------------------------

APP = "harness.apps.pollfail:app"


def schedule(r: redis_sync.Redis, prefix: str, poller: str, *items: str, shards: int = 2) -> None:
    """What ``BoundPoller.schedule(item)`` writes: each item due now in its shard."""
    keys = K.Keys(prefix)
    now_ms = int(time.time() * 1000)
    for item in items:
        r.zadd(keys.poll_shard(poller, shard_of(item, shards)), {item: now_ms})


def runs(r: redis_sync.Redis, prefix: str) -> dict[str, list[dict[str, Any]]]:
    """Item -> its recorded runs, in order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for raw in r.lrange(f"{prefix}pf:runs", 0, -1):
        run = json.loads(raw)
        out[run["item"]].append(run)
    return out


def jobs_of(item_runs: list[dict[str, Any]]) -> list[str]:
    """The distinct jobs that carried an item, in order."""
    return list(dict.fromkeys(run["job_id"] for run in item_runs))


def waiting(r: redis_sync.Redis, prefix: str, poller: str, item: str, shards: int = 2) -> bool:
    return r.zscore(K.Keys(prefix).poll_shard(poller, shard_of(item, shards)), item) is not None


@pytest.mark.slow
def test_a_failing_poll_job_puts_its_item_back_after_the_delay(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    w = spawn("all", app=APP, env={"POLLFAIL_DELAY_S": "1.5"})
    fails = [f"fail-{n}" for n in range(20)]
    schedule(rsync, prefix, "items", *fails, "done-0")

    def each_failed_three_times() -> bool:
        seen = runs(rsync, prefix)
        return all(len(jobs_of(seen[i])) >= 3 for i in fails)

    wait_until(each_failed_three_times, timeout=45, what=f"3 jobs per failing item\n{w.log()}")
    seen = runs(rsync, prefix)
    for item in fails:
        starts = [run["t"] for run in seen[item]]
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert min(gaps) >= 1.5 - 0.05, (item, gaps)  # the backoff, not a hot loop
    # success without a reschedule: the app is done with the item, it is not polled again
    assert len(seen["done-0"]) == 1
    assert not waiting(rsync, prefix, "items", "done-0")


@pytest.mark.slow
def test_retries_come_first_then_the_dead_lettered_job_puts_its_item_back(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    w = spawn("all", app=APP, env={"POLLFAIL_DELAY_S": "1"})
    schedule(rsync, prefix, "flaky", "f-0", "f-1", shards=1)
    wait_until(
        lambda: all(len(jobs_of(runs(rsync, prefix)[i])) >= 2 for i in ("f-0", "f-1")),
        timeout=45,
        what=f"a second job per item after the first one was dead-lettered\n{w.log()}",
    )
    dead = {j.decode() for j in rsync.zrange(K.Keys(prefix).dead, 0, -1)}
    for item in ("f-0", "f-1"):
        item_runs = runs(rsync, prefix)[item]
        first = jobs_of(item_runs)[0]
        assert [r["try"] for r in item_runs if r["job_id"] == first] == [1, 2, 3]
        assert first in dead
        second_start = next(r["t"] for r in item_runs if r["job_id"] != first)
        assert second_start - item_runs[2]["t"] >= 1 - 0.05


@pytest.mark.slow
def test_an_aborted_poll_job_puts_its_item_back(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    w = spawn("all", app=APP, env={"POLLFAIL_DELAY_S": "1"})
    schedule(rsync, prefix, "items", "slow-0")
    wait_until(lambda: runs(rsync, prefix)["slow-0"], timeout=30, what=f"slow-0 runs\n{w.log()}")
    first = runs(rsync, prefix)["slow-0"][0]["job_id"]
    client_call(redis_url, prefix, "abort", first)
    wait_until(
        lambda: len(jobs_of(runs(rsync, prefix)["slow-0"])) >= 2,
        timeout=30,
        what=f"a new job for slow-0 after the abort\n{w.log()}",
    )


@pytest.mark.slow
def test_an_item_the_app_removed_is_not_put_back_by_its_failing_job(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    w = spawn("all", app=APP, env={"POLLFAIL_DELAY_S": "0.5"})
    keys = K.Keys(prefix)
    schedule(rsync, prefix, "items", "gone-0")
    wait_until(lambda: runs(rsync, prefix)["gone-0"], timeout=30, what=f"gone-0 runs\n{w.log()}")
    # the leader's sweep forgets its in-flight entry (after its grace), without putting it back
    wait_until(
        lambda: not rsync.hexists(keys.poll_inflight("items"), "gone-0"),
        timeout=SWEEP_GRACE_S + 30,
        what=f"gone-0's in-flight entry forgotten\n{w.log()}",
    )
    time.sleep(1.5)  # three of its failure delays
    assert len(runs(rsync, prefix)["gone-0"]) == 1
    assert not waiting(rsync, prefix, "items", "gone-0")
    assert rsync.hlen(keys.poll_removed("items")) == 0


@pytest.mark.slow
def test_an_item_whose_job_record_was_lost_is_put_back(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """The job of ``ok-lost`` waits behind the only slot, busy 5 s; its record is deleted
    (evicted, expired); the consumer dead-letters it as expired without reporting to the
    poller."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    env = {"POLLFAIL_DELAY_S": "0.5", "POLLFAIL_SLOW_S": "5", "WORKER_CONCURRENCY": "1"}
    env["WORKER_DUTY_SLOTS"] = "0"  # no duty lane: the poll job queues behind the one slot
    w = spawn("all", app=APP, env=env)
    schedule(rsync, prefix, "items", "slow-0")
    wait_until(lambda: runs(rsync, prefix)["slow-0"], timeout=30, what=f"slow-0 runs\n{w.log()}")
    schedule(rsync, prefix, "items", "ok-lost")
    job = wait_until(
        lambda: rsync.hget(keys.poll_inflight("items"), "ok-lost"), timeout=30, what="dispatch"
    ).decode()
    assert rsync.delete(K.ARQ_JOB + job) == 1
    wait_until(
        lambda: job in {j.decode() for j in rsync.zrange(keys.dead, 0, -1)},
        timeout=30,
        what=f"the expired job dead-lettered\n{w.log()}",
    )
    wait_until(
        lambda: runs(rsync, prefix)["ok-lost"],
        timeout=SWEEP_GRACE_S + 30,
        what=f"ok-lost polled after all\n{w.log()}",
    )
    assert job not in jobs_of(runs(rsync, prefix)["ok-lost"])
