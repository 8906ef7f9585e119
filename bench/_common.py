"""Shared helpers for the benchmarks: a private valkey-server, command counts, machine info.

Every benchmark starts its own server through :class:`worker.runtime.embedded.EmbeddedServer`, so
runs
do not disturb each other or a developer's Redis. Command counts come from ``INFO
commandstats`` deltas; note that valkey counts the commands a Lua script runs as well as the
``EVALSHA`` that ran it, so "commands" include work done inside scripts and "requests" are
what a client sent.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis as redis_sync

from harness.leases import FixedLease
from harness.ports import free_port
from worker.core.errors import ConfigError
from worker.runtime.embedded import EmbeddedServer, find_server_binary

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

#: Commands the harness itself sends while a measurement window is open.
HARNESS_COMMANDS = frozenset({"info", "config|resetstat", "client|setinfo", "hello", "ping"})


def start_server(extra_args: Iterable[str] = ()) -> tuple[EmbeddedServer, str]:
    """A fresh valkey-server on a free loopback port (no persistence, noeviction). A port free
    when picked can be taken before the server binds it (other processes pick too): another
    port then, up to 5 tries."""
    for attempt in range(5):
        server = EmbeddedServer(port=free_port(), unix_socket=False, extra_args=tuple(extra_args))
        try:
            return server, server.start()
        except ConfigError as exc:
            if "Failed listening" not in str(exc) or attempt == 4:
                raise
    raise AssertionError("unreachable")


def server_version(url: str) -> str:
    r = redis_sync.Redis.from_url(url)
    try:
        info = r.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        return f"{name} {info.get('valkey_version') or info.get('redis_version')}"
    finally:
        r.close()


def machine(url: str | None = None) -> dict[str, str]:
    """What a result depends on: cores, CPU model, Python, server version, date."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "python": platform.python_version(),
        "server": server_version(url) if url else find_server_binary(),
    }
    return out


def print_machine(info: Mapping[str, str]) -> None:
    print(
        f"machine: nproc={info['nproc']} cpu={info['cpu']!r} python={info['python']} "
        f"server={info['server']} date={info['date']}"
    )


def commandstats(r: redis_sync.Redis) -> dict[str, int]:
    """``{command: calls}`` from INFO commandstats (subcommands as ``cmd|sub``)."""
    raw = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in raw.items()}


