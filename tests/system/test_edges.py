"""Edge faults an outside audit used against the promise "no fault duplicates or loses work".

Every test runs real ``python -m worker`` processes (harness/apps/edges.py) against a real
server, injects the fault at the worst moment, and counts what happened in a LEDGER ON A SECOND
SERVER that is never faulted (``EDGE_LEDGER_URL``), so the evidence survives the fault. A
failing assertion reads like a measurement: it prints the counts (duplicates, misses,
overlaps), not just "False".

Timings are conftest's FAST_ENV (lease TTL 3 s, renew 0.5 s, deadline 1.5 s, heartbeat 0.5 s,
orphan stale 2 s) unless a test says otherwise.

These tests use API the framework gains with the fixes they document: ``Context.is_leading()``,
``Context.leader_epoch()``, ``Context.fenced_pipeline()``, ``JobContext.still_claimed()`` and
the settings ``WORKER_MAX_PAYLOAD_BYTES`` / ``WORKER_DEAD_LETTER_MAX``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import Spawn, WorkerProc, wait_until
from harness.arqfmt import Job
from harness.ports import free_port
from harness.probes import (
    consumer_restarts,
    dead_records,
    enqueue_jobs,
    http_get,
    instance_records,
    led_hash,
    led_key,
    led_total,
    problem_report,
    put_raw_job,
    record_of,
    rss_mb,
    wait_ready,
)
from harness.realredis import RealRedis
from harness.soak import size
from harness.waiting import settle
from worker.core.serializer import msgpack_loads
from worker.runtime.embedded import EmbeddedServer
from worker.settings import Settings
from worker.storage import keys as K

pytestmark = pytest.mark.slow

MB = 1024 * 1024


# -- helpers: run intervals and their overlaps ------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One run of a singleton: ``[start, end]`` in epoch seconds; ``ended`` is False when the
    run never wrote its end and ``end`` is its last "alive" time instead."""

    rid: str
    pid: int
    start: float
    end: float
    ended: bool


def read_intervals(lsync: redis_sync.Redis, prefix: str) -> list[Interval]:
    alive = {k.decode(): float(v) for k, v in lsync.hgetall(led_key(prefix, "alive")).items()}
    ends = {k.decode(): float(v) for k, v in lsync.hgetall(led_key(prefix, "end")).items()}
    out = []
    for raw in lsync.lrange(led_key(prefix, "intervals"), 0, -1):
        rec = json.loads(raw)
        rid, start = rec["id"], float(rec["start"])
        ended = rid in ends
        end = ends[rid] if ended else alive.get(rid, start)
        out.append(Interval(rid, int(rec["pid"]), start, max(start, end), ended))
    return sorted(out, key=lambda i: i.start)


def overlap_s(a: Interval, b: Interval) -> float:
    """Seconds during which both intervals ran (0.0 if disjoint)."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def overlapping_pairs(intervals: Iterable[Interval]) -> list[tuple[Interval, Interval, float]]:
    """Every pair of runs in DIFFERENT processes that ran at the same time, with the overlap."""
    runs = sorted(intervals, key=lambda i: i.start)
    pairs = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if b.start >= a.end:
                break
            if a.pid != b.pid and (o := overlap_s(a, b)) > 0:
                pairs.append((a, b, o))
    return pairs


def describe_overlaps(pairs: list[tuple[Interval, Interval, float]]) -> str:
    if not pairs:
        return "none"
    worst = max(o for _, _, o in pairs)
    total = sum(o for _, _, o in pairs)
    shown = ", ".join(f"pid {a.pid}+{b.pid} {o:.2f}s" for a, b, o in pairs[:6])
    return f"{len(pairs)} overlapping pair(s), worst {worst:.2f}s, total {total:.2f}s ({shown})"


def epoch_regressions(epochs: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(position, epoch, higher epoch seen before)`` for each value below an earlier one."""
    out, high = [], None
    for i, e in enumerate(epochs):
        if high is not None and e < high:
            out.append((i, e, high))
        high = e if high is None else max(high, e)
    return out


# -- 1. singleton services after the lock vanishes --------------------------------------------


