"""Roles with real processes: consumers never run singleton duties, leaders do; poll items,
periodic ticks and a crashing component, asserted on the ledger app's Redis ledgers."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, WorkerProc, ledger, wait_until
from harness.apps.ledger import app as ledger_app
from worker.client import Client
from worker.core.clock import ms
from worker.storage import keys as K

pytestmark = pytest.mark.timeout(120)

SINGLETONS = {
    "leader-election", "initializer:seed", "poller:items", "periodic", "schedules",
    "orphan-reaper", "queue-metrics", "unannounced-jobs",
}  # fmt: skip
EVERYWHERE = {"consumer", "heartbeat"}


def start_event(proc: WorkerProc) -> dict[str, Any] | None:
    """The start-up event (it lists the enabled and disabled components)."""
    return next((e for e in proc.events() if e.get("event") == "worker starting"), None)


def wait_started(proc: WorkerProc, timeout: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        assert proc.alive(), f"{proc.name} exited early:\n{proc.log()}"
        return start_event(proc)

    return wait_until(check, timeout, what=f"{proc.name} to start")  # type: ignore[no-any-return]


def shard_keys(prefix: str) -> list[str]:
    keys = K.Keys(prefix)
    return [keys.poll_shard("items", s) for s in range(ledger_app.pollers["items"].shards)]


def shard_key(prefix: str, item: str) -> str:
    return K.Keys(prefix).poll_shard("items", ledger_app.pollers["items"].shard_of(item))


async def _with_client(url: str, prefix: str, fn: Any) -> Any:
    client = await Client.connect(url, app=ledger_app, key_prefix=prefix)
    try:
        return await fn(client)
    finally:
        await client.close()


def with_client(url: str, prefix: str, fn: Any) -> Any:
    """Run ``await fn(client)`` with a :class:`worker.Client` for the test's key prefix."""
    return asyncio.run(_with_client(url, prefix, fn))


def assert_consecutive_ticks(ticks: dict[str, int], at_least: int) -> list[int]:
    assert len(ticks) >= at_least, ticks
    stamps = sorted(int(t) for t in ticks)
    gaps = {b - a for a, b in itertools.pairwise(stamps)}
    assert gaps == {1000}, f"ticks are not consecutive seconds: {stamps}"
    assert set(ticks.values()) == {1}, f"a tick ran more than once: {ticks}"
    return stamps


