"""The loop watchdog (worker/runtime/watchdog.py): a blocked event loop is noticed from a thread,
the
ends of finished runs are recorded and the leadership is given up while the loop is blocked.

The real-process test blocks a real loop with ``time.sleep`` right after a tick finished
(harness/apps/loopblock.py) and counts executions in a ledger on a second server that is never
faulted; the unit tests drive the watchdog against a real loop and a fake Redis.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import Spawn, eventually, wait_until
from harness.arqfmt import Job
from harness.probes import problem_report, record_of
from harness.realredis import RealRedis
from harness.soak import size
from harness.waiting import settle
from tests.consumer.test_consumer import KEYS, Loop
from worker.app import App
from worker.context import JobContext
from worker.core.clock import FakeClock, ms
from worker.core.ids import LockValue
from worker.core.metrics import Metrics
from worker.core.serializer import msgpack_loads
from worker.leadership.base import LeaderTiming
from worker.leadership.elector import LeaderElector
from worker.runtime.watchdog import LoopWatchdog, blocked_threshold_s
from worker.storage import keys as K
from worker.storage.election import Acquired
from worker.storage.store import Store

APP = "harness.apps.loopblock:app"
#: How long the task blocks A's loop: past B's takeover (lease TTL 3 s) and its reaping of A
#: (orphan stale 2 s, reaper every 0.5 s) with room to spare; 25 s under ``python -m bench soak``.
BLOCK_S = size(12.0, 25.0)


@pytest.fixture
def ledger_url() -> Iterator[str]:
    with RealRedis(extra_args=("--appendfsync", "everysec")) as server:
        yield server.url


@pytest.mark.slow
def test_a_finished_tick_never_runs_again_when_its_process_then_blocks_the_loop(
    spawn: Spawn, rsync: redis_sync.Redis, ledger_url: str
) -> None:
    """Leader A (role ``all``) and standby B; a task on A calls ``time.sleep(BLOCK_S)`` right after
    one of A's ticks returned, before the consumer's next round. B takes over and reaps A; the
    blocked tick ran once, every tick ran once, A noticed the blocked loop, dropped the lease
    while blocked, past its renew deadline (its own lock: it had not expired yet), and lives on.

    On main 8b143f0 and b1f4189 (no watchdog): the blocked tick ran twice, 4 of 4 runs (A's end
    was still in the batched FINISH; B's reaper re-queued the job and B ran it again)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    led = redis_sync.Redis.from_url(ledger_url)
    env = {"EDGE_LEDGER_URL": ledger_url}
    a = spawn("all", name="A", app=APP, env={**env, "LB_BLOCK_S": str(BLOCK_S)})
    wait_until(lambda: (record_of(rsync, prefix, "A") or {}).get("is_leader"), 45, what="A leads")
    b = spawn("all", name="B", app=APP, env=env)
    wait_until(lambda: record_of(rsync, prefix, "B"), 45, what="B registered")
    led.set(f"{prefix}lb:arm", 1)
    wait_until(lambda: led.get(f"{prefix}lb:blocked"), 30, 0.02, what="a tick on A blocks A")
    blocked_at = time.monotonic()
    blocked_tick = int(led.get(f"{prefix}lb:blocked") or 0)
    took_over = settle(lambda: (record_of(rsync, prefix, "B") or {}).get("is_leader"), 20)
    resumed = settle(
        lambda: time.monotonic() - blocked_at > BLOCK_S - 5 and record_of(rsync, prefix, "A"),
        BLOCK_S + 20,
    )
    time.sleep(2.0)  # A's loop runs again: whatever it does with the blocked tick is done

    ticks = {int(k): int(v) for k, v in led.hgetall(f"{prefix}lb:ticks").items()}
    twice = {t: n for t, n in ticks.items() if n > 1}
    events = a.events()
    noticed = [e for e in events if e.get("event") == "event loop blocked"]
    gave_up = [
        e
        for e in events
        if e.get("event") == "event loop blocked past the renew deadline; dropped the lease"
    ]
    dropped = [e for e in gave_up if e.get("dropped")]  # its own lock: not expired yet
    rescued = [e for e in events if str(e.get("event")).startswith("event loop blocked; recorded")]
    figures = {
        "ticks executed": f"{len(ticks)}, {sum(ticks.values())} executions",
        "the blocked tick executed": f"{ticks.get(blocked_tick, 0)} time(s)",
        "ticks executed more than once": twice or "none",
        "B took over while A was blocked": took_over,
        "A noticed the blocked loop (where)": [e.get("where") for e in noticed] or "no",
        "A dropped the lease while blocked / its own lock": f"{bool(gave_up)} / {bool(dropped)}",
        "ends A recorded from the watchdog": sum(int(e.get("runs", 0)) for e in rescued),
        "A back after the block / alive": f"{bool(resumed)} / {a.alive()}",
    }
    problems = []
    if ticks.get(blocked_tick, 0) != 1:
        problems.append(f"the blocked tick executed {ticks.get(blocked_tick, 0)} times")
    if twice:
        problems.append(f"{len(twice)} ticks executed more than once")
    if not took_over:
        problems.append("B did not take the lease over while A was blocked")
    if not any("_block" in str(e.get("where")) for e in noticed):
        problems.append("A did not log the blocked loop with where it was blocked")
    if not dropped:
        problems.append("A did not drop its lease while blocked")
    if not (resumed and a.alive() and b.alive()):
        problems.append("A did not come back after the block, or a process died")
    led.close()
    assert not problems, problem_report("blocked event loop", problems, figures)


# -- unit: the threshold and the watchdog on a real loop -------------------------------------


def test_threshold_acts_before_the_renew_deadline_and_the_orphan_bound() -> None:
    def threshold(deadline: float, stale: float, heartbeat: float) -> float:
        return blocked_threshold_s(
            2.0, renew_deadline_s=deadline, orphan_stale_s=stale, heartbeat_s=heartbeat
        )

    assert threshold(6.0, 10.0, 2.0) == 2.0  # the defaults: the setting itself
    # fast timings: half the renew deadline, half the orphan bound less a heartbeat
    assert threshold(1.5, 2.0, 0.5) == 0.75
    assert threshold(6.0, 3.0, 1.0) == 1.0


class _Recorder:
    """A component that wants to act while the loop is blocked: records the calls (made from
    the watchdog's thread)."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []

    async def loop_blocked(self, store: Store, lag_s: float) -> None:
        self.calls.append((lag_s, threading.current_thread().name))


def _no_store() -> Store:
    raise AssertionError("no Redis in this test")


async def test_watchdog_acts_from_its_thread_while_the_loop_is_blocked() -> None:
    metrics = Metrics()
    recorder = _Recorder()
    dog = LoopWatchdog(lambda: [recorder], _no_store, metrics=metrics, threshold_s=0.5)
    dog.make_store = lambda: None  # type: ignore[assignment,return-value]
    stop = asyncio.Event()
    task = asyncio.create_task(dog.run(stop))
    await asyncio.sleep(0.5)
    assert recorder.calls == []  # an idle loop is not blocked
    time.sleep(1.5)  # noqa: ASYNC251 - block the loop
    calls = len(recorder.calls)
    await asyncio.sleep(0.2)
    stop.set()
    await task
    assert calls >= 2, "the watchdog did not act (at every missed beat) while the loop was blocked"
    assert len(recorder.calls) == calls  # nothing once the loop ran again
    lag, thread = recorder.calls[0]
    assert 0.5 <= lag < 1.5 and thread == "worker-loop-watchdog"
    assert metrics.registry.get_sample_value("worker_event_loop_blocks_total") == 1
    below = metrics.registry.get_sample_value("worker_event_loop_lag_seconds_bucket", {"le": "1.0"})
    count = metrics.registry.get_sample_value("worker_event_loop_lag_seconds_count")
    assert below is not None and count is not None and count - below >= 1  # the 1.5 s lag


async def test_ends_of_finished_runs_are_recorded_while_the_loop_is_blocked(
    redis_url: str, rsync: redis_sync.Redis
) -> None:
    """A job returns and, before the consumer's next round, a task blocks the loop for up to 3 s,
    watching Redis for the job's result meanwhile: the watchdog's thread wrote it.

    Before the watchdog: no result during the block (the end waited for the loop)."""
    app = App("t")
    seen: dict[str, Any] = {}
    blockers: set[asyncio.Task[None]] = set()

    async def block_and_look(job_id: str) -> None:
        started = time.monotonic()
        while time.monotonic() - started < 3 and not rsync.exists(K.ARQ_RESULT + job_id):
            time.sleep(0.02)  # noqa: ASYNC251 - blocks the loop
        seen["result written during the block"] = bool(rsync.exists(K.ARQ_RESULT + job_id))
        seen["job still in the holds set"] = bool(rsync.sismember(KEYS.holds("i-1"), job_id))

    @app.task
    async def quick(ctx: JobContext) -> str:
        task = asyncio.create_task(block_and_look(ctx.job_id))  # runs once this job returned
        blockers.add(task)
        return "done"

    r = aioredis.Redis.from_url(redis_url)
    lp = Loop(r, app)
    made: list[aioredis.Redis] = []

    def thread_store() -> Store:
        made.append(aioredis.Redis.from_url(redis_url))
        return Store(made[-1], KEYS)

    dog = LoopWatchdog(lambda: [lp.consumer], thread_store, threshold_s=0.3)
    stop = asyncio.Event()
    watching = asyncio.create_task(dog.run(stop))
    lp.start()
    try:
        job_id = await lp.client.enqueue("quick")
        assert job_id is not None
        await eventually(lambda: "result written during the block" in seen, what="the block")
        assert seen == {
            "result written during the block": True,
            "job still in the holds set": False,
        }
        assert await Job(job_id, r, _deserializer=msgpack_loads).result(timeout=1) == "done"
    finally:
        await lp.halt()
        stop.set()
        await watching
        await r.aclose()


async def test_elector_drops_its_lock_from_the_watchdog_once_the_renew_deadline_passed(
    redis_url: str, rsync: redis_sync.Redis
) -> None:
    """Within the renew deadline a blocked loop keeps the lease; past it (the loop never ran:
    a fake clock) the watchdog's call drops the lock, without a clean release (the next holder
    waits out the safety gap), and the elector steps down once its loop runs."""
    clock = FakeClock()
    timing = LeaderTiming(ttl_s=3, renew_interval_s=0.5, renew_deadline_s=1.5)
    client = aioredis.Redis.from_url(redis_url)
    store = Store(client, KEYS)
    elector = LeaderElector(store, timing, clock, stop_grace_s=2)
    elector._loop = asyncio.get_running_loop()  # as run() records it
    await elector._campaign()
    lock = elector.lock
    assert lock is not None and elector.is_leading()
    await elector.loop_blocked(store, 1.0)
    assert rsync.get(KEYS.leader) == str(lock).encode()  # a short block keeps the lease
    clock.advance(timing.renew_deadline_s + 0.01)
    await elector.loop_blocked(store, 1.6)
    await elector.loop_blocked(store, 1.7)  # once is enough
    assert rsync.exists(KEYS.leader) == 0
    assert rsync.hget(KEYS.leader_state, "released") != str(lock.epoch).encode()
    await asyncio.sleep(0)  # the loop runs again: the step-down it was told about
    assert elector._lost.is_set() and "event loop blocked" in elector._lost_reason
    other = await store.acquire("other", 3000, bound_ms=ms(elector.safety_bound_s))
    assert isinstance(other, Acquired) and other.gap_ms > 0  # not a clean release
    # a lock that is someone else's is never dropped
    elector._blocked = None
    await elector.loop_blocked(store, 2.0)
    assert LockValue.parse(rsync.get(KEYS.leader)) == other.lock
    await client.aclose()
