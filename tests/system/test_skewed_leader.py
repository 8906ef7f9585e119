"""A leader whose host clock is 30 s fast (libfaketime, Debian's ``faketime`` package): real
server, real ``python -m worker`` processes, jobs counted in the edges tests' ledger.

A reaper that compared its own clock with the consumers' heartbeats judged every live
instance stale on every tick and released the jobs they were running; ``doctor`` saw one
instance (the others were just reaped) and reported the clocks fine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, wait_until
from harness.probes import enqueue_jobs, instance_records, led_hash, problem_report
from harness.waiting import settle
from worker.storage import keys as K

pytestmark = pytest.mark.slow

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
#: The wall clock 30 s fast; the monotonic clock left alone (the fault is the host's time).
FAST_30S = {
    "LD_PRELOAD": str(LIBFAKETIME),
    "FAKETIME": "+30s",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
}


def doctor(cli: CliRun, redis_url: str, prefix: str) -> tuple[int, dict[str, dict[str, object]]]:
    out = cli(
        "doctor",
        "--json",
        env={
            "WORKER_REDIS_URL": redis_url,
            "WORKER_KEY_PREFIX": prefix,
            "WORKER_APP": "harness.apps.edges:app",
        },
    )
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, {c["name"]: c for c in json.loads(out.stdout)["checks"]}


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="needs Debian's faketime package")
def test_leader_30s_fast_reaps_nobody_and_doctor_fails_its_clock(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis, cli: CliRun, redis_url: str
) -> None:
    """A ``leader`` under ``faketime +30s`` alone: doctor fails the clock check (its offset to
    Redis, no spread needed). Then a consumer runs 20 x 2 s jobs for 8 s: the leader's reaper
    reaps nobody, no job starts twice, and doctor counts both instances.

    On b1f4189 (3 runs): doctor exited 0 both times (clock-skew ✓ "across 1 instances",
    heartbeats counting 1 of the 2 live instances); the leader reaped the live consumer 11-14
    times (none of its jobs happened to be released)."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    leader = espawn("leader", name="fast-leader", env=FAST_30S)
    wait_until(
        lambda: (instance_records(rsync, prefix) or [{}])[0].get("clock_offset_ms") is not None,
        45,
        what="the fast leader measured its clock",
    )
    code_alone, alone = doctor(cli, redis_url, prefix)

    consumer = espawn("consumer", name="consumer")
    wait_until(lambda: len(instance_records(rsync, prefix)) == 2, 45, what="2 registered")
    ids = enqueue_jobs(rsync, prefix, "edge_job", [(2.0,)] * 20)
    settle(lambda: len(led_hash(lsync, prefix, "job-end")) >= len(ids), 12, 0.2)
    time.sleep(2.0)  # a job released by a reaper would start again now
    code_both, both = doctor(cli, redis_url, prefix)
    starts = led_hash(lsync, prefix, "job-start")
    twice = [j for j in ids if starts.get(j, 0) > 1]
    reaped = [e for e in leader.events() if e.get("event") == "stale instance reaped"]
    reaps, released = len(reaped), sum(int(e.get("jobs_released") or 0) for e in reaped)
    # a job released after its run could not record its end: queued to run again
    requeued = rsync.zcard(K.Keys(prefix).queue)

    figures = {
        "doctor with the fast leader alone": (code_alone, alone["clock-skew"]["summary"]),
        "doctor with both": (code_both, both["clock-skew"]["summary"]),
        "instances doctor counted": both["heartbeats"]["data"],
        "reaps logged by the leader (jobs released)": f"{reaps} ({released})",
        "jobs started twice": f"{len(twice)} of {len(ids)}",
        "jobs queued again after their run": requeued,
    }
    print(problem_report("leader 30 s fast", [], figures))
    problems = []
    if code_alone != 1 or alone["clock-skew"]["status"] != "fail":
        problems.append("doctor did not fail the clock check of a leader 30 s off Redis")
    if code_both != 1 or both["clock-skew"]["status"] != "fail":
        problems.append("doctor did not fail the clock check with the consumer beside it")
    if both["heartbeats"]["data"].get("registered") != 2:  # type: ignore[union-attr]
        problems.append("doctor did not count both live instances")
    if reaps:
        problems.append(f"the leader reaped live instances {reaps} times")
    if twice or requeued:
        problems.append(f"{len(twice)} of {len(ids)} jobs started twice, {requeued} queued again")
    dead = [p.name for p in (leader, consumer) if not p.alive()]
    if dead:
        problems.append(f"processes died: {dead}")
    assert not problems, problem_report("leader 30 s fast", problems, figures)
