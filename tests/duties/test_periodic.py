"""PeriodicEnqueuer: the catch-up plan (pure) and fenced, deduplicated tick enqueueing."""

from __future__ import annotations

from typing import Any

import fakeredis
import pytest

from harness import FixedLease
from harness.arqfmt import deserialize_job
from worker.core.clock import FakeClock
from worker.core.errors import LeadershipLost
from worker.core.ids import JobIds
from worker.core.metrics import Metrics
from worker.core.schedule import Every
from worker.core.serializer import msgpack_dumps, msgpack_loads
from worker.duties.periodic import (
    MAX_SLEEP_S,
    ON_TIME_MS,
    PeriodicDef,
    PeriodicEnqueuer,
    plan_ticks,
)
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

MIN = 60_000
T0 = 28_333_334 * MIN  # 2023-11-14T22:34:00Z, on the minute grid
KEYS = K.Keys("t:")
KEYS_ids = JobIds("t:")
LOCK = "3:mine"


async def job_fn(ctx: Any) -> None:
    return None


def pdef(catch_up: Any = "all", limit: int = 10, name: str = "job", period: int = MIN) -> Any:
    return PeriodicDef(name, job_fn, Every(period), catch_up, limit)


async def snapshot(r: Any) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for k in sorted(await r.keys("*")):
        t = (await r.type(k)).decode()
        v = {
            "string": lambda k: r.get(k),
            "hash": lambda k: r.hgetall(k),
            "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
        }[t](k)
        out[k] = (t, await v)
    return out


def enqueuer(
    r: Any,
    jobs: list[Any],
    clock: FakeClock,
    lock: str | None = LOCK,
    metrics: Metrics | None = None,
) -> PeriodicEnqueuer:
    store = Store(r, KEYS)
    return PeriodicEnqueuer(
        jobs, store, FencedStore(store, FixedLease(lock)), msgpack_dumps, clock, metrics
    )


def clock_at(ms: int) -> FakeClock:
    return FakeClock(start=ms / 1000)


def test_a_leader_duty_reads_and_writes_the_same_keys() -> None:
    """The store a duty reads and the fenced store it writes come side by side: a pair over
    different key prefixes is a wiring mistake, refused at construction."""
    r = fakeredis.FakeAsyncRedis()
    other = FencedStore(Store(r, K.Keys("other:")), FixedLease(LOCK))
    with pytest.raises(ValueError, match="other:"):
        PeriodicEnqueuer([pdef()], Store(r, KEYS), other, msgpack_dumps, clock_at(T0))


async def queued(r: Any) -> list[str]:
    return [m.decode() for m in await r.zrange(KEYS.queue, 0, -1)]


def ids(name: str, *ticks: int) -> list[str]:
    return [KEYS_ids.periodic(name, t) for t in ticks]


# ---------------------------------------------------------------------------------------------
# plan(): pure
# ---------------------------------------------------------------------------------------------


def test_plan_nothing_recorded_starts_with_the_next_tick() -> None:
    # A job never recorded is new, or Redis lost its data: a tick already due may have run
    # before the loss, so none is enqueued; the latest is recorded, the next one runs.
    job = pdef()
    for now in (T0, T0 + 1, T0 + 59_999):
        assert plan_ticks(job, None, now) == ([], T0)
    assert plan_ticks(job, T0, T0 + MIN) == ([T0 + MIN], T0 + MIN)


def test_plan_up_to_date() -> None:
    for policy in ("all", "latest", "skip"):
        assert plan_ticks(pdef(policy), T0, T0 + 59_999) == ([], T0)
        assert plan_ticks(pdef(policy), T0 + MIN, T0 + 59_999) == ([], T0 + MIN)


def test_plan_next_tick_on_time() -> None:
    for policy in ("all", "latest", "skip"):
        assert plan_ticks(pdef(policy), T0, T0 + MIN + 10) == ([T0 + MIN], T0 + MIN)


def test_plan_catch_up_all() -> None:
    now = T0 + 5 * MIN + 10_000
    expected = [T0 + i * MIN for i in range(1, 6)]
    assert plan_ticks(pdef("all"), T0, now) == (expected, T0 + 5 * MIN)


