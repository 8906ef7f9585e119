"""What durable writes cost: WAIT on (``WORKER_REDIS_WAIT_REPLICAS=1``) vs off, same machine,
same primary with one replica attached, interleaved rounds.

1. **consumer**: N no-op jobs pre-filled, one ``python -m worker run --role consumer``; time
   to drain, Redis commands per job (the claim and the finish of each batch carry one ``WAIT``),
   worker and server CPU per job;
2. **enqueue**: ``Client.enqueue`` one call at a time (each waits for its ``WAIT``), then 100
   gathered at once: calls per second, latency p50/p99, commands per enqueue.

Replication runs in both variants (the replica is attached either way): the difference is the
``WAIT`` itself. Run from the repository root: ``python -m bench wait`` (``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis as redis_sync

from bench._common import (
    commandstats,
    delta,
    fmt_breakdown,
    machine,
    median,
    pct,
    print_machine,
    result_count,
    rotated,
    run_async,
    server_cpu,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    time_drain,
    wait_until,
    worker_env,
)
from bench.consumer import OUR_QUEUE, PREFIX, fill
from harness.ports import free_port
from worker.client import Client
from worker.runtime.embedded import EmbeddedServer

VARIANTS = {"wait-0": 0, "wait-1": 1}


def start_pair() -> tuple[EmbeddedServer, EmbeddedServer, str]:
    """A primary and one synced replica."""
    primary, url = start_server()
    replica = EmbeddedServer(
        port=free_port(),
        unix_socket=False,
        extra_args=("--replicaof", "127.0.0.1", str(primary.port)),
    )
    replica.start()
    r = redis_sync.Redis.from_url(url)

    def synced() -> bool:
        r.set("bench:sync", 1)
        return int(r.wait(1, 200)) == 1

    wait_until(synced, 30, "the replica to sync")
    r.close()
    return primary, replica, url


def consumer_round(
    name: str, replicas: int, url: str, n: int, logdir: Path, rnd: int
) -> dict[str, Any]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    env = worker_env(url, "bench.apps:noop_app", PREFIX, WORKER_REDIS_WAIT_REPLICAS=str(replicas))
    proc = spawn_worker("consumer", env, logdir / f"{name}-{rnd}.log")
    try:
        wait_until(lambda: any(True for _ in r.scan_iter(f"{PREFIX}arq-health:*")), 30, "start")
        time.sleep(0.5)
        t0_wall = time.time() + 1.0 + n / 40_000
        fill(r, "ours", n, int(t0_wall * 1000))
        res = time_drain(
            r, psutil.Process(proc.pid), n, t0_wall, lambda: int(r.zcard(OUR_QUEUE)),
            {"zcard": 1}, name,
        )  # fmt: skip
    finally:
        stop_procs([proc], 15)
    done = result_count(r)
    r.close()
    if done != n:
        raise AssertionError(f"{name}: {done} results for {n} jobs (see {logdir})")
    return res


async def enqueue_round(replicas: int, url: str, n: int) -> dict[str, Any]:
    client = await Client.connect(url, key_prefix=PREFIX, wait_replicas=replicas)
    r = redis_sync.Redis.from_url(url)
    try:
        await client.redis.flushall()
        before, cpu0 = commandstats(r), server_cpu(r)
        lat = []
        t0 = time.perf_counter()
        for i in range(n):
            s = time.perf_counter()
            await client.enqueue("noop", i)
            lat.append((time.perf_counter() - s) * 1000)
        one = time.perf_counter() - t0
        d = delta(commandstats(r), before)
        cpu = server_cpu(r) - cpu0
        t1 = time.perf_counter()
        for start in range(0, n, 100):
            await asyncio.gather(*(client.enqueue("noop", i) for i in range(start, start + 100)))
        gathered = time.perf_counter() - t1
        return {
            "rate": n / one,
            "p50": pct(lat, 50),
            "p99": pct(lat, 99),
            "cmds": sum(d.values()) / n,
            "server_us": cpu / n * 1e6,
            "gathered": n / gathered,
            "breakdown": d,
        }
    finally:
        r.close()
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, help="jobs per consumer run (20k; quick 4k)")
    ap.add_argument("--enqueues", type=int, help="enqueues per run (3k; quick 1k)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (3; quick 2)")
    args = ap.parse_args()
    n = args.n or (4_000 if args.quick else 20_000)
    k = args.enqueues or (1_000 if args.quick else 3_000)
    rounds = args.rounds or (2 if args.quick else 3)
    primary, replica, url = start_pair()
    logdir = Path(tempfile.mkdtemp(prefix="bench-wait-"))
    try:
        print_machine(machine(url))
        print(f"primary + 1 replica on loopback; {n} jobs and {k} enqueues per run, {rounds} "
              f"rounds; logs in {logdir}")  # fmt: skip
        cons: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        enq: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for rnd in range(rounds):
            for name in rotated(list(VARIANTS), rnd):
                c = consumer_round(name, VARIANTS[name], url, n, logdir, rnd)
                e = run_async(enqueue_round(VARIANTS[name], url, k))
                cons[name].append(c)
                enq[name].append(e)
                print(f"round {rnd + 1} {name}: consumer {c['rate']:7.0f} jobs/s "
                      f"{c['cmds']:.2f} cmds/job; enqueue {e['rate']:6.0f}/s p50 {e['p50']:.2f} "
                      f"ms p99 {e['p99']:.2f} ms {e['cmds']:.2f} cmds, gathered "
                      f"{e['gathered']:6.0f}/s", flush=True)  # fmt: skip
        print("\n## Consumer, no-op jobs (median of rounds)")
        rows = []
        for name in VARIANTS:
            rs = cons[name]
            rows.append([
                name, f"{median([x['rate'] for x in rs]):,.0f}",
                f"{median([x['cmds'] for x in rs]):.2f}",
                f"{median([x['worker_us'] for x in rs]) / 1000:.3f}",
                f"{median([x['server_us'] for x in rs]):.0f}",
            ])  # fmt: skip
        print(table(["variant", "jobs/s", "Redis commands/job", "worker CPU ms/job",
                     "server CPU us/job"], rows))  # fmt: skip
        print("\n## Client.enqueue (median of rounds)")
        rows = []
        for name in VARIANTS:
            rs = enq[name]
            rows.append([
                name, f"{median([x['rate'] for x in rs]):,.0f}",
                f"{median([x['p50'] for x in rs]):.2f}", f"{median([x['p99'] for x in rs]):.2f}",
                f"{median([x['cmds'] for x in rs]):.2f}",
                f"{median([x['gathered'] for x in rs]):,.0f}",
            ])  # fmt: skip
        print(table(["variant", "one at a time /s", "p50 ms", "p99 ms", "commands/enqueue",
                     "gathered x100 /s"], rows))  # fmt: skip
        for name in VARIANTS:
            last = cons[name][-1]
            print(f"consumer commands/job {name}: {fmt_breakdown(last['breakdown'], last['n'])}")
            e = enq[name][-1]
            print(f"enqueue commands/call {name}: {fmt_breakdown(e['breakdown'], k)}")
    finally:
        replica.stop()
        primary.stop()


if __name__ == "__main__":
    main()
