"""The enqueue phase of ``python -m bench peers``: N no-op jobs enqueued into an empty keyspace
with nothing consuming, ours (``Client.enqueue_many``; ``Client.enqueue`` gathered 1,000 at a
time) beside saq's own client (``Queue.enqueue`` gathered 1,000 at a time, its fill).

Each run: flushed keyspace, a connected client that has enqueued one job already (connection,
script and clock warm), then the time to enqueue N jobs, all acknowledged (the jobs are then
counted in Redis). Commands per job from INFO commandstats, server CPU per job from INFO cpu,
client CPU per job from the enqueueing process (ours: this process, on uvloop; saq: its child
in its own venv, which reports its own time and CPU).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis as redis_sync

from bench._common import ROOT, commandstats, delta, median, rotated, run_async, server_cpu, table

PREFIX = "bench:"
GATHER = 1000
LABELS = {
    "ours-many": "**ours**: `Client.enqueue_many` (500 per round trip)",
    "ours-gathered": "ours: `Client.enqueue`, gathered ×1,000",
    "saq": "saq {saq}: `Queue.enqueue`, gathered ×1,000",
}


async def _ours(url: str, n: int, many: bool) -> tuple[float, float]:
    from bench.apps import noop_app
    from worker.client import Client

    client = await Client.connect(url, app=noop_app, key_prefix=PREFIX)
    try:
        await client.enqueue("noop", -1)  # warm: connection, scripts, the server clock
        await client.enqueue_many([("noop", (-2,))])
        cpu0, t0 = time.process_time(), time.perf_counter()
        if many:
            ids = await client.enqueue_many([("noop", (i,)) for i in range(n)])
        else:
            ids = []
            for lo in range(0, n, GATHER):
                chunk = range(lo, min(n, lo + GATHER))
                ids += await asyncio.gather(*(client.enqueue("noop", i) for i in chunk))
        secs, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await client.close()
    if None in ids:
        raise AssertionError("an enqueue was refused")
    return secs, cpu


def _saq(py: Path, url: str, n: int) -> tuple[float, float]:
    own = ("WORKER_", "PYTHON", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    script = ROOT / "bench" / "peer_apps" / "saq_app.py"
    out = subprocess.run(
        [str(py), str(script), "fill", url, str(n)], capture_output=True, text=True, timeout=600,
        cwd=ROOT, env=env,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"saq fill exited {out.returncode}: {out.stderr[-300:]}")
    timing = json.loads(out.stdout.strip().splitlines()[-1])
    return float(timing["secs"]), float(timing["cpu"])


def run_once(name: str, url: str, n: int, saq_py: Path | None) -> dict[str, Any]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    runs: dict[str, Callable[[], tuple[float, float]]] = {
        "ours-many": lambda: run_async(_ours(url, n, many=True)),
        "ours-gathered": lambda: run_async(_ours(url, n, many=False)),
        "saq": lambda: _saq(saq_py, url, n) if saq_py else (0.0, 0.0),
    }
    before, scpu0 = commandstats(r), server_cpu(r)
    secs, cpu = runs[name]()
    d, scpu = delta(commandstats(r), before), server_cpu(r) - scpu0
    queued = int(r.zcard("saq:default:incomplete" if name == "saq" else f"{PREFIX}queue"))
    r.close()
    if queued < n:
        raise AssertionError(f"{name}: {queued} jobs queued after enqueueing {n}")
    return {
        "rate": n / secs, "secs": secs, "cmds": sum(d.values()) / n,
        "client_us": cpu / n * 1e6, "server_us": scpu / n * 1e6, "breakdown": d,
    }  # fmt: skip


def phase(url: str, n: int, rounds: int, saq_py: Path | None, saq_version: str) -> None:
    """Run the phase's rounds (interleaved, order rotating) and print its table."""
    names = ["ours-many", "ours-gathered", *(["saq"] if saq_py else [])]
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    for rnd in range(rounds):
        for name in rotated(names, rnd):
            res = run_once(name, url, n, saq_py)
            results[name].append(res)
            print(f"enqueue round {rnd + 1} {name:13s} {n} jobs in {res['secs']:5.2f} s = "
                  f"{res['rate']:7.0f} jobs/s, {res['cmds']:.1f} cmds/job, client CPU "
                  f"{res['client_us']:.0f} us/job, server CPU {res['server_us']:.0f} us/job",
                  flush=True)  # fmt: skip
    rate = {k: median([x["rate"] for x in v]) for k, v in results.items()}
    print()
    print(f"## Enqueue: {n:,} no-op jobs, nothing consuming (median of {rounds} rounds)")
    print()
    rows = [
        [LABELS[k].format(saq=saq_version), f"{rate[k]:,.0f}",
         "1×" if k == "ours-many" else f"{rate['ours-many'] / rate[k]:.2f}×",
         f"{median([x['cmds'] for x in rs]):.1f}", f"{median([x['client_us'] for x in rs]):.0f}",
         f"{median([x['server_us'] for x in rs]):.1f}"]
        for k, rs in results.items()
    ]  # fmt: skip
    print(table(["enqueue", "jobs/s", "ours is", "Redis commands/job", "client CPU µs/job",
                 "server CPU µs/job"], rows))  # fmt: skip
    if "saq" in rate:
        ratio = rate["ours-many"] / rate["saq"]
        print(f"target: enqueue_many >= 1.5x saq -> {ratio:.2f}x "
              f"({'met' if ratio >= 1.5 else 'MISSED'})")  # fmt: skip
    else:
        print("saq not measured (skipped or not selected): no target ratio")
