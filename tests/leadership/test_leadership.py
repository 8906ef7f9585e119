"""Leadership on the real server: one suite for both implementations, plus elector specifics.

Lease timing is driven by a :class:`FakeClock` wherever a test judges *when* something happens:
the elector waits on the clock, the test advances it, and nothing asserts on wall-clock time.
The singleton group a leader starts and stops is a :class:`Probe` that records what it saw.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
import structlog
from redis.asyncio.connection import Connection as AsyncConnection

from harness import eventually
from harness.settled import SettledClock, counting
from worker.core.clock import Clock, FakeClock, SystemClock
from worker.core.component import Component, Group
from worker.core.ids import LockValue
from worker.core.metrics import Metrics
from worker.leadership.base import Leadership, LeaderTiming
from worker.leadership.elector import LeaderElector
from worker.leadership.maintainer import LeaderWork
from worker.leadership.static import StaticLeader
from worker.storage import keys as K
from worker.storage.election import Acquired
from worker.storage.store import Store

KEYS = K.Keys("t:")
FAST = LeaderTiming(ttl_s=1.0, renew_interval_s=0.2, renew_deadline_s=0.6, poll_interval_s=0.1)
#: on real time (a SystemClock): a renew slowed by a loaded box must not cost the lease
REAL = LeaderTiming(ttl_s=4.0, renew_interval_s=0.5, renew_deadline_s=2.0, poll_interval_s=0.1)


@pytest.fixture(autouse=True)
def _settled() -> Iterator[None]:
    """Fake time waits for the Redis replies (:class:`harness.settled.SettledClock`): a round
    trip slowed by a loaded box costs no fake time, so no lease runs out during one."""
    with counting():
        yield


class Probe(Component):
    """Stands in for the singleton components: records when it starts and stops."""

    def __init__(self, clock: Clock, stop_delay: float = 0.0) -> None:
        super().__init__("probe", clock)
        self.stop_delay = stop_delay
        self.events: list[tuple[str, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        self.events.append(("start", self.clock.monotonic()))
        try:
            await stop.wait()
        finally:
            if self.stop_delay:
                await asyncio.sleep(self.stop_delay)  # stopping the singletons takes a while
            self.events.append(("stop", self.clock.monotonic()))

    def count(self, kind: str) -> int:
        return sum(1 for e, _ in self.events if e == kind)


class Run:
    """A leadership implementation running as a task, with a probe as its singletons."""

    def __init__(self, leader: Leadership, probe: Probe) -> None:
        self.leader = leader
        self.probe = probe
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Run:
        self.task = asyncio.create_task(self.leader.run(self.stop))
        return self

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)
        await self.leader.retire()


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Callable[[], Store]]:
    made: list[aioredis.Redis] = []

    def make() -> Store:
        c = aioredis.Redis.from_url(redis_url)
        made.append(c)
        return Store(c, KEYS)

    yield make
    for c in made:
        await c.aclose()


@pytest.fixture
async def runs() -> AsyncIterator[list[Run]]:
    started: list[Run] = []
    yield started
    for r in started:
        await r.halt()


@pytest.fixture(params=["elector", "static"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def start(
    kind: str,
    store: Store,
    runs: list[Run],
    *,
    clock: Clock | None = None,
    timing: LeaderTiming | None = None,
    stop_delay: float = 0.0,
) -> Run:
    timing = timing or (REAL if clock is None else FAST)
    clock = clock or SystemClock()
    probe = Probe(clock, stop_delay)
    group = Group("singletons", [probe])
    leader: Leadership
    if kind == "elector":
        leader = LeaderElector(store, timing, clock, stop_grace_s=2)
    else:
        leader = StaticLeader(store, clock, retry_s=0.1)
    leader.listen(LeaderWork(group, stop_grace_s=2))
    run = Run(leader, probe).start()
    runs.append(run)
    return run


# ---------------------------------------------------------------------------------------------
# Shared behaviour (LeaderElector and StaticLeader)
# ---------------------------------------------------------------------------------------------


async def test_becomes_leader_with_consistent_state(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    run = start(kind, clients(), runs)
    lead = run.leader
    assert not lead.is_leading() and lead.epoch is None and lead.lock is None
    await eventually(lambda: lead.is_leading(), what="leadership")
    await eventually(lambda: run.probe.count("start") == 1, what="singletons started")

    assert lead.lock is not None
    assert LockValue.parse(rsync.get(KEYS.leader)) == lead.lock
    assert lead.lock.token == lead.token  # type: ignore[attr-defined]
    # the epoch counter holds the lock's epoch; a fresh dataset starts it at the server's clock
    assert lead.epoch == int(rsync.get(KEYS.leader_epoch) or 0)
    sec, usec = rsync.time()
    assert 0 <= sec * 1000 + usec // 1000 - lead.epoch < 60_000
    assert (lead.lease_age() or 0) >= 0
    assert lead.health.extra["is_leader"] is True
    assert lead.health.extra["epoch"] == lead.epoch
    pttl = rsync.pttl(KEYS.leader)
    ttl_s = REAL.ttl_s if kind == "elector" else lead.ttl_s  # type: ignore[attr-defined]
    assert 0 < pttl <= ttl_s * 1000  # the static lease expires too


async def test_release_deletes_the_lock(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    run = start(kind, clients(), runs)
    lead = run.leader
    await eventually(lambda: lead.is_leading())
    await run.halt()
    assert run.probe.count("stop") == 1  # retiring stopped the singletons
    assert rsync.exists(KEYS.leader) == 1  # stopping alone does not release (the runtime does)
    await lead.release()
    assert rsync.exists(KEYS.leader) == 0
    assert (lead.is_leading(), lead.lock, lead.epoch, lead.lease_age()) == (False, None, None, None)
    await lead.release()  # idempotent


async def test_release_never_deletes_someone_elses_lock(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    run = start(kind, clients(), runs)
    await eventually(lambda: run.leader.is_leading())
    await run.halt()
    rsync.set(KEYS.leader, "99:successor", px=30_000)
    await run.leader.release()
    assert rsync.get(KEYS.leader) == b"99:successor"
    assert not run.leader.is_leading()


async def test_lost_steps_down_then_reacquires_with_new_epoch(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    run = start(kind, clients(), runs, stop_delay=0.5)
    lead = run.leader
    await eventually(lambda: lead.is_leading())
    first = lead.lock
    assert first is not None

    lead.lost("poller:cards: FENCED test")
    await eventually(lambda: not lead.is_leading(), what="step down")
    # Let the lease lapse now, so a re-acquisition could happen within one poll (0.1 s) if the
    # singletons' stop (0.5 s) were not awaited first.
    rsync.delete(KEYS.leader)
    await eventually(lambda: run.probe.count("start") == 2, within=10, what="re-election")

    second = lead.lock
    assert second is not None and second.epoch > first.epoch and second != first
    assert LockValue.parse(rsync.get(KEYS.leader)) == second
    # the singletons stopped (the stop was awaited) before leadership was taken again
    assert [e for e, _ in run.probe.events] == ["start", "stop", "start"]
    assert lead.health.extra["last_loss"] == "poller:cards: FENCED test"


async def test_lost_while_not_leading_is_ignored(kind: str, clients: Any) -> None:
    clock = SystemClock()
    lead: Leadership = (
        LeaderElector(clients(), FAST, clock)
        if kind == "elector"
        else StaticLeader(clients(), clock)
    )
    lead.lost("nothing to lose")
    assert not lead._lost.is_set()


# ---------------------------------------------------------------------------------------------
# LeaderElector only
# ---------------------------------------------------------------------------------------------


async def test_two_electors_exactly_one_leader(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    clock = SettledClock()
    a = start("elector", clients(), runs, clock=clock)
    b = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: a.leader.is_leading() or b.leader.is_leading(), clock=clock)
    for _ in range(20):  # several renew cycles of fake time: never two, never none
        assert a.leader.is_leading() != b.leader.is_leading()
        holder = a if a.leader.is_leading() else b
        assert LockValue.parse(rsync.get(KEYS.leader)) == holder.leader.lock
        await clock.run_for(0.1)
        await asyncio.sleep(0.005)
    assert a.probe.count("start") + b.probe.count("start") == 1
    assert a.probe.count("stop") == b.probe.count("stop") == 0


async def test_replies_slowed_by_a_loaded_box_cost_no_fake_time(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every reply 50 ms late (a box at load 20): the lease (0.6 s renew deadline of fake
    time) is kept over 60 renews; fake time waits for each round trip. The lock's TTL is the
    one figure Redis counts in real time: 30 s here, so a starved box whose fake renew
    interval took over a second of real time (the default 1 s TTL) cannot let the lock
    expire under a live lease (seen once in a loaded rehearsal: a new epoch 3.6 s in)."""
    real_read = AsyncConnection.read_response

    async def late_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)
        return await real_read(self, *args, **kwargs)

    clock = SettledClock()
    timing = LeaderTiming(ttl_s=30, renew_interval_s=0.2, renew_deadline_s=0.6, poll_interval_s=0.1)
    a = start("elector", clients(), runs, clock=clock, timing=timing)
    await eventually(lambda: a.leader.is_leading(), clock=clock, what="a leads")
    monkeypatch.setattr(AsyncConnection, "read_response", late_read)
    epoch = a.leader.epoch
    for _ in range(60):  # 60 renew intervals of fake time
        await clock.run_for(FAST.renew_interval_s, step=0.05)
        assert a.leader.is_leading() and a.leader.epoch == epoch
    assert a.probe.count("start") == 1 and a.probe.count("stop") == 0


