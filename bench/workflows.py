"""Fan-in cost of a workflow: Redis commands and server time per member of a chord.

A chord of N members and one callback is started on a fresh server; then each member's end is
made exactly as a consumer's ``WorkflowHook`` makes it (``begin_step``, then
``advance_workflow``, then ``enqueue_steps`` of the dependents it answers: the callback, once),
N members in turn, with commandstats read around it. Commands per member count those the
scripts run inside Redis too (commandstats counts them), so an O(1) fan-in shows as a figure
that does not grow with N; the last member's answer carries every member's result (one read of
N fields, once). Sizes run interleaved per round.

    python bench/workflows.py                 # chords of 100, 1,000, 10,000 members, 3 rounds
    python bench/workflows.py --sizes 200 --rounds 1
"""

from __future__ import annotations

import argparse
import time
import uuid

import redis as redis_sync
import redis.asyncio as aioredis

from bench._common import (
    commandstats,
    delta,
    loadavg,
    machine,
    median,
    print_machine,
    run_async,
    server_cpu,
    start_server,
    table,
)
from worker import Job, chord, group
from worker.core.serializer import get_serializer
from worker.core.workflow import compile_flow
from worker.storage import keys as K
from worker.storage.store import Store
from worker.storage.workflows import result_blob

SER, DE = get_serializer("msgpack")


async def fan_in(url: str, n: int) -> tuple[int, float]:
    """Start a chord of ``n`` members and end every member as a consumer does: (how many
    members the callback's input held, wall seconds of the member ends)."""
    r = aioredis.Redis.from_url(url)
    store = Store(r, K.Keys(f"b{uuid.uuid4().hex[:6]}:"))
    try:
        wf = compile_flow(chord(group(Job("m", i) for i in range(n)), Job("cb")))
        wid = uuid.uuid4().hex
        roots = await store.start_workflow(wid, wf, ["default"] * (n + 1), 0, SER)
        await store.enqueue_steps(wid, roots, 0, SER, 86_400_000)
        got, t0 = 0, time.perf_counter()
        for i in range(n):
            await store.begin_step(wid, i)
            moved = await store.advance_workflow(wid, i, True, result_blob(i, SER), 0, 60_000, DE)
            if moved.ready:
                got = len(moved.ready[0].parents)
                await store.enqueue_steps(wid, moved.ready, 0, SER, 86_400_000)
        return got, time.perf_counter() - t0
    finally:
        await r.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000", help="members per chord (comma list)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    server, url = start_server()
    try:
        print_machine(machine(url))
        print(f"load: {loadavg()}")
        rs = redis_sync.Redis.from_url(url)
        seen: dict[int, list[tuple[float, float, float]]] = {n: [] for n in sizes}
        breakdown: dict[int, dict[str, int]] = {}
        for rnd in range(args.rounds):
            for n in sizes:
                before, cpu0 = commandstats(rs), server_cpu(rs)
                got, wall = run_async(fan_in(url, n))
                calls, cpu = delta(commandstats(rs), before), server_cpu(rs) - cpu0
                assert got == n, f"the callback's input held {got} of {n} results"
                per = sum(calls.values()) / n
                seen[n].append((per, cpu / n * 1e6, wall / n * 1e6))
                breakdown[n] = calls
                us_cpu, us_wall = cpu / n * 1e6, wall / n * 1e6
                print(f"round {rnd + 1} n={n}: {per:.1f} cmds/member, "
                      f"server {us_cpu:.0f} us/member, {us_wall:.0f} us/member")  # fmt: skip
        rows = [
            [f"{n:,}", f"{median([s[0] for s in seen[n]]):.1f}",
             f"{median([s[1] for s in seen[n]]):.0f}", f"{median([s[2] for s in seen[n]]):.0f}"]
            for n in sizes
        ]  # fmt: skip
        print("\n## Fan-in cost per chord member (median of rounds)")
        print(table(["members", "Redis commands/member", "server CPU us/member",
                     "wall us/member"], rows))  # fmt: skip
        for n in sizes:
            top = sorted(breakdown[n].items(), key=lambda kv: -kv[1])[:8]
            print(f"n={n}: " + ", ".join(f"{k} {v / n:.2f}" for k, v in top))
        print(f"load after: {loadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
