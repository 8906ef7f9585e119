"""Redis Cluster: what one app costs each node, and how several apps spread over the nodes.

A 3-node cluster on this machine (``valkey-server --cluster-enabled yes``, no replicas) and,
for comparison, one plain server. Every key of an app shares one hash slot (its hash-tagged
``WORKER_KEY_PREFIX``), so an app's whole load lands on the node serving that slot:

1. **single**: one plain server, one consumer draining N no-op jobs (the reference);
2. **cluster, one app**: the same on the cluster (``redis+cluster://``): commands per job,
   and each node's commands and CPU during the drain;
3. **cluster, three apps**: three apps whose slots are on three different nodes, one consumer
   each, N jobs each, drained at once: the split of commands and server CPU over the nodes.

4. **cluster, one app, 3 queue shards** (``WORKER_QUEUE_SHARDS=3``; bench/cluster_shards.py): a
   cluster of 3 primaries with a replica each, one app with ``--consumers`` consumers draining N
   jobs, its queue in 1 shard and in 3 shards, the two interleaved round by round: each
   primary's share of the app's commands, server CPU per job (the primaries' summed), jobs/s.

The box has 2 cores shared by the nodes, the consumers and the harness, so total jobs/s says
little; per-node load and commands per job are the figures. ``python -m bench cluster``
(``--n``, ``--rounds``, ``--consumers``); ``--failover KILLS``: instead, a shard's primary
SIGKILLed mid-drain KILLS times (harness/shard_failover.py; ``--backlog``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import redis as redis_sync
from redis.crc import key_slot

from bench import cluster_shards as shards
from bench._common import (
    fill_noop_queue,
    fmt_breakdown,
    machine,
    measure_drain,
    median,
    print_machine,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    wait_until,
    worker_env,
)
from harness.topology import Cluster


def prefixes_on(cluster: Cluster, count: int) -> list[tuple[str, int]]:
    """``count`` hash-tagged prefixes whose slots are served by ``count`` different nodes:
    ``(prefix, index of the node in cluster.masters)``."""
    found: dict[int, str] = {}
    for i in range(10_000):
        prefix = f"{{app{i}}}:"
        node = cluster.owner(key_slot(prefix.encode()))
        idx = cluster.masters.index(node)
        found.setdefault(idx, prefix)
        if len(found) == count:
            break
    return [(p, idx) for idx, p in sorted(found.items())]


def drain(
    url: str, nodes: list[redis_sync.Redis], apps: list[tuple[str, int]], n: int, logdir: Path,
    tag: str,
) -> dict[str, Any]:  # fmt: skip
    """Start one consumer per app (``(prefix, index of its node in nodes)``), fill ``n`` jobs
    each, time until every queue is empty; per node: commands and server CPU during the drain."""
    procs = []
    for i, (prefix, _) in enumerate(apps):
        env = worker_env(url, "bench.apps:noop_app", prefix, WORKER_LOG_LEVEL="WARNING")
        procs.append(spawn_worker("consumer", env, logdir / f"{tag}-{i}.log"))
    try:
        for prefix, i in apps:
            wait_until(
                lambda p=prefix, c=nodes[i]: c.zcard(f"{p}instances") >= 1, 30, "consumer start"
            )
        time.sleep(0.5)
        due = int((time.time() + 1.0 + len(apps) * n / 40_000) * 1000)
        for prefix, i in apps:
            fill_noop_queue(nodes[i], prefix, n, due)
        queues = [(i, f"{prefix}queue") for prefix, i in apps]
        res = measure_drain(nodes, queues, procs, due, f"{tag} (logs in {logdir})")
        total = len(apps) * n
        per_node = res["per_node"]
        return {
            "secs": res["secs"],
            "rate": total / res["secs"],
            "per_node": per_node,
            "cmds_per_job": sum(p["cmds"] for p in per_node) / total,
            "server_us_per_job": sum(p["cpu_s"] for p in per_node) / total * 1e6,
            "worker_us_per_job": res["worker_cpu_s"] / total * 1e6,
        }
    finally:
        stop_procs(procs, 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="jobs per app per run (20,000)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    ap.add_argument(
        "--consumers", type=int, default=2, help="consumers of the sharded app's runs (2)"
    )
    ap.add_argument(
        "--failover", type=int, default=0, metavar="KILLS",
        help="instead: KILLS SIGKILLs of a shard's primary mid-drain (3 shards)",
    )  # fmt: skip
    ap.add_argument("--backlog", type=int, default=3000, help="--failover: backlog jobs (3000)")
    ap.add_argument("--verbose", action="store_true", help="--failover: print each step")
    args = ap.parse_args()
    if args.failover:
        print_machine(machine())
        shards.failover(args.failover, args.backlog, args.verbose)
        return
    logdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    single, single_url = start_server()
    cluster = Cluster(masters=3, replicas=0).start()
    try:
        print_machine(machine(single_url))
        print(f"{args.n} no-op jobs per app, {args.rounds} rounds; logs in {logdir}")
        plain = redis_sync.Redis.from_url(single_url)
        nodes = [m.client() for m in cluster.masters]
        apps = prefixes_on(cluster, 3)
        results: dict[str, list[dict[str, Any]]] = {"single": [], "one": [], "three": []}
        for rnd in range(args.rounds):
            plain.flushall()
            for c in nodes:
                c.flushall()
            s = drain(single_url, [plain], [("bench:", 0)], args.n, logdir, f"single-{rnd}")
            results["single"].append(s)
            p0, i0 = apps[0]
            one = drain(cluster.url(), nodes, [(p0, i0)], args.n, logdir, f"one-{rnd}")
            results["one"].append(one)
            for c in nodes:
                c.flushall()
            three = drain(cluster.url(), nodes, apps, args.n, logdir, f"three-{rnd}")
            results["three"].append(three)
            print(f"round {rnd + 1}: single {s['rate']:,.0f} jobs/s {s['cmds_per_job']:.2f} "
                  f"cmds/job; cluster one app {one['rate']:,.0f} jobs/s "
                  f"{one['cmds_per_job']:.2f} cmds/job; three apps {three['rate']:,.0f} jobs/s",
                  flush=True)  # fmt: skip
        print("\n## One app (median of rounds)")
        rows = []
        for name in ("single", "one"):
            rs = results[name]
            rows.append([
                "one server" if name == "single" else "3-node cluster",
                f"{median([r['rate'] for r in rs]):,.0f}",
                f"{median([r['cmds_per_job'] for r in rs]):.2f}",
                f"{median([r['server_us_per_job'] for r in rs]):.0f}",
                f"{median([r['worker_us_per_job'] for r in rs]):.0f}",
            ])  # fmt: skip
        print(table(["Redis", "jobs/s", "Redis commands/job", "server CPU us/job",
                     "worker CPU us/job"], rows))  # fmt: skip
        print("\nper node, one app (median of rounds): " + ", ".join(
            f"node {i} ({'the app' if i == apps[0][1] else 'other'}): "
            f"{median([r['per_node'][i]['cmds'] for r in results['one']]):,.0f} commands, "
            f"{median([r['per_node'][i]['cpu_s'] for r in results['one']]):.2f} s CPU"
            for i in range(3)
        ))  # fmt: skip
        print("\n## Three apps, one slot each on a different node (median of rounds)")
        rows = []
        for i in range(3):
            cmds = [r["per_node"][i]["cmds"] for r in results["three"]]
            cpu = [r["per_node"][i]["cpu_s"] for r in results["three"]]
            allc = [sum(p["cmds"] for p in r["per_node"]) for r in results["three"]]
            allcpu = [sum(p["cpu_s"] for p in r["per_node"]) for r in results["three"]]
            share = median([c / a for c, a in zip(cmds, allc, strict=True)]) * 100
            cpu_share = median([c / a for c, a in zip(cpu, allcpu, strict=True)]) * 100
            rows.append([
                f"node {i} (app {next(p for p, j in apps if j == i)})",
                f"{median(cmds):,.0f}", f"{share:.0f} %",
                f"{median(cpu):.2f}", f"{cpu_share:.0f} %",
            ])  # fmt: skip
        print(table(["node", "commands", "share", "server CPU s", "share"], rows))
        three = results["three"]
        print(f"three apps: {median([r['rate'] for r in three]):,.0f} jobs/s together, "
              f"{median([r['cmds_per_job'] for r in three]):.2f} commands/job")  # fmt: skip
        last = results["one"][-1]["per_node"][apps[0][1]]
        print(f"commands/job on the app's node: {fmt_breakdown(last['breakdown'], args.n)}")
    finally:
        cluster.close()
        single.stop()
    sharded(args, logdir)


def sharded(args: argparse.Namespace, logdir: Path) -> None:
    """Part 4 (see the module docstring): 1 vs 3 shards, interleaved, on 3 primaries + 1
    replica each."""
    cluster = Cluster(masters=3, replicas=1).start()
    try:
        results: dict[int, list[dict[str, Any]]] = {1: [], 3: []}
        for rnd in range(args.rounds):
            for n_shards in (1, 3) if rnd % 2 == 0 else (3, 1):
                r = shards.drain_sharded(
                    cluster, n_shards, args.n, args.consumers, logdir, f"shards{n_shards}-{rnd}"
                )
                results[n_shards].append(r)
                spread = " / ".join(f"{x * 100:.0f} %" for x in r["shares"])
                print(f"round {rnd + 1}, {n_shards} shard(s): {r['rate']:,.0f} jobs/s, "
                      f"{r['server_us_per_job']:.1f} us primaries' CPU/job, shares {spread}",
                      flush=True)  # fmt: skip
        shards.report_sharded(results, args.consumers, args.n)
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
