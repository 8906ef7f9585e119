"""What an idle fleet costs Redis, and what it keeps: commands/s per idle role, wake latency,
orphan recovery and leader takeover times, with real ``python -m worker`` processes on the
framework defaults (``bench.apps:idle_app``: no periodic job, nothing to do).

COST: each role on a private valkey-server of its own, so ``INFO commandstats`` deltas are
that process's commands alone (valkey counts the commands a Lua script runs as well as the
``EVALSHA``: "commands" include script work; "requests" are what the process's connections
sent, from ``CLIENT LIST``'s ``tot-cmds``):

- ``consumer``: one ``--role consumer``;
- ``standby``: one ``--role leader`` that cannot win: the harness holds the lock and renews it
  every 2 s with ``PEXPIRE`` (as a leader's RENEW does; those commands are not counted);
- ``leader``: one ``--role leader`` holding the lease (for reference).

WAKE: after the cost window, on the consumer's server: ``--spells`` times, an idle spell of
``--spell-s`` then one ``wake_stamp`` enqueued through ``worker.Client``; the job records
enqueue -> start.

REAP: a leader (the orphan reaper) and two consumers of queue ``slow``; one long ``hold`` job;
the process running it is SIGKILLed; time until the other starts it again.

TAKEOVER: a leader and a standby; the leader SIGKILLed (the lease must expire) or SIGTERMed (a
release: the standby hears it); time until the lock holds a new epoch.

    python -m bench idle            # 60 s window, 60 wakes, 2 + 2 takeovers (~5 min)
    python -m bench idle --quick    # 3 s window, 5 wakes, fast liveness timings, all at once

Targets: each idle role ≤ 1 command/s; first job after an idle spell ≤ 20 ms
p99 after its enqueue; orphans and takeovers within the documented bounds
(docs/deployment.md "Scale", docs/guarantees.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis as redis_sync

from bench._common import (
    commandstats,
    fmt_breakdown,
    loadavg,
    machine,
    pct,
    print_machine,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    wait_until,
    worker_env,
)

PREFIX = "bench:"
APP = "bench.apps:idle_app"
WAKE, HOLD = "bench:idle:wake", "bench:idle:hold"
#: what the harness itself sends while a window is open (INFO, CLIENT LIST; the standby's
#: fake holder renews with PEXPIRE, which an idle standby never sends)
HARNESS = {
    "consumer": frozenset({"info", "client|list"}),
    "standby": frozenset({"info", "client|list", "pexpire"}),
    "leader": frozenset({"info", "client|list"}),
}
#: short liveness timings for --quick (as the tests' FAST_ENV): the bounds scale with them
FAST = {
    "WORKER_LEADER_TTL_S": "3",
    "WORKER_LEADER_RENEW_INTERVAL_S": "0.5",
    "WORKER_LEADER_RENEW_DEADLINE_S": "1.5",
    "WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    "WORKER_ORPHAN_STALE_S": "2",
    "WORKER_STOP_GRACE_S": "1",
}


def start(
    role: str, url: str, log: Path, name: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    full = worker_env(url, APP, PREFIX, **(env or {}))
    return spawn_worker(role, full, log, "--instance-name", name)


def requests(r: redis_sync.Redis, harness: set[int]) -> int:
    """Commands every connection but the harness's sent so far (``tot-cmds``; valkey counts
    a script's commands there too)."""
    return sum(int(c.get("tot-cmds", 0)) for c in r.client_list() if int(c["id"]) not in harness)


class Renewer:
    """Holds the lock for a standby to lose against: ``PEXPIRE`` every 2 s (a leader's renew)."""

    def __init__(self, url: str) -> None:
        self.r = redis_sync.Redis.from_url(url)
        self.id = int(self.r.client_id())
        self.r.set(f"{PREFIX}leader", "1:harness-holder", px=10_000)
        self.r.set(f"{PREFIX}leader:epoch", 1)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(2.0):
            self.r.pexpire(f"{PREFIX}leader", 10_000)

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.r.close()


def diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """Calls per command between two ``INFO commandstats`` snapshots."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def cost(window_s: float, settle_s: float, logdir: Path) -> dict[str, dict[str, Any]]:
    """Commands/s per idle role, each on its own server, measured at the same time."""
    servers = {role: start_server() for role in ("consumer", "standby", "leader")}
    clients = {role: redis_sync.Redis.from_url(url) for role, (_, url) in servers.items()}
    renewer = Renewer(servers["standby"][1])
    one = {"WORKER_QUEUES": "default"}  # one queue, as most apps (a look per queue)
    procs = {
        "consumer": start("consumer", servers["consumer"][1], logdir / "c.log", "idle-c", one),
        "standby": start("leader", servers["standby"][1], logdir / "s.log", "idle-s", one),
        "leader": start("leader", servers["leader"][1], logdir / "l.log", "idle-l", one),
    }
    out: dict[str, dict[str, Any]] = {}
    try:
        for role, r in clients.items():
            wait_until(lambda r=r: r.zcard(f"{PREFIX}instances") >= 1, 60, f"the {role}")
        wait_until(lambda: clients["leader"].exists(f"{PREFIX}leader"), 60, "a leader")
        time.sleep(settle_s)  # start-up is not idle: manifests, script loads, first looks
        ids = {role: {int(r.client_id())} for role, r in clients.items()}
        ids["standby"].add(renewer.id)
        before = {role: (commandstats(r), requests(r, ids[role])) for role, r in clients.items()}
        t0 = time.monotonic()
        time.sleep(window_s)
        secs = time.monotonic() - t0
        for role, r in clients.items():
            stats, reqs = commandstats(r), requests(r, ids[role])
            d = {k: v for k, v in diff(stats, before[role][0]).items() if k not in HARNESS[role]}
            out[role] = {
                "cmds": sum(d.values()) / secs,
                "requests": (reqs - before[role][1]) / secs,
                "breakdown": {k: v / secs for k, v in d.items()},
                "alive": procs[role].poll() is None,
            }
    finally:
        renewer.close()
        stop_procs(list(procs.values()))
        for role, r in clients.items():
            r.close()
            servers[role][0].stop()
    return out


async def _enqueue(url: str, task: str, *args: Any, **kwargs: Any) -> None:
    from worker.client import Client

    client = await Client.connect(url, key_prefix=PREFIX)
    try:
        await client.enqueue(task, *args, **kwargs)
    finally:
        await client.close()


async def _enqueue_after_spells(url: str, spells: int, spell_s: float) -> None:
    from worker.client import Client

    r = redis_sync.Redis.from_url(url)
    client = await Client.connect(url, key_prefix=PREFIX)
    try:
        for i in range(spells):
            await asyncio.sleep(spell_s)
            await client.enqueue("wake_stamp", time.time())
            deadline = time.monotonic() + 30
            while r.llen(WAKE) <= i:  # one at a time: each job meets an idle consumer
                if time.monotonic() > deadline:
                    raise TimeoutError(f"wake {i}: no start within 30 s")
                await asyncio.sleep(0.005)
    finally:
        await client.close()
        r.close()


def wake(spells: int, spell_s: float, logdir: Path) -> list[float]:
    server, url = start_server()
    r = redis_sync.Redis.from_url(url)
    proc = start("consumer", url, logdir / "wake.log", "wake-c")
    try:
        wait_until(lambda: r.zcard(f"{PREFIX}instances") == 1, 60, "the consumer")
        time.sleep(1.0)
        asyncio.run(_enqueue_after_spells(url, spells, spell_s))
        return [float(v) for v in r.lrange(WAKE, 0, -1)]
    finally:
        stop_procs([proc])
        r.close()
        server.stop()


def reap(env: Mapping[str, str], logdir: Path) -> float:
    """SIGKILL the consumer running a long job; seconds until another consumer starts it."""
    server, url = start_server()
    r = redis_sync.Redis.from_url(url)
    procs = [
        start("leader", url, logdir / "reap-l.log", "reap-l", {**env, "WORKER_QUEUES": "default"}),
        start("consumer", url, logdir / "reap-c1.log", "reap-c1", env),
        start("consumer", url, logdir / "reap-c2.log", "reap-c2", env),
    ]
    try:
        wait_until(lambda: r.zcard(f"{PREFIX}instances") == 3, 60, "three instances")
        wait_until(lambda: r.exists(f"{PREFIX}leader"), 60, "a leader")
        stale_s = float(env.get("WORKER_ORPHAN_STALE_S", "10"))
        time.sleep(stale_s + 1)  # the reaper reaps nobody for orphan_stale_s after it starts
        asyncio.run(_enqueue(url, "hold", 600, queue="slow"))
        first = wait_until(lambda: r.lrange(HOLD, 0, 0), 60, "the hold job")[0].decode()
        pid = int(first.split(":")[0])
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        again = wait_until(lambda: r.llen(HOLD) >= 2, 120, "the re-run", 0.01)
        assert again
        return float(r.lindex(HOLD, 1).decode().split(":")[1]) - killed  # type: ignore[union-attr]
    finally:
        stop_procs(procs)
        r.close()
        server.stop()


def epoch(r: redis_sync.Redis) -> int | None:
    raw = r.get(f"{PREFIX}leader")
    return int(raw.split(b":")[0]) if raw else None


def takeover(
    kind: str, env: Mapping[str, str], logdir: Path, n: int, settle_s: float = 3.0
) -> list[float]:
    """``n`` trials: the leader SIGKILLed (``crash``) or SIGTERMed (``release``); seconds from
    the signal until the lock holds a new epoch (the standby's)."""
    server, url = start_server()
    r = redis_sync.Redis.from_url(url)
    procs: list[subprocess.Popen[bytes]] = []
    times = []
    try:
        leader = start("leader", url, logdir / f"{kind}-0.log", f"{kind}-0", env)
        procs.append(leader)
        wait_until(lambda: epoch(r) is not None, 60, "a leader")
        for i in range(n):
            standby = start("leader", url, logdir / f"{kind}-{i + 1}.log", f"{kind}-{i + 1}", env)
            procs.append(standby)
            wait_until(lambda: r.zcard(f"{PREFIX}instances") >= 2, 60, "the standby")
            time.sleep(settle_s)  # the standby settles into its idle campaign
            before = epoch(r)
            t0 = time.time()
            leader.send_signal(signal.SIGKILL if kind == "crash" else signal.SIGTERM)
            wait_until(lambda b=before: epoch(r) not in (None, b), 120, "a new epoch", 0.005)
            times.append(time.time() - t0)
            leader.wait(30)
            r.zremrangebyrank(f"{PREFIX}instances", 0, -1)  # count the next standby afresh
            leader = standby
        return times
    finally:
        stop_procs(procs)
        r.close()
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick", "--smoke", action="store_true", help="a few seconds per part (smoke test)"
    )
    ap.add_argument("--window-s", type=float, help="idle window (default 60; quick 3)")
    ap.add_argument("--spells", type=int, help="wakes measured (default 60; quick 5)")
    ap.add_argument("--spell-s", type=float, default=1.0, help="idle spell before each wake")
    ap.add_argument("--trials", type=int, help="takeovers per kind (default 2; quick 1)")
    ap.add_argument("--parts", default="cost,wake,reap,crash,release", help="what to run")
    args = ap.parse_args()
    window = args.window_s or (3.0 if args.quick else 60.0)
    spells = args.spells or (5 if args.quick else 60)
    trials = args.trials or (1 if args.quick else 2)
    spell_s = 0.3 if args.quick else args.spell_s
    env = FAST if args.quick else {}
    settle = 1.0 if args.quick else 3.0
    server, url = start_server()
    print_machine(machine(url))
    server.stop()
    print(f"load before: {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        logdir = Path(tmp)
        parts: dict[str, Callable[[], Any]] = {
            "cost": lambda: cost(window, 1.0 if args.quick else 10.0, logdir),
            "wake": lambda: wake(spells, spell_s, logdir),
            "reap": lambda: reap(env, logdir),
            "crash": lambda: takeover("crash", env, logdir, trials, settle),
            "release": lambda: takeover("release", env, logdir, trials, settle),
        }
        chosen = args.parts.split(",")
        parts = {k: f for k, f in parts.items() if k in chosen}
        if args.quick:  # a smoke run: the parts at once, each on its own server
            with ThreadPoolExecutor(len(parts)) as pool:
                futures = {k: pool.submit(f) for k, f in parts.items()}
                got = {k: f.result() for k, f in futures.items()}
        else:  # one at a time: a measurement must not share the box with the others
            got = {k: f() for k, f in parts.items()}
    print(f"load after: {loadavg()}\n")
    report(got, args.quick, window, spell_s)


def report(got: dict[str, Any], quick: bool, window: float, spell_s: float) -> None:
    if "cost" in got:
        timing = "fast test timings" if quick else "defaults"
        print(f"idle cost over {window:.0f} s, each role alone on a server, one queue ({timing} "
              "for the liveness parts)")  # fmt: skip
        rows = [
            [role, f"{c['cmds']:.2f}", f"{c['requests']:.2f}", fmt_breakdown(c["breakdown"])]
            + ([] if c["alive"] else ["(process exited!)"])
            for role, c in got["cost"].items()
        ]
        print(table(["role", "commands/s", "requests/s", "by command (/s)"], rows))
        print()
    rows = []
    if "wake" in got:
        w = got["wake"]
        rows.append(
            [f"first job after a {spell_s:g} s idle spell, enqueue -> start (ms), n={len(w)}",
             f"{pct(w, 50):.1f}", f"{pct(w, 99):.1f}", f"{max(w):.1f}"]
        )  # fmt: skip
    if "reap" in got:
        rows.append(
            ["orphaned job: consumer SIGKILLed -> job started again (s)", f"{got['reap']:.1f}",
             "", ""]
        )  # fmt: skip
    for kind, signal_name, digits in (("crash", "SIGKILLed", 2), ("release", "SIGTERMed", 3)):
        if kind in got:
            t = got[kind]
            rows.append(
                [f"takeover: leader {signal_name} -> new epoch (s), n={len(t)}",
                 f"{pct(t, 50):.{digits}f}", "", f"{max(t):.{digits}f}"]
            )  # fmt: skip
    if rows:
        print(table(["liveness", "p50", "p99", "max"], rows))


if __name__ == "__main__":
    main()
