"""Poll dispatch: moving due items from a poller's shards into the arq queue.

OURS: ``worker.duties.poller.PollingScheduler.dispatch_shard`` in a loop until every shard is empty
(one read + one fenced DISPATCH script per batch of ``batch_size`` items), with a static lock
value set so the fence passes.

BASELINE: what a naive poller would do with plain arq (a pool from ``arq.create_pool``), per
item: ``Any.enqueue_job`` with the same job id and serializer, then ``ZREM`` the item from
its shard, (a) one item at a time and (b) gathered 100 at a time. The naive poller reads due
items in the same batches.

All variants run in this one process on the same event loop (uvloop, as ``python -m worker``
does; ``--loop asyncio`` to change), against a fresh keyspace each run, and rounds are
interleaved (the order rotates) so machine drift hits all of them. The naive baselines get a
smaller N per round because they are slow; their rate does not depend on N.

    python bench/dispatch.py            # ours 200k items, baselines 20k, 3 rounds (~1.5 min)
    python bench/dispatch.py --quick    # ours 20k, baselines 4k, 2 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    BenchLease,
    commandstats,
    delta,
    have_arq,
    machine,
    median,
    print_breakdowns,
    print_machine,
    result_count,
    rotated,
    run_async,
    server_cpu,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    wait_until,
    worker_env,
)
from worker.client import connect_redis
from worker.core.clock import SystemClock, ms
from worker.core.ids import JobIds
from worker.core.serializer import get_serializer
from worker.duties.poller import PollingScheduler
from worker.polls import PollerDef
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("bench:")
LOCK_VALUE = "1:bench-static-lock"
SERIALIZE, DESERIALIZE = get_serializer("msgpack")
#: Commands a client sends on our path; everything else in the delta ran inside DISPATCH.
OUR_REQUESTS = {"zrangebyscore", "evalsha", "eval", "script|load"}


def fill(r: redis_sync.Redis, poller: PollerDef, n: int) -> None:
    """Put n items due a second ago into the poller's shards (untimed)."""
    r.flushall()
    due = ms(time.time()) - 1000
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        item = f"item-{i:07d}"
        pipe.zadd(KEYS.poll_shard(poller.name, poller.shard_of(item)), {item: due})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    r.set(KEYS.leader, LOCK_VALUE)


async def drain_ours(redis: Any, poller: PollerDef) -> None:
    store = Store(redis, KEYS)
    sched = PollingScheduler(
        poller, store, FencedStore(store, BenchLease(LOCK_VALUE)), SERIALIZE, SystemClock()
    )
    for shard in range(poller.shards):
        while await sched.dispatch_shard(shard):
            pass


async def drain_naive(redis: Any, poller: PollerDef, concurrency: int) -> None:
    """Per item: arq's enqueue_job with a deterministic id, then ZREM from the shard."""

    async def one(shard_key: str, item: str, score: float) -> None:
        job_id = JobIds(KEYS.prefix).poll(poller.name, item, int(score))
        await redis.enqueue_job(poller.task, item, _job_id=job_id, _queue_name=KEYS.queue)
        await redis.zrem(shard_key, item)

    for shard in range(poller.shards):
        key = KEYS.poll_shard(poller.name, shard)
        while True:
            now = ms(time.time())
            due = await redis.zrangebyscore(
                key, "-inf", now, start=0, num=poller.batch_size, withscores=True
            )
            if not due:
                break
            pairs = [(raw.decode(), score) for raw, score in due]
            if concurrency == 1:
                for item, score in pairs:
                    await one(key, item, score)
            else:
                for i in range(0, len(pairs), concurrency):
                    chunk = pairs[i : i + concurrency]
                    await asyncio.gather(*(one(key, it, sc) for it, sc in chunk))


VARIANTS: dict[str, tuple[str, Callable[[Any, PollerDef], Awaitable[None]]]] = {
    "ours": ("ours: PollingScheduler.dispatch_shard (DISPATCH script per batch)", drain_ours),
    "seq": (
        "baseline: enqueue_job + ZREM, sequential",
        lambda r, p: drain_naive(r, p, 1),
    ),
    "gather": (
        "baseline: enqueue_job + ZREM, gathered x100",
        lambda r, p: drain_naive(r, p, 100),
    ),
}


async def run_variant(url: str, name: str, poller: PollerDef, n: int) -> dict[str, object]:
    r = redis_sync.Redis.from_url(url)
    fill(r, poller, n)
    if name == "ours":  # the client the runtime builds
        redis = connect_redis(url, queue_name=KEYS.queue)
    else:  # what a naive poller on plain arq would use (fenced-worker[arq])
        from arq.connections import RedisSettings, create_pool

        redis = await create_pool(
            RedisSettings.from_dsn(url),
            job_serializer=SERIALIZE,
            job_deserializer=DESERIALIZE,
            default_queue_name=KEYS.queue,
        )
    await redis.ping()
    before, scpu0 = commandstats(r), server_cpu(r)
    c0, t0 = time.process_time(), time.perf_counter()
    await VARIANTS[name][1](redis, poller)
    secs, ccpu = time.perf_counter() - t0, time.process_time() - c0
    after, scpu1 = commandstats(r), server_cpu(r)
    queued = r.zcard(KEYS.queue)
    left = sum(r.zcard(KEYS.poll_shard(poller.name, s)) for s in range(poller.shards))
    inflight_key = KEYS.poll_inflight(poller.name)
    inflight = (r.hlen(inflight_key), r.memory_usage(inflight_key) or 0)
    await redis.aclose(close_connection_pool=True)
    r.close()
    if queued != n or left:
        raise AssertionError(f"{name}: {queued} jobs queued, {left} items left (expected {n}, 0)")
    d = delta(after, before)
    mine = {k: v for k, v in d.items() if k in OUR_REQUESTS}
    requests = sum(mine.values()) if name == "ours" else sum(d.values())
    return {
        "rate": n / secs,
        "secs": secs,
        "n": n,
        "cmds": sum(d.values()) / n,
        "reqs": requests / n,
        "client_us": ccpu / n * 1e6,
        "server_us": (scpu1 - scpu0) / n * 1e6,
        "breakdown": d,
        "inflight": inflight,
    }


