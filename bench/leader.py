"""A leader at scale: 1,000 periodic jobs every second; a per_key service over 10,000 keys.

PERIODIC: the leader's ``PeriodicEnqueuer`` runs in this process (a fixed lease on a real
server), with 1,000 periodic jobs ``every=1``; two real ``python -m worker run --role consumer``
processes run the ticks, each recording its runs per tick and how late the tick was enqueued.
Over a window: the enqueuer's CPU (this process's CPU time: it does nothing else), its
requests per tick instant (``CLIENT LIST`` ``tot-cmds`` of its own connection), ticks run per
instant (exactly 1,000 each, none missing) and the enqueue lateness (p50/p99).

KEYS: a ``per_key`` service (``KeyedService``) over 10,000 keys in this process, every loop
waiting on its stop event; after every key started, its CPU over a window, its requests per
renewal round, and renewals that failed (a lease lost means a missed renew deadline).

    python bench/leader.py            # 30 s windows
    python bench/leader.py --quick    # 10 s windows

Targets: the enqueuer at most 10 % of a core and 2 round trips per tick instant, every tick on
time; 10,000 keys renewed at most 5 % of a core with no deadline missed. Before batching (one
script per job, one renew per key): ~70 % of a core and 24k Redis commands/s for the periodic
load; 3 commands per key per round, sent one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("BENCH_PERIODIC_N", "1000")

import redis as redis_sync

from bench._common import (
    BenchLease,
    machine,
    pct,
    print_machine,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    worker_env,
)

PREFIX = "bench:"
LOCK = "1:bench-leader"


class Requests:
    """Counts the requests this process sends on its asyncio Redis connections (a pipeline or
    a script call is one request; ``tot-cmds`` would also count what a script runs inside)."""

    sent = 0

    @classmethod
    def install(cls) -> None:
        from redis.asyncio.connection import Connection

        real = Connection.send_packed_command

        async def counting(self: Any, command: Any, check_health: bool = True) -> None:
            cls.sent += 1
            await real(self, command, check_health)

        Connection.send_packed_command = counting  # type: ignore[method-assign]


def client_cmds(r: redis_sync.Redis, name: str) -> int:
    """Commands the server ran for a named client, script bodies included."""
    return sum(int(c.get("tot-cmds", 0)) for c in r.client_list() if c.get("name") == name)


def lateness(r: redis_sync.Redis) -> tuple[float, float]:
    buckets = {int(k): int(v) for k, v in r.hgetall("bench:late").items()}
    values = [b for b, n in sorted(buckets.items()) for _ in range(n)]
    return (pct(values, 50), pct(values, 99)) if values else (float("nan"), float("nan"))


async def periodic(url: str, window: float, logdir: Path) -> dict[str, Any]:
    import bench.apps as apps
    from worker.client import connect_redis
    from worker.core.clock import SystemClock
    from worker.core.serializer import get_serializer
    from worker.duties.periodic import PeriodicEnqueuer
    from worker.storage import keys as K
    from worker.storage.store import FencedStore, Store

    n = len(apps.many_periodic_app.periodics)
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    env = worker_env(url, "bench.apps:many_periodic_app", PREFIX, BENCH_PERIODIC_N=str(n))
    consumers = [spawn_worker("consumer", env, logdir / f"c{i}.log") for i in range(2)]
    keys = K.Keys(PREFIX)
    ser, _ = get_serializer("msgpack")
    redis = connect_redis(url, queue_name=keys.queue, client_name="bench-enqueuer")
    r.set(keys.leader, LOCK)
    store = Store(redis, keys)
    enqueuer = PeriodicEnqueuer(
        list(apps.many_periodic_app.periodics.values()),
        store,
        FencedStore(store, BenchLease(LOCK)),
        ser,
        SystemClock(),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(enqueuer.run(stop))
    try:
        deadline = time.monotonic() + 60
        while r.hlen("bench:runs") < 3:  # (this loop must not block the enqueuer: it sleeps async)
            assert time.monotonic() < deadline, "ticks never ran"
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # warm-up
        r.delete("bench:late")
        first = int(time.time()) * 1000 + 1000
        cmds0, req0 = client_cmds(r, "bench-enqueuer"), Requests.sent
        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(window)
        cmds1, req1 = client_cmds(r, "bench-enqueuer"), Requests.sent
        cpu1, t1 = time.process_time(), time.monotonic()
        last = int(time.time()) * 1000 - 1000
        await asyncio.sleep(3.0)  # let the consumers finish the window's ticks
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        stop_procs(consumers)
        await redis.aclose(close_connection_pool=True)
    runs = {int(k): int(v) for k, v in r.hgetall("bench:runs").items()}
    instants = list(range(first, last + 1, 1000))
    wrong = {t: runs.get(t, 0) for t in instants if runs.get(t, 0) != n}
    p50, p99 = lateness(r)
    seconds = t1 - t0
    return {
        "jobs": n,
        "cpu_pct": (cpu1 - cpu0) / seconds * 100,
        "requests_per_instant": (req1 - req0) / seconds,
        "commands_per_s": (cmds1 - cmds0) / seconds,
        "instants": len(instants),
        "wrong_instants": wrong,
        "late_p50_ms": p50,
        "late_p99_ms": p99,
    }


async def per_key(url: str, window: float, n_keys: int) -> dict[str, Any]:
    from bench.apps import holder
    from worker.app import App
    from worker.client import Client, connect_redis
    from worker.context import Context
    from worker.core.clock import SystemClock
    from worker.core.serializer import get_serializer
    from worker.duties.keyed import KeyedService
    from worker.settings import Settings
    from worker.storage import keys as K
    from worker.storage.store import open_store

    r = redis_sync.Redis.from_url(url)
    r.flushall()
    keys = K.Keys(PREFIX)
    ser, _ = get_serializer("msgpack")
    redis = connect_redis(url, queue_name=keys.queue, client_name="bench-keys")
    app = App("bench-keys")
    app.service(cardinality="per_key", keys=[f"k{i:05d}" for i in range(n_keys)])(holder)
    store = open_store(redis, keys, None)
    failed = 0
    real_renew = store.renew_leases

    async def renew(lease_keys: Any, owner: str, ttl_ms: int) -> list[bool]:
        nonlocal failed
        out = await real_renew(lease_keys, owner, ttl_ms)
        failed += out.count(False)
        return out

    store.renew_leases = renew  # type: ignore[method-assign]
    ctx = Context(
        Settings.model_construct(key_prefix=keys.prefix),
        redis,
        Client(redis, keys=keys, serialize=ser),
        SystemClock(),
        "bench",
    )
    svc = KeyedService(
        app.services["holder"], ctx, store, SystemClock(), instance_id="bench",
        lease_ttl_s=10, renew_interval_s=2, renew_deadline_s=6, stop_grace_s=5,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(svc.run(stop))
    try:
        deadline = time.monotonic() + 120
        while len(svc.running) < n_keys:
            assert time.monotonic() < deadline, f"only {len(svc.running)} keys started"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.5)  # one steady round
        cmds0, req0 = client_cmds(r, "bench-keys"), Requests.sent
        cpu0, t0 = time.process_time(), time.monotonic()
        rounds0 = svc.health.iterations
        await asyncio.sleep(window)
        cmds1, req1 = client_cmds(r, "bench-keys"), Requests.sent
        cpu1, t1 = time.process_time(), time.monotonic()
        rounds = svc.health.iterations - rounds0
    finally:
        stop.set()
        await asyncio.wait_for(task, 120)
        await redis.aclose(close_connection_pool=True)
    return {
        "keys": n_keys,
        "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "rounds": rounds,
        "requests_per_round": (req1 - req0) / max(rounds, 1),
        "commands_per_round": (cmds1 - cmds0) / max(rounds, 1),
        "renewals_failed": failed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--window", type=float, help="seconds measured (30; quick 10)")
    ap.add_argument("--keys", type=int, default=10_000)
    args = ap.parse_args()
    from worker.core.logs import configure_logging

    configure_logging("WARNING", "console")  # as a production process: no per-tick lines
    window = args.window or (10.0 if args.quick else 30.0)
    Requests.install()
    server, url = start_server()
    import uvloop

    try:
        info = machine(url)
        print_machine(info)
        print(f"load before: {os.getloadavg()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-leader-") as tmp:
            p = uvloop.run(periodic(url, window, Path(tmp)))
        k = uvloop.run(per_key(url, window, args.keys))
        print(f"load after: {os.getloadavg()}")
    finally:
        server.stop()
    print()
    print(f"## {p['jobs']:,} periodic jobs every second ({window:g} s, {p['instants']} instants)")
    late = f"{p['late_p50_ms']:.0f} / {p['late_p99_ms']:.0f}"
    rows = [
        ["enqueuer CPU, % of one core", f"{p['cpu_pct']:.1f}", "≤ 10"],
        ["enqueuer requests per tick instant", f"{p['requests_per_instant']:.2f}", "≤ 2"],
        ["Redis commands per second (script bodies)", f"{p['commands_per_s']:,.0f}", "-"],
        ["instants not run exactly once per job", str(len(p["wrong_instants"])), "0"],
        ["enqueued after the instant, p50 / p99 (ms, 10 ms buckets)", late, "on time"],
    ]
    print(table(["figure", "measured", "target"], rows))
    if p["wrong_instants"]:
        wrong = dict(list(p["wrong_instants"].items())[:10])
        print(f"instants with other than {p['jobs']} runs: {wrong}")
    print()
    print(f"## per_key service over {k['keys']:,} keys, renewed every 2 s ({window:g} s window)")
    rows = [
        ["CPU, % of one core", f"{k['cpu_pct']:.1f}", "≤ 5"],
        ["requests per renewal round", f"{k['requests_per_round']:.1f}", "2 per 5,000 keys"],
        ["Redis commands per round (script bodies)", f"{k['commands_per_round']:,.0f}", "-"],
        ["renewals failed (a missed deadline)", str(k["renewals_failed"]), "0"],
    ]
    print(table(["figure", "measured", "target"], rows))


if __name__ == "__main__":
    main()
