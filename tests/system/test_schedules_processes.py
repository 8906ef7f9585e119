"""Run-time schedules in real worker processes: two ``--role all`` processes, schedules added,
changed and removed while the leader is SIGKILLed mid-way; every tick of every live schedule
runs once (the ledger of harness/apps/sched.py), none of a removed one after its removal."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, wait_until
from harness.apps.sched import app
from harness.ports import free_port
from worker.client import Client
from worker.core.clock import ms, on_server_time

pytestmark = pytest.mark.timeout(120)
APP = "harness.apps.sched:app"
S = 1000


def leading(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            found = re.search(r"^worker_leader (\S+)$", resp.read().decode(), re.M)
    except OSError:
        return False
    return found is not None and float(found.group(1)) == 1.0


def sched_ledger(rsync: redis_sync.Redis, prefix: str, tag: str) -> dict[int, int]:
    raw: dict[bytes, bytes] = rsync.hgetall(f"{prefix}ledger:sched:{tag}")  # type: ignore[assignment]
    return {int(k): int(v) for k, v in raw.items()}


def contiguous(ticks: dict[int, int], first: int, last: int, step_ms: int) -> list[int]:
    """The ticks of ``step_ms`` in ``[first, last]`` missing from the ledger."""
    return [t for t in range(first, last + 1, step_ms) if t not in ticks]


@pytest.mark.slow
def test_schedules_change_while_the_leader_is_killed(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    ports = [free_port(), free_port()]
    procs = [
        spawn("all", name=f"s{i}", app=APP, env={"WORKER_HEALTH_PORT": str(port)})
        for i, port in enumerate(ports)
    ]

    def leader() -> WorkerProc | None:
        for proc, port in zip(procs, ports, strict=True):
            assert proc.alive() or proc is killed, proc.log()[-3000:]
            if proc is not killed and leading(port):
                return proc
        return None

    killed: WorkerProc | None = None
    first = wait_until(leader, timeout=30, what="a leader")
    at: dict[str, int] = {}

    async def scenario() -> None:
        nonlocal killed
        client = await Client.connect(redis_url, key_prefix=prefix, app=app)
        schedules = client.schedules

        async def now() -> int:
            await on_server_time(client.clock, client.store.server_time_ms)
            return ms(client.clock.time())

        try:
            await schedules.upsert("a", "stamp", "a", every=1)
            await schedules.upsert("b", "stamp", "b", every=1)
            await asyncio.sleep(4)
            at["b-changed"] = await now()
            await schedules.upsert("b", "stamp", "b", every=2)
            await schedules.upsert("c", "stamp", "c", every=1)
            at["c-added"] = await now()
            await asyncio.sleep(2.5)
            first.kill()  # mid-way: SIGKILL, the lease stays until it expires
            killed = first
            at["a-removed"] = await now()
            assert await schedules.remove("a")  # with no leader
            await asyncio.to_thread(wait_until, leader, 30, 0.1, "a new leader")
            await asyncio.sleep(3)
            at["c-removed"] = await now()
            assert await schedules.remove("c")
            await asyncio.sleep(3)
            at["end"] = await now()
        finally:
            await client.close()

    asyncio.run(scenario())
    # the ticks up to the end have run (a loaded box may take a while: 30 s ran out with the
    # suite on 4 workers beside other suites; the wait ends as soon as they have)
    wait_until(
        lambda: max(sched_ledger(rsync, prefix, "b"), default=0) >= at["end"] - 2 * S,
        timeout=90,
        what="the last ticks of b to run",
    )
    second = leader()
    assert second is not None and second is not first
    a, b, c = (sched_ledger(rsync, prefix, tag) for tag in "abc")
    log = second.log()[-3000:]
    # one run per tick, everywhere
    assert {*a.values(), *b.values(), *c.values()} == {1}, (a, b, c, log)
    # a: every second from its first tick until its removal, none after
    assert a and max(a) <= at["a-removed"], (a, at)
    assert contiguous(a, min(a), at["a-removed"] - 2 * S, S) == [], (a, at, log)
    # b: every second until the change, every even second after it (across the failover)
    assert contiguous(b, min(b), at["b-changed"] - S, S) == [], (b, at, log)
    after = [t for t in b if t > at["b-changed"] + S]
    assert after and all(t % (2 * S) == 0 for t in after), (b, at)
    start = (at["b-changed"] // (2 * S) + 1) * 2 * S
    assert contiguous(b, start, at["end"] - 2 * S, 2 * S) == [], (b, at, log)
    # c: added before the kill, removed after it: every second between, none after
    assert c and min(c) <= at["c-added"] + 3 * S, (c, at)
    assert contiguous(c, min(c), at["c-removed"] - 2 * S, S) == [], (c, at, log)
    assert max(c) <= at["c-removed"], (c, at)
    assert max(c) > at["a-removed"] + S, (c, at)  # the new leader ticked it after the kill
    assert second.terminate() == 0, second.log()[-3000:]
