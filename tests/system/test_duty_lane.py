"""The duty lane against real worker processes: with thousands of user jobs queued and every
shared slot busy with 1 s jobs, ticks start on time and poll items keep their schedule (the
leader's duties enqueue into ``<queue>:duty``, claimed first and into slots user jobs never
take); the user's queue drains at the shared slots' pace meanwhile. A leader's own task handing
20,000 jobs to ``ctx.enqueue_many`` keeps its lease and its ticks, at the client path's rate."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.apps.lane import app as lane_app
from worker.bulk import JobSpec
from worker.client import Client
from worker.storage import keys as K

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

APP = "harness.apps.lane:app"
USER_JOBS = 5_000
SLOTS = 10  # shared slots: 5,000 jobs of 1 s keep them busy for 500 s
ITEMS = 20


async def _backlog(url: str, prefix: str) -> None:
    """Every user job queued, due now, then the poll items due now."""
    client = await Client.connect(url, key_prefix=prefix, app=lane_app)
    try:
        await client.enqueue_many([JobSpec("busy", (1.0,)) for _ in range(USER_JOBS)])
        await client.poller("lanepoll").schedule_many([f"i{n}" for n in range(ITEMS)])
    finally:
        await client.close()


def _ints(rsync: redis_sync.Redis, key: str) -> list[int]:
    return [int(v) for v in rsync.lrange(key, 0, -1)]  # type: ignore[union-attr]


def test_ticks_and_poll_jobs_start_on_time_behind_a_user_backlog_with_every_slot_busy(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    asyncio.run(_backlog(redis_url, prefix))
    queue = K.Keys(prefix).queue
    assert rsync.zcard(queue) == USER_JOBS
    spawn("all", name="a1", app=APP, env={"WORKER_CONCURRENCY": str(SLOTS)})
    # every shared slot busy: the queue drains at SLOTS jobs per second from here on
    wait_until(lambda: rsync.zcard(queue) <= USER_JOBS - SLOTS, 60, what="user jobs to start")
    begun = time.monotonic()
    ticks = wait_until(
        lambda: (t := _ints(rsync, prefix + "lane:tick")) and len(t) >= 8 and t, 40,
        what="8 ticks run behind the user backlog",
    )  # fmt: skip
    elapsed = time.monotonic() - begun
    polls = [v.decode().split(":") for v in rsync.lrange(prefix + "lane:poll", 0, -1)]  # type: ignore[union-attr]
    left = rsync.zcard(queue)
    # the ticks ran while the backlog was there, and the shared slots stayed busy meanwhile
    assert left > USER_JOBS - SLOTS * (elapsed + 30), (left, elapsed)
    assert left > USER_JOBS / 2, left
    # generous on a loaded box (the bench states the bound: <= 1 s p99 at 100,000 jobs)
    assert max(ticks) <= 2_000, ticks
    runs: dict[str, int] = {}
    for item, waited in polls:
        runs[item] = runs.get(item, 0) + 1
        assert int(waited) <= 2_000, polls
    assert len(runs) == ITEMS, runs  # every item dispatched, and back on its schedule:
    assert min(runs.values()) >= 3, runs  # ~1 run per 1.5 s each over the 8 s or more


FANOUT = 20_000


async def _client_fanout(url: str, prefix: str) -> float:
    """The same batch from a client in this process: the client path's time, for comparison."""
    client = await Client.connect(url, key_prefix=prefix, app=lane_app)
    try:
        began = time.monotonic()
        jobs = (JobSpec("noop", (i,), unique_key=f"c{i}") for i in range(FANOUT))
        assert all(await client.enqueue_many(jobs))
        return time.monotonic() - began
    finally:
        await client.close()


async def _enqueue(url: str, prefix: str, task: str, *args: object) -> None:
    client = await Client.connect(url, key_prefix=prefix, app=lane_app)
    try:
        await client.enqueue(task, *args)
    finally:
        await client.close()


@pytest.mark.timeout(240)
def test_a_leaders_task_enqueuing_many_keeps_its_lease_and_its_ticks(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """``fanout(20000)`` in a ``--role all`` process on the tests' short lease (TTL 3 s, renewed
    within 1.5 s): the ids come back at the client path's rate, the lease is never lost (no
    acquisition or release in the history), no "event loop blocked" line, and the ticks due
    meanwhile start on time (before: they queued behind the 20,000 jobs)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leader = spawn("all", name="a1", app=APP)
    ticks_key, history = prefix + "lane:tick", f"{prefix}leader:history"
    wait_until(lambda: rsync.llen(ticks_key) >= 2, 60, what="the leader's ticks")
    changes = rsync.llen(history)
    rsync.delete(ticks_key)
    asyncio.run(_enqueue(redis_url, prefix, "fanout", FANOUT))
    done = wait_until(lambda: rsync.get(prefix + "lane:fanout"), 120, what="the fanout's ids")
    took, written = done.decode().split(":")
    assert int(written) == FANOUT
    queue = K.Keys(prefix).queue
    wait_until(lambda: rsync.zcard(queue) == 0, 120, what="the 20,000 jobs to run", interval=0.2)
    time.sleep(2.0)  # the ticks of the last seconds
    ticks = _ints(rsync, ticks_key)
    client_s = asyncio.run(_client_fanout(redis_url, prefix))
    print(f"enqueue_many of {FANOUT:,}: task {float(took):.2f} s, client {client_s:.2f} s; "
          f"ticks late ms {sorted(ticks)}")  # fmt: skip
    assert rsync.llen(history) == changes, rsync.lrange(history, 0, -1)  # the lease held
    assert "event loop blocked" not in leader.log()
    assert len(ticks) >= 3, ticks
    assert max(ticks) <= 2_000, ticks  # generous on a loaded box (the bench: p99 < 1 s)
    # at the client path's rate (a loaded 2-core box: generous; before, ~10x slower)
    assert float(took) <= 3 * client_s + 5, (took, client_s)
