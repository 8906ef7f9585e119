"""Leader failover with the DEFAULT timings (ttl 10 s, renew 2 s, deadline 6 s, poll 1 s).

Two real ``python -m worker run --role leader`` processes share a private valkey-server. Each
trial finds the active one (the lock value ``<epoch>:<token>`` at ``<prefix>leader`` and the
instance record whose ``epoch`` matches), then either

- SIGKILLs it (crash): the lease must expire, then a standby's poll (1 s ±25 %) takes it, or
- SIGTERMs it (planned handoff): the leader releases the lock and publishes, the standby
  campaigns at once,

and measures the time from the signal until the lock holds a NEW epoch. The killed process is
replaced by a fresh standby before the next trial; crash and handoff trials alternate so drift
hits both. The baselines are the bounds in docs/architecture.md §5.1 (nothing to run: arq has
no leader election).

It also measures what one idle standby costs Redis: commandstats over a window in which the
only client is one leader-role process that cannot win (a fake holder owns the lock).

    python bench/takeover.py            # 10 + 10 trials, 10 s standby window (~4 min)
    python bench/takeover.py --quick    # 3 + 3 trials, 5 s window
    python bench/takeover.py --smoke    # does it run: one planned trial, 1 s window
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    commandstats,
    delta,
    machine,
    median,
    pct,
    print_machine,
    spawn_worker,
    start_server,
    table,
    wait_until,
    worker_env,
)

PREFIX = "bench:"
LOCK = f"{PREFIX}leader"
TTL_S, RENEW_S, DEADLINE_S, POLL_S = 10.0, 2.0, 6.0, 1.0  # the framework defaults

CATEGORIES = {
    # EXISTS runs inside the ACQUIRE script: one request, two commands per campaign
    "election (ACQUIRE EVALSHA + its EXISTS)": {
        "evalsha",
        "eval",
        "script|load",
        "exists",
        "subscribe",
        "ping",
    },
    "heartbeat (instance record)": {"multi", "exec", "set", "zadd"},
    "consumer (arq poll + health key)": {"zrangebyscore", "zcard", "psetex"},
}


class Fleet:
    """Leader-role worker processes on one server."""

    def __init__(self, url: str, logdir: Path) -> None:
        self.url = url
        self.logdir = logdir
        self.r = redis_sync.Redis.from_url(url, decode_responses=True)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.env = worker_env(
            url, "bench.apps:periodic_app", PREFIX, WORKER_ROLE="leader", WORKER_LOG_LEVEL="INFO"
        )
        self.n = 0

    def start(self) -> int:
        """Start one leader-role process; return once its instance record exists (+ margin)."""
        self.n += 1
        p = spawn_worker(
            "leader", self.env, self.logdir / f"l{self.n}.log", "--instance-name", f"l{self.n}"
        )
        self.procs[p.pid] = p
        wait_until(lambda: p.pid in self.records(), 30, f"instance record of pid {p.pid}")
        time.sleep(1.5)  # pub/sub subscription and first campaign happen right after start-up
        return p.pid

    def records(self) -> dict[int, dict[str, object]]:
        """pid -> instance record (JSON) of every registered process."""
        out: dict[int, dict[str, object]] = {}
        for key in self.r.scan_iter(f"{PREFIX}instance:*", count=1000):
            if key.endswith(":jobs"):
                continue
            raw = self.r.get(key)
            if raw:
                rec = json.loads(raw)
                out[int(rec["pid"])] = rec
        return out

    def active(self, timeout: float = 30) -> tuple[int, str]:
        """(pid, lock value) of the process whose record claims the current epoch."""

        def find() -> tuple[int, str] | None:
            value = self.r.get(LOCK)
            if not value:
                return None
            epoch = int(value.split(":", 1)[0])
            for pid, rec in self.records().items():
                if (
                    rec.get("is_leader")
                    and rec.get("epoch") == epoch
                    and pid in self.procs
                    and self.procs[pid].poll() is None
                ):
                    return pid, value
            return None

        return wait_until(find, timeout, "an active leader with a matching instance record")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)


def epoch_of(value: str | None) -> int:
    return int(value.split(":", 1)[0]) if value else -1


def standby_cost(fleet: Fleet, window_s: float) -> tuple[float, dict[str, int], int]:
    """Commands/s issued by one leader-role process that stays a standby."""
    r = fleet.r
    r.set(LOCK, "0:fake-holder", px=int((window_s + 60) * 1000))
    pid = fleet.start()
    time.sleep(2.5)  # past start-up bursts (arq start-up info, first health key, first beat)
    assert not fleet.records()[pid].get("is_leader"), "standby unexpectedly leads"
    before = commandstats(r)
    t0 = time.monotonic()
    time.sleep(window_s)
    after = commandstats(r)
    elapsed = time.monotonic() - t0
    assert r.get(LOCK) == "0:fake-holder"
    d = delta(after, before)
    total = sum(d.values())
    r.delete(LOCK)  # let the standby take over: it becomes the first real leader
    return elapsed, d, total


def trial(fleet: Fleet, kind: str) -> dict[str, float]:
    r = fleet.r
    pid, value = fleet.active()
    old = epoch_of(value)
    time.sleep(random.uniform(0, RENEW_S))  # random phase relative to the renew loop
    pttl = r.pttl(LOCK) / 1000
    proc = fleet.procs[pid]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGKILL if kind == "crash" else signal.SIGTERM)
    while True:
        v = r.get(LOCK)
        if v and epoch_of(v) > old:
            took = time.monotonic() - t0
            break
        if time.monotonic() - t0 > 60:
            raise TimeoutError(f"{kind}: no new epoch within 60 s")
        time.sleep(0.002)
    proc.wait(60)
    exited = time.monotonic() - t0
    del fleet.procs[pid]
    fleet.start()  # replacement standby
    return {"took": took, "pttl": pttl, "exited": exited, "new_epoch": epoch_of(v)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 + 3 trials, 5 s standby window")
    ap.add_argument("--trials", type=int, help="trials per kind (default 10, quick 3)")
    ap.add_argument("--window", type=float, help="standby measurement window, s (default 10)")
    ap.add_argument(
        "--smoke", action="store_true", help="does it run: 1 s window, one planned trial only"
    )
    args = ap.parse_args()
    trials = args.trials or (3 if args.quick else 10)
    window = args.window or (1.0 if args.smoke else 5.0 if args.quick else 10.0)

    server, url = start_server()
    logdir = Path(tempfile.mkdtemp(prefix="bench-takeover-"))
    fleet = Fleet(url, logdir)
    try:
        info = machine(url)
        print_machine(info)
        print(
            f"timings: ttl {TTL_S:g} s, renew {RENEW_S:g} s, deadline {DEADLINE_S:g} s, "
            f"standby poll {POLL_S:g} s (framework defaults); logs in {logdir}"
        )

        elapsed, d, total = standby_cost(fleet, window)
        fleet.start()  # second process: the standby for the first trial
        results: dict[str, list[dict[str, float]]] = {"crash": [], "graceful": []}
        order = ["graceful"] if args.smoke else ["crash", "graceful"] * trials
        for i, kind in enumerate(order):
            res = trial(fleet, kind)
            results[kind].append(res)
            print(
                f"trial {i + 1:2d}/{len(order)} {kind:8s} new epoch {res['new_epoch']:3d} after "
                f"{res['took'] * 1000:8.1f} ms (lease had {res['pttl']:.2f} s left; old process "
                f"gone after {res['exited']:.2f} s)",
                flush=True,
            )

        crash = [x["took"] for x in results["crash"]] or [float("nan")]
        grace = [x["took"] for x in results["graceful"]]
        after_expiry = [x["took"] - x["pttl"] for x in results["crash"]] or [float("nan")]
        print()
        print("## Failover: signal -> lock holds a new epoch")
        print(table(
            ["scenario", "trials", "ours p50", "ours max", "baseline (expectation)"],
            [
                ["crash (SIGKILL)", len(results["crash"]), f"{median(crash):.2f} s",
                 f"{max(crash):.2f} s",
                 f"<= TTL + poll = {TTL_S + POLL_S * 1.25:.2f} s; k8s leaderelection 15 s lease; "
                 "Sidekiq/Oban 30-120 s"],
                ["  of which after lease expiry", len(results["crash"]),
                 f"{median(after_expiry):.2f} s", f"{max(after_expiry):.2f} s",
                 f"standby poll {POLL_S:g} s x U(0.75, 1.25)"],
                ["planned (SIGTERM)", len(grace), f"{median(grace) * 1000:.1f} ms",
                 f"{max(grace) * 1000:.1f} ms",
                 f"<< 1 s (without release + publish it would be a crash: ~{TTL_S:g} s)"],
            ],
        ))  # fmt: skip
        print(f"crash p90 {pct(crash, 90):.2f} s; planned p90 {pct(grace, 90) * 1000:.1f} ms")

        print()
        print(f"## One idle standby (leader role, not leading), {elapsed:.1f} s window")
        rows = []
        seen: set[str] = set()
        for cat, cmds in CATEGORIES.items():
            part = {k: v for k, v in d.items() if k in cmds}
            seen |= part.keys()
            n = sum(part.values())
            rows.append([cat, f"{n / elapsed:.2f}", ", ".join(f"{k} {v}" for k, v in part.items())])
        other = {k: v for k, v in d.items() if k not in seen}
        if other:
            rows.append(["other", f"{sum(other.values()) / elapsed:.2f}",
                         ", ".join(f"{k} {v}" for k, v in other.items())])  # fmt: skip
        rows.append(["total", f"{total / elapsed:.2f}", ""])
        print(table(["part", "commands/s", "calls in window"], rows))
        print(
            f"leadership requests (EVALSHA ACQUIRE): {d.get('evalsha', 0) / elapsed:.2f}/s; "
            "target: leadership costs a standby about 1 command/s"
        )
    finally:
        fleet.close()
        server.stop()


if __name__ == "__main__":
    main()
