"""A primary failover under real workers, many times: what it costs (time to the first tick)
and what it breaks (duplicates, misses, lost acknowledged enqueues, singleton overlaps).

Each run is harness/failover_scenario.py (the CI test tests/system/test_failover.py runs it once per
topology): a primary + 2 replicas + 3 Sentinels (failure detected after 1 s), or a Redis
Cluster of 3 primaries with 2 replicas each (node timeout 1 s; the app's slot's primary is the
one killed); 3 ``leader`` + 2 ``consumer`` processes, a client enqueueing all along; the
primary SIGKILLed right after an initializer checkpoint, right after a tick, right after a poll
dispatch batch, the old primary brought back as a replica after each. Ledgers on a server that
is never faulted.

``python -m bench failover --runs 5`` (about a minute a run); ``--topology cluster``;
``--wait-replicas 0`` runs the same without durable writes (what WAIT buys), ``auto`` with the
workers' default. ``--replicas 1 --never-back --wait-replicas auto``: the most common topology
(1 primary + 1 replica), the primary killed once after a poll dispatch batch and never brought
back (a fresh topology per run); ``--wait-replicas 1`` there shows the strict policy's outage.
``--cpu-hogs 6 --topology cluster --wait-replicas auto``: the same on a loaded machine (busy
loops beside it), where a live consumer whose replies came back late was once reaped (its
heartbeat scored with a late copy of the server's clock) and poll items ran twice.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench._common import loadavg, machine, median, print_machine, table
from harness.failover_scenario import Outcome, Scenario
from harness.realredis import RealRedis
from harness.topology import Cluster, SentinelSet
from worker.runtime.embedded import death_signal_hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="scenario runs (3)")
    ap.add_argument("--topology", choices=("sentinel", "cluster"), default="sentinel")
    ap.add_argument(
        "--wait-replicas",
        default="1",
        help="WORKER_REDIS_WAIT_REPLICAS of the workers and the enqueueing client: a number or "
        "auto (1)",
    )
    ap.add_argument("--replicas", type=int, default=2, help="replicas per primary (2)")
    ap.add_argument(
        "--never-back",
        action="store_true",
        help="kill the primary once (after a dispatch batch) and never bring it back",
    )
    ap.add_argument(
        "--down-after-ms",
        type=int,
        default=1000,
        help="Sentinel down-after / cluster node timeout (1000)",
    )
    ap.add_argument(
        "--cpu-hogs",
        type=int,
        default=0,
        help="busy-loop processes beside the run (a loaded machine: 6 on 2 cores put the load "
        "at ~15, where the Cluster run once put poll items twice; 0)",
    )
    ap.add_argument("--verbose", action="store_true", help="print each step")
    ap.add_argument("--smoke", action="store_true",
                    help="does it run: one --never-back run")  # fmt: skip
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.never_back = 1, True
    wait = None if args.wait_replicas == "auto" else int(args.wait_replicas)
    faults = ("dispatch",) if args.never_back else ("checkpoint", "tick", "dispatch")
    logs = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    ledger = RealRedis(extra_args=("--appendfsync", "everysec"))
    ledger.start()
    outcomes: list[Outcome] = []

    def topology() -> SentinelSet | Cluster:
        if args.topology == "sentinel":
            return SentinelSet(
                replicas=args.replicas, down_after_ms=args.down_after_ms, failover_timeout_ms=3000
            )
        return Cluster(masters=3, replicas=args.replicas, node_timeout_ms=args.down_after_ms)

    def one_run(s: SentinelSet | Cluster, i: int) -> None:
        run_logs = logs / f"run-{i + 1}"
        run_logs.mkdir()
        scenario = Scenario(
            s, ledger.url, run_logs, wait_replicas=wait,
            say=print if args.verbose else (lambda _: None),
        )  # fmt: skip
        o = scenario.run(faults, bring_back=not args.never_back)
        outcomes.append(o)
        print(f"run {i + 1}: {o.summary()} (load {loadavg()})", flush=True)

    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=death_signal_hook())
        for _ in range(args.cpu_hogs)
    ]
    try:
        print_machine(machine())
        print(f"{args.runs} runs on {args.topology} ({args.replicas} replica(s)), "
              f"WORKER_REDIS_WAIT_REPLICAS={args.wait_replicas}, failure detection "
              f"{args.down_after_ms} ms; worker logs in {logs}")  # fmt: skip
        if args.never_back:  # the killed primary stays dead: a fresh topology per run
            for i in range(args.runs):
                with topology() as s:
                    one_run(s, i)
        else:
            with topology() as s:
                for i in range(args.runs):
                    one_run(s, i)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        ledger.close()
    report(outcomes, args.topology)


def report(outcomes: list[Outcome], topology: str) -> None:
    rows: list[list[Any]] = []
    for i, o in enumerate(outcomes, 1):
        k = [x.first_tick_after_s for x in o.kills]
        p = [x.promoted_after_s for x in o.kills]
        rows.append([
            i, len(o.ticks), len(o.tick_duplicates), len(o.tick_misses),
            f"{o.items_expected - o.item_misses}/{o.items_expected}", len(o.item_duplicates),
            f"{o.acked}", len(o.lost), len(o.job_duplicates), f"{o.enqueue_outage_s:.2f}",
            len(o.overlaps),
            f"{o.init_items}/{o.init_expected}",
            max(0, len(o.primaries) - 1 - len(o.kills)),
            " / ".join(f"{x:.2f}" for x in p),
            " / ".join("-" if x is None else f"{x:.2f}" for x in k),
        ])  # fmt: skip
    print(f"\n## Primary failover (SIGKILL, {topology}) under 3 leaders + 2 consumers")
    print(table(
        ["run", "ticks", "run twice", "missed", "poll items run", "item twice",
         "acked enqueues", "acked lost", "job twice", "longest enqueue outage s",
         "singleton overlaps", "init items", "failovers nobody caused",
         "kill -> promoted s (1 / 2 / 3)", "kill -> first tick due after it ran s (1 / 2 / 3)"],
        rows,
    ))  # fmt: skip
    firsts = [x.first_tick_after_s for o in outcomes for x in o.kills if x.first_tick_after_s]
    promos = [x.promoted_after_s for o in outcomes for x in o.kills]
    if firsts:
        print(f"kill -> first tick: median {median(firsts):.2f} s, max {max(firsts):.2f} s over "
              f"{len(firsts)} kills; kill -> promoted: median {median(promos):.2f} s, max "
              f"{max(promos):.2f} s")  # fmt: skip
    totals = {
        "ticks run twice": sum(len(o.tick_duplicates) for o in outcomes),
        "ticks missed": sum(len(o.tick_misses) for o in outcomes),
        "poll items run twice": sum(len(o.item_duplicates) for o in outcomes),
        "poll items never run": sum(o.item_misses for o in outcomes),
        "acknowledged enqueues lost": sum(len(o.lost) for o in outcomes),
        "jobs run twice": sum(len(o.job_duplicates) for o in outcomes),
        "singleton overlaps": sum(len(o.overlaps) for o in outcomes),
        # a live primary deposed (by an overloaded Sentinel, say): see README "Scale", Limits
        "failovers nobody caused": sum(
            max(0, len(o.primaries) - 1 - len(o.kills)) for o in outcomes
        ),
    }
    print("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))


if __name__ == "__main__":
    main()