def test_singleton_never_overlaps_and_fenced_writes_stay_ordered_when_the_lock_vanishes(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """3 leaders; the lock is DELeted 5 times (10 under ``python -m bench soak``) at random
    moments and once right after a new singleton run started. Runs of the singleton in
    different processes never overlap, fenced marks land with non-decreasing epochs, and the
    service runs again afterwards.

    On 77fd932: 8-10 overlapping pairs per 11 deletions, worst 0.41-0.45 s; no fenced API
    (so 6 deletions still meet several overlaps where the fencing is missing)."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    lock = K.Keys(prefix).leader
    intervals_key = led_key(prefix, "intervals")
    leaders = [espawn("leader", name=f"leader-{i}", env={"EDGE_SINGLETON": "1"}) for i in range(3)]
    wait_until(lambda: lsync.llen(intervals_key), 45, what="the singleton service to start")
    time.sleep(1.0)

    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    deleted_at: list[float] = []
    for _ in range(size(5, 10)):
        time.sleep(rng.uniform(1.5, 3.5))
        rsync.delete(lock)
        deleted_at.append(time.time())
    # Once more, the moment a (new) singleton run has just started (if leadership moves on a
    # deletion at all: a framework may also keep it where it was).
    runs = lsync.llen(intervals_key)
    fresh_run = settle(lambda: lsync.llen(intervals_key) > runs, 10, interval=0.01)
    rsync.delete(lock)
    deleted_at.append(time.time())

    # Leadership moved or not, the service runs again.
    def running() -> bool:
        alive = [float(v) for v in lsync.hvals(led_key(prefix, "alive"))]
        return bool(alive) and max(alive) > max(time.time() - 0.5, deleted_at[-1])

    resumed = settle(running, 20)
    time.sleep(2.0)
    for p in leaders:
        p.signal(signal.SIGTERM)
    exits = [p.proc.wait(40) for p in leaders]

    intervals = read_intervals(lsync, prefix)
    pairs = overlapping_pairs(intervals)
    marks = [m.decode() for m in rsync.lrange(f"{prefix}edge:marks", 0, -1)]
    mark_epochs = [int(m.split(":", 1)[0]) for m in marks if m.split(":", 1)[0].isdigit()]
    regressions = epoch_regressions(mark_epochs)
    api_missing = led_total(lsync, prefix, "api-missing")
    figures = {
        "lock deletions": f"{len(deleted_at)} (random seed {seed})",
        "last deletion right after a new run started": fresh_run,
        "singleton runs": f"{len(intervals)} in {len({i.pid for i in intervals})} process(es)",
        "runs without an end record": sum(not i.ended for i in intervals),
        "overlaps": describe_overlaps(pairs),
        "fenced marks landed": len(marks),
        "fenced writes refused (LeadershipLost)": led_total(lsync, prefix, "fenced-refused"),
        "writes skipped, is_leading() False": led_total(lsync, prefix, "not-leading"),
        "iterations without is_leading/leader_epoch/fenced_pipeline": api_missing,
        "marks with an epoch below an earlier mark's": len(regressions),
        "exit codes": exits,
    }
    print("singleton after the lock vanished:", figures)
    problems = []
    if pairs:
        problems.append(f"singleton runs overlapped: {describe_overlaps(pairs)}")
    if api_missing:
        problems.append(
            f"Context.is_leading/leader_epoch/fenced_pipeline missing ({api_missing} iterations)"
        )
    if not marks:
        problems.append("no fenced write landed in <prefix>edge:marks")
    if regressions:
        pos, epoch, high = regressions[0]
        problems.append(
            f"{len(regressions)} of {len(marks)} fenced marks landed after a newer epoch's "
            f"(first: mark #{pos} epoch {epoch} after epoch {high})"
        )
    if not resumed:
        problems.append("the singleton did not run again after the last deletion (20 s)")
    if any(code != 0 for code in exits):
        problems.append(f"a leader exited uncleanly: {exits}")
    assert not problems, problem_report("singleton after the lock vanished", problems, figures)


def test_a_frozen_leaders_singleton_takes_no_step_when_it_thaws(
    espawn: Spawn, lsync: redis_sync.Redis
) -> None:
    """The leader running the singleton is SIGSTOPped (every thread: a starved or suspended
    process) past its lease; a standby is elected and, after the gap, starts its own run; then
    the old leader is SIGCONTed. Its thawed loop must not run the service's next step: the
    service's last step stays before the new run's start. Before: the thawed loop ran the
    service's next step (its wait had timed out) before the elector stepped down, so both
    acted at once (seen on a loaded box as a 0.47 s overlap in a cluster failover test)."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    intervals_key = led_key(prefix, "intervals")
    env = {"EDGE_SINGLETON": "1"}
    leaders = [espawn("leader", name="leader-a", env=env)]
    wait_until(lambda: lsync.llen(intervals_key), 45, what="the singleton service to start")
    leaders.append(espawn("leader", name="leader-b", env=env))
    time.sleep(2.0)  # the standby campaigns
    (first,) = read_intervals(lsync, prefix)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: lsync.llen(intervals_key) >= 2, 60, what="the standby's run")
        time.sleep(0.5)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    time.sleep(3.0)  # the thawed process steps down (and its stale run ends)
    for p in leaders:
        p.signal(signal.SIGTERM)
    exits = [p.proc.wait(40) for p in leaders]
    runs = read_intervals(lsync, prefix)
    old, new = runs[0], runs[1]
    assert old.pid == first.pid and new.pid != first.pid, runs
    last_step = float(lsync.hget(led_key(prefix, "alive"), old.rid) or old.start)
    assert last_step < new.start, (
        f"the thawed singleton took a step {last_step - new.start:.3f} s after the new run began"
    )
    assert all(r.pid != first.pid for r in runs[1:]), runs  # it did not lead again meanwhile
    assert exits == [0, 0], exits


# -- 2. Redis data loss -----------------------------------------------------------------------