# -- plan -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["consumer", "leader", "all"])
def test_plan_needs_no_redis(cli: CliRun, role: str) -> None:
    env = {
        "WORKER_APP": "harness.apps.ledger:app",
        # unresolvable host: any connection attempt would fail or hang
        "WORKER_REDIS_URL": "redis://no-such-redis-host.invalid:6379/0",
        "WORKER_REDIS_CONNECT_TIMEOUT_S": "30",
    }
    if role == "all":
        del env["WORKER_REDIS_URL"]  # and no embedded server either
    started = time.monotonic()
    proc = cli("plan", "--role", role, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 20
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["role"] == role
    enabled = set(lines["enabled"].split(", "))
    disabled = set(lines["disabled"].split(", ")) - {"-"}
    assert enabled >= EVERYWHERE
    if role == "consumer":
        assert disabled >= SINGLETONS
        assert not enabled & SINGLETONS
    else:
        assert enabled >= SINGLETONS
        assert disabled == set()


# -- consumer vs leader ---------------------------------------------------------------------------


@pytest.mark.slow
def test_consumer_alone_runs_no_singletons_then_leader_does(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    consumer = spawn("consumer", name="c1")
    event = wait_started(consumer)
    assert event["role"] == "consumer"
    assert set(event["disabled"]) >= SINGLETONS
    assert not SINGLETONS & set(event["enabled"])
    assert set(event["enabled"]) >= EVERYWHERE

    # a due poll item that only a leader would dispatch
    rsync.zadd(shard_key(prefix, "lonely"), {"lonely": ms(time.time()) - 1000})
    # the consumer is live and consuming: a plain task runs
    wait_until(lambda: rsync.zcard(keys.instances) == 1, 20, what="c1 to register")
    with_client(redis_url, prefix, lambda c: c.enqueue("record", "consumer-alive"))
    wait_until(
        lambda: ledger(rsync, prefix, "records").get("consumer-alive") == 1,
        20,
        what="the consumer to run a task",
    )

    time.sleep(4.0)  # several periodic intervals and poll intervals with only a consumer
    assert consumer.alive()
    assert not rsync.exists(keys.leader), "a consumer took the leader lock"
    assert not rsync.exists(keys.leader_epoch), "a consumer campaigned"
    assert not rsync.exists(keys.periodic_state), "a consumer ran the periodic enqueuer"
    assert not rsync.exists(f"{prefix}ledger:ticks"), "ticks ran without a leader"
    assert not rsync.exists(keys.init_state("seed")), "a consumer ran the initializer"
    assert rsync.zscore(shard_key(prefix, "lonely"), "lonely") is not None, "item dispatched"
    assert not rsync.exists(f"{prefix}ledger:items")
    assert not rsync.exists(keys.poll_inflight("items"))

    # a leader joins: it takes the lock and the singleton duties start
    leader = spawn("leader", name="l1")
    event = wait_started(leader)
    assert event["disabled"] == []
    assert set(event["enabled"]) >= SINGLETONS | EVERYWHERE
    lock = wait_until(lambda: rsync.get(keys.leader), 20, what="the leader lock")
    assert lock.decode().split(":", 1)[0] == rsync.get(keys.leader_epoch).decode()
    wait_until(lambda: len(ledger(rsync, prefix, "ticks")) >= 2, 20, what="ticks under a leader")
    wait_until(
        lambda: ledger(rsync, prefix, "items").get("lonely") == 1,
        20,
        what="the leader to dispatch the waiting item",
    )
    assert rsync.hget(keys.init_state("seed"), "done") == b"1"
    assert rsync.get(keys.leader) == lock, "the lease changed hands with one leader"


# -- poll items -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_items_handled_exactly_once(spawn: Spawn, rsync: redis_sync.Redis, redis_url: str) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    spawn("leader", name="l1", env={"WORKER_CONCURRENCY": "1"})
    spawn("consumer", name="c1")
    wait_until(lambda: rsync.get(keys.leader), 30, what="the leader lock")
    wait_until(lambda: rsync.zcard(keys.instances) == 2, 30, what="both processes registered")

    via_client = [f"client-{n:03d}" for n in range(60)]
    with_client(redis_url, prefix, lambda c: c.poller("items").schedule_many(via_client, delay=0.0))
    now = ms(time.time())
    via_zadd = [f"zadd-{n:03d}" for n in range(30)]
    for n, item in enumerate(via_zadd):
        rsync.zadd(shard_key(prefix, item), {item: now - n})
    # an item due later must wait for its time
    later_at = time.time() + 3
    with_client(redis_url, prefix, lambda c: c.poller("items").schedule("later", at=later_at))

    expected = set(via_client) | set(via_zadd)
    wait_until(
        lambda: expected <= set(ledger(rsync, prefix, "items")),
        60,
        what="every item to be handled",
    )
    assert "later" not in ledger(rsync, prefix, "items") or time.time() >= later_at
    wait_until(
        lambda: ledger(rsync, prefix, "items").get("later") == 1,
        30,
        what="the later item once it is due",
    )
    assert time.time() >= later_at - 0.5
    time.sleep(1.5)  # a duplicate dispatch would show up by now
    counts = ledger(rsync, prefix, "items")
    assert set(counts) == expected | {"later"}
    assert {k: v for k, v in counts.items() if v != 1} == {}, "an item was handled twice"
    for key in shard_keys(prefix):
        assert rsync.zcard(key) == 0, f"{key} still holds items"
    # Finished jobs leave nothing behind in the poller's in-flight hash.
    wait_until(
        lambda: rsync.hlen(keys.poll_inflight("items")) == 0, 10, what="the in-flight hash to empty"
    )


@pytest.mark.slow
def test_rescheduled_items_are_handled_repeatedly(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    env = {"LEDGER_RESCHEDULE_S": "0.3"}
    spawn("leader", name="l1", env={**env, "WORKER_CONCURRENCY": "1"})
    spawn("consumer", name="c1", env=env)
    wait_until(lambda: rsync.get(keys.leader), 30, what="the leader lock")

    items = [f"card-{n}" for n in range(8)]
    with_client(redis_url, prefix, lambda c: c.poller("items").schedule_many(items))
    wait_until(
        lambda: all(ledger(rsync, prefix, "items").get(i, 0) >= 4 for i in items),
        60,
        what="every item to be handled at least 4 times",
    )
    counts = ledger(rsync, prefix, "items")
    assert set(counts) == set(items)
    # each item is back in its shard, waiting for its next turn, or in flight right now
    waiting = {m.decode() for key in shard_keys(prefix) for m in rsync.zrange(key, 0, -1)}
    in_flight = {k.decode() for k in rsync.hkeys(keys.poll_inflight("items"))}
    assert set(items) <= waiting | in_flight


# -- periodic -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_periodic_ticks_enqueued_and_executed_once_each(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    spawn("leader", name="l1")
    spawn("consumer", name="c1")
    wait_until(lambda: len(ledger(rsync, prefix, "ticks")) >= 6, 40, what="six executed ticks")
    stamps = assert_consecutive_ticks(ledger(rsync, prefix, "ticks"), 6)
    # each tick ran close to its scheduled second, and the schedule state is in Redis
    last = int(rsync.hget(keys.periodic_state, "tick"))
    assert last >= stamps[-1]
    assert abs(stamps[-1] - ms(time.time())) < 5000
    for t in stamps:
        assert t % 1000 == 0


# -- supervision ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_crashing_component_restarted_with_backoff(spawn: Spawn, rsync: redis_sync.Redis) -> None:
    """``crashy`` always raises: it is restarted with growing (capped) gaps; ticks go on."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    counter = f"{prefix}ledger:crashy-starts"
    leader = spawn(
        "leader",
        name="l1",
        env={
            "LEDGER_CRASHY": "1",
            "WORKER_RESTART_BACKOFF_BASE_S": "0.5",
            "WORKER_RESTART_BACKOFF_CAP_S": "2",
        },
    )
    event = wait_started(leader)
    assert "service:crashy" in event["enabled"]

    starts: list[float] = []  # monotonic time each start was seen
    last = 0
    ticks_before: dict[str, int] | None = None
    deadline = time.monotonic() + 40
    while len(starts) < 7:
        assert time.monotonic() < deadline, f"only {len(starts)} starts seen: {starts}"
        n = int(rsync.get(counter) or 0)
        if n != last:
            assert n == last + 1, f"counter jumped from {last} to {n} between two polls"
            starts.append(time.monotonic())
            last = n
            if n == 1:
                ticks_before = ledger(rsync, prefix, "ticks")
        time.sleep(0.01)

    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # backoff ceilings 0.5, 1, 2, 2, ... s with jitter in [ceiling/2, ceiling]
    # (the mean of the later gaps telescopes, so a late observation barely moves it)
    later = (starts[-1] - starts[2]) / (len(starts) - 3)
    assert gaps[0] < 0.9, gaps
    assert later > 0.9, gaps
    assert later > gaps[0] + 0.25, f"gaps do not grow: {gaps}"
    assert max(gaps) < 3.0, f"backoff not capped at 2 s: {gaps}"
    assert leader.alive(), leader.log()

    # the rest of the process kept working all along
    assert ticks_before is not None
    ticks = ledger(rsync, prefix, "ticks")
    new = set(ticks) - set(ticks_before)
    assert len(new) >= int(starts[-1] - starts[0]) - 2, (ticks_before, ticks)
    assert_consecutive_ticks(ticks, 4)
