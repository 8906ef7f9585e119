"""Fair queues: what a fair task's job costs, and the bound a quiet flow key's job waits.

COST: a real ``python -m worker run --role consumer`` (framework defaults: concurrency 100)
drains N no-op jobs, once of a plain task (queue ``plain``) and once of a fair task (queue
``default``, the jobs spread over 100 flow keys), rounds interleaved; each batch is enqueued
with ``enqueue_many`` due at a moment T0 a little ahead and timed from T0 until the queue and the
ring are empty. Commands per job from commandstats (valkey counts a script's commands besides
its ``EVALSHA``; the harness's ``ZCARD`` polls subtracted), CPU per job of the worker process
and the server.

BOUND: one consumer of concurrency 10 (``WORKER_CONCURRENCY=10``), 10 ms jobs; one flow key
(``heavy``) holds B queued jobs, another (``quiet``) enqueues one job a second, Q times; each
quiet job records its enqueue-to-start time. Without ``fair`` a quiet job would wait for the
whole backlog (B x 10 ms / 10 and more).

    python -m bench fair            # COST 20k jobs x 3 rounds; BOUND 100,000 backlog, 30 quiet
    python -m bench fair --quick    # COST 4k x 2; BOUND 10,000 backlog, 10 quiet
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis as redis_sync

from bench._common import (
    fmt_breakdown,
    loadavg,
    machine,
    median,
    pct,
    print_machine,
    spawn_worker,
    start_server,
    table,
    time_drain,
    wait_until,
    worker_env,
)
from bench.apps import fair_app
from worker.bulk import JobSpec
from worker.client import Client
from worker.storage.keys import Keys

PREFIX = "bf:"
KEYS = Keys(PREFIX)


def start_consumer(url: str, log: Path, **env: str) -> Any:
    e = worker_env(url, "bench.apps:fair_app", PREFIX, WORKER_KEEP_RESULT_S="0", **env)
    return spawn_worker("consumer", e, log)


def waiting(r: redis_sync.Redis) -> bool:
    return any(c.get("cmd") == "bzpopmin" for c in r.client_list())


async def _fill(url: str, specs: list[JobSpec]) -> None:
    client = await Client.connect(url, app=fair_app, key_prefix=PREFIX)
    try:
        await client.enqueue_many(specs, chunk_size=1000)
    finally:
        await client.close()


def cost_round(url: str, fair: bool, n: int, logdir: Path, rnd: int) -> dict[str, Any]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    proc = start_consumer(url, logdir / f"cost-{fair}-{rnd}.log")
    try:
        wait_until(lambda: waiting(r), 60, "the consumer to wait")
        t0 = time.time() + 3.0
        due = dt.datetime.fromtimestamp(t0, dt.UTC)
        task = "fair_noop" if fair else "plain_noop"
        specs = [JobSpec(task, (f"k{i % 100}",), defer_until=due) for i in range(n)]
        asyncio.run(_fill(url, specs))
        queue = KEYS.queue if fair else KEYS.queue_of("plain")
        ring = KEYS.fair("default")

        def remaining() -> int:
            return int(r.zcard(queue)) + int(r.zcard(ring))

        return time_drain(r, psutil.Process(proc.pid), n, t0, remaining, {"zcard": 2}, "cost")
    finally:
        proc.terminate()
        proc.wait(30)


def bound(url: str, backlog: int, quiet: int, logdir: Path) -> list[float]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    for lo in range(0, backlog, 10_000):
        hi = min(backlog, lo + 10_000)
        asyncio.run(_fill(url, [JobSpec("fair_job", ("heavy", 0.0)) for _ in range(lo, hi)]))
    proc = start_consumer(url, logdir / "bound.log", WORKER_CONCURRENCY="10")
    try:
        flowing = backlog - min(500, backlog // 2)
        wait_until(lambda: r.zcard(KEYS.fair("default", "heavy")) <= flowing, 60, "flow")

        async def quiet_jobs() -> None:
            client = await Client.connect(url, app=fair_app, key_prefix=PREFIX)
            try:
                for _ in range(quiet):
                    await client.enqueue("fair_job", "quiet", time.time())
                    await asyncio.sleep(1.0)
            finally:
                await client.close()

        asyncio.run(quiet_jobs())
        wait_until(lambda: r.llen("bench:fair:waits") >= quiet, 60, "every quiet job")
        left = int(r.zcard(KEYS.fair("default", "heavy")))
        print(f"backlog of 'heavy' left when the last quiet job started: {left}")
        return [float(x) for x in r.lrange("bench:fair:waits", 0, -1)]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--skip-bound", action="store_true")
    ap.add_argument("--n", type=int, help="no-op jobs per cost round")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--backlog", type=int, help="the heavy key's queued jobs")
    ap.add_argument("--quiet", type=int, help="quiet jobs, one a second")
    a = ap.parse_args()
    n, rounds = (4000, 2) if a.quick else (20_000, 3)
    backlog, quiet = (10_000, 10) if a.quick else (100_000, 30)
    n, rounds = a.n or n, a.rounds or rounds
    backlog, quiet = a.backlog or backlog, a.quiet or quiet
    server, url = start_server()
    logdir = Path(tempfile.mkdtemp(prefix="bench-fair-"))
    try:
        print_machine(machine(url))
        print(f"load average before: {loadavg()}; logs in {logdir}")
        if not a.skip_cost:
            runs: dict[str, list[dict[str, Any]]] = {"plain": [], "fair": []}
            for rnd in range(rounds):
                for name in ["plain", "fair"] if rnd % 2 == 0 else ["fair", "plain"]:
                    res = cost_round(url, name == "fair", n, logdir, rnd)
                    runs[name].append(res)
                    print(
                        f"round {rnd + 1} {name:5} {n} jobs in {res['secs']:.2f} s, "
                        f"{res['cmds']:.1f} cmds/job, worker CPU {res['worker_us']:.0f} us/job"
                    )
            rows = [
                [
                    name,
                    f"{median([x['rate'] for x in rs]):,.0f}",
                    f"{median([x['cmds'] for x in rs]):.1f}",
                    f"{median([x['worker_us'] for x in rs]):.0f}",
                    f"{median([x['server_us'] for x in rs]):.0f}",
                ]
                for name, rs in runs.items()
            ]
            print(f"\n## Cost per job, {n} no-op jobs (median of {rounds} rounds)")
            print(
                table(
                    ["task", "jobs/s", "commands/job", "worker CPU us/job", "server CPU us/job"],
                    rows,
                )
            )
            for name, rs in runs.items():
                print(f"commands/job {name}: {fmt_breakdown(rs[-1]['breakdown'], n)}")
        if not a.skip_bound:
            waits = bound(url, backlog, quiet, logdir)
            print(
                f"\n## Bound: {quiet} quiet jobs beside a {backlog:,}-job backlog (10 ms jobs, "
                "one consumer of concurrency 10)"
            )
            print(
                table(
                    ["p50 ms", "p99 ms", "max ms"],
                    [[f"{pct(waits, 50):.0f}", f"{pct(waits, 99):.0f}", f"{max(waits):.0f}"]],
                )
            )
        print(f"load average after: {loadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
