"""Redis refusing writes for a while — out of memory (``maxmemory``, ``noeviction``) or
``MISCONF`` (it cannot persist: writes refused until a save succeeds) — under real
``python -m worker`` processes (harness/apps/outage.py), what they did counted in a ledger on a
second server that is never faulted.

- Poll jobs mid-flight when the writes are refused call the framework's own
  ``ctx.poller(...).schedule``: it rides the refusal out (retries until Redis takes the write,
  within ``errors.RIDE_OUT_S``), so every item runs again within seconds of the memory being
  freed. Before: each such job failed on the call, its item could not be put back either
  ("could not settle poll item"), and the leader's sweep put it back ``failure_delay_s``
  (60 s) later.
- ``MISCONF`` is a dependency outage like ``OOM``: every process stays live (``/healthz``
  200), reports unready (``/readyz`` 503), no component crash-loops, and everything resumes
  once the server can save again. Before: every process failed ``/healthz`` (a crash loop of
  the heartbeat and the leader's components) while ``/readyz`` said 200.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, wait_until
from harness.ports import free_port
from harness.probes import http_get, problem_report, wait_ready
from harness.realredis import RealRedis
from tests.system.test_oom import fill_memory, free_memory, refused
from worker.polls import shard_of
from worker.storage import keys as K

pytestmark = pytest.mark.slow

OUTAGE_APP = "harness.apps.outage:app"
#: Every poll item runs again within this of the writes being accepted again (the issue's
#: bound; the default ``failure_delay_s`` is 60 s).
BACK_WITHIN_S = 15.0
ITEMS = [f"item-{n:03d}" for n in range(40)]


@pytest.fixture(scope="module")
def server() -> Iterator[RealRedis]:
    """64 MiB ``noeviction`` (what the README asks for), RDB save points (``MISCONF`` needs
    them) and ``CONFIG SET dir`` allowed (how the test makes a save fail)."""
    args = (
        "--appendfsync", "everysec",
        "--maxmemory", "64mb", "--maxmemory-policy", "noeviction",
        "--save", "3600 1", "--enable-protected-configs", "yes",
    )  # fmt: skip
    with RealRedis(extra_args=args) as s:
        yield s


@pytest.fixture
def redis_url(server: RealRedis) -> str:
    """Overrides conftest's: ``spawn`` starts its processes on this module's server."""
    return server.fresh_url()


@pytest.fixture
def ospawn(spawn: Spawn, ledger_url: str) -> Spawn:
    """``spawn`` for the outage app; the processes started are in ``ospawn.procs``."""
    procs: list[WorkerProc] = []

    def start(role: str, *, name: str, env: dict[str, str] | None = None) -> WorkerProc:
        env = {"OUTAGE_LEDGER_URL": ledger_url, **(env or {})}
        procs.append(spawn(role, name=name, app=OUTAGE_APP, env=env))
        return procs[-1]

    start.prefix = spawn.prefix  # type: ignore[attr-defined]
    start.procs = procs  # type: ignore[attr-defined]
    return start


def start_processes(ospawn: Spawn, roles: dict[str, str], env: dict[str, str]) -> dict[str, int]:
    """Start one process per ``name: role``; their health ports once every one is ready."""
    ports = {name: free_port() for name in roles}
    procs = {
        name: ospawn(role, name=name, env={**env, "WORKER_HEALTH_PORT": str(ports[name])})
        for name, role in roles.items()
    }
    for name, proc in procs.items():
        wait_ready(proc, ports[name])
    return ports


def schedule_items(r: redis_sync.Redis, prefix: str) -> None:
    """Every item due within the next 2 s, spread evenly: at any moment about half of the jobs
    are running (a 1 s job, then the item waits 1 s)."""
    keys = K.Keys(prefix)
    now_ms = int(time.time() * 1000)
    for n, item in enumerate(ITEMS):
        r.zadd(keys.poll_shard("items", shard_of(item, 2)), {item: now_ms + n * 2000 // len(ITEMS)})


def starts(lsync: redis_sync.Redis, prefix: str) -> list[tuple[str, float]]:
    """Every poll job's start: ``(item, wall time)`` in order."""
    return [tuple(json.loads(x)) for x in lsync.lrange(f"{prefix}outage:starts", 0, -1)]  # type: ignore[misc]


