"""Deadlines with real processes: jobs enqueued while no consumer runs, a consumer started
after; the job past its deadline ends ``expired`` and never runs, the one within it runs."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, wait_until
from harness.apps.coalesce import app as co_app
from worker.client import Client
from worker.core.codec import JobStatus
from worker.core.errors import JobExpired
from worker.ops.jobsview import job_detail

APP = "harness.apps.coalesce:app"


def _log(rsync: redis_sync.Redis, prefix: str) -> list[list[str]]:
    return [e.decode().split("|") for e in rsync.lrange(f"{prefix}co:log", 0, -1)]


def _ends(rsync: redis_sync.Redis, prefix: str) -> dict[str, str]:
    raw = rsync.hgetall(f"{prefix}co:ends")
    return {k.decode(): v.decode() for k, v in raw.items()}


@pytest.mark.slow
def test_a_job_past_its_deadline_never_starts_and_ends_expired_everywhere(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix, "WORKER_APP": APP}

    async def enqueue() -> tuple[list[str | None], list[str | None]]:
        client = await Client.connect(redis_url, app=co_app, key_prefix=prefix)
        try:
            at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3)
            late = [
                await client.enqueue("note", "k", "late-in", expires_in=0.3),
                await client.enqueue("note", "k", "late-at", expires_at=at),
                await client.enqueue("brief", "k", "late-task"),  # @app.task(expires_in=1.0)
            ]
            fine = [
                await client.enqueue("note", "k", "fine-in", expires_in=120),
                await client.enqueue("note", "k", "plain"),
            ]
        finally:
            await client.close()
        return late, fine

    late, fine = asyncio.run(enqueue())  # no consumer runs yet
    assert None not in late and None not in fine
    time.sleep(1.5)  # every "late" deadline passes on the server's clock
    spawn("consumer", name="c1", app=APP)
    ids = [j for j in late + fine if j is not None]
    wait_until(lambda: len(_ends(rsync, prefix)) == len(ids), 30, what="every job to end")

    ends = _ends(rsync, prefix)  # on_job_end hooks: JobOutcome.status
    assert {ends[j] for j in late if j} == {"expired"}, ends
    assert {ends[j] for j in fine if j} == {"success"}, ends
    ran = {e[3] for e in _log(rsync, prefix) if e[0] == "start"}
    assert ran == set(fine), "an expired job ran"

    async def records() -> None:
        client = await Client.connect(redis_url, app=co_app, key_prefix=prefix)
        try:
            for j in late:
                assert j is not None
                job = client.job(j)
                assert await job.status() == JobStatus.complete
                info = await job.result_info()
                assert info is not None and not info.success
                failure = await client.failure(j)
                assert failure is not None and failure["status"] == "expired"
                assert failure["error_type"] == JobExpired.__name__
                detail = await job_detail(client.store, j)  # the console's Jobs view
                assert detail is not None and detail.state == "expired"
        finally:
            await client.close()

    asyncio.run(records())
    shown = cli("job", str(late[0]), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "expired"
    shown = cli("job", str(late[0]), env=env)
    assert "expired" in shown.stdout
