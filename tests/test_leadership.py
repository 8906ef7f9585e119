"""Leadership on the real server: one suite for both implementations, plus elector specifics."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection as AsyncConnection

from worker import keys as K
from worker.leader import LeaderElector, Leadership, LeaderTiming, StaticLeader

KEYS = K.Keys("t:")
FAST = LeaderTiming(ttl_s=1.0, renew_interval_s=0.2, renew_deadline_s=0.6, poll_interval_s=0.1)


async def eventually(pred: Callable[[], Any], within: float = 5.0, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or pred}")
        await asyncio.sleep(0.01)


class Run:
    """A leadership implementation running as a task, with its callbacks recorded."""

    def __init__(self, leader: Leadership, lost_delay: float = 0.02) -> None:
        self.leader = leader
        self.lost_delay = lost_delay
        self.stop = asyncio.Event()
        self.events: list[tuple[str, Any]] = []
        self.elected: list[tuple[str, int]] = []
        self.lost: list[str] = []
        self.lost_at: list[float] = []
        leader.on_elected = self._on_elected
        leader.on_lost = self._on_lost
        self.task: asyncio.Task[None] | None = None

    def _on_elected(self, value: str, epoch: int) -> None:
        self.elected.append((value, epoch))
        self.events.append(("elected", epoch))

    async def _on_lost(self, reason: str) -> None:
        self.lost_at.append(time.monotonic())
        self.events.append(("lost-start", reason))
        await asyncio.sleep(self.lost_delay)  # e.g. stopping the singletons takes a while
        self.lost.append(reason)
        self.events.append(("lost-end", reason))

    def start(self) -> Run:
        self.task = asyncio.create_task(self.leader.run(self.stop))
        return self

    async def halt(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Callable[[], aioredis.Redis]]:
    made: list[aioredis.Redis] = []

    def make() -> aioredis.Redis:
        c = aioredis.Redis.from_url(redis_url)
        made.append(c)
        return c

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


def make_leader(kind: str, redis: aioredis.Redis, timing: LeaderTiming = FAST) -> Leadership:
    if kind == "elector":
        return LeaderElector(redis, KEYS, timing)
    return StaticLeader(redis, KEYS, retry_s=0.1)


# ---------------------------------------------------------------------------------------------
# Shared behaviour (LeaderElector and StaticLeader)
# ---------------------------------------------------------------------------------------------


async def test_becomes_leader_with_consistent_state(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    lead = make_leader(kind, clients())
    assert not lead.is_leader and lead.epoch is None and lead.value is None
    run = Run(lead).start()
    runs.append(run)
    await eventually(lambda: lead.is_leader, what="leadership")

    assert run.elected == [(lead.value, lead.epoch)]
    assert lead.value is not None
    assert rsync.get(KEYS.leader) == lead.value.encode()
    assert lead.value == f"{lead.epoch}:{lead.token}"  # type: ignore[attr-defined]
    assert lead.epoch == int(rsync.get(KEYS.leader_epoch) or 0) == 1
    assert (lead.lease_age() or 0) >= 0
    assert lead.health.extra["is_leader"] is True
    assert lead.health.extra["epoch"] == lead.epoch
    pttl = rsync.pttl(KEYS.leader)
    if kind == "elector":
        assert 0 < pttl <= FAST.ttl_s * 1000
    else:
        assert pttl == -1


async def test_release_deletes_the_lock(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    lead = make_leader(kind, clients())
    run = Run(lead).start()
    runs.append(run)
    await eventually(lambda: lead.is_leader)
    await run.halt()
    assert rsync.exists(KEYS.leader) == 1  # stopping alone does not release (runtime does)
    await lead.release()
    assert rsync.exists(KEYS.leader) == 0
    assert (lead.is_leader, lead.value, lead.epoch, lead.lease_age()) == (False, None, None, None)
    await lead.release()  # idempotent


async def test_release_never_deletes_someone_elses_lock(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    lead = make_leader(kind, clients())
    run = Run(lead).start()
    runs.append(run)
    await eventually(lambda: lead.is_leader)
    await run.halt()
    rsync.set(KEYS.leader, "99:successor", px=30_000)
    await lead.release()
    assert rsync.get(KEYS.leader) == b"99:successor"
    assert not lead.is_leader


async def test_lost_steps_down_then_reacquires_with_new_epoch(
    kind: str, clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    lead = make_leader(kind, clients())
    run = Run(lead, lost_delay=0.5).start()
    runs.append(run)
    await eventually(lambda: lead.is_leader)
    first_value, first_epoch = run.elected[0]

    lead.lost("poller:cards: FENCED test")
    await eventually(lambda: run.events[-1][0] == "lost-start", what="on_lost called")
    assert not lead.is_leader
    # let the lease lapse now, so a re-acquisition could happen within one poll (0.1 s)
    # if on_lost (still running for 0.5 s) were not awaited first
    rsync.delete(KEYS.leader)
    await eventually(lambda: run.lost, what="on_lost")
    assert run.lost == ["poller:cards: FENCED test"]
    await eventually(lambda: len(run.elected) == 2, within=10, what="re-election")

    second_value, second_epoch = run.elected[1]
    assert second_epoch > first_epoch
    assert second_value != first_value
    assert lead.value == second_value and lead.epoch == second_epoch
    assert rsync.get(KEYS.leader) == second_value.encode()
    # on_lost finished (it was awaited) before leadership was taken again
    assert [e for e, _ in run.events] == ["elected", "lost-start", "lost-end", "elected"]
    assert lead.transitions == 3


async def test_lost_while_not_leading_is_ignored(kind: str, clients: Any) -> None:
    lead = make_leader(kind, clients())
    lead.lost("nothing to lose")
    assert not lead._lost.is_set()


# ---------------------------------------------------------------------------------------------
# LeaderElector only
# ---------------------------------------------------------------------------------------------


async def test_two_electors_exactly_one_leader(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    a, b = LeaderElector(clients(), KEYS, FAST), LeaderElector(clients(), KEYS, FAST)
    ra, rb = Run(a).start(), Run(b).start()
    runs += [ra, rb]
    await eventually(lambda: a.is_leader or b.is_leader)
    for _ in range(40):  # watch a few renew cycles: never two, never none
        assert a.is_leader != b.is_leader
        holder = a if a.is_leader else b
        assert rsync.get(KEYS.leader) == (holder.value or "").encode()
        await asyncio.sleep(0.025)
    assert len(ra.elected) + len(rb.elected) == 1
    assert ra.lost == rb.lost == []


async def test_standby_takes_over_at_once_on_release(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    # a poll interval so long that only the release notification can explain a quick takeover
    slow_poll = LeaderTiming(ttl_s=10, renew_interval_s=2, renew_deadline_s=6, poll_interval_s=5)
    a = LeaderElector(clients(), KEYS, slow_poll)
    ra = Run(a).start()
    runs.append(ra)
    await eventually(lambda: a.is_leader)
    b = LeaderElector(clients(), KEYS, slow_poll)
    rb = Run(b).start()
    runs.append(rb)
    # b has campaigned once (and lost) and is listening on the channel
    await eventually(lambda: b.health.iterations >= 1, what="standby's first campaign")
    await eventually(
        lambda: rsync.pubsub_numsub(KEYS.leader_channel) == [(KEYS.leader_channel.encode(), 2)],
        what="both electors subscribed",
    )
    await ra.halt()
    t0 = time.monotonic()
    await a.release()
    await eventually(lambda: b.is_leader, within=4, what="standby takeover")
    took = time.monotonic() - t0
    # polling alone would need at least 0.75 x 5 s; generous bound for a loaded machine
    assert took < 1.5, took
    assert rb.elected[0][1] == ra.elected[0][1] + 1


async def test_overwritten_lock_makes_holder_step_down_on_next_renew(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    a = LeaderElector(clients(), KEYS, FAST)
    ra = Run(a).start()
    runs.append(ra)
    await eventually(lambda: a.is_leader)
    t0 = time.monotonic()
    rsync.set(KEYS.leader, "99:intruder", px=30_000)
    await eventually(lambda: ra.lost, within=3, what="step down")
    assert ra.lost == ["lease is no longer ours"]
    assert ra.lost_at[0] - t0 < FAST.renew_interval_s + 0.5
    assert not a.is_leader
    # it neither renewed nor deleted the intruder's lock, and stays a standby while it holds
    await asyncio.sleep(3 * FAST.poll_interval_s)
    assert rsync.get(KEYS.leader) == b"99:intruder"
    assert rsync.pttl(KEYS.leader) > 20_000
    assert not a.is_leader and len(ra.elected) == 1


async def test_hanging_renew_steps_down_by_the_deadline(
    clients: Any, runs: list[Run], rsync: redis_sync.Redis
) -> None:
    a = LeaderElector(clients(), KEYS, FAST)
    real_renew = a._renew
    ok_sent: list[float] = []
    hang = asyncio.Event()
    ttl_at_step_down: list[int] = []

    async def renew(keys: list[Any], args: list[Any]) -> Any:
        if hang.is_set():
            await asyncio.sleep(30)  # a renew that never returns (stalled connection)
        sent = time.monotonic()
        res = await real_renew(keys=keys, args=args)
        if res == 1:
            ok_sent.append(sent)
        return res

    a._renew = renew  # type: ignore[assignment]
    ra = Run(a)
    original_on_lost = ra._on_lost

    async def on_lost(reason: str) -> None:
        ttl_at_step_down.append(rsync.pttl(KEYS.leader))
        await original_on_lost(reason)

    a.on_lost = on_lost
    ra.start()
    runs.append(ra)
    await eventually(lambda: a.is_leader and ok_sent, what="a successful renew")
    hang.set()
    await eventually(lambda: ra.lost, within=3, what="step down")
    assert ra.lost == ["renew deadline passed"]
    since_last_ok = ra.lost_at[0] - ok_sent[-1]
    assert FAST.renew_deadline_s - 0.05 <= since_last_ok < FAST.ttl_s, since_last_ok
    # it stepped down while its lease was still valid: nobody else could have led meanwhile
    assert ttl_at_step_down[0] > 0
    # Leading again (its own unexpired lease is replaced, see ACQUIRE) needs a new epoch.
    assert a.epoch is None or a.epoch > ra.elected[0][1], (a.epoch, ra.elected)


async def test_standby_issues_about_one_command_per_poll(
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
    b = LeaderElector(clients(), KEYS, FAST)
    rb = Run(b).start()
    runs.append(rb)
    await eventually(lambda: b.health.iterations >= 3, what="standby polling")

    def evalsha_calls() -> int:
        return int(rsync.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    window = 1.0
    sent_before, sha_before, iters_before = sent, evalsha_calls(), b.health.iterations
    await asyncio.sleep(window)  # a measurement window, not an assertion on timing
    requests = sent - sent_before
    scripts = evalsha_calls() - sha_before
    campaigns = b.health.iterations - iters_before
    expected = window / FAST.poll_interval_s  # ~10 with +-25 % jitter
    assert expected * 0.5 <= campaigns <= expected * 1.5 + 1, campaigns
    # client side, all connections: one request (the acquire script) per campaign
    assert campaigns <= requests <= expected * 1.5 + 2, (requests, campaigns)
    assert abs(scripts - campaigns) <= 1, (scripts, campaigns)  # the server saw the same
    assert not b.is_leader and rsync.get(KEYS.leader) == b"99:other"


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        LeaderTiming(ttl_s=1, renew_interval_s=0.6, renew_deadline_s=0.6)
    with pytest.raises(ValueError):
        LeaderTiming(ttl_s=1, renew_interval_s=0.2, renew_deadline_s=1)
