"""Hosts whose clocks disagree: ticks, due times and poll items are on the Redis server's clock.

Real ``python -m worker`` processes run under Debian's libfaketime (``LD_PRELOAD``, the
``faketime`` package), their wall clock moved through a timestamp file, their monotonic clock
left alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as on a real host whose clock is off. The
test app (harness/apps/skew.py) records, by the server's ``TIME``, when each tick ran and where
each poll item was rescheduled. Without libfaketime the test is skipped on a developer's
machine and fails in CI (``CI`` set).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc
from worker.storage import keys as K

pytestmark = pytest.mark.slow

SKEW_APP = "harness.apps.skew:app"
#: a run that began more than this before its tick by the server's clock is early
EARLY_TOLERANCE_MS = 50


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        why = "libfaketime is not installed (Debian package faketime)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the clock-skew tests: {why}")
        pytest.skip(why)
    return found[0]


def _skewed_env(lib: str, offset_file: Path, offset: str) -> dict[str, str]:
    offset_file.write_text(offset + "\n")
    return {
        "LD_PRELOAD": lib,
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_CACHE_DURATION": "1",  # re-read the file every second: a jump takes effect
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _records(r: redis_sync.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    keys = K.Keys(prefix)
    ids = [i.decode() for i in r.zrange(keys.instances, 0, -1)]
    raw = r.mget([keys.instance(i) for i in ids]) if ids else []
    return {str(rec["name"]): rec for rec in (json.loads(x) for x in raw if x)}


def _leader(r: redis_sync.Redis, prefix: str) -> str | None:
    leaders = [name for name, rec in _records(r, prefix).items() if rec.get("is_leader")]
    return leaders[0] if leaders else None


def _offset_s(r: redis_sync.Redis, prefix: str, name: str) -> float:
    """The host's clock offset to the server's, as its heartbeat measured it (s)."""
    return float(_records(r, prefix).get(name, {}).get("clock_offset_ms") or 0) / 1000


def _wait(predicate: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {predicate}")
        time.sleep(0.1)


def test_skewed_and_jumping_host_clocks_neither_lose_double_nor_advance_ticks_or_poll_items(
    spawn: Spawn, rsync: redis_sync.Redis, tmp_path: Path
) -> None:
    """One leader 30 s behind, a second 30 s ahead taking over, then its clock jumps 20 s
    on: every tick between the first and the last that ran ran exactly once, none began
    before its instant by the server's clock, and every poll item was rescheduled its 2 s
    after the server's now (before, 30 ticks were lost, the fast host ran
    ticks up to 30 s early and rescheduled poll items 30 s too far)."""
    lib = _libfaketime()
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    slow_file, fast_file = tmp_path / "slow.faketime", tmp_path / "fast.faketime"
    env = {"WORKER_SHUTDOWN_TIMEOUT_S": "3"}
    slow: WorkerProc = spawn(
        "all", name="slow", app=SKEW_APP, env={**env, **_skewed_env(lib, slow_file, "-30s")}
    )
    rsync.zadd(keys.poll_shard("skew", 0), {"item-a": 0, "item-b": 0})
    runs = f"{prefix}skew:runs"
    _wait(lambda: _leader(rsync, prefix) == "slow" and rsync.hlen(runs) >= 3, 60)
    fast: WorkerProc = spawn(
        "all", name="fast", app=SKEW_APP, env={**env, **_skewed_env(lib, fast_file, "+30s")}
    )
    _wait(lambda: len(rsync.zrange(keys.instances, 0, -1)) == 2, 60)
    # the fault is real: the hosts' clocks are off by what libfaketime says
    _wait(lambda: abs(_offset_s(rsync, prefix, "slow") - 30) < 2, 30)
    _wait(lambda: abs(_offset_s(rsync, prefix, "fast") + 30) < 2, 30)
    time.sleep(2)  # the fast host's consumer claims too
    slow.signal(signal.SIGTERM)  # a clean handoff: the fast host leads at once
    assert slow.proc.wait(60) == 0
    _wait(lambda: _leader(rsync, prefix) == "fast", 30)
    handed_over = rsync.hlen(runs)
    _wait(lambda: rsync.hlen(runs) >= handed_over + 4, 60)
    fast_file.write_text("+50s\n")  # the fast host's clock jumps 20 s on
    _wait(lambda: abs(_offset_s(rsync, prefix, "fast") + 50) < 2, 30)
    jumped = rsync.hlen(runs)
    _wait(lambda: rsync.hlen(runs) >= jumped + 5, 60)
    fast.signal(signal.SIGTERM)
    assert fast.proc.wait(60) == 0

    counts = {int(t): int(n) for t, n in rsync.hgetall(runs).items()}
    started = {int(t): int(s) for t, s in rsync.hgetall(f"{prefix}skew:started").items()}
    polls = [json.loads(p) for p in rsync.lrange(f"{prefix}skew:polls", 0, -1)]
    first, last = min(counts), max(counts)
    lost = [t for t in range(first, last + 1, 1000) if t not in counts]
    doubled = {t: n for t, n in counts.items() if n > 1}
    early = {t: t - s for t, s in started.items() if s < t - EARLY_TOLERANCE_MS}
    misplaced = [p for p in polls if abs(p["score"] - (p["server_ms"] + 2000)) > 1000]
    pids = {p["pid"] for p in polls}
    problems = [
        f"{len(lost)} tick(s) lost between the first and the last that ran: {lost[:5]}",
        f"{len(doubled)} tick(s) run twice: {list(doubled.items())[:5]}",
        f"{len(early)} tick(s) begun before their instant (ms early): {list(early.items())[:5]}",
        f"{len(misplaced)} of {len(polls)} poll reschedules not 2 s after the server's now "
        f"(off by ms): {[round(p['score'] - p['server_ms'] - 2000) for p in misplaced][:5]}",
    ]
    lags = [s - t for t, s in started.items()]
    figures = (
        f"{len(counts)} ticks ran over {(last - first) / 1000:.0f} s, each began "
        f"{min(lags)}..{max(lags)} ms after its instant; "
        f"{len(polls)} poll runs on {len(pids)} process(es)"
    )
    print(figures)
    assert (lost, doubled, early, misplaced) == ([], {}, {}, []), "\n".join([figures, *problems])
    assert len(counts) >= 12 and len(pids) == 2, figures  # both skewed hosts were measured
