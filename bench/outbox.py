"""The outbox's latency: a job enqueued in a PostgreSQL transaction (``worker.outbox``), from
the enqueue call (its commit right after) to the job's start, with real ``python -m worker``
processes: one ``all`` process (the relay and a consumer), ``WORKER_OUTBOX_DSN`` set, framework
defaults otherwise. A throwaway PostgreSQL (``harness/postgres.py``) and the embedded server.

ONE: one row per transaction every 150 ms on an idle fleet (the relay wakes on the commit's
NOTIFY). BURST: 1,000 rows in one transaction: each row's enqueue-to-start, the last one's
is the time to relay and run them all. Baseline: ``Client.enqueue`` (straight to Redis) the
same way, ONE only.

    python -m bench outbox            # 200 rows one by one, bursts of 1,000
    python -m bench outbox --quick    # 50 rows, bursts of 200
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

import psycopg
import redis as redis_sync

import worker
from bench._common import (
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
from harness.postgres import Postgres, binaries

PREFIX = "bench:"


def start(url: str, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = worker_env(
        url, "bench.apps:latency_app", PREFIX, WORKER_OUTBOX_DSN=dsn, WORKER_LOG_LEVEL="WARNING"
    )
    return spawn_worker("all", env, log)


def stamps(r: redis_sync.Redis, n: int) -> list[float]:
    wait_until(lambda: r.llen("bench:wake") >= n, 120, f"{n} stamps", interval=0.05)
    out = [float(v) for v in r.lrange("bench:wake", 0, -1)]
    r.delete("bench:wake")
    return out


def one_by_one(dsn: str, r: redis_sync.Redis, n: int) -> list[float]:
    with psycopg.connect(dsn) as conn:
        for _ in range(n):
            time.sleep(0.15)
            worker.outbox.enqueue(conn, "stamp", int(time.time() * 1000))
            conn.commit()
    return stamps(r, n)


def burst(dsn: str, r: redis_sync.Redis, n: int) -> list[float]:
    with psycopg.connect(dsn) as conn:
        sent = int(time.time() * 1000)
        for _ in range(n):
            worker.outbox.enqueue(conn, "stamp", sent)
        conn.commit()
    return stamps(r, n)


async def baseline(url: str, n: int) -> None:
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX)
    for _ in range(n):
        await asyncio.sleep(0.15)
        await client.enqueue("stamp", int(time.time() * 1000))
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n_one, n_burst = (50, 200) if args.quick else (200, 1000)
    bindir = binaries()
    if bindir is None:
        raise SystemExit("PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)")
    pg = Postgres(bindir)
    server, url = start_server()
    pg.start()
    proc = None
    try:
        print_machine(machine(url))
        print(f"load before: {os.getloadavg()}", flush=True)
        dsn = pg.database("bench_outbox")
        with psycopg.connect(dsn, autocommit=True) as conn:
            worker.outbox.install(conn)
        r = redis_sync.Redis.from_url(url)
        with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp:
            proc = start(url, dsn, Path(tmp) / "worker.log")
            wait_until(lambda: r.get(f"{PREFIX}leader"), 60, "a leader")
            time.sleep(1.5)  # idle
            one = one_by_one(dsn, r, n_one)
            bursts = [burst(dsn, r, n_burst) for _ in range(3)]
            asyncio.run(baseline(url, n_one))
            base = stamps(r, n_one)
        print(f"load after: {os.getloadavg()}")
    finally:
        if proc is not None:
            stop_procs([proc])
        pg.stop()
        server.stop()
    rows = [
        [f"outbox, one row per commit, every 150 ms ({n_one})", f"{pct(one, 50):.1f}",
         f"{pct(one, 99):.1f}", f"{max(one):.1f}"],
        *([f"outbox, {n_burst} rows in one commit (run {i + 1})", f"{pct(b, 50):.1f}",
           f"{pct(b, 99):.1f}", f"{max(b):.1f}"] for i, b in enumerate(bursts)),
        [f"baseline: Client.enqueue every 150 ms ({n_one})", f"{pct(base, 50):.1f}",
         f"{pct(base, 99):.1f}", f"{max(base):.1f}"],
    ]  # fmt: skip
    print(table(["enqueue -> job start (ms)", "p50", "p99", "max"], rows))


if __name__ == "__main__":
    main()
