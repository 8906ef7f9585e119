"""No-op job throughput side by side: ours vs arq, saq, streaq, taskiq, docket and BullMQ for
Python, one consumer each.

OURS: a real ``python -m worker run --role consumer`` process with the framework defaults on
``bench.apps:noop_app`` and tuned arq on uvloop (max_jobs 100, poll_delay 0.05 s), both run
exactly as ``bench/consumer.py`` runs them (its code, not a copy).

PEERS, each installed at a pinned version into its OWN venv under a cache directory (never into
the project's environment), each worker a child process of that venv's python running
``bench/peer_apps/<peer>_app.py`` on uvloop: saq (``Worker``, concurrency 100), streaq
(``Worker``, concurrency 100, its other defaults), taskiq + taskiq-redis (``RedisStreamBroker``,
the Receiver as ``taskiq worker`` builds it: max_async_tasks 100, one process), docket
(``pydocket``'s ``Worker``, concurrency 100) and BullMQ
for Python (``Worker``, concurrency 100, its docs' knob for I/O-bound jobs).

Each run: a flushed keyspace on one valkey-server shared by all runs; start the worker; pre-fill
N jobs (ours/arq: arq records due at T0, slightly ahead, while the worker polls; peers: the
peer's own client API, in its venv, while the built and connected worker waits for T0); then
time T0 -> all N jobs finished, read from each system's own state (see NOTES below). Commands
per job from INFO commandstats (the harness's polls subtracted), worker CPU per job from psutil
(the process and its children), server CPU per job from INFO cpu. Rounds interleaved, order
rotating. A peer that cannot be installed or run is skipped with its reason.

    python -m bench peers             # 20k jobs, 3 rounds (~6 min; first run + ~1 min installs)
    python -m bench peers --quick     # 4k jobs, 2 rounds

Then the enqueue phase (bench/enqueue_phase.py; --no-enqueue skips it): N jobs enqueued with
nothing consuming, ours with ``Client.enqueue_many`` and with ``Client.enqueue`` gathered
1,000 at a time, beside saq's ``Queue.enqueue`` gathered the same way (its fill).
    python bench/peers.py --only ours,saq
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis as redis_sync

from bench import consumer, enqueue_phase
from bench._common import (
    ROOT,
    loadavg,
    machine,
    median,
    print_breakdowns,
    print_machine,
    rotated,
    start_server,
    table,
    time_drain,
)
from worker.version import DIST_NAME

PEER_APPS = Path(__file__).resolve().parent / "peer_apps"
DEFAULT_VENVS = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "worker-bench" / "venvs"
)


def _taskiq_left(r: redis_sync.Redis) -> int:
    """Entries of the ``taskiq`` stream not yet delivered (lag) or delivered but not acked."""
    for g in r.xinfo_groups("taskiq"):
        if g["name"] in (b"taskiq", "taskiq"):
            lag = g.get("lag")
            if lag is None:  # the server cannot tell: count from what the group read
                lag = int(r.xlen("taskiq")) - int(g["entries-read"] or 0)
            return int(lag) + int(g["pending"])
    raise RuntimeError("taskiq's consumer group is missing")


@dataclass(frozen=True)
class Peer:
    """A peer framework: its pins, how to tell it is done, what its defaults mean."""

    name: str
    label: str
    requirements: tuple[str, ...]
    remaining: Callable[[redis_sync.Redis], int]
    poll_cmds: Mapping[str, int]
    done_from: str
    semantics: str


PEERS: dict[str, Peer] = {
    p.name: p
    for p in [
        Peer(
            "saq",
            "saq {saq} `Worker`, concurrency 100",
            # saq's redis extra caps redis < 8; saq imports typing_extensions undeclared
            (
                "saq[redis,hiredis]==0.26.4",
                "redis==7.4.1",
                "hiredis==3.5.0",
                "typing-extensions==4.16.0",
                "uvloop==0.23.0",
            ),
            lambda r: int(r.zcard("saq:default:incomplete")),
            {"zcard": 1},
            "its `incomplete` sorted set is empty (ZCARD)",
            "JSON; per job a BLMOVE per slot, a status write + pub/sub notify on start and "
            "finish; the finished job record (with its result) kept 600 s. Its sweep runs at "
            "start-up (then every 60 s) and takes a job that a slot has just moved to the active "
            "list, but not yet marked active, for a stuck one: aborts and retries it (while "
            "developing this bench, 1 job in 4,000 ran twice, or ran and was left 'aborting')",
        ),
        Peer(
            "streaq",
            "streaq {streaq} `Worker`, concurrency 100 (prefetch = concurrency)",
            ("streaq==7.2.0", "coredis==6.9.0", "anyio==4.16.0", "uvloop==0.23.0"),
            lambda r: int(r.xlen("streaq:default:queues:normal")),
            {"xlen": 1},
            "its stream is empty (XLEN; a finished entry is XACKed and XDELed)",
            "pickle; per task a read pipeline + Lua, a finish transaction with XACK/XDEL, a "
            "pub/sub message; results kept 300 s; valkey 8.1 lacks XREADGROUP's CLAIM option "
            "(Redis 8.4), so streaq reads through its Lua fallback; coredis runs its runtime "
            "validations (COREDIS_OPTIMIZED unset, the default)",
        ),
        Peer(
            "taskiq",
            "taskiq {taskiq} + taskiq-redis {taskiq_redis} `RedisStreamBroker`, "
            "max_async_tasks 100, 1 process",
            (
                "taskiq==0.13.0",
                "taskiq-redis==1.2.4",
                "redis==8.1.0",
                "hiredis==3.5.0",
                "uvloop==0.23.0",
            ),
            _taskiq_left,
            {"xinfo|groups": 1},
            "its consumer group has no lag and nothing pending (XINFO GROUPS; acked when done)",
            "JSON; streams broker (XREADGROUP of 100, XACK per task, an XAUTOCLAIM under a "
            "lock after every read); NO result stored (no result backend, taskiq's default); "
            "acked entries stay in the stream (no maxlen by default)",
        ),
        Peer(
            "docket",
            "docket (pydocket {pydocket}) `Worker`, concurrency 100",
            # redis-py 7+ caps an asyncio pool at 100 connections: its worker runs out of them
            ("pydocket==0.27.2", "redis==6.4.0", "uvloop==0.23.0"),
            lambda r: int(r.xlen("bench:stream")) + int(r.zcard("bench:queue")),
            {"xlen": 1, "zcard": 1},
            "its stream and schedule are empty (XLEN + ZCARD; an entry is XACKed and XDELed "
            "when its run ends)",
            "cloudpickle; a stream read by a consumer group (1,000 entries a read), each run "
            "leased (Lua), its state in a runs hash kept 15 min, a state event published per "
            "change; no return value stored for a task returning None",
        ),
        Peer(
            "bullmq",
            "BullMQ for Python {bullmq} `Worker`, concurrency 100",
            ("bullmq==3.4.4", "redis==8.1.0", "uvloop==0.23.0"),
            lambda r: int(r.llen("bull:bench:wait")) + int(r.llen("bull:bench:active")),
            {"llen": 2},
            "its `wait` and `active` lists are empty (LLEN ×2)",
            "JSON; BullMQ's Lua scripts (shared with Node.js): a job hash moved wait -> "
            "active under a 30 s lock -> completed with its return value (kept: no "
            "removeOnComplete by default), an event per state change in its events stream",
        ),
    ]
}

# ours and arq: bench/consumer.py's variants
OURS = {"ours": "ours", "arq": "arq-tuned-uvloop"}
SYSTEMS = ["ours", "arq", *PEERS]
LABELS = {
    "ours": "**ours**: `python -m worker run --role consumer`, defaults (100 / 0.05 s, uvloop)",
    "arq": "arq {arq} `Worker`, tuned (max_jobs 100, poll 0.05 s), uvloop",
}
SEMANTICS = {
    "ours": "arq records (msgpack); claim and finish scripts per batch, fenced claims, holds set, "
    "heartbeat, Prometheus metrics; results kept 3600 s",
    "arq": "arq records (pickle); per job in-progress key, retry counter; results kept 3600 s",
}


class Skip(Exception):
    """A peer that cannot be installed or run here (the reason is one line)."""


def _oneline(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("WARNING: Location")] or ["(no output)"]
    err = [ln for ln in lines if "error" in ln.lower()]
    line = (err or lines)[-1]
    return line if len(line) <= limit else line[: limit - 1] + "…"


# -- venvs -------------------------------------------------------------------------------------
def peer_env() -> dict[str, str]:
    """A peer child's environment: nothing of ours (no PYTHONPATH, no WORKER_*)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WORKER_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ensure_venv(peer: Peer, root: Path, reinstall: bool) -> Path:
    """The peer's venv python, created (python -m venv + pip install of the pins) if needed."""
    venv = root / peer.name
    py = venv / "bin" / "python"
    marker = venv / "bench-requirements.txt"
    wanted = "\n".join(peer.requirements) + "\n"
    if not reinstall and py.exists() and marker.exists() and marker.read_text() == wanted:
        return py
    print(f"{peer.name}: creating {venv} with {' '.join(peer.requirements)}", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *peer.requirements],
    ]  # fmt: skip
    for cmd in steps:
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=900, env=peer_env(), cwd=root
            )
        except subprocess.TimeoutExpired:
            raise Skip(f"`{' '.join(cmd[:4])}` timed out after 900 s") from None
        if out.returncode:
            raise Skip(f"install failed: {_oneline(out.stderr or out.stdout)}")
    marker.write_text(wanted)
    return py


