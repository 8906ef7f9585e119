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


def fill_noop_queue(r: redis_sync.Redis, prefix: str, n: int, due_ms: int) -> None:
    """``n`` no-op jobs in ``prefix``'s queue, ids starting with the prefix (its slot)."""
    from worker.core.codec import EXPIRES_EXTRA_MS as expires_extra_ms
    from worker.core.codec import JOB_KEY_PREFIX as job_key_prefix
    from worker.core.serializer import get_serializer, job_payload

    ser, _ = get_serializer("msgpack")
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        job_id = f"{prefix}j{i:07d}"
        pipe.set(
            job_key_prefix + job_id, job_payload("noop", (i,), {}, due_ms, ser), px=expires_extra_ms
        )
        pipe.zadd(f"{prefix}queue", {job_id: due_ms})
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