def test_plan_catch_up_all_limit_keeps_most_recent() -> None:
    now = T0 + 100 * MIN
    ticks, advance = plan_ticks(pdef("all", limit=3), T0, now)
    assert ticks == [T0 + 98 * MIN, T0 + 99 * MIN, T0 + 100 * MIN]
    assert advance == T0 + 100 * MIN


def test_plan_catch_up_window_drops_old_missed_ticks() -> None:
    now = T0 + 5 * MIN + 10_000
    windowed = PeriodicDef("job", job_fn, Every(MIN), "all", 10, None, 2.5 * 60)
    # only ticks within the last 2.5 minutes are still worth running
    expected = [T0 + 3 * MIN, T0 + 4 * MIN, T0 + 5 * MIN]
    assert plan_ticks(windowed, T0, now) == (expected, T0 + 5 * MIN)
    # a window shorter than "on time" never drops the tick that is just due
    tiny = PeriodicDef("job", job_fn, Every(MIN), "latest", 10, None, 0.001)
    assert plan_ticks(tiny, T0 + 4 * MIN, T0 + 5 * MIN + 1000) == ([T0 + 5 * MIN], T0 + 5 * MIN)
    assert plan_ticks(tiny, T0, now + 60_000)[0] == []


def test_plan_catch_up_latest() -> None:
    now = T0 + 5 * MIN + 50_000
    assert plan_ticks(pdef("latest"), T0, now) == ([T0 + 5 * MIN], T0 + 5 * MIN)


def test_plan_catch_up_skip() -> None:
    latest = T0 + 5 * MIN
    assert plan_ticks(pdef("skip"), T0, latest + ON_TIME_MS) == ([latest], latest)
    # too late for the newest tick: nothing enqueued, but it is recorded as handled
    assert plan_ticks(pdef("skip"), T0, latest + ON_TIME_MS + 1) == ([], latest)


# ---------------------------------------------------------------------------------------------
# tick(): fenced writes, each tick once
# ---------------------------------------------------------------------------------------------


async def test_tick_enqueues_each_tick_once_across_repeated_calls(r: Any) -> None:
    await r.set(KEYS.leader, LOCK)
    clock = clock_at(T0 - MIN + 200)
    e = enqueuer(r, [pdef()], clock)
    await e.tick()  # nothing recorded yet: record the latest tick, enqueue from the next
    assert await queued(r) == []
    assert await r.hget(KEYS.periodic_state, "job") == str(T0 - MIN).encode()
    clock.advance(60)
    await e.tick()
    await e.tick()
    assert await queued(r) == ids("job", T0)
    assert await r.hget(KEYS.periodic_state, "job") == str(T0).encode()

    payload = await r.get(K.ARQ_JOB + KEYS_ids.periodic("job", T0))
    assert await r.pttl(K.ARQ_JOB + KEYS_ids.periodic("job", T0)) > 0
    record = deserialize_job(payload, deserializer=msgpack_loads)
    assert (record.function, list(record.args), record.kwargs) == ("job", [], {})
    assert int(record.enqueue_time.timestamp() * 1000) == T0 + 200

    for _ in range(3):
        clock.advance(15)  # within the same minute: nothing new
        await e.tick()
    assert await queued(r) == ids("job", T0)

    clock.advance(3 * 60 - 45)  # three ticks due (leader was busy/paused): caught up in order
    await e.tick()
    await e.tick()
    assert await queued(r) == ids("job", T0, T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN)
    assert await r.hget(KEYS.periodic_state, "job") == str(T0 + 3 * MIN).encode()


async def test_only_enqueued_ticks_count_as_enqueued(r: Any) -> None:
    # A new job records the slot before its first tick as planned (so it starts with the next
    # one) without enqueueing it: that slot is not a tick that ran, and status must not say so.
    await r.set(KEYS.leader, LOCK)
    clock = clock_at(T0 - MIN + 200)
    e = enqueuer(r, [pdef(), pdef("skip", name="late")], clock)
    await e.tick()
    assert await r.hget(KEYS.periodic_state, "job") == str(T0 - MIN).encode()
    assert await Store(r, KEYS).periodic_enqueued() == {}
    clock.advance(60)
    await e.tick()
    assert await Store(r, KEYS).periodic_enqueued() == {"job": T0, "late": T0}
    clock.advance(3 * 60 + 30)  # "job" catches up three ticks, "late" skips them (30 s late)
    await e.tick()
    assert await Store(r, KEYS).periodic_enqueued() == {"job": T0 + 3 * MIN, "late": T0}
    assert await r.hget(KEYS.periodic_state, "late") == str(T0 + 3 * MIN).encode()


