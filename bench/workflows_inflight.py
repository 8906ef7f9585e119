"""Plain jobs with 1,000 workflows in flight: does a consumer's throughput on plain jobs change?

A ``python -m worker run --role consumer`` process serving the ``default`` queue drains N
no-op jobs (due at one instant, as ``bench/consumer.py`` fills them) in three variants, rounds
interleaved:

- ``none``: no workflow;
- ``parked``: 1,000 workflows started first (chains of 8 steps), their steps queued on a queue
  this consumer does not serve: the workflows' state sits in Redis, nothing moves it;
- ``moving``: the same 1,000 workflows, and a second consumer process serving their queue
  (concurrency 200, steps sleeping 0.3 s): they advance while the plain jobs drain (the
  second process shares the machine's cores: its CPU shows in the figure too);
- ``hops``: the control for ``moving``: no workflow, the second process runs 1,000 plain jobs
  that each enqueue their next (8 hops of 0.3 s): the same jobs, the same process, without the
  workflow engine.

Per variant: plain jobs per second, Redis commands per plain job (all commands in the drain
window: with ``moving`` they include the workflows'), and the measured consumer's CPU per job;
at the end of each drain the workflows still running are counted (all 1,000 must be).

    python bench/workflows_inflight.py                     # 5,000 jobs, 3 rounds
    python bench/workflows_inflight.py --jobs 2000 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis as redis_sync

from bench._common import (
    announce,
    fill_noop_queue,
    loadavg,
    machine,
    median,
    print_machine,
    rotated,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    time_drain,
    wait_until,
    worker_env,
)
from worker import App, Job, JobContext, chain
from worker.storage.keys import Keys

PREFIX = "bwf:"
KEYS = Keys(PREFIX)
WORKFLOWS, STEPS, STEP_S = 1000, 8, 0.3

app = App("bench-workflows-inflight")


@app.task
async def noop(ctx: JobContext, *args: Any) -> None:
    return None


@app.task(queue="flows")
async def step(ctx: JobContext, *args: Any) -> float:
    await asyncio.sleep(STEP_S)
    return STEP_S


@app.task(queue="flows")
async def hop(ctx: JobContext, left: int) -> None:
    await asyncio.sleep(STEP_S)
    if left > 1:
        await ctx.enqueue("hop", left - 1)


def _consumer(url: str, queue: str, log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    env = worker_env(
        url, "bench.workflows_inflight:app", PREFIX, WORKER_QUEUES=queue,
        WORKER_CONCURRENCY=str(concurrency), WORKER_LOG_FORMAT="console",
        WORKER_LOG_LEVEL="WARNING",
    )  # fmt: skip
    return spawn_worker("consumer", env, log)


async def _start(url: str, n: int, hops: bool) -> None:
    """``n`` workflows (chains of :data:`STEPS` steps), or ``n`` plain self-enqueuing jobs."""
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX, app=app)  # its steps' queue
    try:
        flow = chain(*(Job("step", i) for i in range(STEPS)))
        for _ in range(n):
            await (client.enqueue("hop", STEPS) if hops else client.start_workflow(flow))
    finally:
        await client.close()


def _running(r: redis_sync.Redis) -> int:
    ids = [i.decode() for i in r.zrange(f"{PREFIX}workflows", 0, -1)]
    pipe = r.pipeline(transaction=False)
    for wid in ids:
        pipe.hget(f"{PREFIX}wf:{wid}", "state")
    return sum(1 for s in pipe.execute() if s == b"running")


def run_once(
    variant: str, url: str, n: int, logdir: Path, rnd: int, flows: int = WORKFLOWS
) -> dict[str, Any]:
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    procs = [_consumer(url, "default", logdir / f"{variant}-{rnd}.log", 50)]
    try:
        if variant != "none":
            asyncio.run(_start(url, flows, hops=variant == "hops"))
        if variant in ("moving", "hops"):
            # 200 slots for 1,000 workflows: their 8 steps keep them moving ~12 s, past the
            # drain; fewer workflows (the suite's tiny run) get fewer slots for as long
            slots = max(1, min(200, flows // 5))
            procs.append(_consumer(url, "flows", logdir / f"flows-{rnd}.log", slots))
        wait_until(lambda: sum(1 for _ in r.scan_iter(f"{PREFIX}arq-health:*")) >= len(procs),
                   30, "the consumers to start")  # fmt: skip
        time.sleep(1.0)
        t0_wall = time.time() + 1.0 + n / 10_000
        fill_noop_queue(r, PREFIX, n, int(t0_wall * 1000))
        announce(r, PREFIX, int(t0_wall * 1000))
        ps = psutil.Process(procs[0].pid)
        queue = KEYS.queue
        res = time_drain(r, ps, n, t0_wall, lambda: int(r.zcard(queue)), {"zcard": 1}, variant)
        res["running"] = _running(r) if variant in ("parked", "moving") else 0
        res["busy"] = int(r.zcard(KEYS.queue_of("flows")))  # its jobs queued or running
    finally:
        stop_procs(procs, 15)
    r.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workflows", type=int, default=WORKFLOWS, help="workflows in flight")
    args = ap.parse_args()
    server, url = start_server()
    variants = ["none", "parked", "moving", "hops"]
    seen: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        print_machine(machine(url))
        print(f"load: {loadavg()}")
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                for v in rotated(variants, rnd):
                    res = run_once(v, url, args.jobs, Path(tmp), rnd, args.workflows)
                    seen[v].append(res)
                    print(f"round {rnd + 1} {v}: {res['rate']:.0f} jobs/s, {res['cmds']:.1f} "
                          f"cmds/job, consumer {res['worker_us']:.0f} us/job; at the end: "
                          f"workflows running {res['running']}, "
                          f"flows queue {res['busy']}")  # fmt: skip
                    if v in ("parked", "moving") and res["running"] != args.workflows:
                        raise AssertionError(
                            f"{v}: {res['running']} workflows in flight at the end"
                        )
        rows = [
            [v, f"{median([s['rate'] for s in seen[v]]):.0f}",
             f"{median([s['cmds'] for s in seen[v]]):.1f}",
             f"{median([s['worker_us'] for s in seen[v]]):.0f}"]
            for v in variants
        ]  # fmt: skip
        print(f"\n## {args.jobs:,} plain no-op jobs beside {args.workflows:,} workflows (or plain "
              f"chains) in flight (median of {args.rounds} rounds)")  # fmt: skip
        print(table(["workflows", "plain jobs/s", "Redis cmds/job", "consumer CPU us/job"], rows))
        print(f"load after: {loadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
