"""Jobs listing cost with 1,000,000 queued jobs, and cancel latency of running jobs.

Listing: a fresh server is loaded with N queued jobs (arq records and queue entries, written
by a Lua loop inside the server, so loading takes seconds), then ``list_jobs`` (what ``python
-m worker jobs`` prints) is timed and its Redis commands counted from ``INFO commandstats``
deltas: ``--state queued --limit 50``, the same with ``--task X`` for a task only at the far
end of the queue (a bounded scan: 10 x limit entries, then a cursor) and the next page. The
command line itself (``python -m worker jobs --limit 50``, Python start-up included) is
timed too.

Cancel: a real consumer process (``harness.apps.ledger``, default settings) runs ``slow_job(60)``;
each round enqueues one, waits until it started, asks ``Operations.cancel_job`` and times the
request -> the job's detail no longer running (it shows as cancelled).

    python bench/jobs.py                  # 1M jobs, 20 cancels
    python bench/jobs.py --jobs 100000 --cancels 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis as redis_sync

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, commandstats, delta, machine, print_machine, start_server
from worker.client import Client
from worker.ops import jobsview
from worker.ops.actions import Actor, Operations
from worker.storage import keys as K

PREFIX = "bj:"
LOAD = """
-- ARGV[1] first index, ARGV[2] count, ARGV[3] payload prefix, ARGV[4] base score
for i = tonumber(ARGV[1]), tonumber(ARGV[1]) + tonumber(ARGV[2]) - 1 do
  local id = 'bj:' .. i
  redis.call('SET', 'arq:job:' .. id, ARGV[3])
  redis.call('ZADD', KEYS[1], tonumber(ARGV[4]) + i, id)
end
return 1
"""


def load(url: str, n: int) -> float:
    from worker.core.serializer import job_payload, msgpack_dumps

    r = redis_sync.Redis.from_url(url)
    now = int(r.time()[0]) * 1000 - 10_000_000
    started = time.monotonic()
    payload = job_payload("bulk", [1, "x"], {"user": "u"}, now, msgpack_dumps)
    script = r.register_script(LOAD)
    for first in range(0, n, 100_000):
        script(keys=[K.Keys(PREFIX).queue], args=[first, min(100_000, n - first), payload, now])
    # one job of task "needle" at the far end (due, but after every bulk job)
    r.set(K.ARQ_JOB + f"{PREFIX}needle", job_payload("needle", [], {}, now, msgpack_dumps))
    r.zadd(K.Keys(PREFIX).queue, {f"{PREFIX}needle": now + n + 1})
    r.close()
    return time.monotonic() - started


async def listing(url: str) -> None:
    client = await Client.connect(url, key_prefix=PREFIX)
    r = redis_sync.Redis.from_url(url)
    try:
        cases = [
            ("--state queued --limit 50", {"state": "queued", "limit": 50}),
            ("--state queued --limit 50 --task needle", {"state": "queued", "task": "needle"}),
            ("--state scheduled --limit 50", {"state": "scheduled", "limit": 50}),
        ]  # fmt: skip
        for label, kw in cases:
            times, page = [], None
            before = commandstats(r)
            for _ in range(5):
                t = time.perf_counter()
                page = await jobsview.list_jobs(client.store, **kw)  # type: ignore[arg-type]
                times.append((time.perf_counter() - t) * 1000)
            spent = delta(commandstats(r), before)
            assert page is not None
            per_call = {k: v // 5 for k, v in spent.items()}
            more = "yes" if page.next_cursor else "no"
            print(
                f"jobs {label}: {statistics.median(times):.1f} ms median of 5, "
                f"{sum(per_call.values())} commands per call {per_call}, "
                f"{len(page.items)} shown, {page.scanned} read, cursor={more}"
            )
    finally:
        r.close()
        await client.close()
    env = {**os.environ, "WORKER_REDIS_URL": url, "WORKER_KEY_PREFIX": PREFIX,
           "WORKER_APP": "harness.apps.ledger:app", "PYTHONPATH": str(ROOT)}  # fmt: skip
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "worker", "jobs", "--limit", "50"], env=env,  # noqa: ASYNC221
                   check=True, capture_output=True)  # fmt: skip
    print(f"python -m worker jobs --limit 50: {(time.perf_counter() - t) * 1000:.0f} ms wall "
          "(Python start-up and imports included)")  # fmt: skip


async def cancels(url: str, rounds: int, busy: int) -> None:
    """``busy``: the consumer's concurrency is 1 (full while the job runs: it claims nothing,
    only its claim check sees the abort), else 100 (idle slots: its claim rounds see it)."""
    prefix = f"bc{busy}:"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
           "WORKER_REDIS_URL": url, "WORKER_KEY_PREFIX": prefix, "WORKER_HEALTH_PORT": "0",
           "WORKER_APP": "harness.apps.ledger:app", "PYTHONPATH": str(ROOT),
           "WORKER_DRAIN_DELAY_S": "0",
           "WORKER_CONCURRENCY": str(busy or 100)}  # fmt: skip
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the timing
        [sys.executable, "-m", "worker", "run", "--role", "consumer"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    from harness.apps.ledger import app

    client = await Client.connect(url, key_prefix=prefix, app=app)
    ops = Operations(client, app, Actor("bench", "cli"))
    took: list[float] = []
    try:
        for _ in range(rounds):
            job_id = await client.enqueue("slow_job", 60)
            assert job_id is not None
            while not await client.redis.hget(f"{prefix}ledger:slow-started", job_id):  # noqa: ASYNC110 - polls Redis
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # a random phase against the claim check's period
            t = time.monotonic()
            outcome = await ops.cancel_job(job_id)
            assert outcome.ok, outcome.message
            while (d := await ops.detail(job_id)) is not None and d.state == "running":  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            took.append(time.monotonic() - t)
            assert d is not None and d.state == "cancelled", d
    finally:
        await client.close()
        proc.terminate()
        proc.wait(15)
    took.sort()
    kind = "a full consumer (concurrency 1)" if busy else "a consumer with free slots"
    med, top, low = (round(x * 1000) for x in (statistics.median(took), took[-1], took[0]))
    print(f"cancel latency, {len(took)} running jobs on {kind}: median {med} ms, max {top} ms, "
          f"min {low} ms (bound: 2 s)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--cancels", type=int, default=20)
    args = p.parse_args()
    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"loaded {args.jobs} queued jobs in {load(url, args.jobs):.1f} s")
        asyncio.run(listing(url))
        if args.cancels:
            asyncio.run(cancels(url, args.cancels, busy=1))
            asyncio.run(cancels(url, args.cancels, busy=0))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
