"""per_key services: keys spread over processes, never one key in two loops, rebalanced when a
process leaves, leases released only after the loop stopped."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from harness import eventually
from worker.app import App
from worker.context import Context
from worker.core.clock import SystemClock
from worker.core.errors import ConfigError
from worker.duties.keyed import KeyedService, owner
from worker.storage import keys as K
from worker.storage.store import Store

KEYS = K.Keys("t:")
MAILBOXES = [f"box-{i}" for i in range(8)]


def test_owner_is_stable_and_spreads() -> None:
    members = ["a", "b", "c"]
    owners = Counter(owner(f"k{i}", members) for i in range(300))
    assert set(owners) == set(members)
    assert min(owners.values()) > 50  # roughly even
    # removing a member moves only that member's keys
    before = {f"k{i}": owner(f"k{i}", members) for i in range(300)}
    after = {k: owner(k, ["a", "b"]) for k in before}
    assert all(after[k] == o for k, o in before.items() if o != "c")
    assert owner("x", []) is None


def test_per_key_needs_keys_and_only_it() -> None:
    app = App()
    with pytest.raises(ConfigError, match="keys"):
        app.service(cardinality="per_key")
    with pytest.raises(ConfigError, match="keys"):
        app.service(cardinality="singleton", keys=["a"])


class Tracker:
    """Records which process runs which key; fails on any overlap."""

    def __init__(self) -> None:
        self.running: dict[str, str] = {}
        self.overlaps: list[str] = []
        self.starts: Counter[str] = Counter()

    def service(self, app: App, who: dict[int, str]) -> None:
        @app.service(cardinality="per_key", keys=lambda ctx: MAILBOXES)
        async def mailbox(ctx: Any, stop: asyncio.Event, key: str) -> None:
            me = ctx.instance_id  # each loop gets its own context (ctx.alive()): not identity
            if key in self.running:
                self.overlaps.append(f"{key}: {self.running[key]} and {me}")
            self.running[key] = me
            self.starts[key] += 1
            try:
                await SystemClock().wait(stop, 3600)
            finally:
                if self.running.get(key) == me:
                    del self.running[key]


def keyed(
    r: Any, app: App, iid: str, who: dict[int, str], *, ttl_s: float = 1.0, deadline_s: float = 0.5
) -> KeyedService:
    """A process's keyed service; ``ttl_s``/``deadline_s``: its lease TTL and renew deadline
    (a renewal later than the deadline stops the loop: a generous one keeps a loaded box from
    restarting loops in a test about placement)."""
    # only the instance id matters to the test service
    ctx = Context(None, None, None, SystemClock(), iid)  # type: ignore[arg-type]
    who[id(ctx)] = iid
    return KeyedService(
        app.services["mailbox"],
        ctx,
        Store(r, KEYS),
        SystemClock(),  # leases expire on the server's clock: this test runs in real time
        instance_id=iid,
        lease_ttl_s=ttl_s,
        renew_interval_s=0.1,
        renew_deadline_s=deadline_s,
        stop_grace_s=0.5,
    )


async def test_keys_spread_disjoint_and_move_when_a_process_leaves(r: Any) -> None:
    app, who, tracker = App(), {}, Tracker()
    tracker.service(app, who)
    # a renewal may wait seconds on a loaded box; b leaves cleanly (releases), so the long
    # TTL costs no time
    slow = {"ttl_s": 10.0, "deadline_s": 6.0}
    a, b = keyed(r, app, "proc-a", who, **slow), keyed(r, app, "proc-b", who, **slow)
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    ta = asyncio.create_task(a.run(stop_a))
    tb = asyncio.create_task(b.run(stop_b))
    try:
        # the first to register may take every key and hand some over when the other joins
        # (a key moves once: stopped here, then started there): wait for the spread
        await eventually(
            lambda: set(tracker.running) == set(MAILBOXES) and bool(a.running and b.running)
        )
        settled = dict(tracker.starts)
        await asyncio.sleep(0.5)  # several rounds: stable, no churn
        assert set(a.running).isdisjoint(b.running)
        assert set(a.running) | set(b.running) == set(MAILBOXES)
        assert a.running and b.running, "both processes got a share"
        for key in MAILBOXES:
            holder = "proc-a" if key in a.running else "proc-b"
            assert await r.get(KEYS.service_lease("mailbox", key)) == holder.encode()
        assert tracker.starts == settled, "no loop restarted once the keys were spread"
        assert max(tracker.starts.values()) <= 2  # at most the one move on joining

        stop_b.set()  # b leaves cleanly: its loops stop, leases released, a takes over
        await tb
        await eventually(lambda: set(a.running) == set(MAILBOXES))
        await eventually(lambda: set(tracker.running) == set(MAILBOXES))
        assert all(v == "proc-a" for v in tracker.running.values())
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(ta, tb)
    assert tracker.overlaps == []
    assert tracker.running == {}
    assert await r.keys(KEYS.service_lease("mailbox", "*")) == []


async def test_a_crashed_process_keys_wait_for_its_leases(r: Any) -> None:
    app, who, tracker = App(), {}, Tracker()
    tracker.service(app, who)
    a = keyed(r, app, "proc-a", who)
    # a dead process still holds box-0's lease (it was killed, nothing was released)
    await r.set(KEYS.service_lease("mailbox", "box-0"), "dead-proc", px=800)
    stop = asyncio.Event()
    task = asyncio.create_task(a.run(stop))
    try:
        await eventually(lambda: set(a.running) == set(MAILBOXES) - {"box-0"})
        assert "box-0" not in tracker.running
        await eventually(lambda: "box-0" in a.running, within=3)  # after the lease expired
    finally:
        stop.set()
        await task
    assert tracker.overlaps == []


async def test_a_lost_lease_stops_the_loop(r: Any) -> None:
    app, who, tracker = App(), {}, Tracker()
    tracker.service(app, who)
    a = keyed(r, app, "proc-a", who)
    stop = asyncio.Event()
    task = asyncio.create_task(a.run(stop))
    try:
        await eventually(lambda: "box-1" in a.running)
        await r.set(KEYS.service_lease("mailbox", "box-1"), "intruder", px=60_000)
        await eventually(lambda: "box-1" not in tracker.running)
        assert await r.get(KEYS.service_lease("mailbox", "box-1")) == b"intruder"
    finally:
        stop.set()
        await task


# ---------------------------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_per_key_across_processes_with_sigkill_and_sigterm(spawn: Any, rsync: Any) -> None:
    from harness import wait_until

    prefix = spawn.prefix
    boxes = [f"mbx{i}" for i in range(30)]  # P(a process gets none) = 3 * (2/3)^30 < 1e-5
    env = {"LEDGER_MAILBOXES": ",".join(boxes)}
    procs = [spawn("consumer", name=f"c{i}", env=env) for i in range(3)]

    def owners() -> dict[str, int]:
        raw = rsync.mget([f"{prefix}ledger:mailbox-owner:{b}" for b in boxes])
        return {b: int(v) for b, v in zip(boxes, raw, strict=True) if v}

    # The first process to start takes every key, then hands the others' shares over as they
    # join (stop the loop, release the lease, the new owner acquires it).
    wait_until(
        lambda: len(owners()) == len(boxes) and len(set(owners().values())) == 3,
        30,
        what="every mailbox running, spread over the three processes",
    )

    victim = procs[0]
    victim.kill()
    wait_until(
        lambda: len(owners()) == len(boxes) and victim.pid not in owners().values(),
        20,
        what="the killed process's mailboxes to move",
    )
    leaving = procs[1]
    leaving.signal(15)
    assert leaving.proc.wait(30) == 0
    wait_until(
        lambda: set(owners().values()) == {procs[2].pid} and len(owners()) == len(boxes),
        20,
        what="every mailbox on the last process",
    )
    assert rsync.hgetall(f"{prefix}ledger:mailbox-overlaps") == {}
