"""Decode budgets: a payload inside WORKER_MAX_PAYLOAD_BYTES that decodes
to millions of objects, a broadcast of any size, a record nested deeper than Python recurses or
holding ``NaN``, huge or out-of-range numbers. Each is written with plain redis-py into a real
server while real ``python -m worker`` processes run; every process keeps running and every
console view and CLI command keeps answering.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest
import redis as redis_sync

from harness import CliRun, Spawn, client_call, wait_until
from harness.ports import free_port
from harness.probes import http_get, rss_mb, wait_ready
from tests.core.test_malformed import component_restarts, skipped
from worker.storage import keys as K

pytestmark = pytest.mark.slow

MB = 1024 * 1024
TOKEN = "decode-budget-tests-token-0123456"
BCAST_APP = "harness.apps.bcast:app"


def strict_json(text: str) -> Any:
    """``text`` as standard JSON (``NaN``/``Infinity`` are not), every ``*_ms`` field in it a
    time a browser can show (``new Date(ms)`` is valid within ±8.64e15) or null."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"non-standard JSON constant {name}")

    def times(value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                times(v)
        elif isinstance(value, dict):
            for k, v in value.items():
                if k.endswith("_ms") and v is not None and not (-8.64e15 <= v <= 8.64e15):
                    raise AssertionError(f"{k}: {v!r} is not a time")
                times(v)

    doc = json.loads(text, parse_constant=refuse)
    times(doc)
    return doc


def put_job(r: redis_sync.Redis, prefix: str, job_id: str, raw: bytes, due_ms: int) -> None:
    """A job record in arq's format (``arq:job:<id>`` + the queue entry), as another client
    (or an attacker) writes it."""
    with r.pipeline(transaction=True) as pipe:
        pipe.set(K.ARQ_JOB + job_id, raw, px=3_600_000)
        pipe.zadd(K.Keys(prefix).queue, {job_id: due_ms})
        pipe.execute()


def test_six_jobs_of_4_million_empty_lists_are_dead_lettered_without_the_memory(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """Six 4 MB msgpack jobs (under WORKER_MAX_PAYLOAD_BYTES) each holding 4 million empty
    lists: the consumer's RSS stays within +100 MB, the leader keeps its lease, /healthz stays
    200, and each job is dead-lettered with a reason naming the decode budget.

    Before: ~300 MB and over a second of blocked loop per job (RSS 110 -> 958 MB for six,
    the lease dropped, /healthz 503)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    port = free_port()
    proc = spawn("all", name="solo", env={"WORKER_HEALTH_PORT": str(port)})
    wait_ready(proc, port)
    lock = wait_until(lambda: rsync.get(keys.leader), 30, what="the lease")
    time.sleep(1.0)
    baseline = rss_mb(proc.pid)[0]
    now = int(time.time() * 1000)
    raw = msgpack.packb(
        {"t": None, "f": "slow_job", "a": [[[] for _ in range(4_000_000)]], "k": {}, "et": now}
    )
    assert len(raw) < 4 * MB
    ids = [f"{prefix}lists-{i}" for i in range(6)]
    for job_id in ids:
        put_job(rsync, prefix, job_id, raw, now)
    del raw
    peak, health = baseline, []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.alive():
        peak = max(peak, rss_mb(proc.pid)[0])
        health.append(http_get(port, "/healthz", timeout=2.0)[0])
        if all(rsync.hexists(keys.dead_jobs, j) for j in ids):
            break
        time.sleep(0.05)
    hwm = rss_mb(proc.pid)[1] if proc.alive() else 0.0
    reasons = [json.loads(rsync.hget(keys.dead_jobs, j) or "{}").get("reason") for j in ids]
    lease = "kept" if rsync.get(keys.leader) == lock else "changed"
    print(f"RSS {baseline:.0f} -> peak {peak:.0f}, VmHWM {hwm:.0f} MB; /healthz {set(health)}; "
          f"lease {lease}; reasons {set(reasons)}")  # fmt: skip
    assert proc.alive(), proc.log()[-3000:]
    assert all(r and "budget" in r for r in reasons), reasons
    assert max(peak, hwm) - baseline < 100, (baseline, peak, hwm)
    assert set(health) == {200}, health
    assert http_get(port, "/healthz")[0] == 200
    assert rsync.get(keys.leader) == lock, proc.log()[-3000:]
    assert "leadership lost" not in proc.log()


def test_a_50_mb_broadcast_is_refused_at_publish_and_one_written_anyway_is_skipped(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """``Client.broadcast`` of 50 MB raises (WORKER_MAX_BROADCAST_BYTES) and writes nothing;
    a 50 MB entry XADDed with plain redis-py is skipped by a running process (logged once,
    counted), which handles the next broadcast once and stays healthy.

    Before: the 50 MB broadcast was accepted and every process of every role decoded it and
    ran its handlers."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    port = free_port()
    proc = spawn("consumer", name="c1", app=BCAST_APP, env={"WORKER_HEALTH_PORT": str(port)})
    wait_ready(proc, port)
    assert client_call(redis_url, prefix, "broadcast", "pricing", {"id": "m1"}) == 1
    with pytest.raises(ValueError, match="WORKER_MAX_BROADCAST_BYTES"):  # BroadcastTooLarge
        client_call(redis_url, prefix, "broadcast", "pricing", {"id": "big", "pad": "x" * 50 * MB})
    assert rsync.xlen(keys.broadcast("pricing")) == 1
    huge = msgpack.packb({"data": {"id": "huge", "pad": "x" * 50 * MB}})
    rsync.xadd(keys.broadcast("pricing"), {"seq": 2, "origin": "x", "chain": "", "data": huge})
    del huge
    assert client_call(redis_url, prefix, "broadcast", "pricing", {"id": "m3"}) == 3
    ledger = f"{prefix}ledger:bcast:c1"
    wait_until(lambda: rsync.hget(ledger, "m3"), 30, what="m3 handled")
    assert rsync.hget(ledger, "huge") is None
    assert proc.alive() and http_get(port, "/healthz")[0] == 200, proc.log()[-3000:]
    assert component_restarts(port, "broadcast") == 0
    assert len(skipped(proc, "pricing")) == 1, proc.log()[-3000:]
    assert (
        'worker_broadcasts_total{outcome="malformed",topic="pricing"} 1.0'
        in (http_get(port, "/metrics")[1])
    )


def nested_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_msgpack(depth: int) -> bytes:
    """A job record whose one argument is lists nested ``depth`` deep (msgpack's own packer
    refuses to nest this deep, so the bytes are written by hand)."""
    head = msgpack.packb({"t": None, "f": "slow_job", "k": {}, "et": int(time.time() * 1000)})
    # a map of 5 entries: the 4 above (fixmap 0x84 -> 0x85) and "a": [[[...]]]
    return b"\x85" + head[1:] + msgpack.packb("a") + b"\x91" * depth + b"\x90"


def write_hostile_records(r: redis_sync.Redis, prefix: str) -> dict[str, str]:
    """Every record kind, hostile (see the test below): ``{what: job id or key}``."""
    keys = K.Keys(prefix)
    now = int(time.time() * 1000)
    later = now + 3_600_000
    deep = nested_json(100_000)  # 200 KB, deeper than Python recurses
    r.set(keys.instance("evil"), deep, px=600_000)
    r.zadd(keys.instances, {"evil": now})
    r.hset(keys.periodic_runs, "tick:success", deep)
    r.hset(keys.periodic_runs, "tick:failure", '{"at_ms": "soon", "instance": "x"}')
    jobs = {
        "nested failure": f"{prefix}f-deep",
        "NaN failure": f"{prefix}f-nan",
        "nested dead letter": f"{prefix}d-deep",
        "nested progress": f"{prefix}p-deep",
        "out-of-range time": f"{prefix}t-big",
        "text time": f"{prefix}t-text",
        "argument nested 1000 deep": f"{prefix}a-deep",
        "NaN result": f"{prefix}r-nan",
        "huge numbers in a failure": f"{prefix}f-huge",
        "huge numbers in a dead letter": f"{prefix}d-huge",
        "huge numbers in a progress": f"{prefix}p-huge",
    }
    huge = '{"at_ms": 1e300, "tries": -1e300, "fraction": 1e300, "error_type": 5, "reason": []}'
    r.set(keys.instance("huge"), huge.replace("at_ms", "heartbeat_ms"), px=600_000)
    r.zadd(keys.instances, {"huge": now})
    r.set(keys.failure(jobs["huge numbers in a failure"]), huge)
    r.zadd(keys.failures, {jobs["huge numbers in a failure"]: now})
    r.hset(keys.dead_jobs, jobs["huge numbers in a dead letter"], huge)
    r.hset(keys.dead_index, jobs["huge numbers in a dead letter"], huge)
    r.zadd(keys.dead, {jobs["huge numbers in a dead letter"]: now})
    r.set(keys.progress(jobs["huge numbers in a progress"]), huge)
    r.lpush(keys.audit, huge)
    r.set(keys.failure(jobs["nested failure"]), deep)
    r.set(
        keys.failure(jobs["NaN failure"]),
        '{"error_type": "X", "message": NaN, "at_ms": Infinity, "tries": 1e999}',
    )
    r.zadd(keys.failures, {jobs["nested failure"]: now, jobs["NaN failure"]: now})
    r.hset(keys.dead_jobs, jobs["nested dead letter"], deep)
    r.hset(keys.dead_index, jobs["nested dead letter"], deep)
    r.zadd(keys.dead, {jobs["nested dead letter"]: now})
    r.set(keys.progress(jobs["nested progress"]), deep)
    r.lpush(keys.audit, deep)
    r.hset(keys.task_stats(now // 3_600_000), f"{now // 60_000}:slow_job:d", "9" * 400)
    record = {"t": None, "f": "slow_job", "a": [1], "k": {}}
    times = [("nested progress", now), ("huge numbers in a progress", now)]
    times += [("out-of-range time", 10**19), ("text time", "x")]
    for what, et in times:
        put_job(r, prefix, jobs[what], msgpack.packb({**record, "et": et}), later)
    put_job(r, prefix, jobs["argument nested 1000 deep"], deep_msgpack(1000), later)
    result = {"t": 1, "f": "slow_job", "a": [], "k": {}, "et": now, "s": True, "r": float("nan"),
              "st": now, "ft": now, "q": keys.queue, "id": jobs["NaN result"]}  # fmt: skip
    r.set(K.ARQ_RESULT + jobs["NaN result"], msgpack.packb(result), px=600_000)
    r.zadd(keys.done, {jobs["NaN result"]: now})
    return jobs


def test_hostile_records_of_every_kind_leave_every_process_and_view_working(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    """Written with plain redis-py: a 200 KB nested instance record, a nested and a text-timed
    ``periodic:runs`` field, nested failure / dead-letter / progress / audit records, ``NaN``
    and ``Infinity`` in a failure record, a result of ``NaN``, job records whose enqueue time
    is out of range or text, a 400-digit ``tstats`` count, a job argument nested 1,000 deep.
    A new worker starts and leads, its periodic component never restarts, and every console
    view and CLI command below answers (200 or 404, standard JSON; exit 0 or 1, no traceback).

    Before (6767e85): the new worker exited at start-up (RecursionError); without the instance
    record, the periodic component never ticked; without that too, 10 of 14 console views
    answered 503 (RecursionError; OverflowError for /api/tasks) and 7 of 13 CLI commands
    failed (RecursionError; ``worker job`` of the out-of-range time: ValueError); the console's
    API emits only standard JSON (a failure record or a result holding ``NaN``)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    jobs = write_hostile_records(rsync, prefix)
    port, web_port = free_port(), free_port()
    proc = spawn("all", name="solo", env={"WORKER_HEALTH_PORT": str(port)})
    web = spawn(
        "all",
        name="console",
        command="web",
        env={"WORKER_WEB_PORT": str(web_port), "WORKER_WEB_TOKEN": TOKEN},
    )
    wait_ready(proc, port)
    wait_until(lambda: rsync.hlen(f"{prefix}ledger:ticks") >= 2, 30, what="periodic ticks")

    def api(path: str) -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{web_port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    wait_until(lambda: api("/api/overview")[0], 45, what="the console")
    views = ["/api/overview", "/api/dead", "/api/tasks"]
    views += [f"/api/jobs?state={s}" for s in ("failed", "scheduled", "queued", "done")]
    views += [f"/api/jobs/{j}" for j in jobs.values()]
    views += [f"/api/dead/{jobs['nested dead letter']}"]
    problems = []
    for path in views:
        code, body = api(path)
        try:
            strict_json(body)
        except (AssertionError, ValueError) as exc:
            problems.append(f"{path}: {code} {exc}: {body[:200]}")
            continue
        if code not in (200, 404) or (code == 404 and path.count("/") < 3):  # a skipped record
            problems.append(f"{path}: {code} {body[:200]}")
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix,
           "WORKER_APP": "harness.apps.ledger:app"}  # fmt: skip
    commands = [("status", "--json"), ("status",), ("doctor",), ("dead",)]
    commands += [("jobs", "--state", s) for s in ("failed", "scheduled")]
    kinds = ("nested failure", "nested progress", "out-of-range time", "argument nested 1000 deep")
    kinds += ("huge numbers in a progress", "huge numbers in a failure")
    commands += [("job", jobs[k]) for k in kinds]
    with ThreadPoolExecutor(4) as pool:  # each command is a process of its own
        outs = list(pool.map(lambda args: cli(*args, env=env), commands))
    for args, out in zip(commands, outs, strict=True):
        if "Traceback" in out.stdout + out.stderr or out.returncode not in (0, 1):
            problems.append(f"worker {' '.join(args)}: exit {out.returncode} {out.stderr[-300:]}")
    assert proc.alive() and web.alive(), proc.log()[-3000:] + web.log()[-3000:]
    assert http_get(port, "/healthz")[0] == 200
    assert component_restarts(port, "periodic") == 0, proc.log()[-3000:]
    assert not problems, "\n".join(problems)
    keys = K.Keys(prefix)
    runs = [f"{keys.periodic_runs} tick:{kind}" for kind in ("success", "failure")]
    for bad in (keys.instance("evil"), keys.instance("huge"), *runs):
        assert len(skipped(proc, bad)) == 1, (bad, proc.log()[-3000:])  # logged once
    assert 'worker_malformed_entries_total{kind="JSON object"}' in http_get(port, "/metrics")[1]
