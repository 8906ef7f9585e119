"""Initializer: writing many items into a poller's shards, resumably.

OURS: ``worker.duties.initializer.Initializer`` running an async generator that yields batches of
``--batch`` items (1000) for a poller with ``--shards`` shards (4); each batch and its
checkpoint go in one fenced CHECKPOINT script. A static lock value is set so the fence passes.

BASELINE: the same generator, each item written with its own ``ZADD`` into its shard,
pipelined (non-transactional) in chunks of 1000 — fast, but neither atomic per batch nor
resumable.

Each run is a fresh child process (so ``resource.getrusage`` peak RSS is that run's own) against
a fresh keyspace; rounds are interleaved. "ours at N/5" is run too: if memory is bounded, the
peak RSS does not grow with N.

    python bench/initializer.py            # 1M items, 2 rounds (~2 min)
    python bench/initializer.py --quick    # 200k items, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    BenchLease,
    child_env,
    commandstats,
    delta,
    machine,
    median,
    print_breakdowns,
    print_machine,
    python,
    rotated,
    run_async,
    server_cpu,
    start_server,
    table,
)
from worker.app import App
from worker.client import Client, connect_redis
from worker.context import Context
from worker.core.clock import SystemClock, ms
from worker.core.serializer import get_serializer
from worker.duties.initializer import Initializer, InitializerDef
from worker.polls import PollerDef
from worker.settings import Settings
from worker.storage import keys as K
from worker.storage.store import FencedStore, Store

KEYS = K.Keys("bench:")
LOCK_VALUE = "1:bench-static-lock"
DUE = 4_000_000_000.0  # far future: nothing dispatches these
OUR_REQUESTS = {"evalsha", "eval", "script|load"}


def rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


# -- child -------------------------------------------------------------------------------------
async def child(kind: str, url: str, n: int, batch: int, shards: int) -> dict[str, float]:
    async def seed(
        ctx: Context, cursor: str | None
    ) -> AsyncIterator[tuple[str, Mapping[str, float]]]:
        start = int(cursor) if cursor else 0
        for first in range(start, n, batch):
            last = min(first + batch, n)
            yield str(last), {f"item-{i:07d}": DUE for i in range(first, last)}

    app = App("bench-init")
    poller = PollerDef("bench", task="noop", shards=shards)
    idef = InitializerDef("seed", seed, "v1", poller="bench")
    ser, _ = get_serializer("msgpack")
    redis = connect_redis(url, queue_name=KEYS.queue)
    client = Client(redis, keys=KEYS, serialize=ser, app=app)
    ctx = Context(Settings(), redis, client, SystemClock(), "bench")
    await redis.ping()
    rss0 = rss_mb()
    t0 = time.perf_counter()
    if kind == "ours":
        fenced = FencedStore(Store(redis, KEYS), BenchLease(LOCK_VALUE))
        init = Initializer(idef, poller, ctx, fenced, SystemClock())
        await init.run(asyncio.Event())
    else:
        pipe = redis.pipeline(transaction=False)
        queued = 0
        async for _cursor, items in seed(ctx, None):
            for item, due in items.items():
                pipe.zadd(KEYS.poll_shard(poller.name, poller.shard_of(item)), {item: ms(due)})
                queued += 1
                if queued == 1000:
                    await pipe.execute()
                    queued = 0
        if queued:
            await pipe.execute()
    secs = time.perf_counter() - t0
    await redis.aclose(close_connection_pool=True)
    return {"secs": secs, "rss0_mb": rss0, "peak_mb": rss_mb(), "end_mb": current_rss_mb()}


# -- parent ------------------------------------------------------------------------------------
VARIANTS = {
    "ours": "ours: Initializer (CHECKPOINT script per batch)",
    "naive": "baseline: per-item ZADD, pipelined x1000",
    "ours-fifth": "ours at N/5 (memory check)",
}


def run_once(kind: str, url: str, n: int, batch: int, shards: int) -> dict[str, Any]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    r.set(KEYS.leader, LOCK_VALUE)
    before, scpu0 = commandstats(r), server_cpu(r)
    out = subprocess.run(
        [python(), __file__, "--child", "ours" if kind.startswith("ours") else "naive",
         url, str(n), str(batch), str(shards)],
        env=child_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"{kind} child failed:\n{out.stderr[-3000:]}")
    after, scpu1 = commandstats(r), server_cpu(r)
    res: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    total = sum(int(r.zcard(KEYS.poll_shard("bench", s))) for s in range(shards))
    if total != n:
        raise AssertionError(f"{kind}: {total} items in the shards, expected {n}")
    if kind.startswith("ours") and r.hget(KEYS.init_state("seed"), "done") != b"1":
        raise AssertionError(f"{kind}: initializer not marked done")
    used = int(r.info("memory")["used_memory"])
    r.close()
    d = delta(after, before)
    d = {k: v for k, v in d.items() if k not in ("hello", "client|setinfo", "ping")}
    reqs = (
        sum(v for k, v in d.items() if k in OUR_REQUESTS)
        if kind.startswith("ours")
        else sum(d.values())
    )
    res.update(
        n=n, rate=n / res["secs"], cmds=sum(d.values()) / n, reqs=reqs / n,
        server_us=(scpu1 - scpu0) / n * 1e6, breakdown=d, server_mb=used / 1e6,
    )  # fmt: skip
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, kind, url, n, batch, shards = sys.argv
        res = run_async(child(kind, url, int(n), int(batch), int(shards)))
        print(json.dumps(res))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, help="items (1M; quick 200k)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (2; quick 1)")
    ap.add_argument("--batch", type=int, default=1000, help="items per yielded batch")
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    n = args.n or (200_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 2)

    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"{n} items, batches of {args.batch}, {args.shards} shards, {rounds} rounds")
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in VARIANTS}
        names = list(VARIANTS)
        for rnd in range(rounds):
            order = rotated(names, rnd)
            for kind in order:
                size = n // 5 if kind == "ours-fifth" else n
                res = run_once(kind, url, size, args.batch, args.shards)
                results[kind].append(res)
                print(f"round {rnd + 1} {kind:10s} {size:8d} items in {res['secs']:6.2f} s = "
                      f"{res['rate']:8.0f} items/s; peak RSS {res['peak_mb']:.1f} MB "
                      f"(peak before the run {res['rss0_mb']:.1f} MB, RSS at end "
                      f"{res['end_mb']:.1f} MB)", flush=True)  # fmt: skip

        print()
        print("## Initializer writes (median of rounds)")
        ours = median([x["rate"] for x in results["ours"]])
        rows = []
        for kind, label in VARIANTS.items():
            rs = results[kind]
            rate = median([x["rate"] for x in rs])
            rows.append([
                label, f"{rs[0]['n']:,}", f"{median([x['secs'] for x in rs]):.1f}",
                f"{rate:,.0f}", "1x" if kind == "ours" else f"{ours / rate:.2f}x",
                f"{median([x['peak_mb'] for x in rs]):.1f} "
                f"(+{median([x['peak_mb'] - x['rss0_mb'] for x in rs]):.1f})",
                f"{median([x['reqs'] for x in rs]):.4f}",
                f"{median([x['cmds'] for x in rs]):.2f}",
                f"{median([x['server_us'] for x in rs]):.1f}",
            ])  # fmt: skip
        print(table(
            ["variant", "items", "seconds", "items/s", "ours is", "peak RSS MB (+ during run)",
             "requests/item", "commands/item (incl. Lua)", "server CPU us/item"],
            rows,
        ))  # fmt: skip
        secs = median([x["secs"] for x in results["ours"]])
        print(f"target: 1M items in <= 30 s with bounded memory -> {n:,} in {secs:.1f} s "
              f"(1M pro rata {secs * 1_000_000 / n:.1f} s)")  # fmt: skip
        print(f"server used_memory after {n:,} items: {results['ours'][-1]['server_mb']:.0f} MB")
        print_breakdowns(results, "commands/item")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