@pytest.fixture
def lossy_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A main server WITHOUT persistence on a fixed port: a restart comes back empty."""
    server = EmbeddedServer(
        port=free_port(), unix_socket=False, appendonly=False, dir=str(tmp_path / "lossy")
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


class LeaseSampler(threading.Thread):
    """Samples the lock's epoch and the heartbeat records' leader claims every ``interval_s``."""

    def __init__(self, url: str, prefix: str, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.url, self.prefix, self.interval_s = url, prefix, interval_s
        self.samples: list[tuple[float, int | None]] = []  # (time, lock epoch); server up
        self.claims: dict[int, set[str]] = {}  # epoch -> instances that reported leading it
        self.down = 0
        self._halt = threading.Event()

    def run(self) -> None:
        keys = K.Keys(self.prefix)
        client = redis_sync.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while not self._halt.is_set():
                now = time.time()
                try:
                    value = client.get(keys.leader)
                    records = instance_records(client, self.prefix)
                except (redis_sync.RedisError, OSError):
                    self.down += 1
                else:
                    epoch = int(value.split(b":", 1)[0]) if value else None
                    self.samples.append((now, epoch))
                    for rec in records:
                        if rec.get("is_leader") and rec.get("epoch") is not None:
                            self.claims.setdefault(int(rec["epoch"]), set()).add(str(rec["id"]))
                self._halt.wait(self.interval_s)
        finally:
            client.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def test_redis_data_loss_never_reruns_a_finished_tick_or_sends_epochs_back(
    espawn: Spawn, lossy_server: EmbeddedServer, lsync: redis_sync.Redis
) -> None:
    """2 leaders + 1 consumer on a server without persistence, SIGKILLed 0.25 s after a tick
    executed and restarted empty 0.3 s later, 2 times (3 under ``python -m bench soak``): no
    tick executes twice, the lock epoch
    never goes back and each lease after a loss has a higher epoch than any before it.

    On 77fd932: 3 of 3 killed-after ticks re-ran; the epoch was 1 in every phase, and epoch 1
    was claimed by both leaders."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": lossy_server.url, "EDGE_TICKS": "1"}
    procs = [espawn("leader", name=f"leader-{i}", env=env) for i in range(2)]
    procs.append(espawn("consumer", name="consumer", env=env))
    ticks_key = led_key(prefix, "ticks")
    wait_until(lambda: lsync.hlen(ticks_key) >= 3, 45, what="3 ticks")

    sampler = LeaseSampler(lossy_server.url, prefix)
    sampler.start()
    time.sleep(1.0)
    killed_at: list[float] = []
    killed_ticks: list[int] = []
    recovered: list[bool] = []
    try:
        for _ in range(size(2, 3)):
            seen = set(lsync.hkeys(ticks_key))
            wait_until(
                lambda seen=seen: set(lsync.hkeys(ticks_key)) - seen, 20, 0.01, what="a tick"
            )
            noticed = time.monotonic()
            killed_ticks += [int(t) for t in set(lsync.hkeys(ticks_key)) - seen]
            time.sleep(max(0.0, 0.25 - (time.monotonic() - noticed)))
            lossy_server.kill()  # SIGKILL, 0.25 s after a tick executed
            killed_at.append(time.time())
            time.sleep(0.3)
            lossy_server.start()  # same port, empty
            restarted_ms = int(time.time() * 1000)
            recovered.append(
                settle(
                    lambda restarted_ms=restarted_ms: (
                        sum(int(t) > restarted_ms for t in lsync.hkeys(ticks_key)) >= 2
                    ),
                    30,
                )
            )
        time.sleep(2.0)
    finally:
        sampler.stop()

    ticks = led_hash(lsync, prefix, "ticks")
    dupes = {int(t): n for t, n in ticks.items() if n > 1}
    rerun_killed = [t for t in killed_ticks if ticks.get(str(t), 0) > 1]
    # Epochs: never below one seen before, and every phase after a data loss (any lock there
    # is a new acquisition) above every epoch of the phase before it.
    epochs = [e for _, e in sampler.samples if e is not None]
    regressions = epoch_regressions(epochs)
    bounds = [0.0, *killed_at, float("inf")]
    phases = [
        sorted({e for t, e in sampler.samples if e is not None and lo <= t < hi})
        for lo, hi in itertools.pairwise(bounds)
    ]
    not_new = [
        (k, before[-1], after[0])
        for k, (before, after) in enumerate(itertools.pairwise(phases), 1)
        if before and after and after[0] <= before[-1]
    ]
    shared = {e: sorted(ids) for e, ids in sampler.claims.items() if len(ids) > 1}
    figures = {
        "ticks executed": f"{len(ticks)}, {sum(ticks.values())} executions",
        "ticks executed more than once": dupes or "none",
        "killed 0.25 s after tick(s)": f"{killed_ticks}; re-ran: {rerun_killed or 'none'}",
        "lock epochs by phase (between restarts)": " -> ".join(str(p) for p in phases),
        "lock epoch samples below an earlier sample": len(regressions),
        "epochs claimed by more than one instance": shared or "none",
        "samples (server up / down)": f"{len(sampler.samples)} / {sampler.down}",
        "recovered (2 new ticks within 30 s) per restart": recovered,
    }
    print("Redis data loss:", figures)
    problems = []
    if dupes:
        problems.append(
            f"{len(dupes)} of {len(ticks)} ticks executed twice or more "
            f"({len(rerun_killed)} of {len(killed_ticks)} killed-after ticks re-ran)"
        )
    if regressions:
        _, epoch, high = regressions[0]
        problems.append(
            f"the lock epoch went backwards in {len(regressions)} samples (to {epoch} after {high})"
        )
    if not_new:
        problems.append(
            f"{len(not_new)} of {len(killed_at)} restarts: the new lease did not get a higher "
            "epoch (restart #, epoch before, epoch after): " + ", ".join(map(str, not_new))
        )
    if shared:
        problems.append(f"one epoch claimed by several instances: {shared}")
    if not all(recovered):
        problems.append(f"ticks did not resume after every restart: {recovered}")
    dead = [p.name for p in procs if not p.alive()]
    if dead:
        problems.append(f"processes died: {dead}")
    assert not problems, problem_report("Redis data loss", problems, figures)


# -- 2b. Redis goes back in time under a lease that stays valid --------------------------------

#: Every key with its remaining TTL and DUMP, in one atomic step (a replica's view at that
#: instant).
_SNAPSHOT = """
local out = {}
for _, k in ipairs(redis.call('KEYS', '*')) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('PTTL', k)
  out[#out + 1] = redis.call('DUMP', k)
end
return out
"""


def _snapshot(r: redis_sync.Redis) -> tuple[float, list[Any]]:
    return time.monotonic(), list(r.eval(_SNAPSHOT, 0))


def _roll_back(r: redis_sync.Redis, snap: tuple[float, list[Any]]) -> None:
    """Replace the whole dataset with ``snap`` in one transaction, TTLs running on as they do on
    a replica (absolute expiry): what a process sees when its primary is replaced by a replica
    that missed every write since the snapshot."""
    taken, flat = snap
    elapsed = int((time.monotonic() - taken) * 1000)
    with r.pipeline(transaction=True) as pipe:
        pipe.flushall()
        for key, pttl, dump in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
            if pttl == -1:
                pipe.restore(key, 0, dump, replace=True)
            elif pttl - elapsed > 0:
                pipe.restore(key, pttl - elapsed, dump, replace=True)
        pipe.execute()


