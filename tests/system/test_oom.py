"""Redis out of memory (``maxmemory`` reached under ``noeviction``): writes are refused for a
while, then memory is freed. Real server, real ``python -m worker`` processes; jobs counted in
a ledger on a second server that is never faulted (harness/apps/edges.py).

Under OOM every write a heartbeat makes is refused, the leader's own too, while the orphan
reaper's script (its first write is a ``DEL``) still runs: a reaper that took the silence for
death released the jobs of live consumers, and jobs whose ``FINISH`` had been refused ran again
once memory was back. The heartbeat failing every interval also made every process report a
crash loop (``/healthz`` 503) for 5 minutes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.ports import free_port
from harness.probes import (
    enqueue_jobs,
    http_get,
    instance_records,
    led_hash,
    problem_report,
    wait_ready,
)
from harness.realredis import RealRedis

pytestmark = pytest.mark.slow

MAXMEMORY = ("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")


@pytest.fixture(scope="module")
def oom_server() -> Iterator[RealRedis]:
    """A server at 64 MiB ``noeviction`` (what the README asks for), for this module only."""
    with RealRedis(extra_args=("--appendfsync", "everysec", *MAXMEMORY)) as server:
        yield server


@pytest.fixture
def redis_url(oom_server: RealRedis) -> str:
    """Overrides conftest's: ``spawn`` starts its processes on the OOM server."""
    return oom_server.fresh_url()


def fill_memory(r: redis_sync.Redis, n: int = 0) -> int:
    """Write filler keys from index ``n`` until the server refuses writes; returns the index
    after the last one written."""
    for size in (1 << 20, 1 << 14, 1 << 10):
        blob = b"x" * size
        while True:
            try:
                r.set(f"oom-fill:{n}", blob)
            except redis_sync.exceptions.OutOfMemoryError:
                break
            n += 1
    return n


def free_memory(r: redis_sync.Redis, n: int) -> None:
    for start in range(0, n, 500):
        r.delete(*[f"oom-fill:{i}" for i in range(start, min(n, start + 500))])


def refused(r: redis_sync.Redis) -> bool:
    try:
        r.set("oom-probe", "1")
    except redis_sync.exceptions.OutOfMemoryError:
        return True
    return False


def test_redis_out_of_memory_reaps_no_live_consumer_and_liveness_recovers(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """A leader (``all``: it consumes too) and a consumer run 1 s jobs; Redis is held at its
    ``maxmemory`` for 8 s (4x the orphan bound, FAST_ENV: heartbeat 0.5 s, stale 2 s), then
    freed. No instance is reaped, no job completes twice, every process is unready during the
    outage and live (``/healthz`` 200) again within 10 s of memory being freed.

    On b1f4189 (2 runs): the leader reaped both live instances (its own included) 3-4 times,
    23-63 of 200 jobs completed twice, /readyz stayed 200 and /healthz was 503 on both
    processes from the OOM to past 10 s after memory was freed (a crash loop, held 300 s)."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_CONCURRENCY": "20"}
    ports = {"leader": free_port(), "consumer": free_port()}
    procs = {
        name: espawn(role, name=name, env={**env, "WORKER_HEALTH_PORT": str(ports[name])})
        for name, role in (("leader", "all"), ("consumer", "consumer"))
    }
    for name, proc in procs.items():
        wait_ready(proc, ports[name])
    wait_until(lambda: len(instance_records(rsync, prefix)) == 2, 30, what="2 registered")

    ids = enqueue_jobs(rsync, prefix, "edge_job", [(1.0,)] * 200)
    wait_until(lambda: len(led_hash(lsync, prefix, "job-start")) >= 20, 30, what="jobs started")
    filled = fill_memory(rsync)
    oom_at = time.monotonic()
    unready_seen = {name: False for name in procs}
    not_live_seen = {name: 0 for name in procs}
    metrics_unready = {name: False for name in procs}
    while time.monotonic() - oom_at < 8.0:
        if not refused(rsync):
            filled = fill_memory(rsync, filled)  # jobs' deletes freed some: fill again
        for name, port in ports.items():
            if http_get(port, "/readyz", timeout=1.0)[0] == 503:
                unready_seen[name] = True
            if http_get(port, "/healthz", timeout=1.0)[0] != 200:
                not_live_seen[name] += 1
            if not metrics_unready[name]:
                metrics_unready[name] = "worker_ready 0.0" in http_get(port, "/metrics")[1]
        time.sleep(0.2)
    free_memory(rsync, filled)
    freed_at = time.monotonic()

    live_again: dict[str, float | None] = {name: None for name in procs}

    ready_again: dict[str, float | None] = {name: None for name in procs}

    def all_live() -> bool:
        for name, port in ports.items():
            for probe, seen in (("/healthz", live_again), ("/readyz", ready_again)):
                if seen[name] is None and http_get(port, probe, timeout=1.0)[0] == 200:
                    seen[name] = round(time.monotonic() - freed_at, 1)
        return all(v is not None for v in (*live_again.values(), *ready_again.values()))

    deadline = time.monotonic() + 10
    while not all_live() and time.monotonic() < deadline:
        time.sleep(0.2)
    wait_until(
        lambda: len(led_hash(lsync, prefix, "job-end")) >= len(ids), 60, 0.5, what="jobs ended"
    )
    time.sleep(1.0)  # a job released by a reaper would run again now
    ends = led_hash(lsync, prefix, "job-end")
    twice = [j for j in ids if ends.get(j, 0) > 1]
    reaped = {
        name: sum(1 for e in p.events() if e.get("event") == "stale instance reaped")
        for name, p in procs.items()
    }
    figures = {
        "filler keys written": filled,
        "jobs": len(ids),
        "completed twice": len(twice),
        "reaps logged by the leader": reaped["leader"],
        "unready seen during the OOM (/readyz, worker_ready)": (unready_seen, metrics_unready),
        "/healthz not 200 during the OOM (probes)": not_live_seen,
        "s from memory freed to /healthz 200": live_again,
        "s from memory freed to /readyz 200": ready_again,
    }
    problems = []
    if twice:
        problems.append(f"{len(twice)} of {len(ids)} jobs completed twice")
    if reaped["leader"]:
        problems.append(f"the leader reaped {reaped['leader']} live instances")
    not_live = [n for n, v in live_again.items() if v is None]
    if not_live:
        problems.append(f"/healthz not 200 within 10 s of memory freed on {not_live}")
    not_ready = [n for n, v in ready_again.items() if v is None]
    if not_ready:
        problems.append(f"/readyz not 200 within 10 s of memory freed on {not_ready}")
    not_unready = [n for n in procs if not (unready_seen[n] and metrics_unready[n])]
    if any(not_live_seen.values()):
        problems.append(f"/healthz failed while Redis refused writes: {not_live_seen}")
    if not_unready:
        problems.append(
            f"/readyz never 503 or worker_ready never 0 while Redis refused writes on {not_unready}"
        )
    dead = [n for n, p in procs.items() if not p.alive()]
    if dead:
        problems.append(f"processes died: {dead}")
    print(problem_report("Redis out of memory", problems, figures))
    assert not problems, problem_report("Redis out of memory", problems, figures)
