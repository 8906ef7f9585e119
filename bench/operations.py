"""Operational latencies with default settings: start-up, probe flip on SIGTERM, orphan re-run.

    python bench/operations.py [--trials N]

- start-up: process spawn -> ``/readyz`` 200, and -> leadership acquired (lock set);
- probe flip: SIGTERM -> ``/readyz`` 503 (``/healthz`` sampled meanwhile must stay 200);
- orphan re-run: a consumer SIGKILLed while running a long job -> the job starts again on
  another consumer (defaults: heartbeat 2 s, stale after 10 s; arq alone waits for its 310 s
  in-progress TTL).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import redis as redis_sync

from bench._common import (
    child_env,
    machine,
    median,
    print_machine,
    python,
    spawn,
    start_server,
    table,
    wait_until,
)
from harness.ports import free_port
from worker.client import Client

APP = "harness.apps.ledger:app"


def status_of(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument(
        "--smoke", action="store_true", help="does it run: 1 start-up trial, no orphan re-run"
    )
    args = ap.parse_args()
    trials = 1 if args.smoke else args.trials
    orphan_trials = 0 if args.smoke else min(trials, 3)
    server, url = start_server()
    r = redis_sync.Redis.from_url(url)
    logs = Path(tempfile.mkdtemp(prefix="bench-ops-"))
    print_machine(machine(url))
    startup, leading, flip, orphan = [], [], [], []
    try:
        for trial in range(trials):
            prefix = f"ops{trial}:"
            port = free_port()
            env = child_env(
                WORKER_REDIS_URL=url,
                WORKER_KEY_PREFIX=prefix,
                WORKER_APP=APP,
                WORKER_HEALTH_PORT=str(port),
                WORKER_DRAIN_DELAY_S="1" if args.smoke else "5",
            )
            t0 = time.monotonic()
            p = spawn(
                [python(), "-m", "worker", "run", "--role", "leader"],
                env,
                logs / f"leader-{trial}.log",
            )
            wait_until(lambda: status_of(port, "/readyz") == 200, 30, "ready")  # noqa: B023
            startup.append(time.monotonic() - t0)
            wait_until(lambda: r.get(f"{prefix}leader"), 30, "leading")  # noqa: B023
            leading.append(time.monotonic() - t0)
            p.send_signal(signal.SIGTERM)
            t1 = time.monotonic()
            wait_until(lambda: status_of(port, "/readyz") == 503, 10, "not ready")  # noqa: B023
            flip.append(time.monotonic() - t1)
            live = [status_of(port, "/healthz") for _ in range(10)]
            assert all(s == 200 for s in live), f"/healthz during drain: {live}"
            p.wait(60)

        # Orphan re-run with default heartbeat (2 s) and stale time (10 s). The victim consumer
        # takes the job before the leader starts (a leader consumes too), then is SIGKILLed;
        # the leader's reaper releases the job and the leader itself runs it again.
        for trial in range(orphan_trials):
            prefix = f"orphan{trial}:"
            env = child_env(
                WORKER_REDIS_URL=url,
                WORKER_KEY_PREFIX=prefix,
                WORKER_APP=APP,
                WORKER_HEALTH_PORT="0",
            )
            victim = spawn(
                [python(), "-m", "worker", "run", "--role", "consumer"],
                env,
                logs / f"victim-{trial}.log",
            )
            job_id = asyncio.run(_enqueue(url, prefix, trial))
            started = f"{prefix}ledger:slow-started"
            wait_until(lambda: r.hget(started, job_id), 30, "job started")  # noqa: B023
            time.sleep(0.5)  # the holds set is flushed within 0.25 s
            leader = spawn(
                [python(), "-m", "worker", "run", "--role", "leader"],
                env,
                logs / f"leader-orphan-{trial}.log",
            )
            wait_until(lambda: r.get(f"{prefix}leader"), 30, "leader")  # noqa: B023
            victim.kill()
            victim.wait(10)
            t0 = time.monotonic()
            wait_until(lambda: int(r.hget(started, job_id) or 0) >= 2, 400, "re-run")  # noqa: B023
            orphan.append(time.monotonic() - t0)
            leader.kill()
            leader.wait(10)
    finally:
        r.close()
        server.stop()
    print(
        table(
            ["measure (defaults)", "trials", "p50", "max", "baseline"],
            [
                [
                    "spawn -> /readyz 200",
                    len(startup),
                    f"{median(startup):.2f} s",
                    f"{max(startup):.2f} s",
                    "-",
                ],
                [
                    "spawn -> leading",
                    len(leading),
                    f"{median(leading):.2f} s",
                    f"{max(leading):.2f} s",
                    "-",
                ],
                [
                    "SIGTERM -> /readyz 503 (/healthz stays 200)",
                    len(flip),
                    f"{median(flip) * 1000:.0f} ms",
                    f"{max(flip) * 1000:.0f} ms",
                    "-",
                ],
                [
                    "SIGKILLed consumer's job re-run",
                    len(orphan),
                    f"{median(orphan):.1f} s",
                    f"{max(orphan, default=float('nan')):.1f} s",
                    "arq alone: 310 s (in-progress TTL)",
                ],
            ],
        )
    )
    print(f"logs: {logs}")


async def _enqueue(url: str, prefix: str, trial: int) -> str:
    from harness.apps.ledger import app

    client = await Client.connect(url, app=app, key_prefix=prefix)
    try:
        jid = await client.enqueue("slow_job", 60.0, job_id=f"{prefix}orphan-{trial}")
        assert jid is not None
        return jid
    finally:
        await client.close()


if __name__ == "__main__":
    main()
