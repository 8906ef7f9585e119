"""Jobs from the command line against real worker processes: ``job ID --cancel`` stops a
running job within the bound and a queued one never starts, ``job ID --retry`` runs a failed
job again, ``jobs --state …`` lists them, and every action is in the audit log."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, client_call, wait_until
from worker.core.serializer import job_payload, msgpack_dumps
from worker.storage import keys as K

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

#: The stated bound: a running job stops within this of `job ID --cancel` (default settings).
CANCEL_BOUND_S = 2.0


def _env(redis_url: str, prefix: str) -> dict[str, str]:
    return {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.ledger:app",
    }


def _json(cli: CliRun, env: dict[str, str], *args: str) -> Any:
    proc = cli(*args, "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _audit(rsync: redis_sync.Redis, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(e) for e in rsync.lrange(K.Keys(prefix).audit, 0, -1)]


def test_cancel_a_running_and_a_queued_job(
    spawn: Spawn, cli: CliRun, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("consumer", name="c1", env={"WORKER_CONCURRENCY": "1"})  # busy with one job
    env = _env(redis_url, prefix)
    ledger = f"{prefix}ledger:slow-started"
    running = client_call(redis_url, prefix, "enqueue", "slow_job", 60)
    wait_until(lambda: rsync.hget(ledger, running), 30, what="slow_job to start")
    queued = client_call(redis_url, prefix, "enqueue", "slow_job", 0.1)  # due, not claimed
    listed = _json(cli, env, "jobs", "--state", "running")
    assert [j["job_id"] for j in listed["items"]] == [running]
    assert listed["items"][0]["instance"] and listed["items"][0]["task"] == "slow_job"
    assert [j["job_id"] for j in _json(cli, env, "jobs", "--state", "queued")["items"]] == [queued]

    proc = cli("job", queued, "--cancel", env=env)
    assert proc.returncode == 0 and "cancelled before it started" in proc.stdout, proc.stdout
    assert _json(cli, env, "job", queued)["state"] == "cancelled"

    proc = cli("job", running, "--cancel", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    took = float(re.search(r"cancelled after ([\d.]+) s", proc.stdout).group(1))  # type: ignore[union-attr]
    assert took <= CANCEL_BOUND_S, proc.stdout
    detail = _json(cli, env, "job", running)
    assert detail["state"] == "cancelled" and detail["error"]["type"] == "CancelledError"
    assert not rsync.hget(f"{prefix}ledger:slow-done", running)

    # the consumer is free again: a later job runs, the cancelled queued one never did
    client_call(redis_url, prefix, "enqueue", "record", "after")
    wait_until(lambda: rsync.hget(f"{prefix}ledger:records", "after"), 30, what="a later job")
    assert not rsync.hget(ledger, queued)
    again = cli("job", queued, "--cancel", env=env)
    assert again.returncode == 1 and "nothing to cancel" in again.stdout

    entries = _audit(rsync, prefix)
    assert [(e["action"], e["target"], e["via"], e["ok"]) for e in entries[:3]] == [
        ("cancel", queued, "cli", False),
        ("cancel", running, "cli", True),
        ("cancel", queued, "cli", True),
    ]


def test_retry_a_failed_job_and_list_failed_and_done(
    spawn: Spawn, cli: CliRun, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("consumer", name="c1")
    env = _env(redis_url, prefix)
    job_id = client_call(redis_url, prefix, "enqueue", "fails_once", "k1")

    def state() -> str:
        proc = cli("job", job_id, "--json", env=env)
        return str(json.loads(proc.stdout)["state"]) if proc.returncode == 0 else "?"

    wait_until(lambda: state() == "failed", 30, interval=0.3, what="fails_once to fail")
    detail = _json(cli, env, "job", job_id)
    assert detail["error"]["type"] == "ValueError" and "on purpose" in detail["error"]["message"]
    assert "Traceback" in detail["error"]["traceback"] and detail["error"]["try"] == 1
    failed = _json(cli, env, "jobs", "--state", "failed", "--task", "fails_once")
    assert [(j["job_id"], j["state"]) for j in failed["items"]] == [(job_id, "failed")]
    assert failed["items"][0]["args"].startswith("ValueError: first run of k1")

    queued = cli("job", job_id, "--retry", env=env)
    assert queued.returncode == 0 and "queued again" in queued.stdout, queued.stdout
    wait_until(lambda: state() == "done", 30, interval=0.3, what="the retried run to succeed")
    assert _json(cli, env, "job", job_id)["result"] == "'ran 2 times'"
    done = _json(cli, env, "jobs", "--state", "done")
    assert job_id in [j["job_id"] for j in done["items"]]
    assert job_id not in [
        j["job_id"] for j in _json(cli, env, "jobs", "--state", "failed")["items"]
    ]

    refused = cli("job", job_id, "--retry", env=env)
    assert refused.returncode == 1 and "done" in refused.stdout
    unknown = cli("job", f"{prefix}nope", env=env)
    assert unknown.returncode == 1 and "no such job" in unknown.stdout
    assert [(e["action"], e["ok"]) for e in _audit(rsync, prefix)[:2]] == [
        ("retry", False),
        ("retry", True),
    ]


def test_jobs_and_job_read_a_few_kib_of_big_payloads(
    cli: CliRun, rsync: redis_sync.Redis, redis_url: str, key_prefix: str
) -> None:
    """50 scheduled jobs of 4 MiB arguments, written with plain redis-py: ``worker jobs`` reads
    a few KiB of each (4.9 s and 286 MB before: every payload read and decoded whole) and
    ``worker job ID`` a capped head."""
    keys, env = K.Keys(key_prefix), _env(redis_url, key_prefix)
    now = int(rsync.time()[0]) * 1000
    rsync.set("big-src", job_payload("record", [b"\0" * (4 << 20), "x"], {}, now, msgpack_dumps))
    ids = [f"{key_prefix}big-{i:02d}" for i in range(50)]
    for i, j in enumerate(ids):  # the server copies: the test sends 4 MiB once
        rsync.copy("big-src", K.ARQ_JOB + j)
        rsync.zadd(keys.queue, {j: now + 600_000 + i})

    def sent() -> int:
        return int(rsync.info("stats")["total_net_output_bytes"])

    before = sent()
    listed = _json(cli, env, "jobs", "--state", "scheduled", "--limit", "50")
    read = sent() - before
    print(f"worker jobs, 50 scheduled 4 MiB jobs: {read} bytes read")
    assert read < 1_000_000, read  # 210 MB before
    assert sorted(j["job_id"] for j in listed["items"]) == ids
    assert all(j["args"].endswith("(4194342 bytes)") for j in listed["items"]), listed["items"][0]

    before = sent()
    detail = _json(cli, env, "job", ids[0])
    read = sent() - before
    assert read < 200_000, read  # 4 MiB before
    assert detail["state"] == "scheduled" and "bytes in all" in detail["args"]