def every_item_cycling(r: redis_sync.Redis, lsync: redis_sync.Redis, prefix: str) -> None:
    """Every item scheduled (:func:`schedule_items` on ``r``) and run at least once."""
    schedule_items(r, prefix)
    wait_until(
        lambda: len({i for i, _ in starts(lsync, prefix)}) == len(ITEMS), 20, what="every item ran"
    )


def items_back(
    lsync: redis_sync.Redis, prefix: str, t: float, within_s: float = BACK_WITHIN_S + 1
) -> dict[str, float]:
    """Each item's first start after ``t`` (seconds after it), once every item started again
    or ``within_s`` passed."""
    settle = t + within_s
    while time.time() < settle and len(first_start_after(lsync, prefix, t)) < len(ITEMS):
        time.sleep(0.2)
    return first_start_after(lsync, prefix, t)


def assert_rode_it_out(
    ospawn: Spawn, title: str, ports: dict[str, int], caught: set[str], back: dict[str, float],
    fault: str, after: str, figures: dict[str, object],
) -> None:  # fmt: skip
    """The verdict of a poll-jobs-through-a-fault test: some job was mid-flight ``fault`` (else
    the test proves nothing), every item ran again within :data:`BACK_WITHIN_S` of ``after``,
    every process live at the end; ``figures`` printed with the verdict's own."""
    late = sorted(set(ITEMS) - {i for i, s in back.items() if s <= BACK_WITHIN_S})
    figures = {
        f"items mid-flight {fault}": len(caught),
        f"items back within 15 s of {after}": len(ITEMS) - len(late),
        f"slowest item back (s after {after})": round(max(back.values(), default=-1), 2),
        "'could not settle poll item' lines": logged(ospawn, "could not settle poll item"),
        **figures,
    }
    problems = []
    if late:
        problems.append(f"{len(late)} items not run within 15 s of {after}: {late[:8]}")
    if not caught:
        problems.append(f"no poll job was mid-flight {fault} (test is vacuous)")
    not_live = [n for n, port in ports.items() if http_get(port, "/healthz")[0] != 200]
    if not_live:
        problems.append(f"/healthz not 200 at the end on {not_live}")
    print(problem_report(title, problems, figures))
    assert not problems, problem_report(title, problems, figures)


