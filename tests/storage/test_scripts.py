"""Every Lua script of worker/storage, against fakeredis AND the real server.

Each test runs twice (``r`` is parametrized): fakeredis's Lua emulation and the real engine must
agree, because unit tests of the components run on fakeredis while production runs the real one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from worker.core.ids import JobIds, LockValue
from worker.storage import claims as claims_lua
from worker.storage import dead as dead_lua
from worker.storage import election as election_lua
from worker.storage import initializer as initializer_lua
from worker.storage import jobs as jobs_lua
from worker.storage import keys as K
from worker.storage import leases as leases_lua
from worker.storage import periodic as periodic_lua
from worker.storage import poller as poller_lua
from worker.storage import registry as registry_lua
from worker.storage.election import Acquired, LeaderChange, Refused, Renewal
from worker.storage.jobs import Finish, Retention
from worker.storage.store import Store

KEYS = K.Keys("t:")
KEYS_ids = JobIds("t:")
MINE = "7:mine"
T = 1_700_000_000_000  # a realistic epoch-ms value (exercises integer formatting in Lua)
#: An epoch counter ahead of the server's clock in ms (by an hour: within the day an epoch may
#: run ahead, see ``election.EPOCH_OF``): the next epoch is exactly +1.
AHEAD = (int(time.time()) + 3600) * 1000
JOB_TTL = 60_000


async def run(r: Any, script: str, keys: list[str], args: list[Any]) -> Any:
    return await r.eval(script, len(keys), *keys, *args)


async def snapshot(r: Any) -> dict[bytes, Any]:
    """Every key with its type, full content and whether it has an expiry."""
    out: dict[bytes, Any] = {}
    for k in sorted(await r.keys("*")):
        t = (await r.type(k)).decode()
        if t == "string":
            v: Any = await r.get(k)
        elif t == "hash":
            v = await r.hgetall(k)
        elif t == "zset":
            v = await r.zrange(k, 0, -1, withscores=True)
        elif t == "set":
            v = sorted(await r.smembers(k))
        elif t == "list":
            v = await r.lrange(k, 0, -1)
        else:  # pragma: no cover - scripts only use the types above
            raise AssertionError(f"unexpected type {t}")
        out[k] = (t, v, await r.pttl(k) > 0)
    return out


# ---------------------------------------------------------------------------------------------
# Leadership scripts
# ---------------------------------------------------------------------------------------------


BOUND = 11_000  # renew deadline + stop grace of a holder, ms


async def test_acquire_increments_epoch_sets_ttl_and_announces(r: Any) -> None:
    store = Store(r, KEYS)
    p = await _subscribe(r, KEYS.leader_announce)
    try:
        before = await store.server_time_ms()
        won = await store.acquire("tokA", 5000, bound_ms=BOUND)
        # a fresh dataset: the first epoch is the server's clock in ms, not 1
        assert isinstance(won, Acquired) and won.lock.token == "tokA"
        assert before - 1 <= won.lock.epoch <= await store.server_time_ms()
        value = f"{won.lock.epoch}:tokA".encode()
        assert await r.get(KEYS.leader) == value
        assert 0 < await r.pttl(KEYS.leader) <= 5000
        assert await r.get(KEYS.leader_epoch) == str(won.lock.epoch).encode()
        msg = await _next_message(p, 5.0)
        assert msg is not None and msg["data"] == value  # every acquisition is announced
        # a counter ahead of the clock: the next epoch is counter + 1
        await r.delete(KEYS.leader)
        await r.set(KEYS.leader_epoch, AHEAD)
        again = await store.acquire("tokB", 5000, bound_ms=BOUND)
        assert isinstance(again, Acquired) and again.lock == LockValue(AHEAD + 1, "tokB")
    finally:
        await p.aclose()
    await r.delete(KEYS.leader)
    third = await store.acquire("tokC", 5000, bound_ms=BOUND)
    assert isinstance(third, Acquired) and third.lock == LockValue(AHEAD + 2, "tokC")


async def test_acquire_refuses_held_lock_but_raises_the_epoch_floor(r: Any) -> None:
    store = Store(r, KEYS)
    await store.acquire("tokA", 5000)
    before = await snapshot(r)
    assert isinstance(await store.acquire("tokB", 5000), Refused)
    assert await snapshot(r) == before  # lock kept, epoch NOT incremented by a failed campaign
    # a standby that saw a higher epoch (before Redis lost its data) raises the counter, so
    # the next acquisition by anyone goes above it
    held = await r.get(KEYS.leader)
    refused = await store.acquire("tokB", 5000, floor=AHEAD)
    assert isinstance(refused, Refused) and refused.holder == LockValue.parse(held)
    assert await r.get(KEYS.leader) == held
    assert await r.get(KEYS.leader_epoch) == str(AHEAD).encode()
    # the answer says when the holder's lock expires unless renewed (a standby waits that long)
    assert refused.pttl_ms is not None and 0 < refused.pttl_ms <= 5000


async def test_a_peek_is_refused_unread_by_a_lock_with_a_ttl_and_acquires_a_free_one(
    r: Any,
) -> None:
    """A subscribed standby's steady look (``peek``): one ``PTTL`` while the lock is held; a
    free lock, or one without expiry, goes the whole way (acquired, or replaced)."""
    store = Store(r, KEYS)
    held = await store.acquire("tokA", 5000)
    assert isinstance(held, Acquired)
    before = await snapshot(r)
    peeked = await store.acquire("tokB", 5000, peek=True)
    assert isinstance(peeked, Refused) and peeked.holder is None
    assert peeked.pttl_ms is not None and 0 < peeked.pttl_ms <= 5000
    assert await snapshot(r) == before
    await r.delete(KEYS.leader)
    won = await store.acquire("tokB", 5000, peek=True)
    assert isinstance(won, Acquired) and won.lock.epoch > held.lock.epoch
    await r.set(KEYS.leader, "1:old-static")  # no expiry: stale, replaced as without peek
    replaced = await store.acquire("tokC", 5000, peek=True)
    assert isinstance(replaced, Acquired) and replaced.replaced == "1:old-static"


@pytest.mark.parametrize(
    "counter", [b"1e+20", b"99999999999999999999", b"100000000000000", b"-5", b"12.5", b"x"]
)
async def test_a_malformed_epoch_counter_is_repaired_by_the_next_acquisition(
    r: Any, counter: bytes
) -> None:
    """Not an integer below 2^53 at most a day ahead of the clock: the epoch is issued from
    the clock (and a valid floor), the counter overwritten, the answer names it; every epoch
    is written as a plain integer (``string.format('%d')``, never ``1e+14``)."""
    store = Store(r, KEYS)
    await r.set(KEYS.leader_epoch, counter)
    now = await store.server_time_ms()
    won = await store.acquire("tokA", 5000, floor=int(now) + 60_000)  # a valid floor counts
    assert isinstance(won, Acquired) and won.malformed == ("counter",)
    assert won.lock.epoch == int(now) + 60_001
    assert await r.get(KEYS.leader_epoch) == str(won.lock.epoch).encode()
    assert await r.get(KEYS.leader) == f"{won.lock.epoch}:tokA".encode()
    assert (await r.hget(KEYS.leader_state, "epoch")).isdigit()
    (entry,) = await store.leader_history()
    assert entry.epoch == won.lock.epoch


async def test_a_floor_far_ahead_of_the_clock_is_ignored_and_named(r: Any) -> None:
    store = Store(r, KEYS)
    held = await store.acquire("tokA", 5000)
    assert isinstance(held, Acquired) and held.malformed == ()
    before = await snapshot(r)
    refused = await store.acquire("tokB", 5000, floor=10**14)  # refused: counter untouched
    assert isinstance(refused, Refused) and refused.malformed == ("floor",)
    assert await snapshot(r) == before
    await r.delete(KEYS.leader)
    won = await store.acquire("tokB", 5000, floor=2**53 + 1)
    assert isinstance(won, Acquired) and won.malformed == ("floor",)
    assert held.lock.epoch < won.lock.epoch <= await store.server_time_ms() + 1


async def test_handoff_ignores_a_lock_that_is_not_one_the_framework_writes(r: Any) -> None:
    store = Store(r, KEYS)
    await r.set(KEYS.leader, "99999999999999999999:forged", px=5000)
    assert await store.request_handoff(1000) is None
    assert await r.get(KEYS.leader_handoff) is None


async def test_acquire_goes_above_the_floor_after_data_loss(r: Any) -> None:
    store = Store(r, KEYS)
    for _ in range(3):
        await store.acquire("tokA", 5000)
        await r.delete(KEYS.leader)
    await r.flushall()  # Redis restarted empty: the counter is gone
    won = await store.acquire("tokB", 5000, floor=AHEAD)
    assert isinstance(won, Acquired) and won.lock.epoch == AHEAD + 1
    assert await r.get(KEYS.leader_epoch) == str(AHEAD + 1).encode()


async def test_epochs_go_above_every_earlier_one_after_a_data_loss_without_any_floor(
    r: Any,
) -> None:
    """A dataset lost while no process remembers an epoch (every process restarted too): the
    counter starts again at the server's clock in ms, above every epoch issued before."""
    store = Store(r, KEYS)
    issued = []
    for _ in range(5):
        won = await store.acquire("tokA", 5000)
        assert isinstance(won, Acquired)
        issued.append(won.lock.epoch)
        await r.delete(KEYS.leader)
    assert issued == sorted(set(issued))  # strictly increasing
    await asyncio.sleep(0.002)  # the clock moves on (the bound: under one leadership per ms)
    await r.flushall()
    won = await store.acquire("tokB", 5000)  # floor 0: nobody remembers
    assert isinstance(won, Acquired) and won.lock.epoch > max(issued)
    (entry,) = await store.leader_history()
    assert entry.reason == "first"  # nothing in Redis says a loss happened; the epoch is above
    static = await run(r, election_lua.CLAIM_STATIC, [KEYS.leader, KEYS.leader_epoch], ["s", 900])
    assert (LockValue.parse(static) or LockValue(0, "")).epoch > won.lock.epoch


