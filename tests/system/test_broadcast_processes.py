"""Broadcasts across real processes on a real server: a dropped connection catches up.

Three ``python -m worker`` processes of mixed roles run ``harness/apps/bcast.py``, which records
every message each process handled in a Redis ledger per process. Assertions are on those
ledgers, never on log wording.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, WorkerProc, client_call, wait_until

pytestmark = pytest.mark.slow

APP = "harness.apps.bcast:app"


def bcast_ledger(r: redis_sync.Redis, prefix: str, name: str) -> dict[str, int]:
    raw = r.hgetall(f"{prefix}ledger:bcast:{name}")
    return {k.decode(): int(v) for k, v in raw.items()}


def broadcast_conns(r: redis_sync.Redis, name: str) -> list[dict[str, Any]]:
    """The server's connections named ``<instance id of name>:broadcast``."""
    return [
        c
        for c in r.client_list()
        if c.get("name", "").startswith(f"{name}-") and c["name"].endswith(":broadcast")
    ]


def test_three_processes_each_handle_a_broadcast_once_across_a_dropped_connection(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    procs: dict[str, WorkerProc] = {
        name: spawn(role, name=name, app=APP)
        for role, name in (("leader", "leader-1"), ("consumer", "consumer-1"), ("all", "all-1"))
    }
    names = list(procs)
    # every wait ends once its messages are handled: the bounds are for a loaded box (15 s
    # ran out with the suite on 4 workers beside other suites)
    wait_until(
        lambda: all(broadcast_conns(rsync, n) for n in names),
        timeout=30,
        what="every process's broadcast connection",
    )
    assert client_call(redis_url, prefix, "broadcast", "pricing", {"id": "m1"}) == 1
    wait_until(
        lambda: all(bcast_ledger(rsync, prefix, n).get("m1") for n in names),
        timeout=60,
        what="m1 handled everywhere",
    )

    # Freeze the consumer and drop its broadcast connection; send while it is cut off: one
    # message from a web client, one from a job (run by the leader or the all process).
    victim = procs["consumer-1"]
    victim.pause()
    try:
        (conn,) = broadcast_conns(rsync, "consumer-1")
        assert rsync.execute_command("CLIENT", "KILL", "ID", conn["id"]) == 1
        assert not broadcast_conns(rsync, "consumer-1")
        assert client_call(redis_url, prefix, "broadcast", "pricing", {"id": "m2"}) == 2
        assert client_call(redis_url, prefix, "enqueue", "announce", "m3")
        wait_until(
            lambda: all(
                {"m2", "m3"} <= set(bcast_ledger(rsync, prefix, n)) for n in ("leader-1", "all-1")
            ),
            timeout=60,
            what="m2 and m3 handled by the live processes",
        )
        time.sleep(0.5)
        assert set(bcast_ledger(rsync, prefix, "consumer-1")) == {"m1"}
    finally:
        victim.resume()
    wait_until(
        lambda: {"m2", "m3"} <= set(bcast_ledger(rsync, prefix, "consumer-1")),
        timeout=60,
        what="the consumer catching up after reconnecting",
    )
    (again,) = broadcast_conns(rsync, "consumer-1")
    assert again["id"] != conn["id"], "the broadcast connection was not replaced"

    # A handler that re-broadcasts its own topic is refused: no loop, each process once.
    client_call(redis_url, prefix, "broadcast", "echo", {"id": "e1"})
    wait_until(
        lambda: all(bcast_ledger(rsync, prefix, n).get("echo:e1") for n in names),
        timeout=60,
        what="echo handled everywhere",
    )
    time.sleep(1.5)  # anything duplicated or looping would show by now
    for n in names:
        assert bcast_ledger(rsync, prefix, n) == {"m1": 1, "m2": 1, "m3": 1, "echo:e1": 1}, n
    assert rsync.xlen(f"{prefix}bcast:echo") == 1
    assert rsync.hgetall(f"{prefix}ledger:echo-sent") == {b"None": b"3"}
    assert rsync.xlen(f"{prefix}bcast:pricing") == 3
    for p in procs.values():
        assert p.alive(), p.log()
        assert p.terminate() == 0, p.log()
        assert "Traceback" not in p.log(), p.log()
