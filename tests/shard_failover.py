"""A Redis Cluster primary SIGKILLed mid-drain under an app with queue shards
(``WORKER_QUEUE_SHARDS``), shared by tests/test_cluster_shards_failover.py (one short kill)
and ``python -m bench cluster --failover`` (several).

One kill: 2 ``--role all`` processes of tests/apps/failover.py (a tick every 1 s, catch-up
``all``; ``record`` jobs) on a cluster of 3 primaries with a replica each (node timeout 1 s),
the app's queue in ``shards`` shards, each on its own primary. A backlog of ``record`` jobs is
enqueued through a :class:`~worker.client.Client` (acknowledged: the call returned an id) and a
client keeps enqueueing during the fault; once part of the backlog ran, the primary serving shard
``kill_shard`` (0: the home, where the lease and every singleton key live) is SIGKILLed and its
replica promoted. Counted from a ledger on a server never faulted: acknowledged jobs that never
ran, ticks run twice, and the time from the kill until the first tick due after it had run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.failover_scenario import APP, ROOT, WORKER_ENV, Enqueuer, Proc
from tests.topology import Cluster, Node, wait_for
from worker.client import Client
from worker.storage.shards import shard_prefixes, slot_of_prefix


@dataclass
class KillOutcome:
    """What one kill cost and broke (see module docstring)."""

    shards: int
    kill_shard: int
    backlog: int
    #: backlog jobs that had run when the primary was killed
    ran_before_kill: int = 0
    acked: int = 0
    unacked: int = 0
    lost: list[str] = field(default_factory=list)
    ticks: dict[int, int] = field(default_factory=dict)
    promoted_after_s: float = 0.0
    #: from the kill until the first tick due after it had run (``None``: none did)
    ticks_back_after_s: float | None = None
    #: from the kill until every acknowledged job had run
    drained_after_s: float | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)

    @property
    def ticks_twice(self) -> dict[int, int]:
        return {t: n for t, n in self.ticks.items() if n > 1}

    @property
    def ok(self) -> bool:
        """No acknowledged job lost, no tick twice, ticks back within 10 s."""
        back = self.ticks_back_after_s
        return not self.lost and not self.ticks_twice and back is not None and back <= 10

    def summary(self) -> str:
        back = "never" if self.ticks_back_after_s is None else f"{self.ticks_back_after_s:.2f} s"
        drained = "never" if self.drained_after_s is None else f"{self.drained_after_s:.2f} s"
        return (
            f"{self.shards} shards, killed shard {self.kill_shard}'s primary after "
            f"{self.ran_before_kill}/{self.backlog} backlog jobs: promoted after "
            f"{self.promoted_after_s:.2f} s, ticks back after {back}, all acknowledged jobs run "
            f"after {drained}; {self.acked} acknowledged ({self.unacked} refused), "
            f"{len(self.lost)} lost, {len(self.ticks)} ticks, {len(self.ticks_twice)} run twice"
        )


class ShardKill:
    """One kill on ``cluster`` (3 primaries with a replica each), ledger at ``ledger_url``."""

    def __init__(
        self,
        cluster: Cluster,
        ledger_url: str,
        logs: Path,
        *,
        shards: int,
        kill_shard: int,
        backlog: int = 3000,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.cluster = cluster
        self.name = f"sk{uuid.uuid4().hex[:6]}"
        self.prefix = f"{{{self.name}}}:"
        self.prefixes = shard_prefixes(self.prefix, shards)
        self.ledger_url = ledger_url
        self.ledger = redis.Redis.from_url(ledger_url, decode_responses=True)
        self.logs = logs
        self.say = say
        self.out = KillOutcome(shards, kill_shard, backlog)
        self.procs: list[Proc] = []

    def _lk(self, name: str) -> str:
        return f"{self.prefix}ledger:{name}"

    def env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
            **WORKER_ENV,
            "WORKER_LOG_LEVEL": "WARNING",
            "WORKER_REDIS_URL": self.cluster.url(),
            "WORKER_KEY_PREFIX": self.prefix,
            "WORKER_QUEUE_SHARDS": str(self.out.shards),
            "WORKER_APP": APP,
            "FAILOVER_LEDGER_URL": self.ledger_url,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }

    def run(self, *, bring_back: bool = True) -> KillOutcome:
        """Start, fill, kill, wait, count; the killed node rejoins as a replica after
        (``bring_back``) so the next kill has one to promote."""
        out = self.out
        env = self.env()
        self.procs = [Proc("all", f"{self.name}-all-{i}", env, self.logs) for i in range(2)]
        enq = Enqueuer(self.cluster.url(), self.prefix, every_s=0.02)
        victim: Node | None = None
        try:
            wait_for(lambda: self.ledger.hlen(self._lk("ticks")) >= 2, 60, "ticks to run")
            backlog = asyncio.run(self._fill(out.backlog))
            enq.start()
            jobs = self._lk("jobs")
            wait_for(  # the drain has begun: jobs claimed and running, most still queued
                lambda: self.ledger.hlen(jobs) >= max(1, out.backlog // 20),
                60,
                "the drain",
                interval=0.005,
            )
            slot = slot_of_prefix(self.prefixes[out.kill_shard])
            victim = self.cluster.watch(slot).owner(slot)
            out.ran_before_kill = int(self.ledger.hlen(jobs))
            killed_at = time.time()
            victim.kill()
            self.say(f"killed :{victim.port} (shard {out.kill_shard}) at {out.ran_before_kill}")
            self.cluster.wait_failover(victim, timeout=30)
            out.promoted_after_s = time.time() - killed_at
            out.ticks_back_after_s = self._first_tick_after(killed_at)
            enq.stop()
            acked = backlog + enq.acked
            drained = _maybe(
                lambda: set(acked) <= set(self.ledger.hkeys(jobs)),
                60,
                "every acknowledged job to run",
            )
            if drained:
                out.drained_after_s = time.time() - killed_at
            time.sleep(1.5)  # ticks in flight run
            ran = self.ledger.hgetall(jobs)
            out.acked, out.unacked = len(acked), enq.failed
            out.lost = [j for j in acked if j not in ran]
            out.ticks = {int(k): int(v) for k, v in self.ledger.hgetall(self._lk("ticks")).items()}
        finally:
            if enq.is_alive():
                enq.stop()
            for p in self.procs:
                out.exit_codes[p.name] = p.terminate()
            if bring_back and victim is not None and not victim.running:
                self.cluster.restart(victim)
                self.cluster.wait_replica(victim, timeout=90)
        return out

    async def _fill(self, n: int) -> list[str]:
        """``n`` ``record`` jobs, all due at one moment after they are in (so the drain starts
        from a full backlog), acknowledged ids returned (200 at a time)."""
        client = await Client.connect(self.cluster.url(), key_prefix=self.prefix)
        due = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2 + n / 1000)
        try:
            ids: list[str] = []
            for first in range(0, n, 200):
                got = await asyncio.gather(
                    *(
                        client.enqueue("record", -i, defer_until=due)
                        for i in range(first, min(n, first + 200))
                    )
                )
                ids += [j for j in got if j is not None]
            return ids
        finally:
            await client.close()

    def _first_tick_after(self, killed_at: float) -> float | None:
        after_ms = int(killed_at * 1000)
        key = self._lk("tick-at")

        def ran() -> float | None:
            at = {int(k): float(v) for k, v in self.ledger.hgetall(key).items()}
            due = [t for t in at if t > after_ms]
            return at[min(due)] if due else None

        found = _maybe(ran, 30, "a tick due after the kill")
        return None if found is None else float(found) - killed_at


def _maybe(predicate: Callable[[], object], timeout: float, what: str) -> object:
    """:func:`wait_for`, ``None`` on a timeout (what did not happen is counted, not raised)."""
    try:
        return wait_for(predicate, timeout, what, interval=0.1)
    except TimeoutError:
        return None