async def test_acquire_gap_depends_on_how_the_previous_lease_ended(r: Any) -> None:
    store = Store(r, KEYS)
    # a fresh cluster (no epoch ever recorded, no lease history): nobody to wait for
    first = await store.acquire("tokA", 5000, bound_ms=BOUND)
    assert isinstance(first, Acquired) and first.gap_ms == 0
    (entry,) = await store.leader_history()
    assert entry.reason == "first"
    # Redis lost its data under a candidate that saw an epoch: its holder may live on, full bound
    await r.flushall()
    lost = await store.acquire("tokA", 5000, floor=first.lock.epoch, bound_ms=BOUND)
    assert isinstance(lost, Acquired) and lost.gap_ms == BOUND
    await r.flushall()
    first = await store.acquire("tokA", 5000, bound_ms=BOUND)
    assert isinstance(first, Acquired) and first.gap_ms == 0
    # released cleanly: the next holder need not wait
    assert await store.release_lock(first.lock)
    clean = await store.acquire("tokB", 5000, bound_ms=BOUND)
    assert isinstance(clean, Acquired) and clean.gap_ms == 0
    # vanished (DEL) right after a renew: the old holder may believe it leads for the bound
    assert await store.renew_lock(clean.lock, 5000)
    await r.delete(KEYS.leader)
    vanished = await store.acquire("tokC", 5000, bound_ms=BOUND)
    assert isinstance(vanished, Acquired) and BOUND - 1000 <= vanished.gap_ms <= BOUND
    # expired long ago (its holder renewed last more than the bound ago): no wait
    await r.delete(KEYS.leader)
    await r.hset(KEYS.leader_state, "renewed_ms", 1_000)
    expired = await store.acquire("tokD", 5000, bound_ms=BOUND)
    assert isinstance(expired, Acquired) and expired.gap_ms == 0
    # the caller's own lock (an acquisition whose reply it never got): replaced, no wait
    mine = await store.acquire("tokD", 5000, bound_ms=BOUND)
    assert isinstance(mine, Acquired) and mine.gap_ms == 0 and mine.lock.epoch > expired.lock.epoch


async def test_leadership_history_notes_a_data_loss(r: Any) -> None:
    store = Store(r, KEYS)
    a = await store.acquire("tokA", 5000, instance="a")
    assert isinstance(a, Acquired)
    await r.flushall()  # Redis lost its data; the candidate remembers the epoch it saw
    b = await store.acquire("tokB", 5000, floor=a.lock.epoch, instance="b")
    assert isinstance(b, Acquired)
    (entry,) = await store.leader_history()
    assert (entry.reason, entry.instance) == ("data loss", "b") and entry.epoch > a.lock.epoch
    assert abs(entry.at_ms - await store.server_time_ms()) < 60_000


async def test_leadership_history_reasons_and_cap(r: Any) -> None:
    store = Store(r, KEYS)
    a = await store.acquire("tokA", 5000, instance="a")
    assert isinstance(a, Acquired)
    assert await store.release_lock(a.lock, reason="handoff", instance="a")
    b = await store.acquire("tokB", 5000, instance="b")
    assert isinstance(b, Acquired)
    assert await store.release_lock(b.lock, instance="b")
    c = await store.acquire("tokC", 5000, instance="c")
    assert isinstance(c, Acquired)
    await r.delete(KEYS.leader)
    d = await store.acquire("tokD", 5000, instance="d|x")
    assert isinstance(d, Acquired)
    again = await store.acquire("tokD", 5000, instance="d|x")  # its own lock: a lost reply
    assert isinstance(again, Acquired)
    await r.persist(KEYS.leader)
    e = await store.acquire("tokE", 5000, instance="e")
    assert isinstance(e, Acquired)
    history = await store.leader_history()
    assert [(h.reason, h.instance) for h in history] == [
        ("replaced", "e"),
        ("retried", "d|x"),
        ("after expiry", "d|x"),
        ("after release", "c"),
        ("released", "b"),
        ("after handoff", "b"),
        ("handoff", "a"),
        ("first", "a"),
    ]
    won = [x.lock.epoch for x in (a, b, c, d, again, e)]
    assert won == sorted(set(won))  # a new, higher epoch for every acquisition
    a_, b_, c_, d_, again_, e_ = won
    assert [h.epoch for h in history] == [e_, again_, d_, c_, b_, b_, a_, a_]
    for i in range(K.HISTORY_KEEP + 5):
        await r.delete(KEYS.leader)
        await store.acquire(f"tok{i}", 5000, instance="n")
    assert await r.llen(KEYS.leader_history) == K.HISTORY_KEEP
    entry = LeaderChange(12, T, "first", "a|b")
    assert LeaderChange.parse(str(entry)) == entry
    assert LeaderChange.parse(b"x|1|y|z") is None


async def test_handoff_request_reaches_only_the_epoch_it_targets(r: Any) -> None:
    store = Store(r, KEYS)
    assert await store.request_handoff(5000) is None  # nobody leads
    a = await store.acquire("tokA", 5000)
    assert isinstance(a, Acquired)
    assert await store.renew_lock(a.lock, 5000) == Renewal.RENEWED
    assert await store.request_handoff(5000) == a.lock.epoch
    assert 0 < await r.pttl(KEYS.leader_handoff) <= 5000
    assert await store.renew_lock(a.lock, 5000) == Renewal.HANDOFF
    assert await store.renew_lock(LockValue(a.lock.epoch, "x"), 5000) == Renewal.LOST
    # the release serves the request; the next acquisition is "after handoff", without a gap
    assert await store.release_lock(a.lock, reason="handoff")
    assert await r.exists(KEYS.leader_handoff) == 0
    b = await store.acquire("tokB", 5000, bound_ms=BOUND)
    assert isinstance(b, Acquired) and b.gap_ms == 0
    assert await store.renew_lock(b.lock, 5000) == Renewal.RENEWED
    # a request for an older epoch is void: a new acquisition deletes it
    assert await store.request_handoff(5000) == b.lock.epoch
    await r.delete(KEYS.leader)
    c = await store.acquire("tokC", 5000)
    assert isinstance(c, Acquired)
    assert await r.exists(KEYS.leader_handoff) == 0


async def test_boot_marker_is_created_once(r: Any) -> None:
    store = Store(r, KEYS)
    assert await store.boot_marker("m1:1") == ("m1:1", True)
    assert await store.boot_marker("m2:2") == ("m1:1", False)
    await r.flushall()
    assert await store.boot_marker("m3:3") == ("m3:3", True)


async def test_leader_renew_records_server_time(r: Any) -> None:
    store = Store(r, KEYS)
    won = await store.acquire("tok", 5000)
    assert isinstance(won, Acquired)
    await r.hset(KEYS.leader_state, "renewed_ms", 0)
    assert await store.renew_lock(won.lock, 3000)
    assert int(await r.hget(KEYS.leader_state, "renewed_ms")) > T
    assert not await store.renew_lock(LockValue(won.lock.epoch, "other"), 3000)


async def test_renew_replaces_ttl_not_adds(r: Any) -> None:
    await r.set(KEYS.leader, MINE, px=5000)
    assert await run(r, leases_lua.LEASES_RENEW, [KEYS.leader], [MINE, 3000]) == [1]
    # adding would give ~8000 ms; replacing gives at most 3000
    assert 0 < await r.pttl(KEYS.leader) <= 3000
    assert await run(r, leases_lua.LEASES_RENEW, [KEYS.leader], [MINE, 20_000]) == [1]
    assert 10_000 < await r.pttl(KEYS.leader) <= 20_000


@pytest.mark.parametrize("caller", ["7:other", "8:mine", "7:min", "7:mine "])
async def test_renew_refuses_any_other_value(r: Any, caller: str) -> None:
    await r.set(KEYS.leader, MINE, px=5000)
    assert await run(r, leases_lua.LEASES_RENEW, [KEYS.leader], [caller, 60_000]) == [0]
    assert await r.get(KEYS.leader) == MINE.encode()
    assert 0 < await r.pttl(KEYS.leader) <= 5000  # TTL untouched


async def test_renew_of_absent_lock_creates_nothing(r: Any) -> None:
    assert await run(r, leases_lua.LEASES_RENEW, [KEYS.leader], [MINE, 5000]) == [0]
    assert await r.exists(KEYS.leader) == 0


async def _subscribe(r: Any, channel: str = KEYS.leader_channel) -> Any:
    p = r.pubsub(ignore_subscribe_messages=True)
    await p.subscribe(channel)
    # consume the subscribe confirmation so the next message is a published one
    for _ in range(50):
        if await r.pubsub_numsub(channel) == [(channel.encode(), 1)]:
            break
        await asyncio.sleep(0.01)
    return p


async def _next_message(p: Any, within: float) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        msg = await p.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if msg is not None:
            return msg
    return None