async def test_tick_several_jobs_and_policies(r: Any) -> None:
    await r.set(KEYS.leader, LOCK)
    await r.hset(KEYS.periodic_state, mapping={"a": T0, "l": T0, "s": T0})
    clock = clock_at(T0 + 4 * MIN + 30_000)
    e = enqueuer(r, [pdef("all", 2, "a"), pdef("latest", 10, "l"), pdef("skip", 10, "s")], clock)
    await e.tick()
    assert sorted(await queued(r)) == sorted(
        ids("a", T0 + 3 * MIN, T0 + 4 * MIN) + ids("l", T0 + 4 * MIN)
    )
    # every job advanced, including the skipped one, so no tick is revisited later
    assert await r.hgetall(KEYS.periodic_state) == {
        n.encode(): str(T0 + 4 * MIN).encode() for n in ("a", "l", "s")
    }


async def test_two_enqueuers_split_brain_never_duplicate(r: Any) -> None:
    """Two leaders overlapping with the same lock value (a paused leader waking up)."""
    await r.set(KEYS.leader, LOCK)
    m_a, m_b = Metrics(), Metrics()
    ca, cb = clock_at(T0 + 100), clock_at(T0 + 900)  # their clocks disagree a little
    a = enqueuer(r, [pdef(limit=100)], ca, metrics=m_a)
    b = enqueuer(r, [pdef(limit=100)], cb, metrics=m_b)
    for _ in range(10):
        await a.tick()
        await b.tick()
        ca.advance(37)
        cb.advance(41)
        await b.tick()
        await a.tick()
    ticks = sorted(int(i.rsplit(":", 1)[1]) for i in await queued(r))
    # each tick exactly once, no gaps, starting with the first tick after the first look
    assert ticks == list(range(T0 + MIN, ticks[-1] + 1, MIN))
    assert len(ticks) >= 6

    # B wakes with a stale view and replays ticks A already enqueued: refused by the script
    await b._enqueue([(pdef(), ticks, ticks[-1])], ticks[-1])
    # the schedule state lost: B, knowing it recorded more, refuses to write past it...
    await r.delete(KEYS.periodic_state)
    assert await b._enqueue([(pdef(), ticks, ticks[-1])], ticks[-1]) is True
    # ...and a leader that never saw the state is held back by the job keys alone
    b._last.clear()
    assert await b._enqueue([(pdef(), ticks, ticks[-1])], ticks[-1]) is False
    assert sorted(int(i.rsplit(":", 1)[1]) for i in await queued(r)) == ticks

    def count(m: Metrics, outcome: str) -> float:
        return (
            m.registry.get_sample_value(
                "worker_periodic_ticks_total", {"periodic": "job", "outcome": outcome}
            )
            or 0.0
        )

    assert count(m_a, "enqueued") + count(m_b, "enqueued") == len(ticks)
    assert count(m_b, "skipped") >= len(ticks)
    assert count(m_b, "deduplicated") >= len(ticks)


async def test_redis_going_back_under_a_kept_lease_catches_the_lost_ticks_up(r: Any) -> None:
    """A failover to a replica that missed the newest writes, the lease still valid there: the
    enqueuer recorded ticks 1 and 2, Redis comes back with only tick 0. Before the fix the
    memory (last = 2) skipped past ticks 1 and 2 for good; now the script refuses to write
    past a state that went back, the enqueuer reads it again and enqueues them."""
    P = 5_000
    await r.set(KEYS.leader, LOCK)
    metrics = Metrics()
    clock = clock_at(T0 + 10)
    e = enqueuer(r, [pdef(period=P)], clock, metrics=metrics)  # read back every 30 s only
    await e.tick()  # first look: records tick 0 (never enqueues an already-due tick)
    for _ in range(2):
        clock.advance(P / 1000)
        await e.tick()
    assert await queued(r) == ids("job", T0 + P, T0 + 2 * P)
    # the replica promoted had the state as of tick 0 and none of the two jobs
    await r.hset(KEYS.periodic_state, "job", T0)
    await r.delete(KEYS.queue, *(K.ARQ_JOB + i for i in ids("job", T0 + P, T0 + 2 * P)))
    clock.advance(P / 1000)
    assert await e.tick() == pytest.approx(0.001)  # refused: plan again at once
    assert await queued(r) == []
    await e.tick()
    assert await queued(r) == ids("job", T0 + P, T0 + 2 * P, T0 + 3 * P)
    assert await r.hget(KEYS.periodic_state, "job") == str(T0 + 3 * P).encode()
    rollbacks = metrics.registry.get_sample_value(
        "worker_periodic_rollbacks_total", {"periodic": "job"}
    )
    assert rollbacks == 1


