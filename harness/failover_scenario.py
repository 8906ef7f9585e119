"""The primary-failover scenario shared by tests/system/test_failover.py (CI, one run) and
bench/failover.py (many runs): real worker processes on a Sentinel set or a Redis Cluster (the
primary serving the app's slot), the primary SIGKILLed at the worst moments, ledgers on a server
that is never faulted.

One run:

1. 3 ``leader`` + 2 ``consumer`` processes of harness/apps/failover.py against
   ``redis+sentinel://`` (WAIT ``auto`` by default) or ``redis+cluster://`` (the node serving the
   app's slot), a client enqueueing ``record`` jobs all along;
2. kill 1: the primary is SIGKILLed right after an initializer batch was checkpointed on it
   (its replication may not have happened), the initializer mid-way;
3. kill 2: right after a tick was enqueued on it;
4. poll items fall due; kill 3: right after a poll dispatch batch;
5. after each kill the old primary comes back and rejoins as a replica (so the next kill has
   a replica to promote); everything settles; the ledgers are counted.

``Scenario.run(faults=...)`` picks other faults in another order, e.g. ``("planned",
"dispatch")``: a planned switch (``CLIENT PAUSE … WRITE``, ``SENTINEL FAILOVER``: the old
primary stays up and the Sentinels make it a replica), then a kill after a dispatch batch.

:class:`Outcome` holds what was counted: ticks run twice or never, poll items run twice or
never, acknowledged enqueues never run (lost) or run twice, overlaps of the singleton
service, the initializer's batches, and per kill the time until the first tick due after it
had run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from harness.timings import FAST_ENV
from harness.topology import Cluster, Node, SentinelSet, wait_for
from worker.client import Client
from worker.runtime.embedded import death_signal_hook

ROOT = Path(__file__).resolve().parent.parent
APP = "harness.apps.failover:app"
TICK_MS = 1000

#: Worker timings: the tests' FAST_ENV (lease TTL 3 s, renew 0.5 s, deadline 1.5 s, heartbeat
#: 0.5 s) but an orphan bound of 5 s instead of 2; WAIT ``auto`` (the attached replicas, up to
#: one) by default. No worker dies in these scenarios (only Redis nodes do), so the bound
#: decides nothing but whether a live process is judged dead: on the CI's two loaded cores a
#: worker was seen starved (every thread, so its loop watchdog saw nothing) for 2.6 s after a
#: failover, and a 2 s bound handed its running jobs to another consumer. That is the bound
#: doing what it says (the default is 10 s), not the failover under test.
WORKER_ENV = {**FAST_ENV, "WORKER_ORPHAN_STALE_S": "5"}
INIT = {
    "FAILOVER_INIT_ITEMS": "8000",
    "FAILOVER_INIT_BATCH": "200",
    "FAILOVER_INIT_SLEEP_S": "0.25",
}


class Proc:
    """One ``python -m worker`` process logging to a file."""

    def __init__(self, role: str, name: str, env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "run", "--role", role, "--instance-name", name],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=death_signal_hook(),  # a killed test run takes them down too
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> int | None:
        self.send_term()
        return self.wait_exit()

    def send_term(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self) -> int | None:
        """Its exit code, SIGKILLing it if it has not exited 30 s on."""
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


class Enqueuer(threading.Thread):
    """Enqueues ``record`` jobs every ``every_s`` through a :class:`Client` on the Sentinel
    URL; an enqueue counts as acknowledged only when the call returned a job id."""

    def __init__(
        self, url: str, prefix: str, every_s: float = 0.02, wait_replicas: int | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.prefix, self.every_s = url, prefix, every_s
        self.wait_replicas = wait_replicas
        self.acked: list[str] = []
        self.failed = 0
        #: (first failed call, next acknowledged call) wall times: the client's outages
        self.outages: list[tuple[float, float]] = []
        self._failing_since: float | None = None
        self.errors: dict[str, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        client = await Client.connect(
            self.url, key_prefix=self.prefix, wait_replicas=self.wait_replicas
        )
        n = 0
        try:
            while not self._halt.is_set():
                n += 1
                started = time.time()
                try:
                    job_id = await client.enqueue("record", n)
                except Exception as exc:  # not acknowledged: it may or may not run
                    self.failed += 1
                    if self._failing_since is None:
                        self._failing_since = started
                    name = type(exc).__name__
                    self.errors[name] = self.errors.get(name, 0) + 1
                else:
                    if job_id is not None:
                        self.acked.append(job_id)
                    if self._failing_since is not None:
                        self.outages.append((self._failing_since, time.time()))
                        self._failing_since = None
                await asyncio.sleep(self.every_s)
        finally:
            await client.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


@dataclass
class Kill:
    """One fault of the primary (a SIGKILL, or a planned switch that deposes it): when, at
    which moment, and how long until the first tick due after it had run (from the ledger's
    run times)."""

    moment: str
    at: float
    port: int
    promoted_after_s: float = 0.0
    first_tick_after_s: float | None = None
    #: the old primary was not killed but deposed (a planned switch): it stays up
    deposed: bool = False
    #: the initializer had not finished when the fault struck (it may then produce the batch
    #: it was on once more)
    during_init: bool = False


@dataclass
class Outcome:
    ticks: dict[int, int] = field(default_factory=dict)
    first_tick: int = 0
    last_tick: int = 0
    items_expected: int = 0
    items: dict[str, int] = field(default_factory=dict)
    acked: int = 0
    unacked: int = 0
    enqueue_errors: dict[str, int] = field(default_factory=dict)
    #: longest stretch from a failed enqueue to the next acknowledged one (s)
    enqueue_outage_s: float = 0.0
    jobs: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    #: the state of (the first five) lost jobs on the primary at the end
    lost_state: list[dict[str, Any]] = field(default_factory=list)
    overlaps: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    intervals: int = 0
    init_done: bool = False
    init_items: int = 0
    init_expected: int = 0
    init_batches: dict[int, int] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    #: (wall time, port) each time the primary serving the app changed, as the harness saw it
    primaries: list[tuple[float, int]] = field(default_factory=list)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    #: the runs of the ticks that ran more than once (job id, try, pid, time)
    tick_runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tick_duplicates(self) -> dict[int, int]:
        return {t: n for t, n in self.ticks.items() if n > 1}

    @property
    def tick_misses(self) -> list[int]:
        return [
            t for t in range(self.first_tick, self.last_tick + 1, TICK_MS) if t not in self.ticks
        ]

    @property
    def item_duplicates(self) -> dict[str, int]:
        return {i: n for i, n in self.items.items() if n > 1}

    @property
    def item_misses(self) -> int:
        return self.items_expected - len(self.items)

    @property
    def job_duplicates(self) -> dict[str, int]:
        return {j: n for j, n in self.jobs.items() if n > 1}

    def summary(self) -> dict[str, Any]:
        def clock(t: float) -> str:
            return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}"

        return {
            "ticks": len(self.ticks),
            "tick_duplicates": len(self.tick_duplicates),
            "tick_misses": len(self.tick_misses),
            **(
                {"missed_ticks_at": [clock(t / 1000) for t in self.tick_misses]}
                if self.tick_misses
                else {}
            ),
            "kills_at": [f"{clock(k.at)} :{k.port}" for k in self.kills],
            "primaries": [f"{clock(at)} :{port}" for at, port in self.primaries],
            "items": self.items_expected,
            "item_duplicates": len(self.item_duplicates),
            "item_misses": self.item_misses,
            "acked_enqueues": self.acked,
            "unacked_enqueues": self.unacked,
            "enqueue_errors": self.enqueue_errors,
            "longest_enqueue_outage_s": round(self.enqueue_outage_s, 2),
            "lost_acked_jobs": len(self.lost),
            **({"lost_jobs": self.lost_state} if self.lost else {}),
            "job_duplicates": len(self.job_duplicates),
            "singleton_intervals": self.intervals,
            "singleton_overlaps": len(self.overlaps),
            "init_done": self.init_done,
            "init_items": f"{self.init_items}/{self.init_expected}",
            "init_batches_produced": sum(self.init_batches.values()),
            "kills": [
                {
                    "moment": k.moment,
                    "promoted_after_s": round(k.promoted_after_s, 2),
                    "first_tick_after_s": None
                    if k.first_tick_after_s is None
                    else round(k.first_tick_after_s, 2),
                }
                for k in self.kills
            ],
            "epochs": self.epochs,
        }


class Scenario:
    """One run of the scenario (see the module docstring) on ``sentinels`` with the ledger at
    ``ledger_url``; worker logs go to ``logs``."""

    def __init__(
        self,
        topology: SentinelSet | Cluster,
        ledger_url: str,
        logs: Path,
        *,
        leaders: int = 3,
        consumers: int = 2,
        wait_replicas: int | None = None,
        extra_env: dict[str, str] | None = None,
        item_spread_s: float = 20.0,
        rejoin_at_once: bool = False,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.s = topology
        self.name = name = f"fo{uuid.uuid4().hex[:6]}"
        if isinstance(topology, Cluster):  # every key of the app in one slot: a tagged prefix
            self.prefix = f"{{{name}}}:"
            topology.watch(key_slot(f"{self.prefix}queue".encode()))
        else:
            self.prefix = f"{name}:"
        self.wait_replicas = wait_replicas
        self.ledger = redis.Redis.from_url(ledger_url, decode_responses=True)
        self.ledger_url = ledger_url
        self.logs = logs
        self.n_leaders, self.n_consumers = leaders, consumers
        self.extra_env = extra_env or {}
        #: the poll items scheduled before the first ``dispatch`` fault fall due over this
        self.item_spread_s = item_spread_s
        #: a killed Sentinel node, restarted, is made a replica by the harness at once instead
        #: of by the Sentinels up to 10 s later (the workers never address it: they ask the
        #: Sentinels for the primary)
        self.rejoin_at_once = rejoin_at_once
        self.say = say
        self.procs: list[Proc] = []
        self.outcome = Outcome()
        self._settled_ms = 0
        self._bring_back = True

    # -- ledgers ------------------------------------------------------------------------------
    def _lk(self, name: str) -> str:
        return f"{self.prefix}ledger:{name}"

    def ticks(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.ledger.hgetall(self._lk("ticks")).items()}

    def tick_at(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in self.ledger.hgetall(self._lk("tick-at")).items()}

    def primary_client(self) -> redis.Redis:
        return self.s.primary().client(decode_responses=True, socket_timeout=2)

    def _on_primary(self, fn: Callable[[redis.Redis], Any]) -> Any:
        """``fn(client)`` on the current primary, retried through a failover."""

        deadline = time.monotonic() + 30
        while True:
            try:
                with self.primary_client() as c:
                    return fn(c)
            except (redis.RedisError, LookupError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- workers ------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
            **WORKER_ENV,
            **INIT,
            "WORKER_REDIS_URL": self.s.url(),
            "WORKER_KEY_PREFIX": self.prefix,
            **(
                {"WORKER_REDIS_WAIT_REPLICAS": str(self.wait_replicas)}
                if self.wait_replicas is not None
                else {}
            ),
            "WORKER_APP": APP,
            "FAILOVER_LEDGER_URL": self.ledger_url,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def start_workers(self) -> None:
        env = self.env()
        for i in range(self.n_leaders):
            self.procs.append(Proc("leader", f"{self.name}-leader-{i}", env, self.logs))
        for i in range(self.n_consumers):
            self.procs.append(Proc("consumer", f"{self.name}-consumer-{i}", env, self.logs))

    def stop_workers(self) -> None:
        """SIGTERM every worker at once, then collect the exit codes (they drain together)."""
        for p in self.procs:
            p.send_term()
        for p in self.procs:
            self.outcome.exit_codes[p.name] = p.wait_exit()

    # -- faults -------------------------------------------------------------------------------
    def _kill_when(
        self,
        moment: str,
        changed: Callable[[redis.Redis], bool],
        fault: Callable[[Node, redis.Redis], None] | None = None,
    ) -> Kill:
        """SIGKILL the primary the moment ``changed(client)`` (polled every ms on it) is true;
        or apply ``fault(primary, client)`` instead (the primary is then deposed, not dead)."""
        node = self.s.primary()
        with node.client(decode_responses=True, socket_timeout=2) as c:
            wait_for(lambda: changed(c), 30, f"the moment: {moment}", interval=0.001)
            during_init = c.hget(f"{self.prefix}init:seed", "done") != "1"
            if fault is None:
                node.kill()
            else:
                fault(node, c)
        kill = Kill(
            moment, time.time(), node.port, deposed=fault is not None, during_init=during_init
        )
        self.say(f"{'deposed' if fault else 'killed'} the primary :{node.port} {moment}")
        new = self.s.wait_failover(node, timeout=60)
        kill.promoted_after_s = time.time() - kill.at
        self.say(f"promoted :{new.port} after {kill.promoted_after_s:.2f}s")
        self.outcome.kills.append(kill)
        return kill

    def kill_after_tick(self) -> Kill:
        key = f"{self.prefix}periodic:last"
        before = self._on_primary(lambda c: c.hget(key, "tick"))
        return self._kill_when(
            "right after a tick was enqueued", lambda c: c.hget(key, "tick") != before
        )

    def planned_failover_after_tick(self, pause_ms: int = 5_000) -> Kill:
        """The planned switch of the README ("Scale", Limits), right after a tick was enqueued:
        ``CLIENT PAUSE <pause_ms> WRITE`` on the primary, then ``SENTINEL FAILOVER``. The old
        primary stays up; the Sentinels make it a replica."""
        assert isinstance(self.s, SentinelSet), "a planned switch is a Sentinel procedure"
        sentinels = self.s
        key = f"{self.prefix}periodic:last"
        before = self._on_primary(lambda c: c.hget(key, "tick"))

        def switch(node: Node, c: redis.Redis) -> None:
            c.execute_command("CLIENT", "PAUSE", pause_ms, "WRITE")
            sentinels.failover(wait=False, timeout=pause_ms / 2000)

        sentinels.wait_promotable()  # before the moment: the pause must not wait for it
        return self._kill_when(
            "planned switch right after a tick", lambda c: c.hget(key, "tick") != before, switch
        )

    def kill_after_checkpoint(self) -> Kill:
        key = f"{self.prefix}init:seed"
        before = self._on_primary(lambda c: c.hget(key, "cursor"))
        return self._kill_when(
            "right after an initializer batch", lambda c: c.hget(key, "cursor") != before
        )

    def kill_after_dispatch(self) -> Kill:
        shards = [f"{self.prefix}poll:{{items}}:{i}" for i in range(2)]

        def backlog(c: redis.Redis) -> int:
            return sum(int(c.zcard(k)) for k in shards)

        seen = [self._on_primary(backlog)]

        def dispatched(c: redis.Redis) -> bool:
            n = backlog(c)
            drop, seen[0] = n < seen[0], n
            return drop

        return self._kill_when("right after a poll dispatch batch", dispatched)

    def kill_replica(self) -> Kill:
        """SIGKILL a replica (the primary stays): no failover; the WAIT policy loses it."""
        primary = self.s.primary()
        node = next(n for n in self.s.nodes if n.port != primary.port and n.running)
        node.kill()
        kill = Kill("a replica killed", time.time(), node.port)
        self.say(f"killed the replica :{node.port}")
        self.outcome.kills.append(kill)
        return kill

    def wait_first_tick_after(self, kill: Kill, timeout: float = 60) -> None:
        after_ms = int(kill.at * 1000)

        def ran() -> float | None:
            due = [t for t in self.tick_at() if t > after_ms]
            if not due:
                return None
            return self.tick_at()[min(due)]

        ran_at = wait_for(ran, timeout, "a tick due after the kill to run", interval=0.05)
        kill.first_tick_after_s = float(ran_at) - kill.at
        self.say(f"first tick due after the kill ran {kill.first_tick_after_s:.2f}s after it")

    def bring_back(self, node: Node, *, deposed: bool = False) -> None:
        if not deposed:  # a deposed primary is up: the Sentinels turn it into a replica
            self.s.restart(node)
            if self.rejoin_at_once and isinstance(self.s, SentinelSet):
                self.s.rejoin_now(node)
        self.s.wait_replica(node, timeout=90)
        self.say(f"old primary :{node.port} is a synced replica again")

    # -- the run ------------------------------------------------------------------------------
    def _watch(self, stop: threading.Event) -> None:
        """Record each change of the primary (every 0.1 s) into the outcome."""
        seen: int | None = None
        while not stop.wait(0.1):
            try:
                port = self.s.primary().port
            except (redis.RedisError, LookupError, OSError):
                continue
            if port != seen:
                self.outcome.primaries.append((time.time(), port))
                seen = port

    def run(
        self, faults: Sequence[str] = ("checkpoint", "tick", "dispatch"), *, bring_back: bool = True
    ) -> Outcome:
        """The scenario with ``faults`` in order: ``checkpoint``, ``tick``, ``dispatch`` (the
        primary SIGKILLed right after that write), ``planned`` (a planned switch right after a
        tick, see :meth:`planned_failover_after_tick`), ``replica`` (a replica SIGKILLed, then
        brought back once a tick due after it ran). Poll items are scheduled before the
        first ``dispatch``. ``bring_back=False``: a killed primary stays dead (with one
        replica, the promoted node then has none)."""
        self._bring_back = bring_back
        o = self.outcome
        enq = Enqueuer(self.s.url(), self.prefix, wait_replicas=self.wait_replicas)
        stop_watch = threading.Event()
        watch = threading.Thread(target=self._watch, args=(stop_watch,), daemon=True)
        watch.start()
        try:
            self.start_workers()
            wait_for(lambda: len(self.ticks()) >= 3, 60, "three ticks", interval=0.1)
            wait_for(
                lambda: int(self.ledger.hlen(self._lk("init-batches"))) >= 3,
                60,
                "initializer batches",
                interval=0.1,
            )
            enq.start()
            time.sleep(1.0)

            for fault in faults:
                if fault == "checkpoint":  # just after an initializer batch, mid-way
                    self._recover(self.kill_after_checkpoint())
                elif fault == "tick":
                    self._recover(self.kill_after_tick())
                elif fault == "dispatch":  # poll items fall due over the next seconds
                    if not o.items_expected:
                        self._schedule_items(count=600, spread_s=self.item_spread_s)
                    self._recover(self.kill_after_dispatch())
                elif fault == "planned":
                    self._recover(self.planned_failover_after_tick())
                elif fault == "replica":
                    self._recover(self.kill_replica())
                else:
                    raise ValueError(f"unknown fault {fault!r}")
        finally:
            enq.stop()
            stop_watch.set()
            watch.join(5)
        self._settle(enq)
        self.stop_workers()
        self._count(enq)
        return o

    def _recover(self, kill: Kill) -> None:
        """Wait for the first tick due after ``kill``, then bring the killed node back."""
        self.wait_first_tick_after(kill)
        if not self._bring_back and not kill.deposed:
            return
        self.bring_back(next(n for n in self.s.nodes if n.port == kill.port), deposed=kill.deposed)

    def _schedule_items(self, count: int, spread_s: float) -> None:
        async def go() -> None:
            from harness.apps.failover import app

            client = await Client.connect(
                self.s.url(), key_prefix=self.prefix, app=app, wait_replicas=self.wait_replicas
            )
            try:
                start = time.time() + 0.5
                due = {f"item-{i:05d}": start + i * spread_s / count for i in range(count)}
                await client.poller("items").schedule_many(due)
            finally:
                await client.close()

        for _ in range(50):
            try:
                asyncio.run(go())
                break
            except redis.RedisError:
                time.sleep(0.2)
        self.outcome.items_expected = count

    def _settle(self, enq: Enqueuer) -> None:
        o = self.outcome
        jobs_key, items_key = self._lk("jobs"), self._lk("items")

        def all_ran() -> bool:
            jobs = self.ledger.hgetall(jobs_key)
            items = self.ledger.hlen(items_key)
            return all(j in jobs for j in enq.acked) and items >= o.items_expected

        with contextlib.suppress(TimeoutError):  # what did not run is counted below
            wait_for(all_ran, 60, "acked jobs and poll items to run", interval=0.2)
        init = f"{self.prefix}init:seed"
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: self._on_primary(lambda c: c.hget(init, "done") == "1"),
                60,
                "the initializer",
                interval=0.2,
            )
        time.sleep(2.5)  # ticks in flight run
        self._settled_ms = int(time.time() * 1000) - 2 * TICK_MS  # every tick before ran

    def _count(self, enq: Enqueuer) -> None:
        o = self.outcome
        o.ticks = self.ticks()
        twice = {str(t) for t in o.tick_duplicates}
        o.tick_runs = [
            r
            for r in (json.loads(x) for x in self.ledger.lrange(self._lk("tick-runs"), 0, -1))
            if r.get("tick") in twice
        ]
        o.first_tick = min(o.ticks) if o.ticks else 0
        o.last_tick = max((t for t in o.ticks if t <= self._settled_ms), default=0)
        o.items = {k: int(v) for k, v in self.ledger.hgetall(self._lk("items")).items()}
        o.jobs = {k: int(v) for k, v in self.ledger.hgetall(self._lk("jobs")).items()}
        o.acked, o.unacked, o.enqueue_errors = len(enq.acked), enq.failed, dict(enq.errors)
        o.enqueue_outage_s = max((b - a for a, b in enq.outages), default=0.0)
        o.lost = [j for j in enq.acked if j not in o.jobs]
        o.lost_state = [self._job_state(j) for j in o.lost[:5]]
        o.overlaps, o.intervals = self._overlaps()
        with self.primary_client() as c:
            state = c.hgetall(f"{self.prefix}init:seed")
            shards = [f"{self.prefix}poll:{{seeds}}:{i}" for i in range(2)]
            o.init_items = sum(int(c.zcard(k)) for k in shards)
        o.init_done = state.get("done") == "1"
        o.init_expected = int(INIT["FAILOVER_INIT_ITEMS"])
        o.init_batches = {
            int(k): int(v) for k, v in self.ledger.hgetall(self._lk("init-batches")).items()
        }
        acquired = [
            (str(e.get("timestamp")), int(e.get("epoch", 0)))
            for p in self.procs
            for e in p.events()
            if e.get("event") == "leadership acquired"
        ]
        o.epochs = [epoch for _, epoch in sorted(acquired)]  # in the order they were acquired

    def _job_state(self, job_id: str) -> dict[str, Any]:
        """Where an acknowledged job that never ran is now (for the report)."""
        from worker.storage import keys as K

        def read(c: redis.Redis) -> dict[str, Any]:
            return {
                "job": job_id,
                "record": bool(c.exists(K.ARQ_JOB + job_id)),
                "claim": c.get(K.ARQ_IN_PROGRESS + job_id),
                "claim_ttl_ms": c.pttl(K.ARQ_IN_PROGRESS + job_id),
                "queued_at": c.zscore(f"{self.prefix}queue", job_id),
                "tries": c.get(K.ARQ_RETRY + job_id),
                "result": bool(c.exists(K.ARQ_RESULT + job_id)),
                "dead": bool(c.hexists(f"{self.prefix}dead:jobs", job_id)),
            }

        return dict(self._on_primary(read))

    def _overlaps(self) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
        runs = [json.loads(x) for x in self.ledger.lrange(self._lk("intervals"), 0, -1)]
        alive = self.ledger.hgetall(self._lk("alive"))
        ends = self.ledger.hgetall(self._lk("end"))
        for run in runs:
            last = float(ends.get(run["id"]) or alive.get(run["id"]) or run["start"])
            run["end"] = last
        runs.sort(key=lambda r: r["start"])
        bad = []
        latest: dict[str, Any] | None = None  # the run ending last among those started so far
        for run in runs:
            if latest is not None and run["start"] < latest["end"]:
                bad.append((latest, run))
            if latest is None or run["end"] > latest["end"]:
                latest = run
        return bad, len(runs)