async def test_standby_takes_over_at_once_on_release(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    # The standby's poll interval is 5 s of fake time that the test never lets pass, so only
    # the release notification can explain the takeover.
    clock = SettledClock()
    slow_poll = LeaderTiming(ttl_s=10, renew_interval_s=2, renew_deadline_s=6, poll_interval_s=5)
    a = start("elector", clients(), runs, clock=clock, timing=slow_poll)
    await eventually(lambda: a.leader.is_leading())
    b = start("elector", clients(), runs, clock=clock, timing=slow_poll)
    await eventually(lambda: b.leader.health.iterations >= 1, what="standby's first campaign")
    await eventually(
        lambda: rsync.pubsub_numsub(KEYS.leader_channel) == [(KEYS.leader_channel.encode(), 2)],
        what="both electors subscribed",
    )
    await a.halt()
    before = clock.monotonic()
    await a.leader.release()
    await eventually(lambda: b.leader.is_leading(), within=4, what="standby takeover")
    assert clock.monotonic() == before  # no fake time passed: the notification woke it
    assert (b.leader.epoch or 0) > (a.leader.floor or 0) > 0


async def test_overwritten_lock_makes_holder_step_down_on_next_renew(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    clock = SettledClock()
    a = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: a.leader.is_leading())
    t0 = clock.monotonic()
    rsync.set(KEYS.leader, "99:intruder", px=30_000)
    await eventually(lambda: a.probe.count("stop") == 1, within=3, what="step down", clock=clock)
    assert a.leader.health.extra["last_loss"] == "lease is no longer ours"
    # it noticed at its next renew: within one renew interval of fake time
    assert a.probe.events[-1][1] - t0 <= FAST.renew_interval_s + 0.05
    assert not a.leader.is_leading()
    # it neither renewed nor deleted the intruder's lock, and stays a standby while it holds
    await clock.run_for(3 * FAST.poll_interval_s)
    await asyncio.sleep(0.05)
    assert rsync.get(KEYS.leader) == b"99:intruder"
    assert rsync.pttl(KEYS.leader) > 20_000
    assert not a.leader.is_leading() and a.probe.count("start") == 1


async def test_hanging_renew_steps_down_by_the_deadline(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    clock = SettledClock()
    store = clients()
    real_renew = store.renew_lock
    ok_sent: list[float] = []
    hang = asyncio.Event()

    async def renew(lock: LockValue, ttl_ms: int) -> bool:
        if hang.is_set():
            await asyncio.Event().wait()  # a renew that never returns (stalled connection)
        sent = clock.monotonic()
        ok = await real_renew(lock, ttl_ms)
        if ok:
            ok_sent.append(sent)
        return ok

    store.renew_lock = renew  # type: ignore[method-assign]
    a = start("elector", store, runs, clock=clock)
    await eventually(lambda: a.leader.is_leading() and ok_sent, clock=clock, what="a renew")
    first_epoch = a.leader.epoch
    hang.set()
    await eventually(lambda: a.probe.count("stop") == 1, within=3, what="step down", clock=clock)
    assert a.leader.health.extra["last_loss"] == "renew deadline passed"
    since_last_ok = a.probe.events[-1][1] - ok_sent[-1]
    # stepped down at the deadline, measured from the last successful renew's *send*, so while
    # the lease it had was still valid: nobody else could have led meanwhile
    assert FAST.renew_deadline_s - 0.02 <= since_last_ok < FAST.ttl_s, since_last_ok
    # Leading again (its own unexpired lease is replaced, see ACQUIRE) needs a new epoch.
    assert a.leader.epoch is None or a.leader.epoch > (first_epoch or 0)


async def test_standby_issues_one_command_per_holder_ttl_or_per_poll_when_unsubscribed(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    rsync.set(KEYS.leader, "99:other", px=60_000)  # someone else leads throughout
    sent = 0
    real_send = AsyncConnection.send_packed_command

    async def counting_send(self: Any, command: Any, check_health: bool = True) -> None:
        nonlocal sent
        sent += 1  # every request the process writes to any Redis connection
        await real_send(self, command, check_health)

    monkeypatch.setattr(AsyncConnection, "send_packed_command", counting_send)
    clock = SettledClock()
    b = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: b.leader.subscribed, what="the release channel", clock=clock)
    await eventually(lambda: b.leader.health.iterations >= 2, what="a campaign", clock=clock)

    def evalsha_calls() -> int:
        return int(rsync.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    async def window(seconds: float) -> tuple[int, int, int]:
        sent_before, sha_before, iters_before = sent, evalsha_calls(), b.leader.health.iterations
        for _ in range(200):
            await clock.run_for(seconds / 200, step=seconds / 200)
            await asyncio.sleep(0.002)
        campaigns = b.leader.health.iterations - iters_before
        return campaigns, sent - sent_before, evalsha_calls() - sha_before

    # subscribed: the refused campaign's PTTL (60 s, capped at the lease TTL) is the wait
    campaigns, requests, scripts = await window(4.0)
    expected = 4.0 / FAST.ttl_s  # ~4, not 4 / poll_interval = 40
    assert expected * 0.7 <= campaigns <= expected + 1, campaigns
    # client side, all connections: one request (the acquire script) per campaign
    assert campaigns <= requests <= campaigns + 2, (requests, campaigns)
    assert abs(scripts - campaigns) <= 1, (scripts, campaigns)  # the server saw the same
    # not subscribed (a release could go unheard): a campaign every poll interval
    b.leader.subscribed = False
    campaigns, requests, scripts = await window(2.0)
    expected = 2.0 / FAST.poll_interval_s  # ~20 with +-25 % jitter
    assert expected * 0.7 <= campaigns <= expected * 1.4 + 1, campaigns
    assert campaigns <= requests <= campaigns + 2, (requests, campaigns)
    assert not b.leader.is_leading() and rsync.get(KEYS.leader) == b"99:other"


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        LeaderTiming(ttl_s=1, renew_interval_s=0.6, renew_deadline_s=0.6)
    with pytest.raises(ValueError):
        LeaderTiming(ttl_s=1, renew_interval_s=0.2, renew_deadline_s=1)


def test_lock_value_round_trip() -> None:
    v = LockValue(12, "abc")
    assert str(v) == "12:abc"
    assert LockValue.parse("12:abc") == LockValue.parse(b"12:abc") == v
    assert LockValue.parse("12:a:b") == LockValue(12, "a:b")
    for bad in (None, "", "12", "x:abc", "12:", ":abc"):
        assert LockValue.parse(bad) is None


# ---------------------------------------------------------------------------------------------
# A lock that vanishes under a live leader; Redis data loss
# ---------------------------------------------------------------------------------------------


async def test_another_acquisition_makes_the_leader_look_and_step_down_at_once(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    """The announcement is a hint: the leader renews at once, and the renew (its own database)
    proves the lease gone."""
    clock = SettledClock()  # never advanced below: a renew can not be what noticed
    slow = LeaderTiming(ttl_s=10, renew_interval_s=2, renew_deadline_s=6, poll_interval_s=5)
    a = start("elector", clients(), runs, clock=clock, timing=slow)
    await eventually(lambda: a.probe.count("start") == 1, what="a leads")
    await eventually(
        lambda: rsync.pubsub_numsub(KEYS.leader_announce) == [(KEYS.leader_announce.encode(), 1)],
        what="a listens for announcements",
    )
    rsync.delete(KEYS.leader)  # the lock vanishes (a failover, a restart without persistence)
    other = await clients().acquire("intruder", 10_000, bound_ms=8_000)
    assert isinstance(other, Acquired)
    await eventually(lambda: a.probe.count("stop") == 1, within=3, what="a steps down")
    assert not a.leader.is_leading()
    assert a.leader.health.extra["last_loss"] == "lease is no longer ours"
    # its next campaign read the holder's lock: that raised its floor, not the announcement
    await eventually(lambda: a.leader.floor == other.lock.epoch, "the floor", within=3, clock=clock)
    assert rsync.get(KEYS.leader) == str(other.lock).encode()


async def test_a_lease_taken_after_an_unclean_end_settles_after_the_bound(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    clock = SettledClock()
    a = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: a.leader.is_leading() and a.leader.health.iterations >= 2, clock=clock)
    stop = asyncio.Event()
    # a released cleanly before: no wait (the first lease of this test had no predecessor)
    await a.halt()
    await a.leader.release()
    b = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: b.leader.is_leading(), clock=clock)
    assert await asyncio.wait_for(b.leader.settled(stop), 1) is True
    # the lock vanishes right after b's renew: c must wait out b's deadline + stop grace
    rsync.delete(KEYS.leader)
    c = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: c.leader.is_leading(), clock=clock, what="c acquires")
    waiting = asyncio.create_task(c.leader.settled(stop))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    bound = FAST.renew_deadline_s + 2  # stop grace 2 s in start()
    await clock.run_for(bound - 1.0)
    assert not waiting.done()
    await clock.run_for(1.2)
    assert await asyncio.wait_for(waiting, 1) is True


async def test_is_leading_turns_false_past_the_deadline_even_if_the_loop_never_ran(
    clients: Any, runs: list[Run]
) -> None:
    clock = SettledClock()
    a = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: a.leader.is_leading(), clock=clock)
    clock.advance(FAST.renew_deadline_s + 0.01)  # a freeze: nothing ran meanwhile
    assert a.leader.lock is not None  # the loop has not stepped down yet...
    assert a.leader.is_leading() is False  # ...but nobody may act on the lease any more


async def test_epochs_never_go_backwards_across_a_redis_data_loss(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    clock = SettledClock()
    a = start("elector", clients(), runs, clock=clock)
    b = start("elector", clients(), runs, clock=clock)
    for _ in range(3):  # a few handovers push the epoch up
        await eventually(lambda: a.leader.is_leading() or b.leader.is_leading(), clock=clock)
        holder = a if a.leader.is_leading() else b
        holder.leader.lost("test handover")
        await eventually(lambda h=holder: not h.leader.is_leading(), clock=clock)
    await eventually(lambda: a.leader.is_leading() or b.leader.is_leading(), clock=clock)
    seen = max(a.leader.floor, b.leader.floor)
    assert seen >= 3
    rsync.flushall()  # Redis restarted without persistence
    await eventually(
        lambda: (LockValue.parse(rsync.get(KEYS.leader)) or LockValue(0, "")).epoch > seen,
        within=10,
        clock=clock,
        what="a new lease above every epoch seen before the loss",
    )


async def test_a_standby_learns_the_current_epoch_from_every_refused_campaign(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    # pub/sub announcements can be missed (a reconnect); the campaign's answer cannot
    rsync.set(KEYS.leader, "41:other", px=60_000)
    clock = SettledClock()
    b = start("elector", clients(), runs, clock=clock)
    await eventually(lambda: b.leader.health.iterations >= 1, clock=clock)
    assert b.leader.floor == 41 and not b.leader.is_leading()


async def test_a_planned_handoff_moves_the_lease_to_a_standby(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    a = start("elector", clients(), runs)
    await eventually(lambda: a.leader.is_leading(), what="a leads")
    b = start("elector", clients(), runs)
    await asyncio.sleep(3 * REAL.poll_interval_s)
    assert not b.leader.is_leading()
    first = a.leader.epoch
    assert first is not None
    assert await clients().request_handoff(5_000) == first
    # the request is heard on pub/sub (or at the next renew): a stops its singletons and
    # releases; b takes over without waiting for an expiry, and a stays a standby meanwhile
    await eventually(lambda: b.leader.is_leading(), within=2 * REAL.ttl_s, what="b leads")
    assert a.probe.events[-1][0] == "stop" and not a.leader.is_leading()
    assert (b.leader.epoch or 0) > first
    history = await clients().leader_history()
    assert [h.reason for h in history[:2]] == ["after handoff", "handoff"]
    assert a.leader.health.extra["last_loss"] == "handoff requested"
    assert rsync.exists(KEYS.leader_handoff) == 0
    await asyncio.sleep(a.leader.handoff_pause_s + 3 * REAL.poll_interval_s)  # type: ignore[attr-defined]
    assert b.leader.is_leading() and not a.leader.is_leading()  # a campaigns again, and loses


async def test_a_candidate_whose_campaigns_fail_tells_how_long_there_is_no_leader() -> None:
    """``worker_leaderless_seconds`` and one error line once no valid leader was found for
    longer than the lease TTL (before: campaigns failed silently forever)."""

    class Broken:
        keys = KEYS

        async def acquire(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("ERR value is not an integer or out of range")

    clock, metrics = FakeClock(), Metrics()
    timing = LeaderTiming(ttl_s=3, renew_interval_s=0.5, renew_deadline_s=1.5)
    elector = LeaderElector(Broken(), timing, clock, metrics=metrics)  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        for _ in range(10):
            await elector._campaign()
            clock.advance(0.5)
    gauge = metrics.registry.get_sample_value("worker_leaderless_seconds")
    assert gauge is not None and gauge >= 3.0
    told = [e for e in logs if e["event"].startswith("no leader for longer than the lease TTL")]
    assert len(told) == 1 and "not an integer" in told[0]["error"]
