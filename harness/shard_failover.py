"""A Redis Cluster primary SIGKILLed mid-drain under an app with queue shards
(``WORKER_QUEUE_SHARDS``), shared by tests/system/test_cluster_shards_failover.py (one short kill)
and ``python -m bench cluster --failover`` (several).

One kill: 2 ``--role all`` processes of harness/apps/failover.py (a tick every 1 s, catch-up
``all``; ``record`` jobs) on a cluster of 3 primaries with a replica each (node timeout 1 s),
the app's queue in ``shards`` shards, each on its own primary. A backlog of ``record`` jobs is
enqueued through a :class:`~worker.client.Client` (acknowledged: the call returned an id) and a
client keeps enqueueing during the fault; once part of the backlog ran, the primary serving shard
``kill_shard`` (0: the home, where the lease and every singleton key live) is SIGKILLed and its
replica promoted. Counted from a ledger on a server never faulted: acknowledged jobs that never
ran, ticks run twice; timed: from the kill until the leader enqueued the first tick due after it
(the singleton duties back: the bound, 10 s) and until that tick ran (later by its wait behind
the backlog: the queue is FIFO by due time).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from harness.failover_scenario import APP, ROOT, WORKER_ENV, Enqueuer, Proc
from harness.topology import Cluster, Node, wait_for
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
    #: from the kill until the leader had enqueued the first tick due after it (``None``:
    #: never): the singleton duties back
    ticks_back_after_s: float | None = None
    #: from the kill until that tick had run (it waits its turn behind the backlog)
    tick_ran_after_s: float | None = None
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
        ran = "never" if self.tick_ran_after_s is None else f"{self.tick_ran_after_s:.2f} s"
        drained = "never" if self.drained_after_s is None else f"{self.drained_after_s:.2f} s"
        return (
            f"{self.shards} shards, killed shard {self.kill_shard}'s primary after "
            f"{self.ran_before_kill}/{self.backlog} backlog jobs: promoted after "
            f"{self.promoted_after_s:.2f} s, ticks enqueued again after {back} (run after {ran}), "
            "all acknowledged jobs run "
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
            enq.start()
            self.say("ticking; filling")
            backlog, due = self._fill(out.backlog)
            self.say(f"filled; due in {due - time.time():.2f} s")
            jobs = self._lk("jobs")
            time.sleep(max(0.0, due - time.time()))
            before = int(self.ledger.hlen(jobs))
            wait_for(  # the drain has begun: jobs claimed and running, most still queued
                lambda: self.ledger.hlen(jobs) >= before + max(1, out.backlog // 20),
                60,
                "the drain",
                interval=0.005,
            )
            slot = slot_of_prefix(self.prefixes[out.kill_shard])
            victim = self.cluster.watch(slot).owner(slot)
            out.ran_before_kill = int(self.ledger.hlen(jobs)) - before
            killed_at = time.time()
            watch = threading.Thread(
                target=self._watch_ticks, args=(killed_at,), daemon=True, name="tick-watch"
            )
            watch.start()
            victim.kill()
            self.say(f"killed :{victim.port} (shard {out.kill_shard}) at {out.ran_before_kill}")
            self.cluster.wait_failover(victim, timeout=30)
            out.promoted_after_s = time.time() - killed_at
            watch.join(35)
            self.say("promoted; ticks back")
            enq.stop()
            acked = backlog + enq.acked
            drained = _maybe(
                lambda: set(acked) <= set(self.ledger.hkeys(jobs)),
                60,
                "every acknowledged job to run",
            )
            if drained:
                out.drained_after_s = time.time() - killed_at
            self.say("drained")
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

    def _fill(self, n: int) -> tuple[list[str], float]:
        """``n`` ``record`` jobs spread evenly over the shards (ids starting with their shard's
        prefix, as the client makes them), due at one moment 1 s after they are in, written
        in pipelines straight into each shard's queue (a client's enqueues one by one are too
        slow on this box to build a backlog ahead of two consumers). They count as
        acknowledged once every replica has caught up (:meth:`_replicated`): ids and the
        moment (wall time)."""
        from harness.arqfmt import expires_extra_ms, job_key_prefix
        from worker.core.serializer import get_serializer, job_payload

        ser, _ = get_serializer("msgpack")
        due = time.time() + 1.0 + n / 5000
        due_ms = int(due * 1000)
        ids: list[str] = []
        for s, prefix in enumerate(self.prefixes):
            mine = [f"{prefix}b{i:06d}" for i in range(s, n, len(self.prefixes))]
            with self.cluster.owner(slot_of_prefix(prefix)).client() as c:
                pipe = c.pipeline(transaction=False)
                for k, job_id in enumerate(mine):
                    payload = job_payload("record", (k,), {}, due_ms, ser)
                    pipe.set(job_key_prefix + job_id, payload, px=expires_extra_ms)
                    pipe.zadd(f"{prefix}queue", {job_id: due_ms})
                pipe.execute()
            ids += mine
        self._replicated()
        return ids, due

    def _replicated(self, timeout: float = 10.0) -> None:
        """Wait until every primary's replicas have its replication offset of now."""
        for node in self.cluster.masters + self.cluster.replicas:
            if not node.running:
                continue
            with node.client() as c:
                info = c.info("replication")
            if info["role"] != "master":
                continue
            offset = int(info["master_repl_offset"])

            def caught_up(n: Node = node, want: int = offset) -> bool:
                with n.client() as c:
                    now = c.info("replication")
                seen = [v for k, v in now.items() if k.startswith("slave") and isinstance(v, dict)]
                return bool(seen) and all(int(v["offset"]) >= want for v in seen)

            wait_for(caught_up, timeout, f"the replicas of {node} to catch up")

    def _watch_ticks(self, killed_at: float, timeout: float = 30.0) -> None:
        """From the kill on, every 50 ms: has the home shard's primary recorded a tick due
        after the kill as enqueued (``<prefix>periodic:enqueued``; the leader's duties back),
        and has the ledger seen one run? Each first time goes into the outcome."""
        out, after_ms = self.out, int(killed_at * 1000)
        home = slot_of_prefix(self.prefix)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (
            out.ticks_back_after_s is None or out.tick_ran_after_s is None
        ):
            if out.ticks_back_after_s is None:
                with contextlib.suppress(redis.RedisError, LookupError, OSError):
                    with self.cluster.owner(home).client(socket_timeout=0.5) as c:
                        tick = c.hget(f"{self.prefix}periodic:enqueued", "tick")
                    if tick is not None and int(tick) > after_ms:
                        out.ticks_back_after_s = time.time() - killed_at
            if out.tick_ran_after_s is None:
                at = [float(v) for k, v in self.ledger.hgetall(self._lk("tick-at")).items()
                      if int(k) > after_ms]  # fmt: skip
                if at:
                    out.tick_ran_after_s = min(at) - killed_at
            time.sleep(0.05)


def _maybe(
    predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.1
) -> object:
    """:func:`wait_for`, ``None`` on a timeout (what did not happen is counted, not raised)."""
    try:
        return wait_for(predicate, timeout, what, interval=interval)
    except TimeoutError:
        return None
