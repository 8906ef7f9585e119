"""Wake-up latency: an idle consumer's first job after an enqueue, and a tick's start after its
instant, with real ``python -m worker`` processes on the framework defaults.

WAKE: one consumer process, idle; this process enqueues ``stamp(sent_ms)`` through
``worker.Client`` every 150 ms; each job records ``start - sent`` (enqueue to start). The
baseline is the same consumer seeing jobs only through its fallback look at the queue
(written the way a plain arq client writes them, unannounced).

TICK: one leader and one consumer process; a periodic job ``every=1`` records ``start -
instant`` for every tick.

    python bench/latency.py            # 200 wakes, 60 ticks
    python bench/latency.py --quick    # 50 wakes, 20 ticks

Targets: first job after an idle spell ≤ 20 ms p99 after enqueue; an ``every=1`` tick starts
≤ 50 ms p99 after its instant. Before wake-on-enqueue: ticks started 0.25–0.6 s late at idle.
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


def start(role: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    return spawn_worker(role, worker_env(url, "bench.apps:latency_app", PREFIX), log)


async def enqueue_stamps(url: str, n: int, announced: bool) -> None:
    from worker.client import Client
    from worker.core.serializer import get_serializer, job_payload
    from worker.storage import keys as K

    client = await Client.connect(url, key_prefix=PREFIX)
    ser, _ = get_serializer("msgpack")
    keys = K.Keys(PREFIX)
    for i in range(n):
        await asyncio.sleep(0.15)
        sent = int(time.time() * 1000)
        if announced:
            await client.enqueue("stamp", sent)
        else:  # as plain arq writes a job: no announcement
            await client.redis.set(
                f"arq:job:plain-{i}", job_payload("stamp", (sent,), {}, sent, ser)
            )
            await client.redis.zadd(keys.queue, {f"plain-{i}": sent})
    await client.close()


def wake(url: str, n: int, logdir: Path, announced: bool) -> list[float]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    proc = start("consumer", url, logdir / f"wake-{announced}.log")
    try:
        wait_until(lambda: r.zcard(f"{PREFIX}instances") == 1, 30, "the consumer")
        time.sleep(1.5)  # idle
        asyncio.run(enqueue_stamps(url, n, announced))
        wait_until(lambda: r.llen("bench:wake") >= n, 30, "every stamp")
        return [float(v) for v in r.lrange("bench:wake", 0, -1)]
    finally:
        stop_procs([proc])
        r.close()


def ticks(url: str, n: int, logdir: Path) -> list[float]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    procs = [start("leader", url, logdir / "leader.log"), start("consumer", url, logdir / "c.log")]
    try:
        wait_until(lambda: r.llen("bench:tick") >= 2, 60, "ticks")
        r.delete("bench:tick")
        wait_until(lambda: r.llen("bench:tick") >= n, n + 30, f"{n} ticks", interval=0.5)
        return [float(v) for v in r.lrange("bench:tick", 0, -1)]
    finally:
        stop_procs(procs)
        r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="does it run: 3 wake-ups, 2 ticks")
    args = ap.parse_args()
    from worker.core.logs import configure_logging

    configure_logging("WARNING", "console")  # as a production process: no per-tick lines
    n_wake, n_tick = (3, 2) if args.smoke else (50, 20) if args.quick else (200, 60)
    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"load before: {os.getloadavg()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
            ours = wake(url, n_wake, Path(tmp), announced=True)
            base = wake(url, n_wake, Path(tmp), announced=False)
            tk = ticks(url, n_tick, Path(tmp))
        print(f"load after: {os.getloadavg()}")
    finally:
        server.stop()
    print()
    rows = [
        ["first job after an idle spell: enqueue -> start (ms)", f"{pct(ours, 50):.1f}",
         f"{pct(ours, 99):.1f}", f"{max(ours):.1f}", "p99 ≤ 20"],
        ["  baseline: unannounced (plain arq), fallback look", f"{pct(base, 50):.1f}",
         f"{pct(base, 99):.1f}", f"{max(base):.1f}", "≤ WORKER_IDLE_POLL_MAX_S"],
        [f"every=1 tick: instant -> start (ms), {len(tk)} ticks", f"{pct(tk, 50):.1f}",
         f"{pct(tk, 99):.1f}", f"{max(tk):.1f}", "p99 ≤ 50"],
    ]  # fmt: skip
    print(table(["latency", "p50", "p99", "max", "target"], rows))


if __name__ == "__main__":
    main()
