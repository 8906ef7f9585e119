"""What a large, near-idle fleet costs Redis per enqueued job: real ``python -m worker``
processes (``--consumers`` of role ``consumer`` and ``--alls`` of role ``all``, default 95 + 5)
on one private valkey-server, the framework's default timings, the app
``bench.apps:idle_app``.

Two windows, one after the other, counted with ``INFO commandstats`` (valkey counts the
commands a Lua script runs as well as the ``EVALSHA``; the harness's own ``INFO`` and
``CLIENT LIST`` left out):

- ``idle``: nothing enqueued: commands/s of the whole fleet, and per process;
- ``load``: the harness enqueues ``wake_stamp`` through ``worker.Client`` at ``--rate`` jobs/s
  (a random moment in each interval): commands/s, and per enqueued job what the load window
  added over the idle one (the job's own enqueue, claim and finish included: with one
  consumer that is the floor), claim rounds (``CLAIM`` runs one ``ZRANGEBYSCORE`` per queue
  it reads, and no other script of this app does) and ``BZPOPMIN`` calls per job; enqueue to
  start latency (p50, p99).

    python -m bench fleet                         # 95 consumers + 5 all, 30 s windows
    python -m bench fleet --consumers 11 --alls 1 --window 10

Targets: a job costs O(1) claim rounds whatever the fleet's size (at most 10 commands per job
over the idle figure beyond the job's own work), an idle process at most 1 command/s, the
first job after an idle spell starts within a few ms.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    commandstats,
    loadavg,
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
APP = "bench.apps:idle_app"
STARTS = "bench:idle:wake"
HARNESS = frozenset({"info", "client|list"})


def start(role: str, url: str, log: Path, name: str) -> Any:
    env = worker_env(url, APP, PREFIX, WORKER_LOG_LEVEL="WARNING", WORKER_QUEUES="default")
    return spawn_worker(role, env, log, "--instance-name", name)


def window(r: redis_sync.Redis, seconds: float) -> tuple[dict[str, int], float]:
    before, t0 = commandstats(r), time.monotonic()
    time.sleep(seconds)
    after, secs = commandstats(r), time.monotonic() - t0
    d = {k: v - before.get(k, 0) for k, v in after.items() if k not in HARNESS}
    return {k: v for k, v in d.items() if v}, secs


async def produce(url: str, rate: float, seconds: float) -> int:
    """Enqueue ``wake_stamp`` at ``rate`` jobs/s for ``seconds``; how many were enqueued."""
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX)
    rng, n = random.Random(7), 0
    try:
        end, step = time.monotonic() + seconds, 1.0 / rate
        slot = time.monotonic()
        while slot < end:
            await asyncio.sleep(max(0.0, slot + rng.uniform(0, step) - time.monotonic()))
            await client.enqueue("wake_stamp", time.time())
            n += 1
            slot += step
            await asyncio.sleep(max(0.0, slot - time.monotonic()))
    finally:
        await client.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--consumers", type=int, default=95)
    ap.add_argument("--alls", type=int, default=5)
    ap.add_argument("--rate", type=float, default=4.3, help="jobs/s in the load window")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per window")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds after the last start")
    a = ap.parse_args()
    n = a.consumers + a.alls
    server, url = start_server(["--maxclients", "10000"])
    r = redis_sync.Redis.from_url(url)
    info = machine(url)
    logdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    procs = [start("all", url, logdir / f"a{i}.log", f"fleet-a{i}") for i in range(a.alls)]
    procs += [
        start("consumer", url, logdir / f"c{i}.log", f"fleet-c{i}") for i in range(a.consumers)
    ]
    try:
        wait_until(lambda: r.zcard(f"{PREFIX}instances") >= n, 600, f"{n} instances", 0.5)
        wait_until(lambda: r.exists(f"{PREFIX}leader"), 60, "a leader")
        time.sleep(a.settle)  # start-up is not idle: manifests, script loads, first looks
        load_before = loadavg()
        idle, idle_s = window(r, a.window)
        r.delete(STARTS)
        before, t0 = commandstats(r), time.monotonic()
        jobs = asyncio.run(produce(url, a.rate, a.window))
        wait_until(lambda: r.llen(STARTS) >= jobs, 60, "every job started")
        time.sleep(1.0)  # the last ends written
        after, load_s = commandstats(r), time.monotonic() - t0
        load = {k: v - before.get(k, 0) for k, v in after.items() if k not in HARNESS}
        alive = sum(p.poll() is None for p in procs)
        starts_ms = sorted(float(x) for x in r.lrange(STARTS, 0, -1))
    finally:
        stop_procs(procs, 60)
        r.close()
        server.stop()

    idle_rate = sum(idle.values()) / idle_s
    load_rate = sum(load.values()) / load_s
    per_job = (sum(load.values()) - idle_rate * load_s) / jobs

    def per(cmd: str) -> float:
        return (load.get(cmd, 0) - idle.get(cmd, 0) / idle_s * load_s) / jobs

    print_machine(info)
    print(
        f"fleet: {a.consumers} consumer + {a.alls} all = {n} processes ({alive} alive at the end)"
    )
    print(f"load average before the windows: {load_before}; logs in {logdir}")
    rows = [
        ["idle: commands/s (fleet)", f"{idle_rate:.1f}"],
        ["idle: commands/s per process", f"{idle_rate / n:.3f}"],
        [f"load: {jobs / load_s:.2f} jobs/s, commands/s (fleet)", f"{load_rate:.1f}"],
        ["commands per enqueued job (over idle)", f"{per_job:.1f}"],
        ["claim rounds (ZRANGEBYSCORE) per job", f"{per('zrangebyscore'):.2f}"],
        ["BZPOPMIN per job", f"{per('bzpopmin'):.2f}"],
        ["EVALSHA per job", f"{per('evalsha'):.2f}"],
        ["enqueue to start p50 / p99 (ms)", f"{pct(starts_ms, 50):.1f} / {pct(starts_ms, 99):.1f}"],
    ]
    print(table(["figure", "value"], rows))
    top = sorted(load.items(), key=lambda kv: -kv[1])[:10]
    print("load window, calls per job: " + ", ".join(f"{k} {v / jobs:.1f}" for k, v in top))


if __name__ == "__main__":
    main()
