"""Every ``python -m bench <name>`` runs: each subcommand in ``bench/__main__.py`` COMMANDS, at
a tiny size, as a real subprocess; exit 0 and its result line on stdout.

The published figures come from these commands (bench/RESULTS.md), so a bench that no longer
runs (a signature changed under it, an import moved) must fail here, not at the next
measurement. A subcommand added to COMMANDS without an entry in SMOKE fails (the tests are
made from COMMANDS).

The selected subcommands run three at a time (most of their time is waiting on servers:
Sentinel promotions, lease expiries), each test waiting for its own; in turn they took ~215 s.

``peers`` runs only "ours" and arq (the other peers need their own venvs, created with pip
from the network: ~1 min each the first time).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.__main__ import COMMANDS

ROOT = Path(__file__).resolve().parents[2]

#: subcommand -> (arguments for a tiny run, a regex its stdout must match: its result line)
SMOKE: dict[str, tuple[list[str], str]] = {
    # arq's baselines need fenced-worker[arq], which this environment (redis-py 8) cannot have
    "peers": (["--only", "ours", "--n", "200", "--rounds", "1"], r"\| \*\*ours\*\*.*\| [\d,]+"),
    "consumer": (
        ["--only", "ours", "--n", "200", "--rounds", "1"],
        r"\| ours: .*\| [\d,]+ ",
    ),
    "dispatch": (
        ["--n", "1000", "--n-baseline", "100", "--rounds", "1"],
        r"in-flight hash holds 0 entries afterwards",
    ),
    "initializer": (["--n", "2000", "--rounds", "1"], r"\| \*\*ours\*\*|\| ours"),
    "takeover": (["--smoke"], r"planned \(SIGTERM\) +\| 1 "),
    "operations": (["--smoke"], r"spawn -> /readyz 200 +\| 1 "),
    "leader": (["--window", "1", "--keys", "100"], r"renewals failed"),
    "latency": (["--smoke"], r"first job after an idle spell"),
    "wait": (["--n", "200", "--enqueues", "50", "--rounds", "1"], r"\|"),
    # no --cpu-hogs here: a busy loop beside the two subcommands that run at the same time
    # starves them (the hogged runs are the bench's, python -m bench failover --cpu-hogs N)
    "failover": (["--smoke"], r"run 1: "),
    "depose": (["--smoke"], r"confirmed then lost"),
    # 50 jobs a phase: 200 ran at 7 jobs/s at load 16 and the four phases (two clusters to
    # form) passed 240 s
    "cluster": (["--n", "50", "--rounds", "1"], r"\|"),
    "jobs": (["--jobs", "1000", "--cancels", "1"], r"cancel"),
    "web": (["--smoke"], r"\| api/overview +\|"),
    "idle": (["--smoke"], r"\| consumer +\| [\d.]+ "),
    "fleet": (
        ["--consumers", "1", "--alls", "1", "--window", "2", "--settle", "2"],
        r"\| commands per enqueued job \(over idle\) +\| [\d.-]+ ",
    ),
    "fair": (
        ["--n", "200", "--rounds", "1", "--backlog", "1000", "--quiet", "2"],
        r"\| fair +\| [\d,]+ ",
    ),
    "workflows": (["--sizes", "50", "--rounds", "1"], r"\| 50 +\| [\d.]+ "),
    "workflows_inflight": (
        ["--jobs", "300", "--rounds", "1", "--workflows", "50"],
        r"\| hops +\| \d+ ",
    ),
    "soak": (["--quick"], r"\d+ tests collected"),  # its test ids resolve (else exit 4)
    "lane": (
        ["--jobs", "1000", "--seconds", "3", "--fanout", "2000"],
        r"\| 2,000 from a task +\| [\d.]+ s \(2,000 written",
    ),
    "outbox": (["--quick"], r"\| outbox, one row per commit, every 150 ms \(50\) +\| [\d.]+ "),
}


#: how many subcommands run at once
PARALLEL = 3
#: one subcommand's bound (they take 5-60 s on a quiet box; 3 at a time beside the suite's
#: other workers on 2 shared cores, several minutes)
RUN_TIMEOUT_S = 420
#: subcommands started so far (their port blocks go round 8-15)
_STARTED = itertools.count()


def _run(name: str) -> tuple[int, str, str, float]:
    args, _ = SMOKE[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "PYTEST_XDIST"))}
    env["BENCH_PERIODIC_N"] = "50"  # leader, web: 50 periodic jobs, not 1,000
    # a port block of its own (harness/ports.py), none of the -n 4 workers' (0-3) nor the one
    # every process outside xdist shares: three benches at once drew from that one and one
    # server's port was taken between the check and its bind ('Failed listening on port')
    env["HARNESS_PORT_BLOCK"] = str(8 + next(_STARTED) % 8)  # < 8 run at once: all differ
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "bench", name, *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        text = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return -1, text, f"timed out after {RUN_TIMEOUT_S} s", time.monotonic() - t0
    return out.returncode, out.stdout, out.stderr, time.monotonic() - t0


@pytest.fixture(scope="module")
def smoke_runs(request: pytest.FixtureRequest) -> dict[str, Future[tuple[int, str, str, float]]]:
    """Every selected subcommand with a smoke entry, started at once, PARALLEL at a time."""
    selected = [
        item.callspec.params["name"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_bench_subcommand_runs_at_a_tiny_size"
    ]
    pool = ThreadPoolExecutor(max_workers=PARALLEL)
    request.addfinalizer(lambda: pool.shutdown(wait=True, cancel_futures=True))
    return {name: pool.submit(_run, name) for name in selected if name in SMOKE}


@pytest.mark.slow
# one xdist worker runs them all: the module's fixture starts every selected subcommand, and
# they pace themselves (PARALLEL at a time) on the box they share with the other workers
@pytest.mark.xdist_group("bench")
# each waits for its own run, queued behind the others (PARALLEL at a time, RUN_TIMEOUT_S each)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_bench_subcommand_runs_at_a_tiny_size(
    name: str, smoke_runs: dict[str, Future[tuple[int, str, str, float]]]
) -> None:
    assert name in SMOKE, f"bench subcommand {name!r} has no smoke entry in SMOKE"
    code, stdout, stderr, secs = smoke_runs[name].result()
    pattern = SMOKE[name][1]
    tail = "\n".join((stdout + stderr).splitlines()[-15:])
    assert code == 0, f"{name}: exit {code} after {secs:.1f} s:\n{tail}"
    assert re.search(pattern, stdout), f"{name}: no line /{pattern}/ in its output:\n{tail}"


def test_every_smoke_entry_names_a_subcommand() -> None:
    assert not set(SMOKE) - set(COMMANDS), "SMOKE names a subcommand COMMANDS no longer has"
