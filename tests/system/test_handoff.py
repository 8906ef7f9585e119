"""A planned leader handoff with real processes (``python -m worker handoff``): the lease
moves to the other candidate at once, and no tick is missed or run twice across it."""

from __future__ import annotations

import time

import pytest
import redis as redis_sync

from harness import FAST_ENV, CliRun, Spawn, wait_until
from harness.probes import instance_records
from tests.system.test_faults import (
    active_leader,
    assert_each_tick_once,
    lock_epoch,
    tick_ledger,
    two_leaders_ticking,
    wait_ticks_settled,
)

pytestmark = pytest.mark.slow


def test_handoff_moves_the_lease_and_keeps_every_tick_once(
    spawn: Spawn, cli: CliRun, redis_url: str, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leaders, first, old, epoch = two_leaders_ticking(spawn, rsync, 3)
    other = next(p for p in leaders if p is not old)
    wait_until(
        lambda: other.name in {r.get("name") for r in instance_records(rsync, prefix)},
        what="the standby registered",
    )

    env = {**FAST_ENV, "WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix,
           "WORKER_APP": "harness.apps.ledger:app"}  # fmt: skip
    asked = time.monotonic()
    out = cli("handoff", env=env)
    took = time.monotonic() - asked
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"asked the leader of epoch {epoch} to hand over" in out.stdout
    new = lock_epoch(rsync, prefix) or 0
    assert new > epoch, (new, epoch)
    assert f"epoch {new} is held by {other.name}" in out.stdout
    assert took < 10, f"the handoff took {took:.1f}s"
    history = [h.decode().split("|") for h in rsync.lrange(f"{prefix}leader:history", 0, 1)]
    assert [(int(h[0]), h[2], h[3]) for h in history] == [
        (new, "after handoff", other.name),
        (epoch, "handoff", old.name),
    ]
    # the old leader stays a standby through its pause (the lease TTL), then campaigns and loses
    time.sleep(4)
    assert lock_epoch(rsync, prefix) == new
    assert wait_until(lambda: active_leader(rsync, prefix, leaders), what="leader")[0] is other

    wait_until(lambda: max(tick_ledger(rsync, prefix)) >= first + 10_000, 30, what="10 ticks")
    last = wait_ticks_settled(rsync, prefix, first)
    assert_each_tick_once(tick_ledger(rsync, prefix), first, last)
    audit = rsync.lrange(f"{prefix}audit", 0, -1)
    assert len(audit) == 1 and b'"via": "cli"' in audit[0] and b'"action": "handoff"' in audit[0]
    assert all(p.alive() for p in leaders)