@pytest.mark.parametrize("lock_in_redis", [None, "3:other", "4:mine"])
async def test_wrong_lock_raises_and_writes_nothing(r: Any, lock_in_redis: str | None) -> None:
    if lock_in_redis is not None:
        await r.set(KEYS.leader, lock_in_redis)
    await r.hset(KEYS.periodic_state, "job", T0 - 10 * MIN)
    e = enqueuer(r, [pdef()], clock_at(T0 + 100))
    before = await snapshot(r)
    with pytest.raises(LeadershipLost, match="FENCED"):
        await e.tick()
    assert await snapshot(r) == before


async def test_not_leading_raises_before_touching_redis(r: Any) -> None:
    e = enqueuer(r, [pdef()], clock_at(T0 + 100), lock=None)
    with pytest.raises(LeadershipLost):
        await e.tick()
    assert await r.keys("*") == []


async def test_tick_returns_time_to_next_due_tick_capped() -> None:
    r = fakeredis.FakeAsyncRedis()
    await r.set(KEYS.leader, LOCK)
    clock = clock_at(T0 + 200)
    e = enqueuer(r, [pdef(period=1000)], clock)
    assert await e.tick() == pytest.approx(0.801)  # just after the next instant
    e = enqueuer(r, [pdef(name="slow", period=MIN)], clock)
    assert await e.tick() == MAX_SLEEP_S
    assert await enqueuer(r, [], clock).tick() == 60.0
    await r.aclose()


async def test_every_job_due_at_an_instant_goes_in_one_call(r: Any) -> None:
    await r.set(KEYS.leader, LOCK)
    jobs = [pdef(name=f"j{n}", period=1000) for n in range(50)]
    await r.hset(KEYS.periodic_state, mapping={j.name: T0 - 1000 for j in jobs})
    e = enqueuer(r, jobs, clock_at(T0 + 3))
    calls = 0
    real = e.fenced.enqueue_ticks

    async def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*args, **kwargs)

    e.fenced.enqueue_ticks = counting  # type: ignore[method-assign]
    delay = await e.tick()
    assert calls == 1
    assert len(await queued(r)) == 50
    assert delay == pytest.approx((1000 - 3 + 1) / 1000)  # wakes just after the next instant
    e.clock.advance(0.5)  # type: ignore[attr-defined]
    await e.tick()
    assert calls == 1  # nothing due: no Redis call at all


async def test_a_paused_job_skips_its_ticks_and_does_not_catch_up(r: Any) -> None:
    await r.set(KEYS.leader, LOCK)
    await r.hset(KEYS.periodic_state, mapping={"job": T0, "other": T0})
    store = Store(r, KEYS)
    await store.pause("periodic:job")
    clock = clock_at(T0 + 3 * MIN + 10)
    e = enqueuer(r, [pdef(), pdef(name="other")], clock)
    await e.tick()
    assert await queued(r) == ids("other", T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN)
    assert await r.hget(KEYS.periodic_state, "job") == str(T0 + 3 * MIN).encode()  # advanced
    await store.resume("periodic:job")
    clock.advance(60)
    e._read_at = float("-inf")
    await e.tick()
    assert ids("job", T0 + 4 * MIN)[0] in await queued(r)  # only ticks after the resume
    assert ids("job", T0 + MIN)[0] not in await queued(r)


async def test_trigger_runs_a_job_once_now(r: Any) -> None:
    from worker.client import Client
    from worker.duties.periodic import trigger

    clock = clock_at(T0 + 1234)
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, clock=clock)
    job = pdef()
    jid = await trigger(client, job)
    assert jid == KEYS_ids.periodic("job", T0 + 1234)
    assert await queued(r) == [jid]
    assert await trigger(client, job) is None  # the same instant twice: once
    assert await r.hget(KEYS.periodic_state, "job") is None  # the schedule did not move
