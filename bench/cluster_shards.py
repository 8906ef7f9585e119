"""``python -m bench cluster``'s sharded queue parts: one app whose queue is split over 3 shards
(``WORKER_QUEUE_SHARDS=3``) on a 3-primary cluster against the same app with one shard, and the
shard primaries SIGKILLed mid-drain (``--failover``, harness/shard_failover.py).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    fill_noop_queue,
    measure_drain,
    median,
    spawn_worker,
    stop_procs,
    table,
    wait_until,
    worker_env,
)
from harness.realredis import RealRedis
from harness.shard_failover import KillOutcome, ShardKill
from harness.topology import Cluster
from worker.storage.shards import shard_prefixes, slot_of_prefix

#: the app of the sharded runs (its home slot decides where its shards land)
PREFIX = "{bench}:"


def drain_sharded(
    cluster: Cluster, shards: int, n: int, consumers: int, logdir: Path, tag: str
) -> dict[str, Any]:
    """``consumers`` consumer processes of one app with ``shards`` queue shards drain ``n``
    no-op jobs (``n / shards`` in each shard's queue); per primary: the app's commands and
    server CPU during the drain; the replicas' CPU summed."""
    prefixes = shard_prefixes(PREFIX, shards)
    masters = cluster.masters
    owner_idx = [masters.index(cluster.owner(slot_of_prefix(p))) for p in prefixes]
    nodes = [m.client() for m in masters]
    replicas = [r.client() for r in cluster.replicas]
    for c in nodes:
        c.flushall()
    env = worker_env(
        cluster.url(), "bench.apps:noop_app", PREFIX, WORKER_QUEUE_SHARDS=str(shards),
        WORKER_LOG_LEVEL="WARNING",
    )  # fmt: skip
    procs = [spawn_worker("consumer", env, logdir / f"{tag}-{i}.log") for i in range(consumers)]
    home = nodes[owner_idx[0]]
    try:
        wait_until(lambda: home.zcard(f"{PREFIX}instances") >= consumers, 60, "consumers start")
        time.sleep(0.5)
        due = int((time.time() + 1.0 + n / 40_000) * 1000)
        per_shard = [n // shards + (1 if i < n % shards else 0) for i in range(shards)]
        for p, i, count in zip(prefixes, owner_idx, per_shard, strict=True):
            fill_noop_queue(nodes[i], p, count, due)
        queues = [(i, f"{p}queue") for p, i in zip(prefixes, owner_idx, strict=True)]
        res = measure_drain(nodes, queues, procs, due, f"{tag} (logs in {logdir})", replicas)
        per_node, secs = res["per_node"], res["secs"]
        total_cmds = sum(p["cmds"] for p in per_node)
        return {
            "secs": secs,
            "rate": n / secs,
            "per_node": per_node,
            "shares": [p["cmds"] / total_cmds for p in per_node],
            "cmds_per_job": total_cmds / n,
            "server_us_per_job": sum(p["cpu_s"] for p in per_node) / n * 1e6,
            "replica_us_per_job": res["replica_cpu_s"] / n * 1e6,
            "worker_us_per_job": res["worker_cpu_s"] / n * 1e6,
            "owners": owner_idx,
        }
    finally:
        stop_procs(procs, 20)
        for c in nodes + replicas:
            c.close()


def report_sharded(results: dict[int, list[dict[str, Any]]], consumers: int, n: int) -> None:
    """The one-shard vs three-shard table, per-primary shares and the targets' verdicts."""
    print(f"\n## One app, its queue in 1 vs 3 shards ({consumers} consumers, {n:,} jobs a run, "
          "median of rounds)")  # fmt: skip
    rows = []
    for shards, rs in sorted(results.items()):
        shares = [median([r["shares"][i] for r in rs]) * 100 for i in range(3)]
        rows.append([
            f"{shards} shard{'s' if shards > 1 else ''}",
            f"{median([r['rate'] for r in rs]):,.0f}",
            f"{median([r['cmds_per_job'] for r in rs]):.2f}",
            f"{median([r['server_us_per_job'] for r in rs]):.1f}",
            f"{median([r['replica_us_per_job'] for r in rs]):.1f}",
            f"{median([r['worker_us_per_job'] for r in rs]):.0f}",
            " / ".join(f"{s:.0f} %" for s in shares),
        ])  # fmt: skip
    print(table(["queue", "jobs/s", "commands/job", "primaries' CPU us/job",
                 "replicas' CPU us/job", "worker CPU us/job",
                 "app's commands per primary (0 / 1 / 2)"], rows))  # fmt: skip
    if 1 in results and 3 in results:
        one = median([r["server_us_per_job"] for r in results[1]])
        three = median([r["server_us_per_job"] for r in results[3]])
        low = min(min(r["shares"]) for r in results[3]) * 100
        print(f"every primary's share of the app's commands with 3 shards: lowest {low:.1f} % "
              f"over the rounds (target >= 20 %: {'met' if low >= 20 else 'NOT met'}); "
              f"primaries' CPU per job 3 shards vs 1: {three:.1f} vs {one:.1f} us "
              f"({(three / one - 1) * 100:+.1f} %, target within 10 %: "
              f"{'met' if abs(three / one - 1) <= 0.10 else 'NOT met'}); jobs/s 3 shards vs 1: "
              f"{median([r['rate'] for r in results[3]]) / median([r['rate'] for r in results[1]]):.2f}x")  # noqa: E501  # fmt: skip


def failover(kills: int, backlog: int, verbose: bool) -> None:
    """``kills`` SIGKILLs of a shard's primary mid-drain (3 shards on 3 primaries + 1 replica
    each), turn by turn a non-home shard and the home; the killed node rejoins as a replica."""
    logs = Path(tempfile.mkdtemp(prefix="bench-cluster-failover-"))
    ledger = RealRedis()
    ledger.start()
    outcomes: list[KillOutcome] = []
    try:
        with Cluster(masters=3, replicas=1, node_timeout_ms=1000) as cluster:
            print(f"{kills} kills, 3 shards on 3 primaries + 1 replica each (node timeout 1 s), "
                  f"2 --role all, a backlog of {backlog:,} jobs; logs in {logs}")  # fmt: skip
            for k in range(kills):
                target = (2, 0, 1)[k % 3]
                run_logs = logs / f"kill-{k + 1}"
                run_logs.mkdir()
                kill = ShardKill(
                    cluster, ledger.url, run_logs, shards=3, kill_shard=target, backlog=backlog,
                    say=print if verbose else (lambda _: None),
                )  # fmt: skip
                out = kill.run(bring_back=True)
                outcomes.append(out)
                print(f"kill {k + 1}: {out.summary()}", flush=True)
    finally:
        ledger.close()
    rows = [
        [
            i, f"{o.kill_shard}{' (home)' if o.kill_shard == 0 else ''}",
            f"{o.ran_before_kill}/{o.backlog}", o.acked, len(o.lost), len(o.ticks),
            len(o.ticks_twice), f"{o.promoted_after_s:.2f}",
            "-" if o.ticks_back_after_s is None else f"{o.ticks_back_after_s:.2f}",
            "-" if o.tick_ran_after_s is None else f"{o.tick_ran_after_s:.2f}",
            "-" if o.drained_after_s is None else f"{o.drained_after_s:.2f}",
        ]
        for i, o in enumerate(outcomes, 1)
    ]  # fmt: skip
    print("\n## A shard's primary SIGKILLed mid-drain (3 shards)")
    print(table(["kill", "shard killed", "backlog run before", "acked", "acked lost", "ticks",
                 "run twice", "kill -> promoted s", "kill -> ticks enqueued again s",
                 "kill -> that tick ran s", "kill -> every acked job ran s"], rows))  # fmt: skip
    backs = [o.ticks_back_after_s for o in outcomes if o.ticks_back_after_s is not None]
    worst = f", kill -> ticks enqueued again max {max(backs):.2f} s" if backs else ""
    print(f"totals: acked lost {sum(len(o.lost) for o in outcomes)}, ticks run twice "
          f"{sum(len(o.ticks_twice) for o in outcomes)}, ticks back within 10 s "
          f"{sum(1 for o in outcomes if o.ok)}/{len(outcomes)}{worst}")  # fmt: skip