#: Per round, whether the consumer is frozen while the writes are lost.
ROLLBACK_ROUNDS = size((True, False), (True, True, False, False))


def test_redis_going_back_under_a_kept_lease_never_loses_a_tick(
    espawn: Spawn, lossy_server: EmbeddedServer, lsync: redis_sync.Redis
) -> None:
    """A failover to a replica that missed the newest writes while the leader's lease is still
    valid there (a primary deposed while it still served: a partition from the Sentinels, an
    overloaded Sentinel; the replica that confirmed those writes followed the old primary).
    Emulated exactly on one real server: the dataset is snapshot right after a tick ran and,
    1.6 s later (the lease TTL is 3 s), replaced by that snapshot; the leader keeps its lease.

    2 rounds (4 under ``python -m bench soak``). In the first (two) the consumer is frozen
    during the lost 1.6 s, so the ticks enqueued then never ran: each must run once, later. In
    the last (two) the consumer runs them before they are lost: every tick still runs, and
    only those may run again (their run was recorded only in the lost writes: at-least-once,
    like any job a failover loses).

    Before the fix (the enqueuer trusted its memory of the last tick, refreshed every 30 s):
    every tick enqueued in a lost window was skipped for good (the CI failure of a Sentinel
    run: ticks never run: [..233000, ..234000])."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": lossy_server.url, "EDGE_TICKS": "1"}
    # the leaders consume another queue: the one consumer runs every tick (and can be frozen)
    lenv = {**env, "WORKER_QUEUES": "elsewhere"}
    procs = [espawn("leader", name=f"leader-{i}", env=lenv) for i in range(2)]
    consumer = espawn("consumer", name="consumer", env=env)
    procs.append(consumer)
    ticks_key = led_key(prefix, "ticks")
    wait_until(lambda: lsync.hlen(ticks_key) >= 3, 45, what="3 ticks")
    main = redis_sync.Redis.from_url(lossy_server.url)
    lock_key = K.Keys(prefix).leader
    first = min(int(t) for t in lsync.hkeys(ticks_key))
    windows: list[tuple[int, int, bool]] = []  # (from ms, to ms, consumer frozen)
    kept: list[bool] = []
    try:
        for frozen in ROLLBACK_ROUNDS:
            seen = set(lsync.hkeys(ticks_key))
            wait_until(lambda seen=seen: set(lsync.hkeys(ticks_key)) - seen, 20, 0.01, "a tick")
            snap = _snapshot(main)  # right after a tick ran
            lock = main.get(lock_key)
            start = int(time.time() * 1000)
            if frozen:
                consumer.pause()
            time.sleep(1.6)
            _roll_back(main, snap)
            end = int(time.time() * 1000)
            consumer.resume()
            windows.append((start, end, frozen))
            time.sleep(1.0)  # the same leader renews the lease it had (no new term)
            kept.append(lock is not None and main.get(lock_key) == lock)
            time.sleep(2.0)
        time.sleep(3.0)  # the last ticks run
    finally:
        consumer.resume()
        main.close()

    ticks = {int(t): n for t, n in led_hash(lsync, prefix, "ticks").items()}
    settled = int(time.time() * 1000) - 2500
    missed = [t for t in range(first, settled, 1000) if t not in ticks]
    dupes = {t: n for t, n in ticks.items() if n > 1}

    # enqueued while the consumer was frozen, then lost: never ran before, must run once now
    must_once = {t for t in ticks for lo, hi, f in windows if f and lo < t <= hi}
    # ran, then lost with the writes (the tick just before the snapshot: its end; with the
    # consumer running, those in the window): at-least-once, like any job a failover loses
    may_twice = {t for t in ticks for lo, hi, _ in windows if lo - 1000 < t <= hi} - must_once
    twice_ok = {t: n for t, n in dupes.items() if t in may_twice}
    unexplained = {t: n for t, n in dupes.items() if t not in may_twice}
    figures = {
        "ticks run": f"{len(ticks)} ({first} .. {max(ticks)})",
        "ticks never run": missed or "none",
        "ticks enqueued in the frozen windows (each must run once)": sorted(must_once),
        "ticks run twice whose first run was in lost writes": twice_ok or "none",
        "ticks run twice otherwise": unexplained or "none",
        "lease kept through the roll-back (per round)": kept,
    }
    print("Redis went back under a kept lease:", figures)
    problems = []
    if missed:
        problems.append(f"{len(missed)} ticks never ran: {missed}")
    if unexplained:
        problems.append(f"ticks ran twice that had not run in lost writes: {unexplained}")
    if sum(kept) < len(ROLLBACK_ROUNDS) - 1:
        problems.append(f"the lease did not survive the roll-back (not the scenario): {kept}")
    if len(must_once) < sum(ROLLBACK_ROUNDS):
        problems.append(f"too few ticks fell in the frozen windows: {sorted(must_once)}")
    dead = [p.name for p in procs if not p.alive()]
    if dead:
        problems.append(f"processes died: {dead}")
    assert not problems, problem_report("Redis went back under a kept lease", problems, figures)


# -- 3. graceful SIGTERM ----------------------------------------------------------------------


def test_graceful_sigterm_never_runs_a_job_twice(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """2 rounds (4 under ``python -m bench soak``) of 3,000 x 50 ms jobs; in each, the busiest
    consumer gets SIGTERM mid-drain and a replacement starts. Every job starts once, ends once
    and is never re-run by arq.

    On 77fd932: 4-53 of 12,000 jobs started twice over 10 runs (median ~40, i.e. ~10 a
    round), up to 2 ended twice."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    rounds, per_round, job_s = size(2, 4), 3_000, 0.05
    env = {"WORKER_CONCURRENCY": "100"}
    espawn("leader", name="leader", env=env)  # the orphan reaper runs there
    consumers = [espawn("consumer", name=f"consumer-{i}", env=env) for i in range(2)]
    wait_until(lambda: len(instance_records(rsync, prefix)) == 3, 45, what="3 processes registered")
    start_key = led_key(prefix, "job-start")

    ids: list[str] = []
    terminated: list[WorkerProc] = []
    busy_at_signal: list[int] = []
    for n in range(rounds):
        ids += enqueue_jobs(rsync, prefix, "edge_job", [(job_s,)] * per_round)
        # The queue is draining: a tenth of this round has started.
        want = len(ids) - per_round * 0.9
        settle(lambda want=want: lsync.hlen(start_key) >= want, 20, 0.02)

        def busiest() -> tuple[int, WorkerProc]:
            """The consumer with the most jobs in flight (per its heartbeat record)."""
            loads = []
            for p in consumers:
                rec = record_of(rsync, prefix, p.name)
                loads.append((int(rec.get("in_flight") or 0) if rec else 0, p))
            return max(loads, key=lambda x: x[0])

        settle(lambda: busiest()[0] >= 20, 5, 0.02)
        load, target = busiest()
        consumers.remove(target)
        busy_at_signal.append(load)
        target.signal(signal.SIGTERM)
        terminated.append(target)
        consumers.append(espawn("consumer", name=f"consumer-r{n}", env=env))
        time.sleep(2.0)

    total = len(ids)
    end_key = led_key(prefix, "job-end")
    finished = settle(lambda: lsync.hlen(end_key) >= total, 40, 0.25)
    exits = [p.proc.wait(30) for p in terminated]
    starts, ends = led_hash(lsync, prefix, "job-start"), led_hash(lsync, prefix, "job-end")
    retried = led_hash(lsync, prefix, "job-retried")
    started_twice = [j for j in ids if starts.get(j, 0) > 1]
    ended_twice = [j for j in ids if ends.get(j, 0) > 1]
    never_started = [j for j in ids if starts.get(j, 0) == 0]
    never_ended = [j for j in ids if ends.get(j, 0) == 0]
    figures = {
        "jobs": f"{total} ({rounds} rounds of {per_round}, {job_s * 1000:.0f} ms each)",
        "SIGTERMs (in-flight jobs on the target at the signal)": busy_at_signal,
        "started more than once": f"{len(started_twice)} of {total}",
        "ended more than once": f"{len(ended_twice)} of {total}",
        "run again by arq (job_try > 1)": f"{len(retried)} of {total}",
        "never started": len(never_started),
        "never ended": len(never_ended),
        "left in the queue": rsync.zcard(K.Keys(prefix).queue),
        "all ended within 40 s of the last round": finished,
        "exit codes of the SIGTERMed consumers": exits,
    }
    print("graceful SIGTERM under load:", figures)
    problems = []
    if started_twice:
        problems.append(f"{len(started_twice)} of {total} jobs ran twice (started again)")
    if retried:
        problems.append(
            f"{len(retried)} of {total} jobs were started by arq, cancelled and run again "
            "(job_try > 1)"
        )
    if ended_twice:
        problems.append(f"{len(ended_twice)} of {total} jobs ended twice")
    if never_ended:
        problems.append(f"{len(never_ended)} of {total} jobs never ended")
    if any(code != 0 for code in exits):
        problems.append(f"a SIGTERMed consumer exited uncleanly: {exits}")
    assert not problems, problem_report("graceful SIGTERM under load", problems, figures)


