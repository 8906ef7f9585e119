"""Shutdown edges with real processes: jobs cut off by the shutdown timeout are retried, a
second signal exits at once, and a leader whose singletons ignore cancellation exits (code 70)
rather than keep running unfenced after losing the lease."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.apps.ledger import app as ledger_app
from worker.client import Client
from worker.leadership.maintainer import EXIT_UNFENCED
from worker.storage import keys as K

pytestmark = pytest.mark.slow


def enqueue_slow(url: str, prefix: str, seconds: float) -> str:
    async def go() -> str:
        client = await Client.connect(url, app=ledger_app, key_prefix=prefix)
        try:
            jid = await client.enqueue("slow_job", seconds)
            assert jid is not None
            return jid
        finally:
            await client.close()

    return asyncio.run(go())


def count(r: redis_sync.Redis, prefix: str, ledger: str, job_id: str) -> int:
    return int(r.hget(f"{prefix}ledger:{ledger}", job_id) or 0)


def test_job_cut_off_by_shutdown_timeout_is_retried_elsewhere(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    first = spawn("consumer", name="first", env={"WORKER_SHUTDOWN_TIMEOUT_S": "1"})
    wait_until(lambda: rsync.zcard(K.Keys(prefix).instances) == 1, 30, what="registration")
    job = enqueue_slow(redis_url, prefix, 4.0)
    wait_until(lambda: count(rsync, prefix, "slow-started", job) == 1, 30, what="job start")

    assert first.terminate(30) == 0  # drains for 1 s, then cancels the job
    assert count(rsync, prefix, "slow-done", job) == 0
    spawn("consumer", name="second")
    wait_until(
        lambda: count(rsync, prefix, "slow-done", job) == 1,
        30,
        what="the interrupted job to be retried and finish",
    )
    assert count(rsync, prefix, "slow-started", job) == 2


def test_second_signal_exits_at_once(spawn: Spawn, rsync: redis_sync.Redis, redis_url: str) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("consumer", name="c", env={"WORKER_SHUTDOWN_TIMEOUT_S": "60"})
    wait_until(lambda: rsync.zcard(K.Keys(prefix).instances) == 1, 30, what="registration")
    job = enqueue_slow(redis_url, prefix, 60.0)
    wait_until(lambda: count(rsync, prefix, "slow-started", job) == 1, 30, what="job start")

    proc.signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.alive(), "the first signal must drain, not exit"
    sent = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.proc.wait(10) == 1
    assert time.monotonic() - sent < 5


def test_singletons_ignoring_cancellation_make_the_ex_leader_exit(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    proc = spawn("leader", name="l", env={"LEDGER_STUBBORN": "1"})
    wait_until(lambda: rsync.get(f"{prefix}ledger:stubborn-starts"), 30, what="singletons")
    # Another process "takes" the lease: the next renew answers "not yours".
    rsync.set(keys.leader, "999:intruder", px=60_000)
    assert proc.proc.wait(30) == EXIT_UNFENCED
    events = proc.events()
    assert any("exiting rather than run unfenced" in str(e.get("event")) for e in events)
