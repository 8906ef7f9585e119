"""Idle fleets that cost nothing, with real processes on the default timings:
an idle consumer and an idle standby leader each send at most one Redis command per second,
counted on the server (``CLIENT LIST``'s per-connection ``tot-cmds``, which counts the commands
a script runs as well as the ``EVALSHA``), and a job enqueued after the idle spell starts at once.
Measured at length, with wake latency percentiles, reap and takeover times: ``python -m bench
idle``."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from harness.timings import FAST_ENV
from worker.client import Client

pytestmark = pytest.mark.slow

APP = "harness.apps.idle:app"
#: the framework's defaults for every timing (the fast test timings unset)
DEFAULTS: dict[str, str | None] = {
    k: None for k in FAST_ENV if k.endswith("_S") and k != "WORKER_DRAIN_DELAY_S"
}
WINDOW_S = 20.0


def instance_ids(r: redis_sync.Redis, prefix: str) -> dict[str, str]:
    """Instance name -> instance id, from the live instance records."""
    out = {}
    for key in r.scan_iter(match=f"{prefix}instance:*", count=1000):
        raw = r.get(key)
        try:
            rec = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(rec, dict) and "name" in rec:
            out[rec["name"]] = rec["id"]
    return out


def sent_per_connection(r: redis_sync.Redis) -> dict[int, tuple[str, int]]:
    """Connection id -> (name, commands it sent so far, script commands included)."""
    return {int(c["id"]): (c.get("name", ""), int(c["tot-cmds"])) for c in r.client_list()}


async def enqueue_stamp(url: str, prefix: str) -> None:
    client = await Client.connect(url, key_prefix=prefix)
    try:
        await client.enqueue("stamp", time.time())
    finally:
        await client.close()


def test_an_idle_consumer_and_an_idle_standby_each_send_at_most_one_command_per_second(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("consumer", name="c", app=APP, env=DEFAULTS)
    spawn("leader", name="l1", app=APP, env=DEFAULTS)
    wait_until(lambda: rsync.exists(f"{prefix}leader"), 60, what="l1 leading")
    spawn("leader", name="l2", app=APP, env=DEFAULTS)  # the standby: l1 holds the lease
    ids = wait_until(
        lambda: (lambda m: m if {"c", "l1", "l2"} <= set(m) else None)(instance_ids(rsync, prefix)),
        60,
        what="three instances",
    )
    time.sleep(4.0)  # start-up is not idle: manifests, script loads, first looks
    before = sent_per_connection(rsync)
    t0 = time.monotonic()
    time.sleep(WINDOW_S)
    after = sent_per_connection(rsync)
    window = time.monotonic() - t0

    rates: dict[str, float] = {}
    for name in ("c", "l2", "l1"):
        mine = {cid for cid, (conn, _) in before.items() if conn.startswith(f"{ids[name]}:")}
        assert mine, f"{name} has no named connection"
        assert mine <= set(after), f"a connection of {name} closed: its count would be lost"
        now = {cid for cid, (conn, _) in after.items() if conn.startswith(f"{ids[name]}:")}
        sent = sum(after[c][1] - before.get(c, ("", 0))[1] for c in now)
        rates[name] = sent / window
    # every connection of the fleet is named after its instance: nothing escapes the count
    unnamed = [n for n, _ in after.values() if not any(n.startswith(f"{i}:") for i in ids.values())]
    assert len(unnamed) <= 1, unnamed  # the test's own connection
    print(
        f"commands/s over {window:.1f} s: consumer {rates['c']:.2f}, standby {rates['l2']:.2f}"
        f" (the leader, one per fleet: {rates['l1']:.2f})"
    )
    assert rates["c"] <= 1.0, rates  # was 4.6/s (heartbeat every 2 s, a look every 1 s)
    assert rates["l2"] <= 1.0, rates  # was 8.2/s (and a campaign every 1 s)
    assert rsync.get(f"{prefix}leader") is not None

    # the wake-up was not given up: a job enqueued now starts at once (pub/sub), not at the
    # next fallback look 30 s away
    asyncio.run(enqueue_stamp(redis_url, prefix))
    starts: Any = wait_until(lambda: rsync.lrange(f"{prefix}idle:starts", 0, -1), 10, what="start")
    assert float(starts[0]) < 0.5, starts