# -- 4. a paused consumer ---------------------------------------------------------------------


async def _results(url: str, job_ids: Sequence[str]) -> dict[str, tuple[bool, Any] | None]:
    """Each job's arq result: ``(success, value)``, or ``None`` without a result."""
    pool = aioredis.Redis.from_url(url)
    try:
        out: dict[str, tuple[bool, Any] | None] = {}
        for jid in job_ids:
            info = await Job(jid, pool, _deserializer=msgpack_loads).result_info()
            out[jid] = None if info is None else (info.success, info.result)
        return out
    finally:
        await pool.aclose()


def test_paused_consumer_never_completes_jobs_handed_to_another(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis, redis_url: str
) -> None:
    """12 x 5 s jobs start on consumer A; A is SIGSTOPped until the leader's orphan reaper has
    handed the jobs over and they ran elsewhere, and for at least 6 s (15 s under ``python -m
    bench soak``); then SIGCONT. Each job completes once (a run completes only while
    ``ctx.still_claimed()``) and its arq result is the completing run's.

    On 77fd932: 12 of 12 completed twice; all 12 arq results overwritten by A."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    jobs, job_s, pause_s = 12, 5.0, size(6.0, 15.0)
    a = espawn("consumer", name="A")
    rec_a = wait_until(lambda: record_of(rsync, prefix, "A"), 45, what="A registered")
    ids = enqueue_jobs(rsync, prefix, "claimed_job", [(job_s,)] * jobs)

    def started_on(pid: int) -> set[str]:
        fields = led_hash(lsync, prefix, "claim-start")
        return {f.split("|")[0] for f in fields if f.endswith(f"|{pid}")}

    wait_until(lambda: started_on(a.pid) >= set(ids), 20, 0.02, what="all jobs started on A")
    # ...and A has published that it holds them (what orphan recovery goes by).
    holds = K.Keys(prefix).holds(rec_a["id"])
    wait_until(
        lambda: {m.decode() for m in rsync.smembers(holds)} >= set(ids), 10, 0.02, what="holds"
    )
    a.pause()
    paused = time.monotonic()
    try:
        espawn("leader", name="leader")  # runs the orphan reaper (and consumes too)
        espawn("consumer", name="B")

        def woke_elsewhere() -> set[str]:
            fields = led_hash(lsync, prefix, "claim-woke")
            return {f.split("|")[0] for f in fields if not f.endswith(f"|{a.pid}")}

        handed_over = settle(lambda: woke_elsewhere() >= set(ids), 30)
        time.sleep(max(0.0, pause_s - (time.monotonic() - paused)))
    finally:
        a.resume()
    paused_for = time.monotonic() - paused

    def woke_on_a() -> int:
        return sum(1 for f in led_hash(lsync, prefix, "claim-woke") if f.endswith(f"|{a.pid}"))

    settle(lambda: woke_on_a() >= jobs, 15)
    time.sleep(2.0)  # A's arq finishes what it woke up to

    ends = led_hash(lsync, prefix, "claim-end")
    end_count = {j: sum(n for f, n in ends.items() if f.startswith(f"{j}|")) for j in ids}
    ended_on_a = [j for j in ids if ends.get(f"{j}|{a.pid}", 0)]
    end_pids = {j: {int(f.split("|")[1]) for f in ends if f.startswith(f"{j}|")} for j in ids}
    results = asyncio.run(_results(redis_url, ids))
    result_of_a = [j for j, r in results.items() if r is not None and r[1] == a.pid]
    no_result = [j for j, r in results.items() if r is None]
    failed = [j for j, r in results.items() if r is not None and not r[0]]
    # The result must be the one of the run that completed the job (B or the leader, never A).
    foreign = [j for j, r in results.items() if r is not None and r[1] not in end_pids[j]]
    twice = [j for j, n in end_count.items() if n > 1]
    never = [j for j, n in end_count.items() if n == 0]
    api_missing = led_total(lsync, prefix, "api-missing")
    figures = {
        "jobs": f"{jobs} x {job_s:g} s on A, A paused {paused_for:.1f} s",
        "re-run elsewhere and woke before SIGCONT": f"{len(woke_elsewhere())} of {jobs}",
        "completed (END) twice": f"{len(twice)} of {jobs}",
        "completed by the paused A after SIGCONT": f"{len(ended_on_a)} of {jobs}",
        "never completed": len(never),
        "arq result written by A (value = A's pid)": f"{len(result_of_a)} of {jobs}",
        "no arq result / failed result": f"{len(no_result)} / {len(failed)}",
        "runs without JobContext.still_claimed": api_missing,
        "A alive": a.alive(),
    }
    print("paused consumer:", figures)
    problems = []
    if not handed_over:
        problems.append("the paused consumer's jobs were not re-run elsewhere during the pause")
    if twice:
        problems.append(f"{len(twice)} of {jobs} jobs completed twice")
    if ended_on_a:
        problems.append(f"{len(ended_on_a)} of {jobs} jobs completed by A after being handed over")
    if never:
        problems.append(f"{len(never)} of {jobs} jobs never completed")
    if result_of_a or no_result or failed or foreign:
        problems.append(
            f"results not from the run that owned the job: {len(result_of_a)} written by A, "
            f"{len(foreign)} from a run that did not complete it, {len(no_result)} missing, "
            f"{len(failed)} failed"
        )
    if api_missing:
        problems.append(f"JobContext.still_claimed missing ({api_missing} runs)")
    assert not problems, problem_report("paused consumer", problems, figures)


# -- 5. hostile or broken jobs ----------------------------------------------------------------

#: Well-formed msgpack, wrong field types: case -> (field, overrides of a good record).
MALFORMED: dict[str, tuple[str, dict[str, Any]]] = {
    "f-map": ("f", {"f": {"name": "edge_record"}}),
    "f-list": ("f", {"f": ["edge_record"]}),
    "t-string": ("t", {"t": "two"}),
    "et-string": ("et", {"et": "yesterday"}),
    "et-huge": ("et", {"et": 10**18}),
    "a-map": ("a", {"a": {"x": 1}}),
    "k-list": ("k", {"k": [1, 2]}),
}
NOT_MSGPACK = b"\xc1\xc1 this is not msgpack \x00\xff"


def good_record() -> dict[str, Any]:
    return {"t": None, "f": "edge_record", "a": [], "k": {}, "et": int(time.time() * 1000)}


def names_field(reason: str, field: str) -> bool:
    """A dead-letter reason that says "malformed" or names the bad field (quoted, ``field f``
    or ``f=``)."""
    quoted = rf"['\"`]{field}['\"`]|\bfield {field}\b|\b{field}="
    return "malformed" in reason.lower() or bool(re.search(quoted, reason))


def test_malformed_jobs_are_dead_lettered_and_never_crash_the_consumer(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """Raw job records with wrong field types (and one not msgpack) arrive while an 8 s job
    (20 s under ``python -m bench soak``) runs: each is dead-lettered with a reason naming the
    field (or "malformed"), a good job after them runs, the long job runs exactly once, the
    consumer never restarts.

    On 77fd932: 0 of 8 dead-lettered ('a' as a map even ran), the consumer restarted and the
    long job was cancelled and started twice."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    port = free_port()
    proc = espawn("all", name="solo", env={"WORKER_HEALTH_PORT": str(port)})
    wait_ready(proc, port)
    long_s = size(8.0, 20.0)  # in flight while the hostile jobs are handled (~1 s)
    [long_id] = enqueue_jobs(rsync, prefix, "edge_job", [(long_s,)])
    wait_until(lambda: led_hash(lsync, prefix, "job-start").get(long_id), 20, what="the long job")
    long_started = time.monotonic()

    bad: dict[str, str | None] = {}  # job id -> the bad field (None: not msgpack at all)
    for case, (field, overrides) in MALFORMED.items():
        jid = f"{prefix}bad:{case}"
        put_raw_job(rsync, prefix, jid, msgpack.packb({**good_record(), **overrides}))
        bad[jid] = field
    put_raw_job(rsync, prefix, f"{prefix}bad:not-msgpack", NOT_MSGPACK)
    bad[f"{prefix}bad:not-msgpack"] = None
    [good_id] = enqueue_jobs(rsync, prefix, "edge_record", [()])

    def settled() -> bool:
        return (
            set(bad) <= set(dead_records(rsync, prefix))
            and good_id in led_hash(lsync, prefix, "records")
            and long_id in led_hash(lsync, prefix, "job-end")
        )

    settle(settled, long_s + 15 - (time.monotonic() - long_started), 0.25)
    restarts = consumer_restarts(port)
    dead = dead_records(rsync, prefix)
    records = led_hash(lsync, prefix, "records")
    starts, ends = led_hash(lsync, prefix, "job-start"), led_hash(lsync, prefix, "job-end")
    not_dead = [j.rsplit(":", 1)[1] for j in bad if j not in dead]
    vague = [
        f"{j.rsplit(':', 1)[1]}: {dead[j].get('reason')!r}"
        for j, field in bad.items()
        if j in dead and not names_field(str(dead[j].get("reason", "")), field or "malformed")
    ]
    ran = [j.rsplit(":", 1)[1] for j in bad if j in records]
    figures = {
        "dead-lettered": f"{len(bad) - len(not_dead)} of {len(bad)} hostile jobs",
        "not dead-lettered": not_dead or "none",
        "ran anyway": ran or "none",
        "dead-letter reasons": {j.rsplit(":", 1)[1]: r.get("reason") for j, r in dead.items()},
        "good job after them ran": records.get(good_id, 0),
        "long job started / ended": f"{starts.get(long_id, 0)} / {ends.get(long_id, 0)}",
        "consumer restarts (/status)": restarts,
        "process alive": proc.alive(),
    }
    print("hostile jobs:", figures)
    problems = []
    if not_dead:
        problems.append(f"{len(not_dead)} of {len(bad)} hostile jobs not dead-lettered")
    if vague:
        problems.append(f"dead-letter reasons that name neither the field nor 'malformed': {vague}")
    if records.get(good_id, 0) != 1:
        problems.append(f"the good job enqueued after them ran {records.get(good_id, 0)} times")
    if (starts.get(long_id, 0), ends.get(long_id, 0)) != (1, 1):
        problems.append(
            f"the in-flight long job started {starts.get(long_id, 0)} and ended "
            f"{ends.get(long_id, 0)} times (want 1 and 1)"
        )
    if restarts != 0:
        problems.append(f"the consumer component restarted {restarts} times")
    assert not problems, problem_report("hostile jobs", problems, figures)