async def test_release_compares_whole_value_and_publishes(r: Any) -> None:
    await r.set(KEYS.leader, MINE, px=5000)
    store = Store(r, KEYS)
    p = await _subscribe(r)
    try:
        for wrong in ("7:other", "8:mine", "7:min"):
            assert await store.release_lock(LockValue.parse(wrong)) is False  # type: ignore[arg-type]
        assert await r.get(KEYS.leader) == MINE.encode()
        assert await _next_message(p, 0.2) is None  # a refused release announces nothing

        assert await store.release_lock(LockValue.parse(MINE)) is True  # type: ignore[arg-type]
        assert await r.exists(KEYS.leader) == 0
        assert await r.hget(KEYS.leader_state, "released") == b"7"  # a clean release
        msg = await _next_message(p, 5.0)
        assert msg is not None
        assert msg["type"] == "message"
        assert msg["channel"] == KEYS.leader_channel.encode()
        assert msg["data"] == MINE.encode()
    finally:
        await p.aclose()


async def test_claim_static_takes_lock_unconditionally_with_a_ttl(r: Any) -> None:
    await r.set(KEYS.leader, f"{AHEAD}:someone", px=5000)
    await r.set(KEYS.leader_epoch, AHEAD)
    v = await run(r, election_lua.CLAIM_STATIC, [KEYS.leader, KEYS.leader_epoch], ["tok", 8000])
    assert v == f"{AHEAD + 1}:tok".encode()
    assert await r.get(KEYS.leader) == v
    assert 5000 < await r.pttl(KEYS.leader) <= 8000
    v2 = await run(r, election_lua.CLAIM_STATIC, [KEYS.leader, KEYS.leader_epoch], ["tok", 8000])
    assert v2 == f"{AHEAD + 2}:tok".encode()
    # a counter behind the clock (a small one, or none): the epoch is the server's clock in ms
    await r.set(KEYS.leader_epoch, 3)
    v3 = await run(r, election_lua.CLAIM_STATIC, [KEYS.leader, KEYS.leader_epoch], ["tok", 8000])
    assert (LockValue.parse(v3) or LockValue(0, "")).epoch >= T


# ---------------------------------------------------------------------------------------------
# Fencing: every fenced script refuses and writes nothing when the lock is not the caller's
# ---------------------------------------------------------------------------------------------

Setup = Callable[[Any], Awaitable[None]]


async def _seed_nothing(r: Any) -> None:
    return None


async def _seed_dispatch(r: Any) -> None:
    await r.zadd(KEYS.poll_shard("p", 0), {"a": T - 1})


async def _seed_checkpoint(r: Any) -> None:
    await r.hset(
        KEYS.init_state("i"),
        mapping={"version": "v1", "cursor": "", "batches": 0, "items": 0, "done": 0},
    )


async def _seed_reap(r: Any) -> None:
    await r.zadd(KEYS.queue, {"j1": T})
    await r.sadd(KEYS.holds("dead"), "j1")
    await r.set(K.ARQ_IN_PROGRESS + "j1", b"dead/1", px=JOB_TTL)
    await r.zadd(KEYS.instances, {"dead": 1000})


FENCED: dict[str, tuple[str, Setup, list[str], list[Any]]] = {
    "ENQUEUE_TICKS": (
        periodic_lua.ENQUEUE_TICKS,
        _seed_nothing,
        [
            KEYS.leader,
            KEYS.periodic_state,
            KEYS.paused,
            KEYS.periodic_enqueued,
            KEYS.queue,
            KEYS.wake_marker,
        ],
        [
            K.ARQ_JOB,
            K.ARQ_RESULT,
            JOB_TTL,
            KEYS.wake,
            "job",
            T,
            5,
            -1,
            1,
            T,
            KEYS_ids.periodic("job", T),
            b"p",
        ],
    ),
    "DISPATCH": (
        poller_lua.DISPATCH,
        _seed_dispatch,
        [
            KEYS.leader,
            KEYS.poll_inflight("p"),
            KEYS.queue,
            KEYS.poll_shard("p", 0),
            KEYS.paused,
            KEYS.wake_marker,
        ],
        [K.ARQ_JOB, K.ARQ_RESULT, JOB_TTL, T, 1000, KEYS.wake, "p", "a", "id-a", b"p"],
    ),
    "INIT_BEGIN": (
        initializer_lua.INIT_BEGIN,
        _seed_nothing,
        [KEYS.leader, KEYS.init_state("i")],
        ["v1", T, 7],
    ),
    "CHECKPOINT": (
        initializer_lua.CHECKPOINT,
        _seed_checkpoint,
        [KEYS.leader, KEYS.init_state("i"), KEYS.poll_shard("p", 0)],
        ["v1", "", "c1", "1", T, 3, T, "a"],
    ),
    "REAP": (
        registry_lua.REAP,
        _seed_reap,
        [KEYS.leader, KEYS.holds("dead"), KEYS.instances, KEYS.queue],
        [K.ARQ_IN_PROGRESS, "dead", 1000, T, KEYS.wake],
    ),
}


@pytest.mark.parametrize("name", sorted(FENCED))
async def test_fenced_script_writes_with_the_right_lock(r: Any, name: str) -> None:
    """Positive control: the same call the refusal tests make does write when allowed."""
    script, seed, keys, args = FENCED[name]
    await seed(r)
    await r.set(KEYS.leader, MINE)
    before = await snapshot(r)
    await run(r, script, keys, [MINE, *args])
    assert await snapshot(r) != before


@pytest.mark.parametrize("name", sorted(FENCED))
@pytest.mark.parametrize("lock", [None, "7:other", "8:mine", "7:mine-longer", "7:min"])
async def test_fenced_script_refuses_and_writes_nothing(
    r: Any, name: str, lock: str | None
) -> None:
    script, seed, keys, args = FENCED[name]
    await seed(r)
    if lock is not None:
        await r.set(KEYS.leader, lock)
    before = await snapshot(r)
    with pytest.raises(ResponseError, match=rf"^{K.FENCE_ERROR}\b"):
        await run(r, script, keys, [MINE, *args])
    assert await snapshot(r) == before


# ---------------------------------------------------------------------------------------------
# ENQUEUE_TICKS
# ---------------------------------------------------------------------------------------------


def _ticks_args(
    name: str, advance: int, ticks: list[int], known: int = -1, wake: str = KEYS.wake
) -> list[Any]:
    args: list[Any] = [MINE, K.ARQ_JOB, K.ARQ_RESULT, JOB_TTL, wake, name, advance, 5]
    args += [known, len(ticks)]
    for t in ticks:
        args += [t, KEYS_ids.periodic(name, t), f"payload-{t}".encode()]
    return args


async def _enqueue_ticks(
    r: Any, name: str, advance: int, ticks: list[int], known: int = -1, *, duty: bool = False
) -> list[int]:
    queue, marker = (
        (KEYS.queue_of("default:duty"), KEYS.wake_duty_marker)
        if duty
        else (
            KEYS.queue,
            KEYS.wake_marker,
        )
    )
    keys = [KEYS.leader, KEYS.periodic_state, KEYS.paused, KEYS.periodic_enqueued, queue, marker]
    args = _ticks_args(name, advance, ticks, known, "" if duty else KEYS.wake)
    return list(await run(r, periodic_lua.ENQUEUE_TICKS, keys, args))


