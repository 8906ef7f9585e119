"""The outbox relay in operations: its report in ``status`` and the doctor (the database at
``WORKER_OUTBOX_DSN`` reachable from the leader, rows waiting, the oldest row's age), and
pausing and resuming it like any duty (``outbox:relay``). A real PostgreSQL and the real
server, as tests/outbox/test_outbox.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import CliRun
from harness.postgres import Postgres
from tests.outbox.test_outbox import KEYS, outbox_db, outbox_rows, relay_of, relay_on
from worker import App
from worker.client import Client
from worker.core.clock import SystemClock
from worker.core.serializer import msgpack_dumps
from worker.core.verdict import Limits
from worker.duties.outbox_kind import OutboxState, check_outbox
from worker.ops import doctor, status
from worker.ops.actions import Actor, Operations

APP = App("outbox-ops")


def ops_of(r: aioredis.Redis) -> Operations:
    client = Client(r, keys=KEYS, serialize=msgpack_dumps, app=APP, clock=SystemClock())
    return Operations(client, APP, Actor("ada", "cli"))


async def test_the_relay_reports_waiting_rows_and_paused_it_moves_none(
    postgres: Postgres, redis_url: str
) -> None:
    dsn = outbox_db(postgres, "outbox_ops", [(0, None), (1, None)])
    async with relay_on(dsn, redis_url) as (relay, _, r):
        ops = ops_of(r)
        paused = await ops.pause("outbox", "relay")
        assert paused.ok and paused.target == "outbox:relay"
        assert await relay.tick() == relay.interval_s  # paused: nothing moved
        assert await r.zcard(KEYS.queue) == 0 and len(outbox_rows(dsn)) == 2
        doc = await status.collect(r, KEYS, APP)
        (row,) = doc["outbox"]
        assert (row["waiting"], row["paused"], row["error"]) == (2, True, None)
        assert row["oldest_age_s"] > 0 and row["token"] == relay.token
        assert any(x.startswith("relay (PAUSED)") for x in status.render(doc).splitlines())
        check = next(
            c for c in (await doctor.diagnose(r, KEYS, APP)).checks if c.name == "outbox-relay"
        )
        assert check.status == "ok" and "2 rows waiting" in check.summary
        assert (await ops.resume("outbox", "relay")).ok
        assert await relay.tick() == 0.001  # moved
        assert await r.zcard(KEYS.queue) == 2 and outbox_rows(dsn) == []
        await relay.tick()  # an empty look (waits its interval for a commit)
        (row,) = (await status.collect(r, KEYS, APP))["outbox"]
        assert (row["waiting"], row["oldest_age_s"], row["paused"]) == (0, None, False)
        audit = [json.loads(e) for e in reversed(await r.lrange(KEYS.audit, 0, -1))]
        assert [(a["action"], a["target"]) for a in audit] == [
            ("pause", "outbox:relay"), ("resume", "outbox:relay"),
        ]  # fmt: skip


async def test_an_unreachable_outbox_database_fails_the_doctor(
    postgres: Postgres, redis_url: str
) -> None:
    dsn = postgres.database("outbox_gone")
    host_port = dsn.split("@", 1)[1].split("/", 1)[0]
    closed = dsn.replace(host_port, "127.0.0.1:9")  # nothing listens on the discard port
    r = aioredis.Redis.from_url(redis_url)
    try:
        with pytest.raises(psycopg.OperationalError):
            await relay_of(closed, r)
        report = await doctor.diagnose(r, KEYS, APP)
        check = next(c for c in report.checks if c.name == "outbox-relay")
        assert check.status == "fail" and "cannot reach the outbox database" in check.summary
        assert check.details and "Connection refused" in check.details[0]
        assert "outbox-relay" in doctor.render(report)
    finally:
        await r.aclose()


@dataclass
class Snap:
    now_ms: int
    duties: dict[str, Any] = field(default_factory=dict)


NOW = 1_700_000_000_000


def judged(report: dict[str, Any] | None) -> Any:
    return check_outbox(Snap(NOW, {"outbox": OutboxState(report)}), APP, Limits(max_lag_s=60))


def test_the_doctor_judges_the_relays_report() -> None:
    fresh = {"at_ms": NOW - 500, "token": 3, "waiting": 0, "error": None, "interval_s": 1.0}
    assert judged(None).status == "ok" and "unset" in judged(None).summary
    assert judged(fresh).status == "ok" and "0 rows waiting" in judged(fresh).summary
    stale = {**fresh, "at_ms": NOW - 20_000}
    assert judged(stale).status == "warn" and "20s ago" in judged(stale).summary
    old = {**fresh, "waiting": 500, "more": True, "oldest_age_s": 95.0}
    assert (
        judged(old).status == "fail" and "500+ rows waiting, the oldest 95s" in judged(old).summary
    )


def test_the_cli_pauses_and_resumes_the_relay(
    cli: CliRun, redis_url: str, rsync: redis_sync.Redis
) -> None:
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": "coo:",
        "WORKER_APP": "harness.apps.sched:app",
    }
    out = cli("pause", "outbox:relay", env=env)
    assert out.returncode == 0 and "outbox relay 'relay' paused" in out.stdout, out
    assert rsync.sismember("coo:paused", "outbox:relay")
    assert cli("resume", "outbox:relay", env=env).returncode == 0
    assert not rsync.sismember("coo:paused", "outbox:relay")
