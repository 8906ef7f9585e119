"""Pausing queues with real processes: two consumers, a queue paused while its jobs flow."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, WorkerProc, wait_until
from harness.apps.flow import app as flow_app
from harness.probes import start_consumers
from worker.client import Client

APP = "harness.apps.flow:app"
#: how long after ``pause`` returns a job of the paused queue may still start: a claim in
#: flight at that moment (the pause takes effect at each consumer's next claim; generous)
BOUND_S = 1.0


def _enqueue(url: str, prefix: str, task: str, n: int) -> list[str]:
    async def go() -> list[str]:
        client = await Client.connect(url, app=flow_app, key_prefix=prefix)
        try:
            ids = [await client.enqueue(task, i) for i in range(n)]
        finally:
            await client.close()
        return [j for j in ids if j is not None]

    return asyncio.run(go())


def _starts(rsync: redis_sync.Redis, prefix: str) -> list[tuple[str, float]]:
    raw = rsync.hgetall(f"{prefix}flow:started")
    out = []
    for v in raw.values():
        queue, at = v.decode().split("|")
        out.append((queue, float(at)))
    return out


def _summary(rsync: redis_sync.Redis, prefix: str, at: float) -> dict[str, int]:
    """Jobs started per queue, before and after ``at``."""
    out: dict[str, int] = {}
    for q, t in _starts(rsync, prefix):
        k = f"{q}{'+' if t > at else '-'}"
        out[k] = out.get(k, 0) + 1
    return out


def _consumers(spawn: Spawn, rsync: redis_sync.Redis, names: list[str]) -> list[WorkerProc]:
    env = {"WORKER_CONCURRENCY": "2", "FLOW_STEP_S": "0.2"}
    return start_consumers(spawn, rsync, names, APP, env)


@pytest.mark.slow
def test_a_paused_queue_starts_nothing_cluster_wide_until_resumed_even_across_restarts(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix, "WORKER_APP": APP}
    first = _consumers(spawn, rsync, ["c1", "c2"])
    a_ids = _enqueue(redis_url, prefix, "step", 300)
    b_ids = _enqueue(redis_url, prefix, "b_step", 150)
    wait_until(lambda: sum(q == "a" for q, _ in _starts(rsync, prefix)) >= 10, 30, what="a flows")

    done = cli("pause", "queue:a", env=env)
    assert done.returncode == 0, done.stderr
    paused_at = time.time()
    assert "paused cluster-wide" in done.stdout
    # queue a (drained first: it comes first in App.queues) stops; b flows in its place
    wait_until(
        lambda: sum(q == "b" and t > paused_at for q, t in _starts(rsync, prefix)) >= 20,
        30,
        what=f"queue b to flow while a is paused: {_summary(rsync, prefix, paused_at)}",
    )
    late = _enqueue(redis_url, prefix, "step", 5)  # enqueues are accepted while paused
    assert len(late) == 5
    status = json.loads(cli("status", "--json", env=env).stdout)
    # each queue's duty lane beside it, flowing: a queue's pause leaves its ticks and poll jobs
    lanes = {"a:duty": False, "b:duty": False}
    assert {q["queue"]: q["paused"] for q in status["queues"]} == {"a": True, "b": False} | lanes

    for p in first:  # every consumer restarts: the pause is in Redis
        assert p.terminate() == 0
    _consumers(spawn, rsync, ["c3", "c4"])
    wait_until(
        lambda: sum(q == "b" for q, _ in _starts(rsync, prefix)) == len(b_ids),
        60,
        what="queue b to run to its end on the restarted consumers",
    )
    time.sleep(1.0)
    a_started = [t for q, t in _starts(rsync, prefix) if q == "a"]
    assert a_started and len(a_started) < len(a_ids), "a flowed before the pause"
    assert max(a_started) <= paused_at + BOUND_S, max(a_started) - paused_at

    done = cli("resume", "queue:a", env=env)
    assert done.returncode == 0, done.stderr
    assert "resumed" in done.stdout
    wait_until(
        lambda: sum(q == "a" for q, _ in _starts(rsync, prefix)) == len(a_ids) + len(late),
        60,
        what="every job of queue a to start after the resume",
    )


@pytest.mark.slow
def test_pause_all_stops_every_queue_and_resume_all_restarts_them(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix, "WORKER_APP": APP}
    _consumers(spawn, rsync, ["c1"])
    assert cli("pause", "--all", env=env).returncode == 0
    _enqueue(redis_url, prefix, "step", 3)
    _enqueue(redis_url, prefix, "b_step", 3)
    time.sleep(2.0)
    assert _starts(rsync, prefix) == []
    assert cli("resume", "--all", env=env).returncode == 0
    wait_until(lambda: len(_starts(rsync, prefix)) == 6, 30, what="every job after resume --all")


def test_a_queue_pause_reaches_every_queue_shard_and_is_audited(redis_url: str) -> None:
    """With queue shards each shard's CLAIM reads its own paused set: the pause is written to
    every one, resumed in every one, and recorded once in the audit log."""
    from worker.app import App
    from worker.ops.actions import Actor, Operations

    async def go() -> None:
        client = await Client.connect(redis_url, key_prefix="{fc}:", queue_shards=3)
        try:
            ops = Operations(client, App("fc"), Actor("tester", "cli"))
            stores = client.shards.stores
            assert len(stores) == 3
            out = await ops.pause_queue("emails")
            assert out.ok and out.target == "queue:emails" and out.details == {"changed": True}
            assert all(["queue:emails" in await s.paused() for s in stores])
            again = await ops.pause_queue("emails")
            assert again.details == {"changed": False} and "already" in again.message
            last = stores[2]
            await last.redis.zadd(last.keys.queue_of("emails"), {"{fc#x}:j": 1})
            got = await last.claim(
                "me", "me/1", now_ms=10**12, limit=5, in_progress_ttl_ms=60_000,
                holds_ttl_ms=60_000, max_payload=100, retry_ttl_ms=60_000, queues=("emails",),
            )  # fmt: skip
            assert got.jobs == []
            assert (await ops.pause_queue("emails", paused=False)).details == {"changed": True}
            assert not any(["queue:emails" in await s.paused() for s in stores])
            audit = await client.store.audit_log(5)
            assert [(a["action"], a["target"]) for a in audit] == [
                ("resume", "queue:emails"), ("pause", "queue:emails"), ("pause", "queue:emails")
            ]  # fmt: skip
        finally:
            await client.close()

    asyncio.run(go())
