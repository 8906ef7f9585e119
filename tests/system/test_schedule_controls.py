"""The operator's controls of run-time schedules, as a code schedule has them: pause and resume
(ticks skipped, not caught up), run one now, ``ctx.tick`` in a run; each an audited
:class:`~worker.ops.actions.Operations` action, through the CLI and ``status`` too."""

from __future__ import annotations

import json
import time
from typing import Any

import redis as redis_sync

from harness import CliRun, Spawn, client_call, wait_until
from harness.arqfmt import deserialize_job
from tests.duties.test_schedules import KEYS, MIN, PREFIX, T0, app, client_of, enqueuer, queued, run
from worker.core.clock import FakeClock
from worker.core.serializer import msgpack_loads
from worker.duties.schedules import ScheduleTickHook
from worker.ops.actions import Actor, Operations


def ops_of(r: Any) -> Operations:
    return Operations(client_of(r), app, Actor("ada", "cli"))


async def audit(r: Any) -> list[dict[str, Any]]:
    return [json.loads(e) for e in reversed(await r.lrange(KEYS.audit, 0, -1))]


def ticks(jobs: list[str]) -> list[int]:
    return [(int(j.rpartition(":")[2]) - T0) // MIN for j in jobs]


async def test_a_paused_schedule_skips_its_ticks_and_does_not_catch_them_up(r: Any) -> None:
    ops = ops_of(r)
    await ops.client.schedules.upsert("acme", "report", "acme", every=60, catch_up="all")
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 60)  # the tick of T0+1m
    paused = await ops.schedule_pause("acme")
    assert paused.ok and paused.details == {"changed": True}
    assert await r.sismember(KEYS.paused, "schedule:acme")
    await run(e, clock, 180)  # T0+2m..4m: skipped
    assert ticks(await queued(r)) == [1]
    assert (await e.store.schedule_state())["acme"] == T0 + 4 * MIN  # planned past them
    assert (await ops.schedule_pause("acme", paused=False)).ok
    await run(e, clock, 60)  # T0+5m, and none of the paused ones caught up
    assert ticks(await queued(r)) == [1, 5]
    assert [(a["action"], a["target"], a["who"], a["ok"]) for a in await audit(r)] == [
        ("pause", "schedule:acme", "ada", True),
        ("resume", "schedule:acme", "ada", True),
    ]


async def test_pausing_a_schedule_that_does_not_exist_is_refused_and_recorded(r: Any) -> None:
    out = await ops_of(r).schedule_pause("nope")
    assert not out.ok and "no schedule 'nope'" in out.message
    assert not await r.sismember(KEYS.paused, "schedule:nope")
    ((entry),) = await audit(r)
    assert (entry["action"], entry["target"], entry["ok"]) == ("pause", "schedule:nope", False)


async def test_a_removed_schedule_takes_its_pause_with_it(r: Any) -> None:
    ops = ops_of(r)
    await ops.client.schedules.upsert("acme", "report", "acme", every=60)
    await ops.schedule_pause("acme")
    assert (await ops.schedule_remove("acme")).ok
    assert not await r.sismember(KEYS.paused, "schedule:acme")  # made again: not paused


async def test_run_now_enqueues_one_job_like_a_tick_and_moves_no_tick(r: Any) -> None:
    ops = ops_of(r)
    await ops.client.schedules.upsert("acme", "report", "acme", every=60, fmt="csv")
    clock = FakeClock(T0 / 1000 + 1)
    e = await enqueuer(r, clock)
    await run(e, clock, 60)
    before = await e.store.schedule_state()
    ops.client.clock = FakeClock(T0 / 1000 + 90)
    out = await ops.schedule_trigger("acme")
    job_id = f"{PREFIX}schedule:acme:{T0 + 90_000}"
    assert out.ok and out.details == {"job": job_id}
    job = deserialize_job(await r.get(f"arq:job:{job_id}"), deserializer=msgpack_loads)
    assert (job.function, list(job.args), job.kwargs) == ("report", ["acme"], {"fmt": "csv"})
    assert await e.store.schedule_state() == before  # its ticks go on as planned
    again = await ops.schedule_trigger("acme")  # the same instant: one run
    assert not again.ok and "already enqueued" in again.message
    missing = await ops.schedule_trigger("nope")
    assert not missing.ok and "no schedule named 'nope'" in missing.message
    assert [(a["action"], a["ok"]) for a in await audit(r)] == [
        ("trigger", True), ("trigger", False), ("trigger", False),
    ]  # fmt: skip


async def test_changes_through_operations_are_audited_and_refusals_recorded(r: Any) -> None:
    ops = ops_of(r)
    made = await ops.schedule_upsert("acme", "report", ["acme"], {"fmt": "csv"}, cron="0 7 * * *")
    assert made.ok and made.details["definition"]["kwargs"] == {"fmt": "csv"}
    bad = await ops.schedule_upsert("acme", "nope", [], {}, every=60)
    assert not bad.ok and "nope" in bad.message
    odd = await ops.schedule_upsert("acme", "report", [], {}, every=60, when="now")
    assert not odd.ok and "when" in odd.message
    assert (await ops.client.schedules.get("acme")).cron == "0 7 * * *"  # type: ignore[union-attr]
    assert (await ops.schedule_remove("acme")).ok
    assert not (await ops.schedule_remove("acme")).ok
    assert [(a["action"], a["ok"]) for a in await audit(r)] == [
        ("schedule", True), ("schedule", False), ("schedule", False),
        ("unschedule", True), ("unschedule", False),
    ]  # fmt: skip