@pytest.mark.parametrize("kind", ["msgpack", "garbage"])
def test_oversized_job_is_dead_lettered_without_loading_it(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis, kind: str
) -> None:
    """A 50 MB job record - a well-formed call of a real task (``msgpack``) or 50 MB that are
    not msgpack at all (``garbage``) - with WORKER_MAX_PAYLOAD_BYTES at its default:
    dead-lettered as oversized, consumer RSS under 150 MB, the dead-letter entry under 1 MB.

    On 77fd932: msgpack - it ran, RSS 68 -> 269 MB; garbage - dead-lettered as "malformed
    payload" with a 66.7 MB entry, RSS 68 -> 419 MB."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    port = free_port()
    proc = espawn("all", name="solo", env={"WORKER_HEALTH_PORT": str(port)})  # default max size
    wait_ready(proc, port)
    time.sleep(1.0)
    baseline, _ = rss_mb(proc.pid)

    big_id = f"{prefix}big"
    if kind == "msgpack":
        payload = msgpack.packb({**good_record(), "a": ["x" * (50 * MB)]})
    else:
        payload = NOT_MSGPACK + b"\xc1" * (50 * MB)
    put_raw_job(rsync, prefix, big_id, payload)
    del payload
    [good_id] = enqueue_jobs(rsync, prefix, "edge_record", [()])

    peak = baseline
    deadline = time.monotonic() + 30

    def handled() -> bool:
        gone = not rsync.exists(K.ARQ_JOB + big_id) and not rsync.zscore(keys.queue, big_id)
        return rsync.zscore(keys.dead, big_id) is not None or gone

    while time.monotonic() < deadline and proc.alive():
        peak = max(peak, rss_mb(proc.pid)[0])
        if handled() and good_id in led_hash(lsync, prefix, "records"):
            break
        time.sleep(0.02)
    for _ in range(50):  # one more second: what follows the decision (results, dead letter)
        if proc.alive():
            peak = max(peak, rss_mb(proc.pid)[0])
        time.sleep(0.02)
    hwm = rss_mb(proc.pid)[1] if proc.alive() else 0.0
    record = rsync.hget(keys.dead_jobs, big_id)
    reason = str(json.loads(record).get("reason")) if record else None
    entry_bytes = rsync.hstrlen(keys.dead_jobs, big_id)
    hash_bytes = rsync.memory_usage(keys.dead_jobs) or 0
    ran = led_hash(lsync, prefix, "records").get(big_id, 0)
    figures = {
        "job record": f"{len(K.ARQ_JOB + big_id)} + 50 MB ({kind})",
        "consumer RSS baseline / peak sampled / VmHWM": (
            f"{baseline:.0f} / {peak:.0f} / {hwm:.0f} MB"
        ),
        "dead-lettered": reason is not None,
        "dead-letter reason": reason,
        "dead-letter entry (HSTRLEN) / hash (MEMORY USAGE)": (
            f"{entry_bytes / MB:.2f} MB / {hash_bytes / MB:.2f} MB"
        ),
        "the job ran anyway": ran,
        "good job after it ran": led_hash(lsync, prefix, "records").get(good_id, 0),
    }
    problems = []
    if reason is None:
        problems.append("the 50 MB job was not dead-lettered" + (" (it ran)" if ran else ""))
    elif not re.search(r"oversiz|too large|too big|exceed|max.?payload", reason, re.I):
        problems.append(f"dead-letter reason does not say oversized: {reason!r}")
    if max(peak, hwm) >= 150:
        problems.append(f"consumer RSS reached {max(peak, hwm):.0f} MB (limit 150 MB)")
    if entry_bytes >= MB or hash_bytes >= MB:
        problems.append(
            f"dead-letter entry holds {entry_bytes / MB:.1f} MB (hash {hash_bytes / MB:.1f} MB); "
            "limit 1 MB"
        )
    if led_hash(lsync, prefix, "records").get(good_id, 0) != 1:
        problems.append("the good job enqueued after it did not run once")
    assert not problems, problem_report("oversized job", problems, figures)


def test_dead_letter_set_keeps_only_the_newest(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """WORKER_DEAD_LETTER_MAX=50: 30 then 50 malformed jobs leave exactly the 50 newer ones.

    On 77fd932: all 80 kept."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    cap = 50
    espawn("all", name="solo", env={"WORKER_DEAD_LETTER_MAX": str(cap)})
    wait_until(lambda: record_of(rsync, prefix, "solo"), 45, what="registration")

    def inject(wave: str, n: int) -> list[str]:
        ids = [f"{prefix}bad:{wave}:{i:03d}" for i in range(n)]
        for jid in ids:
            put_raw_job(rsync, prefix, jid, NOT_MSGPACK)
        return ids

    def handled(ids: list[str]) -> bool:
        queued = rsync.zrange(keys.queue, 0, -1)
        return not {j.encode() for j in ids} & set(queued)

    older = inject("older", 30)
    settle(lambda: handled(older), 20)
    time.sleep(0.5)
    newer = inject("newer", 50)
    settle(lambda: handled(newer), 20)
    time.sleep(1.0)

    kept = {j.decode() for j in rsync.zrange(keys.dead, 0, -1)}
    records = rsync.hlen(keys.dead_jobs)
    figures = {
        "malformed jobs": f"{len(older)} older, then {len(newer)} newer; cap {cap}",
        "kept (sorted set / records hash)": f"{len(kept)} / {records}",
        "newer kept": f"{len(kept & set(newer))} of {len(newer)}",
        "older kept": f"{len(kept & set(older))} of {len(older)}",
    }
    problems = []
    if len(kept) != cap or records != cap:
        problems.append(f"{len(kept)} entries ({records} records) kept; the cap is {cap}")
    if not set(newer) <= kept:
        problems.append(f"{len(set(newer) - kept)} of the {len(newer)} newest were dropped")
    assert not problems, problem_report("dead-letter bound", problems, figures)


