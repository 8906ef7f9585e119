"""Duties behind a user backlog: do ticks and poll jobs start on time while user jobs fill every
slot, and does a task's ``ctx.enqueue_many`` of 200,000 jobs hold anything back?

BACKLOG: 100,000 ``busy(1.0)`` user jobs queued (due now) and 100 poll items, then a leader
(``--role all``) and a consumer, each on the framework defaults (100 shared slots and
``WORKER_DUTY_SLOTS`` of their own): every shared slot is busy with 1 s jobs for the whole
window (200 jobs/s out of a 100,000 backlog). Over ``--seconds``: how late each ``every=1``
tick started (instant -> start), how long each poll job waited in its queue (enqueue ->
start), how many times each item ran, and the user jobs finished per second.

FANOUT: a leader (``--role all``, default lease timings: TTL 10 s) runs ``fanout(200000)``, a
task calling ``ctx.enqueue_many`` with 200,000 unique-key jobs (a generator of ``JobSpec``):
seconds until the ids are back, the leadership changes meanwhile (entries added to
``<prefix>leader:history``: a lost lease comes back as an acquisition), the loop watchdog's
"blocked" lines, and how late the ticks started from the
call until 20 s after it (the 200,000 no-op jobs run meanwhile).

    python -m bench lane                       # both, 100,000 jobs, 60 s window (~5 min)
    python -m bench lane --jobs 20000 --seconds 20   # shorter
    python -m bench lane --against DIR         # the same against another checkout (before)
    python -m bench lane --only fanout --client   # also the batch from a client, to compare

The app is ``bench/lane_app.py``, imported from ``bench/`` so ``--against`` runs it on that
checkout's ``worker`` (``git archive <commit> | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    ROOT,
    machine,
    pct,
    print_machine,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    wait_until,
    worker_env,
)

PREFIX = "bench:"
ITEMS = 100


def start(role: str, url: str, log: Path, root: Path) -> subprocess.Popen[bytes]:
    env = worker_env(
        url, "lane_app:app", PREFIX, WORKER_SHUTDOWN_TIMEOUT_S="1", WORKER_LOG_LEVEL="WARNING"
    )
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT / "bench")])
    return spawn_worker(role, env, log, cwd=root)


async def fill(url: str, jobs: int) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from lane_app import app

    from worker.bulk import JobSpec
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX, app=app)
    try:
        await client.enqueue_many(JobSpec("busy", (1.0,)) for _ in range(jobs))
        await client.poller("lanepoll").schedule_many([f"i{n}" for n in range(ITEMS)])
    finally:
        await client.close()


def _pairs(r: redis_sync.Redis, key: str) -> list[tuple[str, float]]:
    out = []
    for v in r.lrange(key, 0, -1):  # type: ignore[union-attr]
        a, b = v.decode().rsplit(":", 1)
        out.append((a, float(b)))
    return out


def _lat(values: list[float]) -> str:
    if not values:
        return "none started"
    return f"{pct(values, 50):.0f} / {pct(values, 99):.0f} / {max(values):.0f}"


def backlog(url: str, jobs: int, seconds: float, logdir: Path, root: Path) -> list[str]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    t = time.monotonic()
    asyncio.run(fill(url, jobs))
    filled = time.monotonic() - t
    queue = f"{PREFIX}queue"
    procs = [
        start("all", url, logdir / "leader.log", root),
        start("consumer", url, logdir / "consumer.log", root),
    ]
    try:
        # both processes' shared slots busy (100 each): the backlog goes down by 200 and more
        wait_until(lambda: r.zcard(queue) <= jobs - 400, 90, "both consumers busy", 0.2)
        r.delete("bench:lane:tick", "bench:lane:poll")
        left0, t0 = r.zcard(queue), time.monotonic()
        time.sleep(seconds)
        left1, t1 = r.zcard(queue), time.monotonic()
        ticks = [late for _, late in _pairs(r, "bench:lane:tick")]
        polls = _pairs(r, "bench:lane:poll")
    finally:
        stop_procs(procs)
        r.close()
    runs: dict[str, int] = {}
    for item, _ in polls:
        runs[item] = runs.get(item, 0) + 1
    waits = [w for _, w in polls]
    per_item = f"{min(runs.values(), default=0)}–{max(runs.values(), default=0)}"
    return [
        f"{jobs:,} queued (fill {filled:.0f} s), {left1:,} left",
        f"{(left0 - left1) / (t1 - t0):.0f}",
        f"{len(ticks)} of {int(t1 - t0)}",
        _lat(ticks),
        f"{len(polls)} ({len(runs)} items, {per_item} each)",
        _lat(waits),
    ]


def fanout(url: str, n: int, logdir: Path, root: Path, *, client: bool = False) -> list[str]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    log = logdir / "fanout.log"
    procs = [start("all", url, log, root)]
    try:
        wait_until(lambda: r.llen("bench:lane:tick") >= 2, 60, "the leader's ticks", 0.2)
        changes0 = r.llen(f"{PREFIX}leader:history")  # one entry per acquisition or release
        r.delete("bench:lane:tick")
        t0 = time.time()
        asyncio.run(client_fanout(url, n) if client else enqueue_fanout(url, n))
        wait_until(lambda: r.get("bench:lane:fanout"), 600, "the fanout's ids", 0.5)
        took, written = r.get("bench:lane:fanout").decode().split(":")  # type: ignore[union-attr]
        time.sleep(20)
        changes1 = r.llen(f"{PREFIX}leader:history")
        ticks = [late for at, late in _pairs(r, "bench:lane:tick") if float(at) / 1000 >= t0]
        done = n - r.zcard(f"{PREFIX}queue")
    finally:
        stop_procs(procs)
        r.close()
    text = log.read_text(errors="replace")
    blocked = text.count("event loop blocked")
    expected = int(float(took)) + 20
    return [
        f"{n:,} from {'a client' if client else 'a task'}",
        f"{took} s ({int(written):,} written, {n / float(took):,.0f} jobs/s)",
        str(changes1 - changes0),
        str(blocked),
        f"{len(ticks)} of ~{expected}",
        _lat(ticks),
        f"{done:,}",
    ]


async def client_fanout(url: str, n: int) -> None:
    """The same batch from a client in this process (the client path, for comparison)."""
    from worker.bulk import JobSpec
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX)
    try:
        started = time.monotonic()
        ids = await client.enqueue_many(JobSpec("noop", (i,), unique_key=f"f{i}") for i in range(n))
        took = time.monotonic() - started
        await client.redis.set("bench:lane:fanout", f"{took:.2f}:{sum(1 for i in ids if i)}")
    finally:
        await client.close()


async def enqueue_fanout(url: str, n: int) -> None:
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX)
    try:
        await client.enqueue("fanout", n)
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000, help="user jobs queued (backlog)")
    ap.add_argument("--seconds", type=float, default=60.0, help="window measured (backlog)")
    ap.add_argument("--fanout", type=int, default=200_000, help="jobs of ctx.enqueue_many")
    ap.add_argument("--only", choices=["backlog", "fanout"], help="run one scenario")
    ap.add_argument(
        "--client", action="store_true", help="fanout: also the same batch from a client"
    )
    ap.add_argument("--against", metavar="DIR", help="run the worker from another checkout")
    args = ap.parse_args()
    root = Path(args.against).resolve() if args.against else ROOT
    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"worker from: {root}", flush=True)
        print(f"load before: {os.getloadavg()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-lane-") as tmp:
            if args.only in (None, "backlog"):
                row = backlog(url, args.jobs, args.seconds, Path(tmp), root)
                heads = ["backlog", "user jobs/s", "ticks", "tick late ms p50/p99/max",
                         "poll jobs", "poll wait ms p50/p99/max"]  # fmt: skip
                print(table(heads, [row]), flush=True)
            if args.only in (None, "fanout"):
                rows = [fanout(url, args.fanout, Path(tmp), root)]
                if args.client:
                    rows.append(fanout(url, args.fanout, Path(tmp), root, client=True))
                heads = ["enqueue_many jobs", "ids back in", "leadership changes", "loop blocked",
                         "ticks", "tick late ms p50/p99/max", "jobs run"]  # fmt: skip
                print(table(heads, rows), flush=True)
        print(f"load after: {os.getloadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