def test_the_tick_hook_reads_the_tick_from_a_schedule_job_id_only() -> None:
    hook = ScheduleTickHook(PREFIX)
    assert hook.context(f"{PREFIX}schedule:acme:{T0}") == {"tick_ms": T0}
    assert hook.context(f"{PREFIX}schedule:a:b:{T0}") == {"tick_ms": T0}  # names may hold ":"
    for other in (f"{PREFIX}periodic:x:{T0}", f"{PREFIX}schedule:acme:later", "plain", ""):
        assert hook.context(other) == {}


async def test_status_shows_a_paused_schedule(fake_arq: Any) -> None:
    from worker.ops import status

    ops = ops_of(fake_arq)
    await ops.client.schedules.upsert("acme", "report", "acme", every=60)
    await ops.schedule_pause("acme")
    doc = await status.collect(fake_arq, KEYS, app, FakeClock(T0 / 1000))
    (row,) = doc["schedules"]
    assert row["paused"] is True
    assert any(x.startswith("acme (PAUSED) ") for x in status.render(doc).splitlines())


def test_a_schedule_run_knows_its_tick_and_the_cli_pauses_and_runs_one_now(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    """A real worker: each run of ``stamp`` records its ``ctx.tick`` (it fails without one);
    ``worker schedule pause|resume|trigger`` act on the cluster and are audited."""
    rs: Any = rsync  # the sync client (its stubs type replies as awaitables too)
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.sched:app",
    }
    spawn("all", name="w1", app="harness.apps.sched:app")
    client_call(redis_url, prefix, "enqueue", "stamp", "warm-up")  # no tick: it fails
    ledger = f"{prefix}ledger:sched:t"
    assert (
        cli("schedule", "add", "t", "stamp", "--every", "1", "--args", '["t"]', env=env).returncode
        == 0
    )
    wait_until(lambda: rs.hlen(ledger) >= 2, 30, what="two ticks run")
    for tick, runs in rs.hgetall(ledger).items():
        assert int(tick) % 1000 == 0 and int(runs) == 1  # each on its second, once
    paused = cli("schedule", "pause", "t", env=env)
    assert paused.returncode == 0 and "schedule:t: paused" in paused.stdout, paused
    counted = rs.hlen(ledger)
    wait_until(lambda: rs.hlen(ledger) in (counted, counted + 1), 3, what="settled")
    counted = rs.hlen(ledger)  # a tick enqueued just before the pause may have run
    time.sleep(3)
    assert rs.hlen(ledger) == counted  # no tick while paused
    now = cli("schedule", "trigger", "t", env=env)
    assert now.returncode == 0 and "enqueued" in now.stdout, now
    wait_until(lambda: rs.hlen(ledger) == counted + 1, 20, what="the run now")
    assert cli("schedule", "resume", "t", env=env).returncode == 0
    wait_until(lambda: rs.hlen(ledger) >= counted + 3, 20, what="ticking again")
    assert cli("schedule", "pause", "nope", env=env).returncode == 1
    actions = [json.loads(a) for a in rs.lrange(f"{prefix}audit", 0, -1)][::-1]
    assert [(a["action"], a["target"], a["via"], a["ok"]) for a in actions] == [
        ("schedule", "schedule:t", "cli", True),
        ("pause", "schedule:t", "cli", True),
        ("trigger", "schedule:t", "cli", True),
        ("resume", "schedule:t", "cli", True),
        ("pause", "schedule:nope", "cli", False),
    ]


def test_the_cli_adds_and_removes_a_schedule_as_audited_actions(
    rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    """``worker schedule add|rm`` are operator actions like the console's: each recorded in the
    audit log (``schedule``/``unschedule``, via ``cli``), a refused one too."""
    rs: Any = rsync
    prefix = "cliaudit:"
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.sched:app",
    }
    add = cli("schedule", "add", "t", "stamp", "--every", "60", "--args", '["t"]', env=env)
    assert add.returncode == 0 and 'stamp("t")' in add.stdout, add
    bad = cli("schedule", "add", "x", "nope", "--every", "60", env=env)
    assert bad.returncode == 2 and "unknown task 'nope'" in bad.stderr, bad
    assert cli("schedule", "rm", "t", env=env).returncode == 0
    assert cli("schedule", "rm", "t", env=env).returncode == 1
    actions = [json.loads(a) for a in rs.lrange(f"{prefix}audit", 0, -1)][::-1]
    assert [(a["action"], a["target"], a["via"], a["ok"]) for a in actions] == [
        ("schedule", "schedule:t", "cli", True),
        ("schedule", "schedule:x", "cli", False),
        ("unschedule", "schedule:t", "cli", True),
        ("unschedule", "schedule:t", "cli", False),
    ]