def test_liveness_fails_when_a_service_crash_loops(
    espawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """A per_process service that always raises: /healthz answers 503 within 60 s.

    On 77fd932: 200 for 60 s (121 probes) while the service crashed ~40 times."""
    prefix = espawn.prefix  # type: ignore[attr-defined]
    port = free_port()
    proc = espawn("all", name="solo", env={"WORKER_HEALTH_PORT": str(port), "EDGE_CRASHY": "1"})
    wait_ready(proc, port)
    ready = time.monotonic()
    codes: list[int | None] = []
    failing = settle(
        lambda: codes.append(http_get(port, "/healthz")[0]) or codes[-1] == 503, 60, 0.5
    )
    waited = time.monotonic() - ready
    crashes = int(lsync.get(led_key(prefix, "crashy-starts")) or 0)
    figures = {
        "service crashes": crashes,
        "/healthz answers": {c: codes.count(c) for c in set(codes)},
        "seconds watched": round(waited, 1),
    }
    problems = []
    if not failing:
        problems.append(
            f"/healthz never answered 503 in {waited:.0f} s while the service crashed "
            f"{crashes} times"
        )
    assert not problems, problem_report("crash-looping service", problems, figures)


# -- 3b. SIGTERM while Redis does not answer --------------------------------------------------


def test_sigterm_with_redis_frozen_exits_within_the_stated_bound(spawn: Spawn) -> None:
    """Redis SIGSTOPped (a frozen or partitioned server: connections open, nothing answers),
    then SIGTERM to a leader-capable and a consumer process: each exits by itself within
    ``Settings.worst_case_shutdown_s()`` (the bound a container's grace period is sized for),
    saying it overran, instead of waiting on Redis.

    Before the bound was enforced, both processes were still running 90 s after SIGTERM and
    exited only when the server died (its sockets reset)."""
    server = RealRedis(extra_args=("--appendfsync", "everysec"))
    url = server.start()
    env: dict[str, str | None] = {"WORKER_REDIS_URL": url, "WORKER_SHUTDOWN_TIMEOUT_S": "3"}
    procs = [spawn("all", name="frozen-all", env=env), spawn("consumer", name="frozen-c", env=env)]
    try:
        for p in procs:
            wait_until(lambda p=p: "worker starting" in p.log(), 45, what=f"{p.name} started")
        os.kill(server.pid or 0, signal.SIGSTOP)
        time.sleep(1.0)  # the processes' Redis calls now hang
        sent = time.monotonic()
        for p in procs:
            p.signal(signal.SIGTERM)
        for p in procs:
            role = "all" if p.name == "frozen-all" else "consumer"
            bound = Settings(
                role=role, shutdown_timeout_s=3, stop_grace_s=2, drain_delay_s=0
            ).worst_case_shutdown_s()
            code = p.proc.wait(bound + 15)  # + start-up of the interpreter's exit, a busy box
            took = time.monotonic() - sent
            assert took <= bound + 15, (p.name, took, bound)
            assert code == 0, (p.name, code, p.log()[-2000:])
            assert "shutdown overran its bound" in p.log(), p.log()[-2000:]
    finally:
        with contextlib.suppress(Exception):
            os.kill(server.pid or 0, signal.SIGCONT)
        server.close()