def first_start_after(lsync: redis_sync.Redis, prefix: str, t: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for item, at in starts(lsync, prefix):
        if at >= t and item not in out:
            out[item] = at - t
    return out


def mid_flight(lsync: redis_sync.Redis, prefix: str, t: float, work_s: float = 1.0) -> set[str]:
    """Items whose job had started within ``work_s`` before ``t``: still running at ``t``."""
    return {item for item, at in starts(lsync, prefix) if t - work_s < at <= t}


def logged(ospawn: Spawn, event: str) -> int:
    """How many times the processes started logged ``event``."""
    procs: list[WorkerProc] = ospawn.procs  # type: ignore[attr-defined]
    return sum(1 for p in procs for e in p.events() if e.get("event") == event)


def test_poll_jobs_mid_flight_ride_out_redis_out_of_memory(
    ospawn: Spawn, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """40 poll items cycling (a 1 s job that reschedules its item 1 s on); Redis held at
    ``maxmemory`` for 4 s while about half the jobs are mid-flight, then freed: every item
    runs again within 15 s of the memory being freed (none waits out ``failure_delay_s``)."""
    prefix = ospawn.prefix  # type: ignore[attr-defined]
    ports = start_processes(
        ospawn, {"leader": "leader", "consumer": "consumer"}, {"WORKER_CONCURRENCY": "60"}
    )
    every_item_cycling(rsync, lsync, prefix)
    time.sleep(1.0)  # into the cycle: jobs start all the time
    filled = fill_memory(rsync)
    oom_at = time.time()
    caught = mid_flight(lsync, prefix, oom_at)
    while time.time() - oom_at < 4.0:
        if not refused(rsync):
            filled = fill_memory(rsync, filled)  # freed by someone's delete: fill again
        time.sleep(0.1)
    free_memory(rsync, filled)
    back = items_back(lsync, prefix, time.time())
    assert_rode_it_out(
        ospawn, "poll jobs under Redis out of memory", ports, caught, back,
        fault="when writes were refused", after="memory freed", figures={},
    )  # fmt: skip


def break_saves(r: redis_sync.Redis) -> None:
    """Make the server's RDB saves fail (its directory gone): with ``stop-writes-on-bgsave-
    error yes`` (the default) it answers every write ``MISCONF`` until a save succeeds."""
    gone = tempfile.mkdtemp(prefix="worker-misconf-", dir="/tmp")
    r.config_set("dir", gone)
    os.rmdir(gone)
    r.bgsave()
    wait_until(lambda: misconf(r), 10, 0.05, what="writes refused with MISCONF")


def repair_saves(r: redis_sync.Redis, server: RealRedis) -> None:
    r.config_set("dir", server.dir)
    r.bgsave()
    wait_until(lambda: not misconf(r), 10, 0.05, what="writes accepted again")


def misconf(r: redis_sync.Redis) -> bool:
    try:
        r.set("misconf-probe", "1")
    except redis_sync.ResponseError as exc:
        if str(exc).startswith("MISCONF"):
            return True
        raise
    return False


def restarts(port: int) -> dict[str, int]:
    """Per component: its restarts so far (``/status``)."""
    code, body = http_get(port, "/status")
    assert code == 200, body
    return {n: int(c["restarts"]) for n, c in json.loads(body)["components"].items()}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {c: n - before.get(c, 0) for c, n in after.items() if n > before.get(c, 0)}


def test_misconf_keeps_every_process_live_and_unready_then_everything_resumes(
    ospawn: Spawn, server: RealRedis, rsync: redis_sync.Redis, lsync: redis_sync.Redis
) -> None:
    """A leader, a consumer and an ``all`` process, ticks every second and 40 poll items
    cycling; the server answers ``MISCONF`` to every write for 5 s (its saves fail), then can
    save again. During: ``/healthz`` 200 and ``/readyz`` 503 on every process, no component
    crash-loops; after: every process ready again, every item runs again, ticks go on.

    Before: ``/healthz`` 503 on every process (the heartbeat and the leader's components
    crash-looping on a ``ResponseError`` taken for a bug) while ``/readyz`` answered 200."""
    prefix = ospawn.prefix  # type: ignore[attr-defined]
    roles = {"leader": "leader", "consumer": "consumer", "all": "all"}
    ports = start_processes(ospawn, roles, {"WORKER_CONCURRENCY": "30", "OUTAGE_TICKS": "1"})
    every_item_cycling(rsync, lsync, prefix)
    before = {name: restarts(port) for name, port in ports.items()}
    break_saves(rsync)
    refused_at = time.time()
    not_live = {name: 0 for name in ports}
    unready = {name: False for name in ports}
    while time.time() - refused_at < 5.0:
        for name, port in ports.items():
            if http_get(port, "/healthz", timeout=1.0)[0] != 200:
                not_live[name] += 1
            if http_get(port, "/readyz", timeout=1.0)[0] == 503:
                unready[name] = True
        time.sleep(0.2)
    during = {name: restarts(port) for name, port in ports.items()}
    repair_saves(rsync, server)
    repaired_at = time.time()

    def ready() -> bool:
        return all(http_get(port, "/readyz", timeout=1.0)[0] == 200 for port in ports.values())

    ready_in = wait_until(ready, 10, 0.2, what="every process ready") and time.time() - repaired_at
    back = items_back(lsync, prefix, repaired_at, BACK_WITHIN_S)
    ticks = [int(t) / 1000 for t in lsync.hkeys(f"{prefix}outage:ticks")]
    grew = {name: grown(before[name], during[name]) for name in ports}
    figures = {
        "/healthz not 200 while MISCONF (probes)": not_live,
        "/readyz 503 seen while MISCONF": unready,
        "component restarts during the 5 s": grew,
        "s from repair to every /readyz 200": round(ready_in, 1),
        "items run again after the repair": len(back),
        "ticks due after the repair that ran": sum(1 for t in ticks if t > repaired_at),
    }
    problems = []
    if any(not_live.values()):
        problems.append(f"/healthz failed while writes were refused: {not_live}")
    if not all(unready.values()):
        problems.append(f"/readyz never 503 while writes were refused: {unready}")
    if any(grew.values()):
        problems.append(f"components restarted (crashes, not outage waits): {grew}")
    if len(back) < len(ITEMS):
        problems.append(f"{len(ITEMS) - len(back)} items not run within 15 s of the repair")
    if not any(t > repaired_at for t in ticks):
        problems.append("no tick ran after the repair")
    dead = [p.name for p in ospawn.procs if not p.alive()]  # type: ignore[attr-defined]
    if dead:
        problems.append(f"processes died: {dead}")
    print(problem_report("MISCONF", problems, figures))
    assert not problems, problem_report("MISCONF", problems, figures)
