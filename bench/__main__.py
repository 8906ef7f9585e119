"""``python -m bench <name> [options]``: run one benchmark (each is also ``bench/<name>.py``).

For example ``python -m bench peers --quick`` or ``python -m bench consumer --help``; without a
name it lists the benchmarks.
"""

from __future__ import annotations

import importlib
import sys

#: subcommand -> (module with a ``main()`` reading ``sys.argv``, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "peers": ("bench.peers", "no-op throughput: ours vs arq, saq, streaq, taskiq (own venvs)"),
    "consumer": ("bench.consumer", "no-op throughput: ours vs plain arq Worker variants"),
    "dispatch": ("bench.dispatch", "poll dispatch into the arq queue vs enqueue_job"),
    "initializer": ("bench.initializer", "initializer writing 1M items vs pipelined ZADD"),
    "takeover": ("bench.takeover", "leader failover times, idle standby cost"),
    "operations": ("bench.operations", "start-up, drain, orphaned job re-run"),
    "leader": ("bench.leader", "1,000 periodic jobs every second; 10,000 per_key leases"),
    "latency": ("bench.latency", "idle wake-up and tick start latency"),
    "outbox": ("bench.outbox", "PostgreSQL outbox: commit to job start, one by one and bursts"),
    "lane": ("bench.lane", "ticks and poll jobs behind 100,000 user jobs; enqueue_many of 200k"),
    "wait": ("bench.wait", "durable writes: WAIT 1 replica vs none (consumer, enqueue)"),
    "failover": ("bench.failover", "primary SIGKILLed under Sentinel: duplicates, losses, times"),
    "depose": ("bench.depose", "a live primary deposed: WAIT-confirmed writes lost, by policy"),
    "cluster": ("bench.cluster", "3-node Redis Cluster: per-node load, commands per job"),
    "idle": ("bench.idle", "idle fleet: commands/s per idle role, wake latency, reap, takeover"),
    "fleet": ("bench.fleet", "100 near-idle processes: commands/s, claim rounds per enqueued job"),
    "jobs": ("bench.jobs", "jobs listing with 1M queued; cancel latency of running jobs"),
    "web": ("bench.web", "console: 50 instances, 1,000 periodic jobs, 10,000 dead letters"),
    "fair": ("bench.fair", "fair queues: cost per job vs a plain task; a quiet key's wait bound"),
    "workflows": ("bench.workflows", "workflow fan-in: Redis commands and server time per member"),
    "soak": ("bench.soak", "the suite's shortened fault scenarios at their original sizes"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {k.ljust(width)}  {desc}" for k, (_, desc) in COMMANDS.items()]
    return "usage: python -m bench <name> [options]\n\nbenchmarks:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    sys.argv = [f"bench/{name}.py", *rest]  # each main() parses sys.argv as its script would
    module.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