async def inflight_after_jobs_finish(url: str, n: int = 1000) -> str:
    """Dispatch n items, run every job in a real ``python -m worker run --role consumer``
    process (the framework's per-job hooks), then look at the in-flight hash: it should be
    empty once the jobs ended."""
    from bench.apps import leakcheck_poller as poller

    r = redis_sync.Redis.from_url(url)
    fill(r, poller, n)
    redis = connect_redis(url, queue_name=KEYS.queue)
    await drain_ours(redis, poller)
    await redis.aclose()
    key = KEYS.poll_inflight(poller.name)
    dispatched = int(r.hlen(key))
    env = worker_env(url, "bench.apps:leakcheck_app", KEYS.prefix)
    logdir = Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
    proc = spawn_worker("consumer", env, logdir / "c.log")
    try:
        wait_until(lambda: not r.zcard(KEYS.queue) and not r.hlen(key), 60 + n / 100,
                   f"the consumer to run {n} poll jobs (log in {logdir})")  # fmt: skip
    except TimeoutError:
        pass  # reported below: what is left is the finding
    finally:
        stop_procs([proc], 15)
    results = result_count(r)
    out = (
        f"in-flight check: dispatched {n} items ({dispatched} in-flight entries), a real "
        f"consumer process ran them (queue left {r.zcard(KEYS.queue)}, result keys {results}); "
        f"in-flight hash holds {r.hlen(key)} entries afterwards (expected 0)"
    )
    r.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, help="items for our path per round (200k; quick 20k)")
    ap.add_argument("--n-baseline", type=int, help="items for each baseline (20k; quick 4k)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (3; quick 2)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--batch", type=int, default=500, help="poller batch_size (default 500)")
    ap.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = ap.parse_args()
    n = args.n or (20_000 if args.quick else 200_000)
    nb = args.n_baseline or (4_000 if args.quick else 20_000)
    rounds = args.rounds or (2 if args.quick else 3)
    poller = PollerDef("bench", task="noop", shards=args.shards, batch_size=args.batch)

    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"poller: {args.shards} shards, batch_size {args.batch}; loop {args.loop}; "
              f"ours {n} items/round, baselines {nb} items/round, {rounds} rounds")  # fmt: skip
        names = [k for k in VARIANTS if k == "ours" or have_arq()]
        if len(names) < len(VARIANTS):
            print(
                "arq is not installed: the baselines are skipped (pip install 'fenced-worker[arq]')"
            )
        results: dict[str, list[dict[str, object]]] = {k: [] for k in names}
        for rnd in range(rounds):
            order = rotated(names, rnd)
            for name in order:
                res = run_async(
                    run_variant(url, name, poller, n if name == "ours" else nb), args.loop
                )
                results[name].append(res)
                print(f"round {rnd + 1} {name:6s} {res['n']:7d} items in {res['secs']:6.2f} s "
                      f"= {res['rate']:9.0f} items/s", flush=True)  # fmt: skip

        print()
        print("## Poll dispatch (median of rounds)")
        ours_rate = median([float(x["rate"]) for x in results["ours"]])  # type: ignore[arg-type]
        rows = []
        for name in names:
            label, rs = VARIANTS[name][0], results[name]
            rate = median([float(x["rate"]) for x in rs])  # type: ignore[arg-type]
            rows.append([
                label, f"{rate:,.0f}", f"{ours_rate / rate:.1f}x" if name != "ours" else "1x",
                f"{median([float(x['reqs']) for x in rs]):.3f}",  # type: ignore[arg-type]
                f"{median([float(x['cmds']) for x in rs]):.2f}",  # type: ignore[arg-type]
                f"{median([float(x['client_us']) for x in rs]):.0f}",  # type: ignore[arg-type]
                f"{median([float(x['server_us']) for x in rs]):.0f}",  # type: ignore[arg-type]
            ])  # fmt: skip
        print(table(
            ["variant", "items/s", "ours is", "requests/item", "commands/item (incl. Lua)",
             "client CPU us/item", "server CPU us/item"],
            rows,
        ))  # fmt: skip
        if "gather" in results:
            gather = median([float(x["rate"]) for x in results["gather"]])  # type: ignore[arg-type]
            print(f"target: >= 50,000 items/s and >= 10x gathered enqueue_job -> "
                  f"{ours_rate:,.0f}/s, {ours_rate / gather:.1f}x")  # fmt: skip
        print_breakdowns({name: results[name] for name in names}, "commands/item")
        hlen, mem = results["ours"][-1]["inflight"]  # type: ignore[misc]
        print(f"after our last round (jobs still queued): in-flight hash holds {hlen} entries "
              f"({mem / 1e6:.1f} MB)")  # fmt: skip
        print(run_async(inflight_after_jobs_finish(url), args.loop))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