def server_cpu(r: redis_sync.Redis) -> float:
    """Server CPU seconds (user + sys, main thread and children)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def delta(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Per-command calls between two snapshots, harness commands dropped."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0)
        if d and k not in HARNESS_COMMANDS:
            out[k] = d
    return out


def proc_cpu(ps: psutil.Process) -> float:
    """CPU seconds (user + sys) of a process and its live descendants."""
    total = 0.0
    try:
        procs = [ps, *ps.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def loadavg() -> str:
    """The box's 1/5/15-minute load averages (other sessions share the machine)."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def time_drain(
    r: redis_sync.Redis,
    ps: psutil.Process,
    n: int,
    t0_wall: float,
    remaining: Callable[[], int],
    poll_cmds: Mapping[str, int],
    what: str,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Time from the wall-clock moment ``t0_wall`` until ``remaining()`` reports 0 jobs left.

    ``remaining`` asks Redis for the system's own state (queue length, pending entries); the
    commands one call sends (``poll_cmds``) are subtracted from the count, so "cmds" is what
    the worker sent, per job. ``ps`` is the worker process (CPU includes its children).
    """
    time.sleep(max(0.0, t0_wall - time.time()))
    before, scpu0, wcpu0 = commandstats(r), server_cpu(r), proc_cpu(ps)
    t0 = time.perf_counter()
    polls = 1
    while remaining():
        polls += 1
        time.sleep(0.01)
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{what}: {remaining()} of {n} jobs left after {timeout:.0f} s")
    secs = time.perf_counter() - t0
    after, scpu1, wcpu1 = commandstats(r), server_cpu(r), proc_cpu(ps)
    d = delta(after, before)
    for cmd, k in poll_cmds.items():
        d[cmd] = d.get(cmd, 0) - polls * k
    d = {k: v for k, v in d.items() if v > 0}
    return {
        "rate": n / secs,
        "secs": secs,
        "n": n,
        "cmds": sum(d.values()) / n,
        "worker_us": (wcpu1 - wcpu0) / n * 1e6,
        "server_us": (scpu1 - scpu0) / n * 1e6,
        "breakdown": d,
    }


def fmt_breakdown(d: Mapping[str, float], per: float = 1.0, top: int = 12) -> str:
    items = sorted(d.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v / per:.2f}" for k, v in items)


def pct(values: list[float], q: float) -> float:
    """Percentile by nearest rank on sorted values (q in 0..100)."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def rotated(names: list[str], rnd: int) -> list[str]:
    """Round ``rnd``'s run order: each variant goes first in turn, so drift hits all alike."""
    k = rnd % len(names)
    return names[k:] + names[:k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run_async(coro: Coroutine[Any, Any, T], loop: str = "uvloop") -> T:
    """Run on uvloop (what ``python -m worker`` uses) or asyncio's default loop."""
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-markdown table (also readable on a terminal)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    return "\n".join([line, sep, *body])


def child_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: no inherited WORKER_*, the repo on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_")}
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python() -> str:
    return sys.executable


def spawn(
    args: list[str], env: Mapping[str, str], log_path: Path, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    """Start a child with output to ``log_path``."""
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it; closed by the OS at exit
    try:
        return subprocess.Popen(
            args, env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        log.close()


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def have_arq() -> bool:
    """Whether arq is installed (``fenced-worker[arq]``): the benches' arq baselines need it;
    without it they run our side alone and say so."""
    import importlib.util

    return importlib.util.find_spec("arq") is not None


class BenchLease(FixedLease):
    """:class:`harness.leases.FixedLease` that raises on a loss: a benchmark never runs on past
    a refused write (benchmarks run singleton components directly)."""

    def __init__(self, value: str) -> None:
        super().__init__(value, strict=True)


def fill_queue(
    r: redis_sync.Redis, queue: str, n: int, due_ms: int, payload: Callable[[int], bytes],
    id_prefix: str = "",
) -> None:  # fmt: skip
    """``n`` jobs due at ``due_ms`` in ``queue``, written as the framework writes them (the job
    record, then its id in the queue), ``payload(i)`` the i-th job's record; pipelined."""
    from worker.core.codec import EXPIRES_EXTRA_MS, JOB_KEY_PREFIX

    pipe = r.pipeline(transaction=False)
    for i in range(n):
        job_id = f"{id_prefix}j{i:07d}"
        pipe.set(JOB_KEY_PREFIX + job_id, payload(i), px=EXPIRES_EXTRA_MS)
        pipe.zadd(queue, {job_id: due_ms})
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()


def fill_noop_queue(r: redis_sync.Redis, prefix: str, n: int, due_ms: int) -> None:
    """``n`` no-op jobs in ``prefix``'s queue, ids starting with the prefix (its slot)."""
    from worker.core.serializer import get_serializer, job_payload

    ser, _ = get_serializer("msgpack")
    fill_queue(
        r, f"{prefix}queue", n, due_ms, lambda i: job_payload("noop", (i,), {}, due_ms, ser), prefix
    )


def announce(r: redis_sync.Redis, prefix: str, due_ms: int) -> None:
    """A batch's due time on ``prefix``'s wake marker, as the framework's enqueue sets it."""
    from worker.storage.keys import Keys

    r.zadd(Keys(prefix).wake_marker, {"wake": due_ms}, lt=True)


def worker_env(url: str, app: str, prefix: str = "bench:", **extra: str) -> dict[str, str]:
    """A bench's ``python -m worker`` child: ``app`` on ``url`` under ``prefix``, no health
    port, no drain delay (stopping is not measured), JSON logs; ``extra`` on top of those."""
    base = {
        "WORKER_REDIS_URL": url,
        "WORKER_APP": app,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_HEALTH_PORT": "0",
        "WORKER_DRAIN_DELAY_S": "0",
        "WORKER_LOG_FORMAT": "json",
    }
    return child_env(**{**base, **extra})


def spawn_worker(
    role: str, env: Mapping[str, str], log_path: Path, *args: str, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    """``python -m worker run --role <role> [args]`` with output to ``log_path``."""
    return spawn([python(), "-m", "worker", "run", "--role", role, *args], env, log_path, cwd)


def stop_procs(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 30.0) -> None:
    """SIGTERM to every process still running, then wait for each (killed after ``timeout``)."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def result_count(r: redis_sync.Redis) -> int:
    """How many job results (``arq:result:*``) the server holds."""
    return sum(1 for _ in r.scan_iter("arq:result:*", count=5000))


def print_breakdowns(results: Mapping[str, list[dict[str, Any]]], what: str) -> None:
    """Each variant's last run: its commands per job (``what``: per what), the busiest first."""
    for name, runs in results.items():
        last = runs[-1]
        print(f"{what} {name}: {fmt_breakdown(last['breakdown'], last['n'])}")


def measure_drain(
    nodes: list[redis_sync.Redis],
    queues: list[tuple[int, str]],
    procs: Iterable[subprocess.Popen[bytes]],
    due_ms: int,
    what: str,
    replicas: Iterable[redis_sync.Redis] = (),
    timeout: float = 600.0,
) -> dict[str, Any]:
    """From ``due_ms`` until every queue (``(index in nodes, key)``) is empty: the seconds, per
    node its commands (the harness's ZCARD polls left out) and server CPU seconds, the
    ``replicas``' CPU seconds summed and the worker processes' CPU seconds summed."""
    ps = [psutil.Process(p.pid) for p in procs]
    time.sleep(max(0.0, due_ms / 1000 - time.time()))
    before = [commandstats(c) for c in nodes]
    cpu0, rcpu0 = [server_cpu(c) for c in nodes], sum(server_cpu(c) for c in replicas)
    wcpu0 = sum(proc_cpu(p) for p in ps)
    t0 = time.perf_counter()
    polls = 0
    while sum([int(nodes[i].zcard(q)) for i, q in queues]):  # every queue, always
        polls += 1
        time.sleep(0.01)
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"{what}: not drained")
    secs = time.perf_counter() - t0
    cpu1, rcpu1 = [server_cpu(c) for c in nodes], sum(server_cpu(c) for c in replicas)
    wcpu1 = sum(proc_cpu(p) for p in ps)
    per_node = []
    for i, c in enumerate(nodes):
        d = {k: v for k, v in delta(commandstats(c), before[i]).items() if v > 0}
        d["zcard"] = max(0, d.get("zcard", 0) - (polls + 1) * sum(j == i for j, _ in queues))
        per_node.append({"cmds": sum(d.values()), "cpu_s": cpu1[i] - cpu0[i], "breakdown": d})
    return {
        "secs": secs,
        "per_node": per_node,
        "replica_cpu_s": rcpu1 - rcpu0,
        "worker_cpu_s": wcpu1 - wcpu0,
    }
