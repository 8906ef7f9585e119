"""The long versions of the suite's shortened multi-process scenarios: the same tests, run
with ``BENCH_SOAK=1`` (harness/soak.py), i.e. at their original sizes.

The suite keeps each scenario short enough for a 2-core CI machine (fewer ticks, rounds,
deletions, a shorter block) at a size that still fails without the behaviour it pins; this
runs the very same test code longer and prints what each counted and how long it took:

- the steady run, 3 leaders + 2 consumers, every tick once: 60 ticks (suite: 20);
- the leader lock DELeted under a singleton service at random moments: 10 times (suite: 5);
- a task blocking the leader's event loop after a tick: for 25 s (suite: 12 s);
- the primary failovers of tests/system/test_failover.py with the poll items spread over 20 s
  (suite: 8 s, 14 s where the dispatch kill is the only fault) and each killed Sentinel node,
  restarted, made a replica by the Sentinels at their next INFO refresh, up to 10 s on (suite:
  by the harness at once);
- a consumer SIGSTOPped while it runs 12 x 5 s jobs: for 15 s at least (suite: 6 s, and until
  its jobs were handed over and ran elsewhere, as in both).
- Redis rolled back under a kept lease: 4 rounds (suite: 2, one with the consumer frozen);
- hostile job records arriving while a long job runs: a 20 s job (suite: 8 s).
- the busiest consumer SIGTERMed mid-drain of 3,000 jobs: 4 rounds (suite: 2).
- Redis without persistence SIGKILLed after a tick and restarted empty: 3 times (suite: 2).

    python -m bench soak              # all of them (~9 min)
    python -m bench soak -k steady    # those whose test id matches (pytest -k)
    python -m bench soak --quick      # collect them only (that the ids resolve), ~5 s
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The tests whose sizes come from harness/soak.py ``size(suite, soak)``.
TESTS = (
    "tests/system/test_faults.py::test_three_leaders_two_consumers_every_tick_once_over_a_steady_run",
    "tests/system/test_edges.py::test_singleton_never_overlaps_and_fenced_writes_stay_ordered_when_the_lock_vanishes",
    "tests/system/test_edges.py::test_graceful_sigterm_never_runs_a_job_twice",
    "tests/system/test_edges.py::test_paused_consumer_never_completes_jobs_handed_to_another",
    "tests/system/test_edges.py::test_redis_data_loss_never_reruns_a_finished_tick_or_sends_epochs_back",
    "tests/system/test_edges.py::test_redis_going_back_under_a_kept_lease_never_loses_a_tick",
    "tests/system/test_edges.py::test_malformed_jobs_are_dead_lettered_and_never_crash_the_consumer",
    "tests/runtime/test_watchdog.py::test_a_finished_tick_never_runs_again_when_its_process_then_blocks_the_loop",
    "tests/system/test_failover.py",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-k", default="", help="only the tests whose id matches (pytest -k)")
    ap.add_argument("--quick", action="store_true", help="collect the tests only")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *TESTS]
    if args.k:
        cmd += ["-k", args.k]
    if args.quick:
        cmd += ["--collect-only", "-q"]
    else:  # print what each test counted, and every test's duration
        cmd += ["-s", "-q", "--durations=0", "-o", "timeout=900"]
    env = {**os.environ, "BENCH_SOAK": "1"}
    print("$ BENCH_SOAK=1 python", " ".join(cmd[1:]), flush=True)
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main()
