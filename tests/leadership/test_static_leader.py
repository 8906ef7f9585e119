"""Static leader mode must not leave a lock that blocks every later election.

The static lease now has a TTL and is renewed; ACQUIRE replaces a lock without expiry (left
by an older static leader) and the elector logs an ERROR; ``status`` flags such a lock.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import FAST_ENV, CliRun, Spawn, ledger, wait_until
from worker.core.clock import SystemClock
from worker.core.ids import LockValue
from worker.leadership.static import StaticLeader
from worker.storage import election as election_lua
from worker.storage import keys as K
from worker.storage.election import Acquired, Refused
from worker.storage.store import Store

pytestmark = pytest.mark.timeout(120)

KEYS = K.Keys("t:")
TTL_S = float(FAST_ENV["WORKER_LEADER_TTL_S"])
POLL_S = float(FAST_ENV["WORKER_LEADER_POLL_INTERVAL_S"])


async def run(r: Any, script: str, keys: list[str], args: list[Any]) -> Any:
    return await r.eval(script, len(keys), *keys, *args)


# -- scripts (fakeredis and the real server) ------------------------------------------------------


async def test_claim_static_sets_a_ttl(r: Any) -> None:
    v = await run(r, election_lua.CLAIM_STATIC, [KEYS.leader, KEYS.leader_epoch], ["tok", 4000])
    lock = LockValue.parse(v)
    assert lock is not None and lock.token == "tok" and lock.epoch > 1_700_000_000_000  # clock ms
    assert 0 < await r.pttl(KEYS.leader) <= 4000


async def test_acquire_replaces_a_lock_without_expiry(r: Any) -> None:
    await r.set(KEYS.leader, "3:old-static")  # what an old static leader left behind
    await r.set(KEYS.leader_epoch, 3)
    store = Store(r, KEYS)
    won = await store.acquire("tokB", 5000, bound_ms=7000)
    assert isinstance(won, Acquired) and won.lock.token == "tokB" and won.lock.epoch > 3
    assert won.replaced == "3:old-static"  # the lock it replaced, for the error log
    assert won.gap_ms == 7000  # its holder may still be alive: singleton services wait
    assert await r.get(KEYS.leader) == str(won.lock).encode()
    assert 0 < await r.pttl(KEYS.leader) <= 5000
    # a lock with a TTL is still refused
    assert isinstance(await store.acquire("tokC", 5000), Refused)


async def test_static_leader_renews_its_lease(r: Any) -> None:
    import asyncio

    lead = StaticLeader(Store(r, KEYS), SystemClock(), retry_s=0.1, ttl_s=0.6)
    stop = asyncio.Event()
    task = asyncio.create_task(lead.run(stop))
    try:
        for _ in range(200):
            if lead.is_leading():
                break
            await asyncio.sleep(0.01)
        assert lead.is_leading()
        await asyncio.sleep(1.5)  # well past the TTL: only renewals keep the lock
        assert await r.get(KEYS.leader) == str(lead.lock).encode()
        assert 0 < await r.pttl(KEYS.leader) <= 600
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    await lead.release()
    assert await r.exists(KEYS.leader) == 0


# -- real processes -------------------------------------------------------------------------------


def _holder(rsync: redis_sync.Redis, prefix: str) -> str | None:
    raw = rsync.get(K.Keys(prefix).leader)
    return raw.decode() if raw else None


@pytest.mark.slow
def test_sigkilled_static_leader_does_not_block_the_election(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    static = spawn("all", name="s1", env={"WORKER_LEADER_ELECTION": "static"})
    wait_until(lambda: ledger(rsync, prefix, "ticks"), 30, what="the static leader's ticks")
    static_value = _holder(rsync, prefix)
    assert static_value is not None
    assert 0 < rsync.pttl(keys.leader) <= TTL_S * 1000, "the static lease must expire"

    standby = spawn("leader", name="l1")  # redis election: a standby while s1 holds the lock
    wait_until(
        lambda: any(m.decode().startswith("l1-") for m in rsync.zrange(keys.instances, 0, -1)),
        30,
        what="l1 to register",
    )
    time.sleep(2 * POLL_S)
    assert _holder(rsync, prefix) == static_value, "a live static leader keeps its lease"

    static.kill()
    killed = time.monotonic()
    wait_until(
        lambda: (_holder(rsync, prefix) or static_value) != static_value,
        TTL_S + 10,
        interval=0.05,
        what="the elected leader to take over",
    )
    elapsed = time.monotonic() - killed
    assert elapsed < TTL_S + 1.25 * POLL_S + 1.0, elapsed
    assert standby.alive()
    # the lock changed hands by now; the line saying so may still be on its way to the log
    wait_until(
        lambda: any(e.get("event") == "leadership acquired" for e in standby.events()),
        10,
        what="the standby to log its leadership",
    )


@pytest.mark.slow
def test_lock_without_expiry_is_flagged_and_replaced(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    rsync.set(keys.leader_epoch, 41)
    rsync.set(keys.leader, "41:left-by-an-old-static-leader")  # no expiry

    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    st = cli("status", "--json", env={**env, "WORKER_APP": "harness.apps.ledger:app"})
    assert st.returncode == 0, st.stderr
    leader = json.loads(st.stdout)["leader"]
    assert leader["held"] and leader["no_expiry"] is True

    proc = spawn("leader", name="l1")
    wait_until(
        lambda: (LockValue.parse(_holder(rsync, prefix)) or LockValue(0, "")).epoch > 41,
        20,
        what="the lock replaced",
    )
    assert 0 < rsync.pttl(keys.leader) <= TTL_S * 1000
    wait_until(lambda: ledger(rsync, prefix, "ticks"), 20, what="ticks under the new leader")
    errors = [e for e in proc.events() if e.get("level") == "error"]
    assert any("lock without expiry" in e["event"] for e in errors), proc.log()
    assert proc.terminate() == 0


def test_status_renders_a_lock_without_expiry() -> None:
    from worker.ops import status

    data: dict[str, Any] = {
        "at": "2023-11-14T22:13:50+00:00",
        "leader": {"held": True, "epoch": 41, "ttl_remaining_s": None, "no_expiry": True},
        "queue": {"name": "t:queue", "depth": 0, "due": 0},
        "dead_letters": 0,
        "instances": [],
        "periodic": [],
        "pollers": [],
        "initializers": [],
    }
    line = next(ln for ln in status.render(data).splitlines() if ln.startswith("leader:"))
    assert "epoch 41" in line and "ttl NONE" in line and "without expiry" in line