def peer_versions(peer: Peer, py: Path) -> dict[str, str]:
    """Versions as the peer's venv sees them (also proves its app imports)."""
    script = PEER_APPS / f"{peer.name}_app.py"
    out = subprocess.run(
        [str(py), str(script), "versions"], capture_output=True, text=True, timeout=120,
        env=peer_env(), cwd=ROOT,
    )  # fmt: skip
    if out.returncode:
        raise Skip(f"its app does not load: {_oneline(out.stderr)}")
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


# -- one run of a peer -------------------------------------------------------------------------
def _read_line(proc: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise RuntimeError(f"no {what} from the worker within {timeout:.0f} s")
    line = proc.stdout.readline().decode().strip()
    if not line:
        raise RuntimeError(f"the worker exited (code {proc.poll()}) before {what}")
    return line


def _send(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def run_peer(peer: Peer, py: Path, url: str, n: int, logdir: Path, rnd: int) -> dict[str, Any]:
    script = str(PEER_APPS / f"{peer.name}_app.py")
    log_path = logdir / f"{peer.name}-{rnd}.log"
    env = peer_env()
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(py), script, "worker", url], env=env, cwd=ROOT, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
        try:
            if (line := _read_line(proc, 60, "'ready'")) != "ready":
                raise RuntimeError(f"expected 'ready', got {line!r}")
            filled = subprocess.run(
                [str(py), script, "fill", url, str(n)], env=env, cwd=ROOT, stdout=log,
                stderr=log, timeout=600,
            )  # fmt: skip
            if filled.returncode:
                raise RuntimeError(f"fill exited {filled.returncode} (see {log_path})")
            if (left := peer.remaining(r)) != n:
                raise RuntimeError(f"{n} jobs filled but {left} waiting (see {log_path})")
            t0_wall = time.time() + 0.3
            _send(proc, f"go {t0_wall!r}")
            ps = psutil.Process(proc.pid)
            res = time_drain(
                r, ps, n, t0_wall, lambda: peer.remaining(r), peer.poll_cmds, peer.name,
                timeout=max(120.0, n / 50),
            )  # fmt: skip
            _send(proc, "count")
            ran = int(_read_line(proc, 30, "a count"))
        finally:
            _stop(proc)
            r.close()
    if ran < n:
        raise AssertionError(f"{peer.name}: its no-op ran {ran} times for {n} jobs")
    res["extra_runs"] = ran - n  # a job run twice (reported, not fatal)
    return res


def run_system(
    name: str, pys: Mapping[str, Path], url: str, n: int, logdir: Path, rnd: int
) -> dict[str, Any]:
    if name in OURS:
        variant = OURS[name]
        return consumer.run_once(variant, consumer.VARIANTS[variant], url, n, logdir, rnd)
    return run_peer(PEERS[name], pys[name], url, n, logdir, rnd)


def commit() -> str:
    """The checkout's commit (``+ uncommitted changes`` when the tree is dirty)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"commit {head or 'unknown'}" + (" + uncommitted changes" if dirty else "")


# -- main --------------------------------------------------------------------------------------
@dataclass
class Outcome:
    runs: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    """``python bench/peers.py`` (also ``python -m bench peers``)."""
    ap = argparse.ArgumentParser(
        prog="python -m bench peers",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="4k jobs, 2 rounds")
    ap.add_argument("--n", type=int, help="jobs per run (20k; quick 4k)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (3; quick 2)")
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(SYSTEMS)}")
    ap.add_argument("--venvs", type=Path, default=DEFAULT_VENVS, help="peer venvs (%(default)s)")
    ap.add_argument("--reinstall", action="store_true", help="recreate the peer venvs")
    ap.add_argument("--no-enqueue", action="store_true", help="skip the enqueue phase")
    args = ap.parse_args()
    n = args.n or (4_000 if args.quick else 20_000)
    rounds = args.rounds or (2 if args.quick else 3)
    names = SYSTEMS
    if args.only:
        names = [s.strip() for s in args.only.split(",") if s.strip()]
        if unknown := set(names) - set(SYSTEMS):
            ap.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")

    out: dict[str, Outcome] = {s: Outcome() for s in names}
    versions: dict[str, dict[str, str]] = {
        s: {d: _version(d) for d in ((DIST_NAME, "redis", "hiredis") if s == "ours" else
                                     ("arq", "redis", "uvloop"))}
        for s in names if s in OURS
    }  # fmt: skip
    pys: dict[str, Path] = {}
    for s in names:  # installs happen before the server starts and are never timed
        if s in PEERS:
            try:
                pys[s] = ensure_venv(PEERS[s], args.venvs, args.reinstall)
                versions[s] = peer_versions(PEERS[s], pys[s])
            except Skip as e:
                out[s].skipped = str(e)
                print(f"{s}: SKIPPED: {e}", flush=True)

    server, url = start_server()
    logdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    try:
        info = machine(url)
        load_start = loadavg()
        print_machine(info)
        print(f"load average at start (1/5/15 min): {load_start}")
        print(f"{n} jobs per run, {rounds} rounds, one consumer process per system; "
              f"logs in {logdir}")  # fmt: skip
        for rnd in range(rounds):
            for name in rotated(names, rnd):
                if out[name].skipped:
                    continue
                try:
                    res = run_system(name, pys, url, n, logdir, rnd)
                except Exception as e:  # a peer that breaks is skipped, the rest go on
                    out[name].skipped = f"round {rnd + 1}: {type(e).__name__}: {_oneline(str(e))}"
                    print(f"round {rnd + 1} {name:8s} FAILED, skipped from now on: {e}")
                    continue
                out[name].runs.append(res)
                print(f"round {rnd + 1} {name:8s} {res['n']:6d} jobs in {res['secs']:6.2f} s = "
                      f"{res['rate']:7.0f} jobs/s, {res['cmds']:5.1f} cmds/job, worker CPU "
                      f"{res['worker_us']:4.0f} us/job, server CPU {res['server_us']:3.0f} us/job, "
                      f"load {os.getloadavg()[0]:.2f}"
                      + (f", {res['extra_runs']} EXTRA RUNS" if res.get("extra_runs") else ""),
                      flush=True)  # fmt: skip
        if not args.no_enqueue and {"ours", "saq"} & set(names):
            print()
            saq_py = pys.get("saq") if "saq" in names and not out["saq"].skipped else None
            enqueue_phase.phase(url, n, rounds, saq_py, versions.get("saq", {}).get("saq", "?"))
        load_end = loadavg()
    finally:
        server.stop()

    print()
    print(f"## Peers, side by side: {n:,} no-op jobs, one consumer process each "
          f"(median of {rounds} rounds)")  # fmt: skip
    print()
    print_machine(info)
    print(f"code: {commit()}")
    print(f"load average (1/5/15 min): start {load_start}, end {load_end}")
    print()
    measured = [s for s in names if out[s].runs]
    ours = median([x["rate"] for x in out["ours"].runs]) if "ours" in measured else None
    rows = []
    for s in measured:
        rs = out[s].runs
        rate = median([x["rate"] for x in rs])
        fields = {k.replace("-", "_"): v for k, v in versions[s].items()}
        label = (LABELS.get(s) or PEERS[s].label).format(**fields)
        ratio = "1×" if s == "ours" else (f"{ours / rate:.2f}×" if ours else "–")
        rows.append([
            label, f"{rate:,.0f}", ratio, f"{median([x['cmds'] for x in rs]):.1f}",
            f"{median([x['worker_us'] for x in rs]):.0f}",
            f"{median([x['server_us'] for x in rs]):.0f}",
        ])  # fmt: skip
    print(table(
        ["system", "jobs/s", "ours is", "Redis commands/job", "worker CPU µs/job",
         "server CPU µs/job"],
        rows,
    ))  # fmt: skip
    print()
    print("Versions: " + "; ".join(
        f"{s}: " + ", ".join(f"{d} {v}" for d, v in versions[s].items()) for s in versions
    ))  # fmt: skip
    for s in names:
        if out[s].skipped:
            print(f"SKIPPED {s}: {out[s].skipped}")
    for s in measured:
        extra = [x.get("extra_runs", 0) for x in out[s].runs]
        if any(extra):
            print(f"DUPLICATES {s}: its no-op ran more often than jobs were filled, by "
                  f"{', '.join(map(str, extra))} in rounds 1..{len(extra)}")  # fmt: skip
    print()
    print("Notes:")
    print(
        "- Done = each system's own state, polled every 10 ms (the polls are subtracted from "
        "the command counts): ours and arq: the arq queue is empty (ZCARD; a job leaves it "
        "when it finishes); "
        + "; ".join(f"{p.name}: {p.done_from}" for p in PEERS.values())
        + ". No task writes a counter to Redis (an INCR per job would add a command and a "
        "round trip to every system); the peers' no-op tasks count their runs in memory and "
        "each run checks that count == N; ours and arq are checked by their N result keys."
    )
    print(
        "- Ours and arq poll, so they see the jobs due at T0 at their next poll (<= 50 ms "
        "late); a peer's worker is built and connected before T0 and starts consuming at "
        "T0, so its own start-up (a few ms) is inside the window."
    )
    print(
        "- Commands include those that Lua scripts and functions run (valkey counts them as "
        "well as the EVALSHA/FCALL), so they measure server work, not round trips."
    )
    for s in names:
        print(f"- {s}, per job with its defaults: {SEMANTICS.get(s) or PEERS[s].semantics}.")
    print(
        "- Logging: ours logs INFO (per-job lines are DEBUG); arq's and the peers' loggers "
        "are left unconfigured (warnings only), so their per-job INFO lines cost nothing "
        "here; every system runs on uvloop (saq's and streaq's CLIs would use asyncio)."
    )
    print_breakdowns({s: out[s].runs for s in measured}, "commands/job")


if __name__ == "__main__":
    main()