async def test_enqueue_ticks_writes_jobs_queue_and_state(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    ticks = [T, T + 60_000, T + 120_000]
    assert await _enqueue_ticks(r, "job", ticks[-1], ticks) == [3, 0, 0, 0]
    for t in ticks:
        jid = KEYS_ids.periodic("job", t)
        assert await r.get(K.ARQ_JOB + jid) == f"payload-{t}".encode()
        assert 0 < await r.pttl(K.ARQ_JOB + jid) <= JOB_TTL
        assert await r.zscore(KEYS.queue, jid) == t
    assert await r.zcard(KEYS.queue) == 3
    assert await r.hget(KEYS.periodic_state, "job") == str(ticks[-1]).encode()
    assert await r.hget(KEYS.periodic_enqueued, "job") == str(ticks[-1]).encode()


async def test_enqueue_ticks_skips_ticks_at_or_before_last(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    ticks = [T, T + 60_000]
    await _enqueue_ticks(r, "job", ticks[-1], ticks)
    await r.delete(*(K.ARQ_JOB + KEYS_ids.periodic("job", t) for t in ticks))
    await r.delete(KEYS.queue)
    # the jobs are gone (ran and expired), but the recorded last tick still refuses them
    assert await _enqueue_ticks(r, "job", ticks[-1], ticks) == [0, 0, 2, 0]
    assert await r.zcard(KEYS.queue) == 0
    # a later tick still goes through; the earlier ones count as skipped
    later = [*ticks, T + 120_000]
    assert await _enqueue_ticks(r, "job", later[-1], later) == [1, 0, 2, 0]


async def test_enqueue_ticks_dedups_when_job_or_result_exists(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    t1, t2, t3 = T, T + 60_000, T + 120_000
    await r.set(K.ARQ_JOB + KEYS_ids.periodic("job", t1), b"theirs")
    await r.set(K.ARQ_RESULT + KEYS_ids.periodic("job", t2), b"done")
    assert await _enqueue_ticks(r, "job", t3, [t1, t2, t3]) == [1, 2, 0, 0]
    assert await r.get(K.ARQ_JOB + KEYS_ids.periodic("job", t1)) == b"theirs"  # untouched
    assert await r.exists(K.ARQ_JOB + KEYS_ids.periodic("job", t2)) == 0
    assert await r.zrange(KEYS.queue, 0, -1) == [KEYS_ids.periodic("job", t3).encode()]
    assert await r.hget(KEYS.periodic_state, "job") == str(t3).encode()


async def test_enqueue_ticks_refuses_to_skip_past_a_state_that_went_back(r: Any) -> None:
    """The caller recorded (and had confirmed) tick T + 60 s, but Redis says T: it lost those
    writes. Nothing is written for the job, and it is reported, so the caller re-plans from
    what Redis has instead of skipping the lost tick for good."""
    await r.set(KEYS.leader, MINE)
    await _enqueue_ticks(r, "job", T, [T])
    t2, t3 = T + 60_000, T + 120_000
    assert await _enqueue_ticks(r, "job", t3, [t3], known=t2) == [0, 0, 0, 1]
    assert await r.hget(KEYS.periodic_state, "job") == str(T).encode()
    assert await r.zrange(KEYS.queue, 0, -1) == [KEYS_ids.periodic("job", T).encode()]
    # planned again from the recorded state, the lost tick goes through with the new one
    assert await _enqueue_ticks(r, "job", t3, [t2, t3], known=T) == [2, 0, 0, 0]
    assert await r.hget(KEYS.periodic_state, "job") == str(t3).encode()
    # a state that moved ahead of what the caller knew (another leader) is no rollback
    assert await _enqueue_ticks(r, "job", t3, [], known=T) == [0, 0, 0, 0]


async def test_enqueue_ticks_records_advance_even_without_ticks(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    assert await _enqueue_ticks(r, "job", T, []) == [0, 0, 0, 0]
    assert await r.hget(KEYS.periodic_state, "job") == str(T).encode()
    assert await r.zcard(KEYS.queue) == 0
    assert await r.hget(KEYS.periodic_enqueued, "job") is None  # planned, never enqueued
    # never moves backwards
    assert await _enqueue_ticks(r, "job", T - 60_000, []) == [0, 0, 0, 0]
    assert await r.hget(KEYS.periodic_state, "job") == str(T).encode()
    # other jobs have their own entry
    await _enqueue_ticks(r, "other", T - 5, [])
    assert await r.hgetall(KEYS.periodic_state) == {
        b"job": str(T).encode(),
        b"other": str(T - 5).encode(),
    }


# ---------------------------------------------------------------------------------------------
# DISPATCH
# ---------------------------------------------------------------------------------------------

SHARD = KEYS.poll_shard("p", 0)
INFLIGHT = KEYS.poll_inflight("p")


async def _dispatch(
    r: Any, now: int, items: list[tuple[str, str]], defer: int = 1000, *, duty: bool = False
) -> list[int]:
    queue, marker = (
        (KEYS.queue_of("default:duty"), KEYS.wake_duty_marker)
        if duty
        else (
            KEYS.queue,
            KEYS.wake_marker,
        )
    )
    keys = [KEYS.leader, INFLIGHT, queue, SHARD, KEYS.paused, marker]
    wake = "" if duty else KEYS.wake
    args: list[Any] = [MINE, K.ARQ_JOB, K.ARQ_RESULT, JOB_TTL, now, defer, wake, "p"]
    for item, jid in items:
        args += [item, jid, f"job-for-{item}".encode()]
    return list(await run(r, poller_lua.DISPATCH, keys, args))


async def test_dispatch_moves_due_items_and_counts_gone(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await r.zadd(SHARD, {"a": T - 1000, "b": T, "c": T + 1})
    res = await _dispatch(r, T, [("a", "id-a"), ("b", "id-b"), ("c", "id-c"), ("d", "id-d")])
    assert res == [2, 0, 0, 2]  # c not due, d no longer in the shard
    assert await r.zrange(SHARD, 0, -1) == [b"c"]
    for item in ("a", "b"):
        assert await r.get(K.ARQ_JOB + f"id-{item}") == f"job-for-{item}".encode()
        assert 0 < await r.pttl(K.ARQ_JOB + f"id-{item}") <= JOB_TTL
        assert await r.zscore(KEYS.queue, f"id-{item}") == T
    assert await r.exists(K.ARQ_JOB + "id-c", K.ARQ_JOB + "id-d") == 0
    assert await r.hgetall(INFLIGHT) == {b"a": b"id-a", b"b": b"id-b"}


async def test_dispatch_pushes_back_item_still_in_flight(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await r.zadd(SHARD, {"a": T})
    await r.hset(INFLIGHT, "a", "id-old")
    await r.set(K.ARQ_JOB + "id-old", b"running")
    assert await _dispatch(r, T, [("a", "id-new")], defer=2500) == [0, 1, 0, 0]
    assert await r.zscore(SHARD, "a") == T + 2500
    assert await r.exists(K.ARQ_JOB + "id-new") == 0
    assert await r.zcard(KEYS.queue) == 0
    assert await r.hget(INFLIGHT, "a") == b"id-old"

    # once the previous job is gone (finished), the item is dispatched again
    await r.delete(K.ARQ_JOB + "id-old")
    assert await _dispatch(r, T + 2500, [("a", "id-new")]) == [1, 0, 0, 0]
    assert await r.hget(INFLIGHT, "a") == b"id-new"
    assert await r.zcard(SHARD) == 0


@pytest.mark.parametrize("existing", [K.ARQ_JOB, K.ARQ_RESULT])
async def test_dispatch_duplicate_id_is_not_enqueued_again(r: Any, existing: str) -> None:
    await r.set(KEYS.leader, MINE)
    await r.zadd(SHARD, {"a": T})
    await r.set(existing + "id-a", b"theirs")
    assert await _dispatch(r, T, [("a", "id-a")]) == [0, 0, 1, 0]
    assert await r.get(existing + "id-a") == b"theirs"
    assert await r.zcard(KEYS.queue) == 0
    assert await r.zcard(SHARD) == 0  # consumed: that due instance was already enqueued


@pytest.mark.parametrize("duty", [False, True])
async def test_ticks_and_dispatches_set_one_marker(r: Any, duty: bool) -> None:
    """A tick or a poll dispatch wakes one consumer: the earliest due time on the wake marker
    (a duty lane's: the duty marker), ``ZADD LT``; a plain queue's also a ``+``-marked
    ``PUBLISH`` for consumers of earlier versions (the leader's relay skips it), a lane's none
    (no consumer of an earlier version reads the lanes)."""
    marker, other = (KEYS.wake_duty_marker, KEYS.wake_marker)
    if not duty:
        marker, other = other, marker
    await r.set(KEYS.leader, MINE)
    await r.zadd(SHARD, {"a": T - 1000})
    p = await _subscribe(r, KEYS.wake)
    try:
        assert await _enqueue_ticks(r, "job", T + 5, [T, T + 5], duty=duty) == [2, 0, 0, 0]
        first = await _next_message(p, 0.5 if duty else 5.0)
        assert await r.zrange(marker, 0, -1, withscores=True) == [(b"wake", T)]
        await r.delete(marker)
        assert await _dispatch(r, T - 500, [("a", "id-a")], duty=duty) == [1, 0, 0, 0]
        second = await _next_message(p, 0.5 if duty else 5.0)
    finally:
        await p.aclose()
    assert await r.zrange(marker, 0, -1, withscores=True) == [(b"wake", T - 500)]
    assert await r.exists(other) == 0
    if duty:
        assert first is None and second is None
    else:
        assert first["data"] == f"+{T}".encode() and second["data"] == f"+{T - 500}".encode()


# ---------------------------------------------------------------------------------------------
# INIT_BEGIN / CHECKPOINT
# ---------------------------------------------------------------------------------------------

STATE = KEYS.init_state("i")


async def _begin(r: Any, version: str, now: int = T, epoch: int = 7) -> list[bytes]:
    return list(
        await run(r, initializer_lua.INIT_BEGIN, [KEYS.leader, STATE], [MINE, version, now, epoch])
    )


async def _checkpoint(
    r: Any,
    version: str,
    cursor: str,
    nxt: str,
    items: list[tuple[int, int, str]],
    *,
    last: bool = False,
    shards: int = 2,
) -> list[int]:
    keys = [KEYS.leader, STATE, *(KEYS.poll_shard("p", s) for s in range(shards))]
    args: list[Any] = [MINE, version, cursor, nxt, "1" if last else "0", T + 5]
    for shard, due, item in items:
        args += [shard + 3, due, item]
    return list(await run(r, initializer_lua.CHECKPOINT, keys, args))


async def test_init_begin_fresh_then_resume_same_version(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    assert await _begin(r, "v1") == [b"0", b"", b"0", b"0"]
    st = await r.hgetall(STATE)
    assert st[b"version"] == b"v1"
    assert st[b"started_ms"] == str(T).encode()
    assert st[b"epoch"] == b"7"

    assert await _checkpoint(r, "v1", "", "c1", [(0, 10, "x"), (1, 20, "y")]) == [2, 1]
    assert await _begin(r, "v1", now=T + 99, epoch=8) == [b"0", b"c1", b"1", b"2"]
    st = await r.hgetall(STATE)
    assert st[b"started_ms"] == str(T).encode()  # a resume is not a restart
    assert st[b"resumed_ms"] == str(T + 99).encode()
    assert st[b"epoch"] == b"8"


async def test_init_begin_new_version_resets_state(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await _begin(r, "v1")
    await _checkpoint(r, "v1", "", "c1", [(0, 10, "x")], last=True)
    assert await _begin(r, "v1") == [b"1", b"c1", b"1", b"1"]

    assert await _begin(r, "v2", now=T + 1) == [b"0", b"", b"0", b"0"]
    st = await r.hgetall(STATE)
    assert st[b"version"] == b"v2"
    assert st[b"started_ms"] == str(T + 1).encode()
    assert b"finished_ms" not in st
    assert b"updated_ms" not in st


async def test_checkpoint_zadd_nx_counts_and_done_flag(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await _begin(r, "v1")
    await r.zadd(KEYS.poll_shard("p", 0), {"x": 999})  # already scheduled elsewhere
    assert await _checkpoint(r, "v1", "", "c1", [(0, 10, "x"), (0, 11, "y"), (1, 12, "z")]) == [
        2,
        1,
    ]
    assert await r.zscore(KEYS.poll_shard("p", 0), "x") == 999  # NX: existing score kept
    assert await r.zscore(KEYS.poll_shard("p", 0), "y") == 11
    assert await r.zscore(KEYS.poll_shard("p", 1), "z") == 12
    st = await r.hgetall(STATE)
    assert (st[b"cursor"], st[b"items"], st[b"batches"], st[b"done"]) == (b"c1", b"2", b"1", b"0")

    assert await _checkpoint(r, "v1", "c1", "c2", [(1, 13, "w")], last=True) == [1, 2]
    st = await r.hgetall(STATE)
    assert (st[b"cursor"], st[b"items"], st[b"batches"], st[b"done"]) == (b"c2", b"3", b"2", b"1")
    assert st[b"finished_ms"] == str(T + 5).encode()


@pytest.mark.parametrize(("version", "cursor"), [("v1", "stale"), ("v1", ""), ("v0", "c1")])
async def test_checkpoint_cursor_compare_and_set(r: Any, version: str, cursor: str) -> None:
    await r.set(KEYS.leader, MINE)
    await _begin(r, "v1")
    await _checkpoint(r, "v1", "", "c1", [(0, 10, "x")])
    before = await snapshot(r)
    with pytest.raises(ResponseError, match=r"^CURSOR\b"):
        await _checkpoint(r, version, cursor, "c2", [(0, 10, "new")])
    assert await snapshot(r) == before


# ---------------------------------------------------------------------------------------------
# REAP
# ---------------------------------------------------------------------------------------------


async def _reap(r: Any, instance: str, judged: int) -> int:
    keys = [KEYS.leader, KEYS.holds(instance), KEYS.instances, KEYS.queue]
    args = [MINE, K.ARQ_IN_PROGRESS, instance, judged, T + 7, KEYS.wake]
    return int(await run(r, registry_lua.REAP, keys, args))


async def test_reap_releases_only_jobs_still_queued(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await r.zadd(KEYS.queue, {"queued-1": T, "queued-2": T})
    await r.sadd(KEYS.holds("dead"), "queued-1", "queued-2", "finished")
    await r.sadd(KEYS.holds("dead"), "reclaimed")
    await r.zadd(KEYS.queue, {"reclaimed": T})
    for jid in ("queued-1", "queued-2", "finished"):
        await r.set(K.ARQ_IN_PROGRESS + jid, f"dead/{jid}", px=JOB_TTL)  # the dead one's claims
    await r.set(K.ARQ_IN_PROGRESS + "someone-elses", b"alive/1", px=JOB_TTL)
    # held by "dead" once, but claimed by another consumer since (or by arq's own Worker)
    await r.set(K.ARQ_IN_PROGRESS + "reclaimed", b"1", px=JOB_TTL)
    await r.zadd(KEYS.instances, {"dead": 1000, "alive": 5000})
    await r.sadd(KEYS.holds("alive"), "someone-elses")

    assert await _reap(r, "dead", 1000) == 2
    assert await r.exists(K.ARQ_IN_PROGRESS + "queued-1", K.ARQ_IN_PROGRESS + "queued-2") == 0
    # a job no longer in the queue (finished/being finished) keeps its marker
    assert await r.exists(K.ARQ_IN_PROGRESS + "finished") == 1
    assert await r.exists(K.ARQ_IN_PROGRESS + "someone-elses") == 1
    assert await r.get(K.ARQ_IN_PROGRESS + "reclaimed") == b"1"  # not the dead one's claim
    assert await r.exists(KEYS.holds("dead")) == 0
    assert await r.zrange(KEYS.instances, 0, -1) == [b"alive"]
    assert await r.smembers(KEYS.holds("alive")) == {b"someone-elses"}
    assert await r.zcard(KEYS.queue) == 3  # jobs stay queued; only the marker goes
    # released jobs are due now (a claimed job is parked in the future while it runs)
    assert await r.zscore(KEYS.queue, "queued-1") == T + 7
    assert await r.zscore(KEYS.queue, "reclaimed") == T


async def test_reap_refuses_when_heartbeat_is_newer(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await _seed_reap(r)
    await r.zadd(KEYS.instances, {"dead": 2000})  # heartbeated after the caller looked
    before = await snapshot(r)
    assert await _reap(r, "dead", 1000) == -1
    assert await snapshot(r) == before


async def test_reap_of_instance_missing_from_registry(r: Any) -> None:
    await r.set(KEYS.leader, MINE)
    await _seed_reap(r)
    await r.zrem(KEYS.instances, "dead")
    assert await _reap(r, "dead", 1000) == 1
    assert await r.exists(KEYS.holds("dead")) == 0


# ---------------------------------------------------------------------------------------------
# Unfenced helpers
# ---------------------------------------------------------------------------------------------


async def _unique(r: Any, jid: str, score: int, payload: bytes) -> int:
    return int(
        await run(
            r,
            jobs_lua.UNIQUE_ENQUEUE,
            [KEYS.queue, KEYS.wake_marker],
            [jid, K.ARQ_JOB, K.ARQ_RESULT, JOB_TTL, score, payload, KEYS.wake],
        )
    )


async def test_unique_enqueue(r: Any) -> None:
    assert await _unique(r, "j", T, b"first") == 1
    assert await r.get(K.ARQ_JOB + "j") == b"first"
    assert 0 < await r.pttl(K.ARQ_JOB + "j") <= JOB_TTL
    assert await r.zscore(KEYS.queue, "j") == T
    assert await r.zrange(KEYS.wake_marker, 0, -1, withscores=True) == [(b"wake", T)]
    assert await _unique(r, "j0", T - 5, b"sooner") == 1  # the marker: the earliest due time
    assert await _unique(r, "j2", T + 5, b"later") == 1
    assert await r.zrange(KEYS.wake_marker, 0, -1, withscores=True) == [(b"wake", T - 5)]
    assert await _unique(r, "j", T + 5, b"second") == 0
    assert await r.get(K.ARQ_JOB + "j") == b"first"
    assert await r.zscore(KEYS.queue, "j") == T

    await r.set(K.ARQ_RESULT + "k", b"result")
    assert await _unique(r, "k", T, b"x") == 0
    assert await r.exists(K.ARQ_JOB + "k") == 0
    assert await r.zscore(KEYS.queue, "k") is None


# ---------------------------------------------------------------------------------------------
# Composed scripts: every fragment's path (FINISH, CLAIM; ACQUIRE above and below)
# ---------------------------------------------------------------------------------------------


async def _claim(store: Store, limit: int = 10, queues: tuple[str, ...] = ("default",)) -> Any:
    return await store.claim(
        "me",
        "me/1",
        now_ms=T,
        limit=limit,
        in_progress_ttl_ms=60_000,
        holds_ttl_ms=60_000,
        max_payload=1000,
        retry_ttl_ms=60_000,
        queues=queues,
    )


async def test_finish_every_transition_in_one_batch(r: Any) -> None:
    """Transitions, indexes, statistics and the wake-up in one FINISH: the whole dataset after
    it, on both engines."""
    store = Store(r, KEYS)
    where = {"ok": "default", "bad": "mail", "again": "default", "later": "mail"}
    where |= {"stay": "default", "stolen": "default"}
    for jid, queue in where.items():
        await r.zadd(KEYS.queue_of(queue), {jid: T - 10})
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.zadd(KEYS.abort, {"ok": T, "elsewhere": T})
    await _claim(store, queues=("default", "mail"))
    await r.set(K.ARQ_IN_PROGRESS + "stolen", b"other/9")  # reaped and claimed elsewhere
    runs = [
        Finish("done", "ok", "me/1", b"r", 5000, task="send", run_ms=30),
        Finish("failed", "bad", "me/1", queue="mail", failure=b"{}", failure_ttl_ms=9000,
               task="send", run_ms=400_000),
        Finish("retry", "again", "me/1", score_ms=T + 3000),
        Finish("defer", "later", "me/1", score_ms=T + 2000, queue="mail"),
        Finish("retry", "stay", "me/1"),  # no score: stays where it is (parked)
        Finish("done", "stolen", "me/1", b"mine", 5000, task="send", run_ms=1),
    ]  # fmt: skip
    p = await _subscribe(r, KEYS.wake)
    try:
        out = await store.finish("me", runs, now_ms=T)
        woken = await _next_message(p, 5.0)
    finally:
        await p.aclose()
    assert (out.done, out.retried, out.refused) == (2, 3, 1)
    # the earliest put back, on the wake marker and (marked) on the channel
    assert woken is not None and woken["data"] == f"+{T + 2000}".encode()
    minute, hour = T // 60_000, T // 3_600_000
    slot = f"s{minute // 10}:send"
    job, retry = K.ARQ_JOB.encode(), K.ARQ_RETRY.encode()
    parked = T + 60_000
    assert await snapshot(r) == {
        K.ARQ_RESULT.encode() + b"ok": ("string", b"r", True),
        KEYS.failure("bad").encode(): ("string", b"{}", True),
        **{job + j: ("string", b"p", False) for j in (b"again", b"later", b"stay", b"stolen")},
        K.ARQ_IN_PROGRESS.encode() + b"stolen": ("string", b"other/9", False),
        retry + b"again": ("string", b"1", True),
        retry + b"later": ("string", b"0", True),  # the deferral gave its try back
        retry + b"stay": ("string", b"1", True),
        retry + b"stolen": ("string", b"1", True),
        KEYS.queue.encode(): (
            "zset",
            [(b"again", T + 3000), (b"stay", parked), (b"stolen", parked)],
            False,
        ),
        KEYS.queue_of("mail").encode(): ("zset", [(b"later", T + 2000)], False),
        KEYS.abort.encode(): ("zset", [(b"elsewhere", T)], False),
        KEYS.wake_marker.encode(): ("zset", [(b"wake", T + 2000)], False),
        KEYS.done.encode(): ("zset", [(b"ok", T)], False),
        KEYS.failures.encode(): ("zset", [(b"bad", T)], False),
        KEYS.stats("default", hour).encode(): ("hash", {f"{minute}:done".encode(): b"1"}, True),
        KEYS.stats("mail", hour).encode(): ("hash", {f"{minute}:failed".encode(): b"1"}, True),
        KEYS.task_stats(hour).encode(): (
            "hash",
            {
                f"{minute}:send:d".encode(): b"1",
                f"{minute}:send:f".encode(): b"1",
                f"{slot}:ms".encode(): b"400030",
                f"{slot}:2".encode(): b"1",  # 30 ms: the second bucket (<= 50 ms)
                f"{slot}:{len(K.TASK_BUCKETS_MS) + 1}".encode(): b"1",  # beyond every bucket
            },
            True,
        ),
    }  # the holds set: empty, gone


async def test_finish_announces_a_job_put_back_on_its_marker(r: Any) -> None:
    """A job retried or deferred is announced like a new one: its due time on the wake marker
    (a duty lane's on the duty marker, no channel message: consumers of earlier versions read
    no lanes), so a consumer waiting there claims it when it is due, leader or not (a deferral
    announced on the channel alone waited for the consumers' 30 s fallback look)."""
    store = Store(r, KEYS)
    for jid, queue in {"user": "default", "tick": "default:duty"}.items():
        await r.zadd(KEYS.queue_of(queue), {jid: T - 10})
        await r.set(K.ARQ_JOB + jid, b"p")
    await _claim(store, queues=("default:duty", "default"))
    await store.finish(
        "me", [Finish("defer", "tick", "me/1", score_ms=T + 700, queue="default:duty")], now_ms=T
    )
    assert await r.zrange(KEYS.wake_duty_marker, 0, -1, withscores=True) == [(b"wake", T + 700)]
    assert await r.exists(KEYS.wake_marker) == 0
    await store.finish("me", [Finish("defer", "user", "me/1", score_ms=T + 900)], now_ms=T)
    assert await r.zrange(KEYS.wake_marker, 0, -1, withscores=True) == [(b"wake", T + 900)]


async def test_finish_retention_trims_at_most_what_a_batch_brings(r: Any) -> None:
    """Retention's bound: a batch trims at most TRIM_MAX (1000) more recent failures than it
    adds, by age and by count, their records with them; completions by rank."""
    store = Store(r, KEYS)
    old = {f"old{i:04}": T - 10**8 + i for i in range(1005)}
    await r.zadd(KEYS.failures, old)
    await r.mset({KEYS.failure(j): b"{}" for j in old})
    await r.zadd(KEYS.done, {f"d{i}": T - 10 + i for i in range(5)})
    for jid in ("f1", "d9"):
        await r.zadd(KEYS.queue, {jid: T - 10})
        await r.set(K.ARQ_JOB + jid, b"p")
    await _claim(store)
    runs = [
        Finish("failed", "f1", "me/1", failure=b"{}", failure_ttl_ms=60_000),
        Finish("done", "d9", "me/1"),
    ]
    keep = Retention(failures=5000, failures_ms=60_000, done=2)
    await store.finish("me", runs, now_ms=T, retention=keep)
    # by age: 1001 of the 1005 old ones (TRIM_MAX + the 1 added), the rest at the next batch
    assert await r.zrange(KEYS.failures, 0, -1) == [
        *(f"old{i}".encode() for i in range(1001, 1005)),
        b"f1",
    ]
    assert await r.exists(*(KEYS.failure(f"old{i:04}") for i in range(1005))) == 4
    assert await r.zrange(KEYS.done, 0, -1) == [b"d4", b"d9"]
    # by count: as many as 1001 beyond the kept number
    fresh = {f"new{i:04}": T - 1000 + i / 10 for i in range(1005)}
    await r.zadd(KEYS.failures, fresh)
    await r.zadd(KEYS.queue, {"f2": T - 10})
    await r.set(K.ARQ_JOB + "f2", b"p")
    await _claim(store)
    keep = Retention(failures=3, failures_ms=10**9, done=2)
    await store.finish(
        "me", [Finish("failed", "f2", "me/1", failure=b"{}")], now_ms=T, retention=keep
    )
    # 1011 entries, 3 kept: 1001 of the oldest trimmed (TRIM_MAX + 1), 10 left
    left = await r.zrange(KEYS.failures, 0, -1)
    assert len(left) == 10 and left[-1] == b"f2" and b"old1004" not in left
    assert await r.exists(KEYS.failure("old1004"), KEYS.failure("f1")) == 1  # f1's record


async def test_claim_every_path_in_one_round(r: Any) -> None:
    """Foreign ids, markers held, stale and too long, bad records, abort requests and the
    second queue, in one CLAIM under a hash-tagged prefix."""
    keys = K.Keys("{t}:")
    store = Store(r, keys)
    ids = ["x:foreign", "held", "stale", "long", "free", "big", "hash", "missing", "badtry", "ab"]
    ids = [ids[0], *(f"{{t}}:{j}" for j in ids[1:])]
    await r.zadd(keys.queue, {jid: T - 100 + 10 * n for n, jid in enumerate(ids)})
    await r.zadd(keys.queue, {"{t}:future": T + 1})
    await r.zadd(keys.queue_of("low"), {"{t}:low1": T - 5, "{t}:low2": T - 4})
    for jid in [*ids, "{t}:low1", "{t}:low2"]:
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.set(K.ARQ_JOB + "{t}:big", b"x" * 2000)
    await r.delete(K.ARQ_JOB + "{t}:hash", K.ARQ_JOB + "{t}:missing")
    await r.hset(K.ARQ_JOB + "{t}:hash", "f", "x")
    await r.hset(K.ARQ_RETRY + "{t}:badtry", "n", 1)
    await r.set(K.ARQ_IN_PROGRESS + "{t}:held", b"1", px=30_000)  # arq's own Worker runs it
    await r.set(K.ARQ_IN_PROGRESS + "{t}:stale", b"1")  # no TTL: taken over
    await r.set(K.ARQ_IN_PROGRESS + "{t}:long", b"1", px=10**9)  # cut to the marker TTL
    await r.zadd(keys.abort, {"{t}:ab": T, "{t}:gone": T})
    got = await _claim(store, limit=9, queues=("default", "low"))
    assert (got.aborts_pending, got.stale) == (2, 2)
    summary = [
        (j.job_id, j.score_ms, j.try_, j.payload, j.size, j.queue, j.aborted) for j in got.jobs
    ]
    assert summary == [
        ("x:foreign", T - 100, -1, None, claims_lua.FOREIGN, "default", False),
        ("{t}:stale", T - 80, 1, b"p", 1, "default", False),
        ("{t}:free", T - 60, 1, b"p", 1, "default", False),
        ("{t}:big", T - 50, 1, None, 2000, "default", False),
        ("{t}:hash", T - 40, 1, None, -1, "default", False),
        ("{t}:missing", T - 30, 1, None, 0, "default", False),
        ("{t}:badtry", T - 20, -1, b"p", 1, "default", False),
        ("{t}:ab", T - 10, 1, b"p", 1, "default", True),
        ("{t}:low1", T - 5, 1, b"p", 1, "low", False),  # the limit: 9 ids, the foreign one too
    ]
    parked = float(T + 60_000)
    claimed = [j.job_id.encode() for j in got.jobs[1:]]
    assert sorted(await r.smembers(keys.holds("me"))) == sorted(claimed)
    assert 0 < await r.pttl(keys.holds("me")) <= 60_000
    assert await r.zrange(keys.queue, 0, -1, withscores=True) == [
        (b"{t}:held", T - 90),
        (b"{t}:long", T - 70),
        (b"{t}:future", T + 1),
        *sorted((j, parked) for j in claimed[:-1]),
    ]
    assert await r.zrange(keys.queue_of("low"), 0, -1, withscores=True) == [
        (b"{t}:low2", T - 4),
        (b"{t}:low1", parked),
    ]
    assert await r.get(K.ARQ_JOB + "x:foreign") == b"p"  # never touched
    assert await r.exists(K.ARQ_IN_PROGRESS + "x:foreign", K.ARQ_RETRY + "x:foreign") == 0
    assert await r.get(K.ARQ_IN_PROGRESS + "{t}:held") == b"1"
    assert 0 < await r.pttl(K.ARQ_IN_PROGRESS + "{t}:held") <= 30_000
    assert await r.get(K.ARQ_IN_PROGRESS + "{t}:long") == b"1"
    assert 0 < await r.pttl(K.ARQ_IN_PROGRESS + "{t}:long") <= 60_000
    assert await r.get(K.ARQ_IN_PROGRESS + "{t}:stale") == b"me/1"
    assert await r.type(K.ARQ_RETRY + "{t}:badtry") == b"hash"
    assert 0 < await r.pttl(K.ARQ_RETRY + "{t}:free") <= 60_000


async def test_claim_counts_tries_as_arq_does(r: Any) -> None:
    """A first try sets the counter to 1 with its TTL (one ``SET NX PX``: arq's ``INCR`` and
    ``EXPIRE``); a later one increments it, its TTL kept; a counter a deferral gave back to 0
    counts 1 again with its TTL renewed."""
    store = Store(r, K.Keys("c:"))
    for jid in ("new", "third", "deferred"):
        await r.zadd("c:queue", {jid: T - 1})
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.set(K.ARQ_RETRY + "third", 2, px=5_000)
    await r.set(K.ARQ_RETRY + "deferred", 0, px=5_000)
    got = await _claim(store, queues=("default",))
    assert {j.job_id: j.try_ for j in got.jobs} == {"new": 1, "third": 3, "deferred": 1}
    assert await r.mget([K.ARQ_RETRY + j for j in ("new", "third", "deferred")]) == [
        b"1",
        b"3",
        b"1",
    ]
    assert 5_000 < await r.pttl(K.ARQ_RETRY + "new") <= 60_000
    assert 0 < await r.pttl(K.ARQ_RETRY + "third") <= 5_000  # kept
    assert 5_000 < await r.pttl(K.ARQ_RETRY + "deferred") <= 60_000  # renewed at 1


async def test_claim_reads_past_at_most_claim_skips_held_jobs(r: Any) -> None:
    store = Store(r, KEYS)
    held = {f"h{i:04}": T - 2000 + i for i in range(claims_lua.CLAIM_SKIPS)}
    await r.zadd(KEYS.queue, {**held, "free": T})
    async with r.pipeline(transaction=False) as pipe:
        for jid in held:
            pipe.set(K.ARQ_IN_PROGRESS + jid, b"1", px=60_000)
        await pipe.execute()
    assert (await _claim(store)).jobs == []  # CLAIM_SKIPS held: the round ends there
    await r.delete(K.ARQ_IN_PROGRESS + "h0000")
    assert [j.job_id for j in (await _claim(store)).jobs] == ["h0000", "free"]


async def test_claim_takes_ids_outside_the_users_key_patterns_off_the_queue(
    redis_url: str,
) -> None:
    """CLAIM_FOREIGN's ``denied``: on the real server only (fakeredis refuses the whole call
    where the server refuses the one command inside it)."""
    admin = aioredis.Redis.from_url(redis_url)
    user = f"claim{uuid.uuid4().hex[:6]}"
    patterns = ["~t:*", "~arq:job:t:*", "~arq:in-progress:t:*", "~arq:retry:t:*"]
    await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", *patterns, "+@all")
    limited = aioredis.Redis.from_url(redis_url.replace("://", f"://{user}:pw@"))
    try:
        await admin.zadd(KEYS.queue, {"other": T - 20, "t:mine": T - 10})
        await admin.set(K.ARQ_JOB + "other", b"p")
        await admin.set(K.ARQ_JOB + "t:mine", b"p")
        got = await _claim(Store(limited, KEYS))
        assert [(j.job_id, j.size) for j in got.jobs] == [
            ("other", claims_lua.FOREIGN),
            ("t:mine", 1),
        ]
        assert await admin.zrange(KEYS.queue, 0, -1) == [b"t:mine"]
        assert await admin.get(K.ARQ_JOB + "other") == b"p"  # never touched
        assert await admin.exists(K.ARQ_IN_PROGRESS + "other", K.ARQ_RETRY + "other") == 0
    finally:
        await limited.aclose()
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


@pytest.mark.parametrize(
    ("before", "reason", "gap"),
    [
        ("history", "first", BOUND),  # a history but no counter or state: someone led
        ("counter", "after expiry", BOUND),  # a counter but no state
        ("unreadable renew", "after expiry", BOUND),
        ("renewed long ago", "after expiry", 0),
    ],
)
async def test_acquire_gap_of_every_previous_state(
    r: Any, before: str, reason: str, gap: int
) -> None:
    store = Store(r, KEYS)
    if before == "history":
        await r.lpush(KEYS.leader_history, "1|1|first|a")
    elif before == "counter":
        await r.set(KEYS.leader_epoch, 5)
    else:
        renewed = "zz" if before == "unreadable renew" else "1000"
        await r.hset(KEYS.leader_state, mapping={"epoch": "5", "renewed_ms": renewed})
    won = await store.acquire("tokA", 5000, bound_ms=BOUND, instance="a")
    assert isinstance(won, Acquired) and won.gap_ms == gap
    assert (await store.leader_history())[0].reason == reason


async def test_a_refused_campaign_below_the_counter_writes_nothing(r: Any) -> None:
    """A floor above the holder's epoch but not above the counter: the counter is read, not
    written."""
    store = Store(r, KEYS)
    await r.set(KEYS.leader, "5:other", px=5000)
    await r.set(KEYS.leader_epoch, AHEAD)
    before = await snapshot(r)
    refused = await store.acquire("tokB", 5000, floor=AHEAD - 1)
    assert isinstance(refused, Refused) and refused.holder == LockValue(5, "other")
    assert refused.malformed == () and await snapshot(r) == before


async def test_mutex_release_only_by_owner(r: Any) -> None:
    name = KEYS.mutex("m")
    assert await run(r, leases_lua.LEASE_RELEASE, [name], ["tok"]) == 0  # absent
    await r.set(name, "tok", px=5000)
    assert await run(r, leases_lua.LEASE_RELEASE, [name], ["other"]) == 0
    assert await run(r, leases_lua.LEASE_RELEASE, [name], ["to"]) == 0
    assert await r.get(name) == b"tok"
    assert await run(r, leases_lua.LEASE_RELEASE, [name], ["tok"]) == 1
    assert await r.exists(name) == 0


def test_keys_live_under_the_prefix() -> None:
    k = K.Keys("app1:")
    k_ids = JobIds("app1:")
    names = [
        k.queue,
        k.leader,
        k.leader_epoch,
        k.leader_channel,
        k.leader_announce,
        k.leader_state,
        k.boot,
        k.periodic_state,
        k.periodic_enqueued,
        k_ids.periodic("j", 1),
        k.poll_shard("p", 0),
        k.poll_inflight("p"),
        k_ids.poll("p", "i", 1),
        k.init_state("i"),
        k.instances,
        k.instance("x"),
        k.holds("x"),
        k.arq_health("x"),
        k.mutex("m"),
        k.once("o"),
        k_ids.unique("u"),
        k.dead,
        k.dead_jobs,
        k.dead_index,
    ]
    assert all(n.startswith("app1:") for n in names)
    assert len(set(names)) == len(names)
    # one poller's keys share a Redis Cluster hash tag
    assert "{p}" in k.poll_shard("p", 3) and "{p}" in k.poll_inflight("p")


async def test_acquire_replaces_own_orphaned_lock_with_a_new_epoch(r: Any) -> None:
    # An acquisition whose reply the caller never saw (client timeout) left our token behind.
    await r.set(KEYS.leader, f"{AHEAD}:tok", px=10_000)
    await r.set(KEYS.leader_epoch, AHEAD)
    store = Store(r, KEYS)
    won = await store.acquire("tok", 5_000)
    assert isinstance(won, Acquired) and str(won.lock) == f"{AHEAD + 1}:tok"
    assert await r.get(KEYS.leader) == f"{AHEAD + 1}:tok".encode()
    assert 0 < await r.pttl(KEYS.leader) <= 5_000
    # ...but a token that merely ends the same way is someone else's lock.
    await r.set(KEYS.leader, "6:other-tok", px=10_000)
    assert isinstance(await store.acquire("tok", 5_000), Refused)
    assert await r.get(KEYS.leader) == b"6:other-tok"


async def test_inflight_clear_by_job_id_and_by_missing_job(r: Any) -> None:
    inflight, removed = KEYS.poll_inflight("p"), KEYS.poll_removed("p")
    keys = [inflight, removed]
    await r.hset(inflight, mapping={"a": "job-a", "b": "job-b", "c": "job-c"})
    await r.hset(removed, mapping={"a": "job-a", "c": "job-c"})
    await r.set(K.ARQ_JOB + "job-c", b"x")
    # The ended job's id must match the entry (a newer dispatch is left alone).
    assert await run(r, poller_lua.INFLIGHT_CLEAR, keys, ["a", "job-old", K.ARQ_JOB]) == 0
    assert await run(r, poller_lua.INFLIGHT_CLEAR, keys, ["a", "job-a", K.ARQ_JOB]) == 1
    # Without a job id: cleared only when the recorded job no longer exists.
    assert await run(r, poller_lua.INFLIGHT_CLEAR, keys, ["b", "", K.ARQ_JOB]) == 1
    assert await run(r, poller_lua.INFLIGHT_CLEAR, keys, ["c", "", K.ARQ_JOB]) == 0
    assert await run(r, poller_lua.INFLIGHT_CLEAR, keys, ["zz", "", K.ARQ_JOB]) == 0
    assert await r.hgetall(inflight) == {b"c": b"job-c"}
    assert await r.hgetall(removed) == {b"c": b"job-c"}  # a removal mark goes with its job


async def test_dead_retry_requeues_once_and_refuses_live_ids(r: Any) -> None:
    jid = "t:job-1"
    await r.zadd(KEYS.dead, {jid: T})
    await r.hset(KEYS.dead_jobs, jid, "{}")
    await r.hset(KEYS.dead_index, jid, "{}")
    await r.set(K.ARQ_RESULT + jid, b"failed")
    await r.set(K.ARQ_RETRY + jid, 5)
    args = [jid, b"payload", K.ARQ_JOB, K.ARQ_RESULT, K.ARQ_RETRY, JOB_TTL, T + 1, KEYS.wake]
    keys = [KEYS.queue, KEYS.dead, KEYS.dead_jobs, KEYS.dead_index]
    await r.set(K.ARQ_JOB + jid, b"still queued")
    assert await run(r, dead_lua.DEAD_RETRY, keys, args) == 0  # an id in use is never overwritten
    assert await r.get(K.ARQ_JOB + jid) == b"still queued"
    await r.delete(K.ARQ_JOB + jid)
    assert await run(r, dead_lua.DEAD_RETRY, keys, args) == 1
    assert await r.get(K.ARQ_JOB + jid) == b"payload"
    assert 0 < await r.pttl(K.ARQ_JOB + jid) <= JOB_TTL
    assert await r.zscore(KEYS.queue, jid) == T + 1
    assert not await r.exists(K.ARQ_RESULT + jid, K.ARQ_RETRY + jid)  # tries start over
    assert await r.zcard(KEYS.dead) == 0 and await r.hlen(KEYS.dead_jobs) == 0
    assert await r.hlen(KEYS.dead_index) == 0
    assert await run(r, dead_lua.DEAD_RETRY, keys, args) == -1


async def test_leases_renew_and_take_in_one_step(r: Any) -> None:
    store = Store(r, KEYS)
    keys = [KEYS.service_lease("s", f"k{n}") for n in range(5)]
    await r.set(keys[1], "other", px=60_000)
    assert await store.take_leases(keys, "me", 5000) == [True, False, True, True, True]
    await r.set(keys[2], "intruder", px=60_000)
    assert await store.renew_leases(keys, "me", 20_000) == [True, False, False, True, True]
    assert 10_000 < await r.pttl(keys[0]) <= 20_000
    assert await r.get(keys[2]) == b"intruder"


async def test_claim_skips_paused_queues_and_takes_them_again_once_resumed(r: Any) -> None:
    """A queue whose ``queue:<name>`` is in the paused set is skipped (its jobs stay due and
    untouched) while the next queue is claimed from; ``queue:*`` pauses every queue."""
    keys = K.Keys("{t}:")
    store = Store(r, keys)
    await r.zadd(keys.queue, {"{t}:d1": T - 10})
    await r.zadd(keys.queue_of("low"), {"{t}:l1": T - 5})
    for jid in ("{t}:d1", "{t}:l1"):
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.sadd(keys.paused, "queue:default", "periodic:report")
    got = await _claim(store, queues=("default", "low"))
    assert [j.job_id for j in got.jobs] == ["{t}:l1"]
    assert await r.zscore(keys.queue, "{t}:d1") == T - 10  # untouched: no marker, no try
    assert await r.exists(K.ARQ_IN_PROGRESS + "{t}:d1", K.ARQ_RETRY + "{t}:d1") == 0
    await r.sadd(keys.paused, "queue:*")
    await r.srem(keys.paused, "queue:default")
    await r.zadd(keys.queue_of("low"), {"{t}:l2": T - 5})
    assert (await _claim(store, queues=("default", "low"))).jobs == []
    await r.srem(keys.paused, "queue:*")
    got = await _claim(store, queues=("default", "low"))
    assert [j.job_id for j in got.jobs] == ["{t}:d1", "{t}:l2"]


async def test_fair_enqueue_and_move_round_robin_by_pass_fifo_within_a_key(r: Any) -> None:
    """FAIR_ENQUEUE: each job into its flow key's queue (a tie in the same ms ordered by a
    1/1024 ms fraction), the key into the ring at its lowest pass, an id taken refused.
    FAIR_MOVE: due jobs into the queue proper in whole ms, lowest pass first (1 / weight per
    move), keys with nothing due passed over, empty keys out of the ring, a paused queue none."""
    from worker.storage.enqueue import QueuedJob
    from worker.storage.jobs import NewJob

    keys = K.Keys("{t}:")
    store = Store(r, keys)

    def job(jid: str, flow: str, at: int = T) -> QueuedJob:
        return QueuedJob(NewJob("{t}:" + jid, b"p", at), "default", JOB_TTL, flow)

    batch = [job("a1", "a"), job("a2", "a"), job("a3", "a"), job("b1", "b"), job("a1", "x")]
    assert await store.fair_enqueue(batch) == [True] * 4 + [False]
    assert await store.fair_enqueue([job("later", "c", T + 60_000)]) == [True]
    assert await r.zrange(keys.fair("default", "a"), 0, -1, withscores=True) == [
        (b"{t}:a1", T),
        (b"{t}:a2", T + 1 / 1024),
        (b"{t}:a3", T + 2 / 1024),
    ]
    assert await r.zrange(keys.fair("default"), 0, -1, withscores=True) == [
        (b"a", 0.0),
        (b"b", 0.0),
        (b"c", 0.0),
    ]
    assert await r.exists(keys.fair("default", "x")) == 0
    await r.sadd(keys.paused, "queue:default")
    assert await store.fair_move("default", T + 5, 10) == 0
    await r.srem(keys.paused, "queue:default")
    assert await store.fair_move("default", T + 5, 2, {"a": 2}) == 2  # a, then b
    assert await r.zrange(keys.queue, 0, -1, withscores=True) == [(b"{t}:a1", T), (b"{t}:b1", T)]
    assert await store.fair_move("default", T + 5, 2) == 0  # two due already: room for none
    await r.zrem(keys.queue, "{t}:a1", "{t}:b1")
    assert await store.fair_move("default", T + 5, 10) == 2  # a's rest; c has nothing due
    assert await r.zrange(keys.fair("default"), 0, -1, withscores=True) == [(b"c", 0.0)]
    assert await r.zrange(keys.queue, 0, -1) == [b"{t}:a2", b"{t}:a3"]
    assert await store.fair_move("default", T + 60_000, 10) == 1
    assert await r.exists(keys.fair("default"), keys.fair("default", "c")) == 0


@pytest.mark.parametrize("mode", ["replace", "debounce", "throttle", "keep_last"])
async def test_coalesce_writes_the_state_the_job_and_the_announcement(r: Any, mode: str) -> None:
    from worker.core.flow import Coalesce

    store = Store(r, KEYS)
    how = Coalesce.of(
        mode,
        debounce_s=1.0 if mode == "debounce" else None,
        max_wait_s=5.0 if mode == "debounce" else None,
        throttle_s=2.0 if mode == "throttle" else None,
    )
    assert how is not None
    state = KEYS.coalesce("note", "k")
    one = await store.coalesce_enqueue(
        how, state, "t:a", b"one", now_ms=T, due_ms=T, ttl_ms=JOB_TTL
    )
    two = await store.coalesce_enqueue(
        how, state, "t:b", b"two", now_ms=T + 100, due_ms=T + 100, ttl_ms=JOB_TTL
    )
    assert (one.code, one.job_id) == (1, "t:a")
    snap = await snapshot(r)
    assert snap[state.encode()][1][b"p"] == b"t:a"
    assert snap[state.encode()][2]  # it expires
    if mode == "throttle":  # dropped within the period: nothing written
        assert (two.code, two.job_id) == (0, None)
        assert snap[state.encode()][1][b"t"] == str(T + 2000).encode()
        assert snap[b"arq:job:t:a"] == ("string", b"one", True)
        return
    assert (two.code, two.job_id) == (2, "t:a")  # folded into the pending job
    assert snap[b"arq:job:t:a"] == ("string", b"two", True)
    due = T + 100 + 1000 if mode == "debounce" else T
    assert snap[KEYS.queue.encode()] == ("zset", [(b"t:a", float(due))], False)
    assert b"arq:job:t:b" not in snap


async def test_a_queues_pause_leaves_its_duty_lane_flowing(r: Any) -> None:
    """``queue:default`` paused: the lane ``default:duty`` is still claimed (ticks and poll jobs
    of a paused queue run); ``queue:default:duty`` pauses the lane, ``queue:*`` both."""
    keys = K.Keys("{t}:")
    store = Store(r, keys)
    lanes = ("default:duty", "default")
    for jid, queue in {"{t}:tick1": "default:duty", "{t}:user": "default"}.items():
        await r.zadd(keys.queue_of(queue), {jid: T - 10})
        await r.set(K.ARQ_JOB + jid, b"p")
    await r.sadd(keys.paused, "queue:default")
    assert [j.job_id for j in (await _claim(store, queues=lanes)).jobs] == ["{t}:tick1"]
    await r.zadd(keys.queue_of("default:duty"), {"{t}:tick2": T - 5})
    await r.set(K.ARQ_JOB + "{t}:tick2", b"p")
    for entry in ("queue:default:duty", "queue:*"):
        await r.sadd(keys.paused, entry)
        assert (await _claim(store, queues=lanes)).jobs == []
        await r.srem(keys.paused, entry)
    await r.srem(keys.paused, "queue:default")
    got = await _claim(store, queues=lanes)
    assert [j.job_id for j in got.jobs] == ["{t}:tick2", "{t}:user"]
