"""A dead leader's own jobs come back within the dead-consumer bound: the standby it elects
reaps as soon as the dead process's heartbeat is stale, judging silence on its own unbroken run
of accepted heartbeat writes (which began before it led), not a settle time counted from its
election (it measured 19.4 s with the defaults, a plain consumer's 8 s)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis as redis_sync

from harness import FixedLease, Spawn, client_call, wait_until
from tests.duties.test_registry import new_reaper
from worker.core.clock import FakeClock
from worker.duties.registry import WriteWitness
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")


NOW_S = 1_700_000_000.0


async def test_a_new_reaper_with_a_long_witness_reaps_at_its_first_tick(r: Any) -> None:
    clock = FakeClock(NOW_S)
    now_ms = round(await Store(r, KEYS).server_time_ms())
    await r.set(KEYS.leader, "5:me")
    await r.zadd(KEYS.instances, {"old-leader": now_ms - 11_000})
    await r.zadd(KEYS.queue, {"j": now_ms + 300_000})
    await r.sadd(KEYS.holds("old-leader"), "j")
    await r.set(K.ARQ_IN_PROGRESS + "j", "old-leader/1")
    witness = WriteWitness(max_gap_s=9)
    for _ in range(6):  # this process's heartbeat, accepted every 4 s for 20 s before it led
        witness.ok(clock.monotonic())
        clock.advance(4)
    witness.ok(clock.monotonic())
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=10, interval_s=2,
        witness=witness,
    )  # fmt: skip
    await reaper.setup()  # elected now
    await reaper.tick()
    assert await r.zrange(KEYS.instances, 0, -1) == []
    assert await r.get(K.ARQ_IN_PROGRESS + "j") is None  # its job is due again


async def test_a_short_witness_still_holds_a_new_reaper_off(r: Any) -> None:
    """A process whose heartbeat was accepted for less than the settle time (it just started,
    or Redis just came back) judges nobody yet."""
    clock = FakeClock(NOW_S)
    await r.set(KEYS.leader, "5:me")
    await r.zadd(KEYS.instances, {"silent": round(await Store(r, KEYS).server_time_ms()) - 60_000})
    witness = WriteWitness(max_gap_s=9)
    witness.ok(clock.monotonic())
    reaper = new_reaper(
        r, FixedLease("5:me"), clock, stale_s=10, interval_s=2,
        witness=witness,
    )  # fmt: skip
    await reaper.setup()
    clock.advance(2)
    witness.ok(clock.monotonic())
    await reaper.tick()
    assert await r.zrange(KEYS.instances, 0, -1) == [b"silent"]


#: The lease's TTL and the stale age equal (as their defaults, 10 s): the stated bound for a
#: dead process's jobs, whatever its role, is the larger of them plus the reaper's interval.
STALE_S, HEARTBEAT_S = 8.0, 1.0
TIMES = {
    "WORKER_LEADER_TTL_S": str(STALE_S),
    "WORKER_LEADER_RENEW_INTERVAL_S": "1",
    "WORKER_LEADER_RENEW_DEADLINE_S": "4",
    "WORKER_ORPHAN_STALE_S": str(STALE_S),
    "WORKER_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
}
BOUND_S = STALE_S + min(HEARTBEAT_S, 2.0)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_killed_leaders_own_job_runs_elsewhere_within_the_bound(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    app = "harness.apps.aborts:app"
    leader = spawn("all", name="l1", app=app, env=TIMES)
    wait_until(lambda: "leadership acquired" in leader.log(), 30, what="l1 to lead")
    jid = client_call(redis_url, prefix, "enqueue", "sleeper", 60)
    started = f"{prefix}aborts:started"
    wait_until(lambda: rsync.hget(started, f"{jid}:{leader.pid}"), 30, what="the job on l1")
    standby = spawn("all", name="l2", app=app, env=TIMES)
    wait_until(lambda: _id(rsync, prefix, "l2"), 30, what="l2's heartbeat")
    time.sleep(2.0)  # l2's heartbeat writes accepted for a while: its evidence of a live Redis
    leader.kill()
    killed = time.monotonic()
    wait_until(lambda: rsync.hget(started, f"{jid}:{standby.pid}"), BOUND_S + 20,
               interval=0.05, what=f"the job on l2\n{standby.log()}")  # fmt: skip
    took = time.monotonic() - killed
    assert "leadership acquired" in standby.log()
    assert took <= BOUND_S + 4, f"the dead leader's job came back after {took:.1f} s"


def _id(rsync: redis_sync.Redis, prefix: str, name: str) -> str | None:
    """The instance id of the process named ``name`` (its registry record)."""
    for member in rsync.zrange(K.Keys(prefix).instances, 0, -1):
        if member.decode().startswith(f"{name}-"):
            return member.decode()  # type: ignore[no-any-return]
    return None
