"""A live primary deposed by ``SENTINEL FAILOVER``: how many ``WAIT``-confirmed writes are lost.

A Sentinel failover does not stop the old primary: until the Sentinels reconfigure it, it takes
the writes of clients still connected to it, and a replica still following it confirms them.
The same happens when the Sentinels lose sight of a primary the clients still reach (a
partition, an overloaded Sentinel). Each run: primary + 2 replicas + 3 Sentinels; a client
connected straight to the primary sends ``INCR n`` + ``WAIT <n> 500`` back to back and notes
every value a replica confirmed; ``SENTINEL FAILOVER``; 15 s later, every confirmed value above
the counter on the new primary was lost. Variants:

- ``wait1``: ``WAIT 1`` (the ``auto`` policy with Sentinel);
- ``wait2``: ``WAIT 2`` (every replica): the promoted replica stops following at once;
- ``paused``: ``WAIT 1``, and ``CLIENT PAUSE 10000 WRITE`` on the primary just before the
  failover (the planned-switch recipe in the README).

``python -m bench depose --runs 3``.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import redis

from bench._common import machine, print_machine, table
from harness.topology import SentinelSet

VARIANTS = {"wait1": (1, None), "wait2": (2, None), "paused": (1, 10_000)}


def one_run(replicas: int, pause_ms: int | None) -> dict[str, Any]:
    with SentinelSet(replicas=2, down_after_ms=2000, failover_timeout_ms=3000) as s:
        old = s.primary()
        confirmed: list[tuple[float, int]] = []
        halt = threading.Event()

        def writer() -> None:
            with old.client(socket_timeout=15) as c:
                while not halt.is_set():
                    try:
                        pipe = c.pipeline(transaction=False)
                        pipe.incr("n")
                        pipe.wait(replicas, 500)
                        value, acked = pipe.execute()
                    except redis.RedisError:  # READONLY once demoted
                        time.sleep(0.01)
                        continue
                    if acked >= replicas:
                        confirmed.append((time.time(), int(value)))

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        time.sleep(1.0)
        s.wait_promotable()
        if pause_ms is not None:
            with old.client() as c:
                c.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")
        at = time.time()
        s.failover(wait=False, timeout=2.0)
        new = s.wait_failover(old, 30)
        promoted = time.time() - at
        time.sleep(15.0)
        halt.set()
        thread.join(20)
        with new.client() as c:
            final = int(c.get("n") or 0)
        lost = [(t - at, v) for t, v in confirmed if v > final]
        return {
            "confirmed": len(confirmed),
            "lost": len(lost),
            "window": (lost[0][0], lost[-1][0]) if lost else None,
            "promoted_s": promoted,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs per variant (3)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="wait1,wait2,paused")
    ap.add_argument("--smoke", action="store_true", help="does it run: one wait1 run")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.variants = 1, "wait1"
    print_machine(machine())
    rows = []
    for name in args.variants.split(","):
        replicas, pause_ms = VARIANTS[name]
        for i in range(args.runs):
            r = one_run(replicas, pause_ms)
            window = "-" if r["window"] is None else "{:.2f} .. {:.2f}".format(*r["window"])
            rows.append([name, i + 1, r["confirmed"], r["lost"], window, f"{r['promoted_s']:.2f}"])
            print(rows[-1], flush=True)
    print("\n## A live primary deposed by SENTINEL FAILOVER: confirmed writes lost")
    print(
        table(
            ["variant", "run", "writes confirmed", "confirmed then lost",
             "lost window s after FAILOVER", "FAILOVER -> promoted s"],
            rows,
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
