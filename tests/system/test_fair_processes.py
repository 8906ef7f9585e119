"""Flow keys with real processes: per-key concurrency held by two consumers, a SIGKILLed
holder's slot back within its lease, and a fair queue's bound across two consumers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, wait_until
from harness.apps.fairflow import app as fair_app
from harness.probes import start_consumers
from worker.bulk import JobSpec
from worker.client import Client
from worker.consumer.limits import SLOT_LEASE_S
from worker.storage import keys as K

APP = "harness.apps.fairflow:app"


def _client_call(url: str, prefix: str, go: Any) -> Any:
    async def run() -> Any:
        client = await Client.connect(url, app=fair_app, key_prefix=prefix)
        try:
            return await go(client)
        finally:
            await client.close()

    return asyncio.run(run())


def _runs(rsync: redis_sync.Redis, prefix: str) -> dict[str, list[str]]:
    return {
        k.decode(): v.decode().split("|") for k, v in rsync.hgetall(f"{prefix}fair:runs").items()
    }


def _consumers(spawn: Spawn, rsync: redis_sync.Redis, names: list[str]) -> list[WorkerProc]:
    return start_consumers(spawn, rsync, names, APP, {"WORKER_CONCURRENCY": "10"})


def _holder(rsync: redis_sync.Redis, prefix: str, job_id: str) -> str:
    """The instance id whose holds set has ``job_id``."""
    keys = K.Keys(prefix)
    for key in rsync.scan_iter(match=keys.holds_pattern):
        if rsync.sismember(key, job_id):
            return keys.holds_owner(key.decode()) or ""
    raise AssertionError(f"nobody holds {job_id}")


def _peak(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    peak = now = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


@pytest.mark.slow
def test_max_concurrency_per_key_holds_across_two_consumer_processes(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    _consumers(spawn, rsync, ["c1", "c2"])
    specs = [JobSpec("per_key", (k, n)) for n in range(15) for k in ("x", "y")]
    _client_call(redis_url, prefix, lambda c: c.enqueue_many(specs))
    wait_until(
        lambda: sum(len(v) == 3 for v in _runs(rsync, prefix).values()) == 30, 60, what="30 runs"
    )
    runs = list(_runs(rsync, prefix).values())
    per = {k: [(float(s), float(e)) for kk, s, e in runs if kk == k] for k in ("x", "y")}
    assert _peak(per["x"]) == 2 and _peak(per["y"]) == 2  # 2 per key, 20 slots free
    assert _peak(per["x"] + per["y"]) >= 3  # the keys ran side by side


@pytest.mark.slow
def test_a_sigkilled_consumers_per_key_slot_comes_back_within_its_lease(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    c1, c2 = _consumers(spawn, rsync, ["c1", "c2"])
    hold = _client_call(redis_url, prefix, lambda c: c.enqueue("one_per_key", "k", 0))
    wait_until(lambda: hold in _runs(rsync, prefix), 30, what="the holder to start")
    victim = c1 if _holder(rsync, prefix, hold).startswith("c1-") else c2
    victim.kill()
    killed = time.time()
    nxt = _client_call(redis_url, prefix, lambda c: c.enqueue("one_per_key", "k", 1))
    other = _client_call(redis_url, prefix, lambda c: c.enqueue("one_per_key", "z", 1))
    wait_until(lambda: other in _runs(rsync, prefix), 10, what="another key at once")
    wait_until(lambda: nxt in _runs(rsync, prefix), SLOT_LEASE_S + 10, what="the slot back")
    started = float(_runs(rsync, prefix)[nxt][1])
    assert started - killed <= SLOT_LEASE_S + 5  # the slot's lease, not the job's 60 s


@pytest.mark.slow
def test_a_quiet_flow_keys_jobs_wait_about_a_turn_not_the_backlog_across_two_consumers(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """The bound, short (``python -m bench fair``: 100,000 jobs): one key holds 10,000 queued
    jobs of 10 ms (about 5 s of work for two consumers of 10), another enqueues one job every
    0.3 s: each of those starts within a turn of the two keys, well under a second."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    specs = [JobSpec("fair_step", ("heavy", n)) for n in range(10_000)]
    _client_call(redis_url, prefix, lambda c: c.enqueue_many(specs))
    _consumers(spawn, rsync, ["c1", "c2"])
    wait_until(lambda: len(_runs(rsync, prefix)) >= 200, 30, what="the backlog to flow")
    waits = []
    for n in range(6):
        sent = time.time()
        jid = _client_call(redis_url, prefix, lambda c, n=n: c.enqueue("fair_step", "quiet", n))
        wait_until(lambda jid=jid: jid in _runs(rsync, prefix), 30, what=f"quiet job {n}")
        waits.append(float(_runs(rsync, prefix)[jid][1]) - sent)
        time.sleep(0.3)
    assert max(waits) < 1.0, waits
    assert rsync.zcard(K.Keys(prefix).fair("default", "heavy")) > 1000  # still a backlog
