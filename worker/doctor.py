"""``python -m worker doctor``: the N-replica acceptance checklist, run against a live cluster.

It reads Redis only (plus the app, for the jobs and pollers it declares) and judges what a
correct deployment at N replicas must look like (seed 004): exactly one leader with a sane
epoch, a Redis that never evicts, every registered instance heartbeating, one app version, clocks
that agree, periodic jobs on schedule and succeeding, pollers and the queue keeping up, no dead
letters, no holds sets nobody owns. Each check answers ✓ (ok), ! (warning: shown, does not fail)
or ✗ (fails: the command exits 1) with a one-line explanation and, where useful, the offending
instances or jobs below it.

:func:`diagnose` gathers a :class:`Snapshot` (one read of everything, "now" being the Redis
server's clock) and runs every check on it; each check is a pure function of the snapshot, so
it can be tested on a hand-made one. :func:`render` prints the checklist; ``--json`` prints
:meth:`Report.to_json`.

Some checks look at moments: a leader that took over within the last heartbeat interval, or a
tick due a second ago, can show as ✗ once. Run it again before acting; between the steps of a
staged rollout (README, "Rolling out the role split") run it until it passes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from worker.app import App
from worker.connection import Replication
from worker.durability import attached_replicas, describe
from worker.ids import LockValue
from worker.periodic import freshness
from worker.preflight import ALLOW_EVICTION, NOEVICTION
from worker.settings import Settings
from worker.storage import PeriodicRuns, open_store, server
from worker.storage import keys as K
from worker.storage.server import read_eviction_policy

Status = Literal["ok", "warn", "fail"]
MARKS: dict[str, str] = {"ok": "✓", "warn": "!", "fail": "✗"}


@dataclass(frozen=True)
class Check:
    """One line of the checklist: ``name``, its verdict, a one-line ``summary``, optional
    ``details`` lines (the offending instances, jobs…) and machine-readable ``data``."""

    name: str
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass(frozen=True)
class Report:
    """Every check's result, judged at ``at_ms`` (the Redis server's clock)."""

    at_ms: int
    prefix: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "at": _iso(self.at_ms),
            "prefix": self.prefix,
            "failed": [c.name for c in self.checks if c.status == "fail"],
            "checks": [asdict(c) for c in self.checks],
        }


@dataclass(frozen=True)
class Limits:
    """Thresholds. ``stale_s``: a heartbeat older than this is stale (default: the orphan
    bound, after which the leader re-queues the instance's jobs); ``max_skew_s``: how far an
    instance's clock may be from the Redis server's; ``max_lag_s``: how long the oldest due
    job or poll item may wait; ``tick_grace_s``: how late a due tick may be before its job
    counts as overdue."""

    stale_s: float = 10.0
    max_skew_s: float = 1.0
    max_lag_s: float = 60.0
    tick_grace_s: float = 30.0
    allow_eviction: bool = False
    #: the WAIT policy the workers run with (``durability`` judges the primary against it)
    replication: Replication = field(default_factory=Replication)

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            stale_s=settings.orphan_stale_s,
            allow_eviction=settings.allow_eviction,
            replication=settings.replication(),
        )


@dataclass
class Instance:
    """A registered instance: its last heartbeat (the server's clock, ms) and record (``None``
    once expired: it missed about 2.5 heartbeats)."""

    id: str
    heartbeat_ms: int
    record: dict[str, Any] | None

    @property
    def name(self) -> str:
        return str((self.record or {}).get("name") or self.id)

    @property
    def offset_ms(self) -> float | None:
        value = (self.record or {}).get("clock_offset_ms")
        return float(value) if isinstance(value, int | float) else None

    def age_s(self, now_ms: int) -> float:
        """Seconds since its last heartbeat, on the server's clock."""
        return (now_ms - self.heartbeat_ms) / 1000


@dataclass
class Snapshot:
    """Everything the checks judge, read once."""

    now_ms: int
    prefix: str
    lock: LockValue | None
    lock_pttl_ms: int
    epoch_counter: int | None
    lease_state: dict[str, str]
    instances: list[Instance]
    policy: str | None
    policy_source: str
    periodic_last: dict[str, int]
    periodic_runs: dict[str, PeriodicRuns]
    queue_head_ms: int | None
    poller_heads: dict[str, list[int | None]]
    dead_letters: int
    holds: dict[str, int]
    #: replicas attached to the primary (``INFO replication``; ``None``: not readable)
    attached_replicas: int | None = None

    @property
    def live(self) -> list[Instance]:
        return [i for i in self.instances if i.record is not None]


async def gather(redis: Redis, keys: K.Keys, app: App, *, now_ms: int | None = None) -> Snapshot:
    """Read everything the checks need (read-only). ``now_ms``: judge at this instant instead
    of the server's clock (tests)."""
    store = open_store(redis, keys, None)  # read-only
    now = now_ms if now_ms is not None else round(await store.server_time_ms())
    lock, pttl = await store.read_lock()
    counter, lease_state = await store.lease_counters()
    instances = [Instance(i, hb, rec) for i, hb, rec in await store.instances()]
    policy, source = await read_eviction_policy(redis)
    heads: dict[str, list[int | None]] = {}
    for p in app.pollers.values():
        shards = [keys.poll_shard(p.name, s) for s in range(p.shards)]
        heads[p.name] = await store.queue_heads(shards)
    return Snapshot(
        now_ms=now,
        prefix=keys.prefix,
        lock=lock,
        lock_pttl_ms=pttl,
        epoch_counter=counter,
        lease_state=lease_state,
        instances=instances,
        policy=policy,
        policy_source=source,
        periodic_last=await store.periodic_last(),
        periodic_runs=await store.periodic_runs(),
        queue_head_ms=await store.queue_head(app.queue_names()),
        poller_heads=heads,
        dead_letters=await store.dead_count(),
        holds=await store.holds_sets(),
        attached_replicas=await read_attached(redis),
    )


async def diagnose(
    redis: Redis,
    keys: K.Keys,
    app: App,
    *,
    limits: Limits | None = None,
    now_ms: int | None = None,
) -> Report:
    """Run the whole checklist against the cluster behind ``redis`` (read-only)."""
    snap = await gather(redis, keys, app, now_ms=now_ms)
    return judge(snap, app, limits or Limits())


def judge(snap: Snapshot, app: App, limits: Limits) -> Report:
    """Every check on one snapshot (pure)."""
    return Report(snap.now_ms, snap.prefix, [check(snap, app, limits) for check in CHECKS])


# -- the checks ---------------------------------------------------------------------------------


def _leading(snap: Snapshot) -> list[Instance]:
    return [i for i in snap.live if (i.record or {}).get("is_leader")]


def check_leader(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Exactly one leader: the lock is held, with a TTL, by the one live instance that reports
    leading with its epoch."""
    lock, pttl = snap.lock, snap.lock_pttl_ms
    claimants = _leading(snap)
    names = ", ".join(f"{i.name} (epoch {(i.record or {}).get('epoch')})" for i in claimants)
    if lock is None:
        return Check(
            "leader",
            "fail",
            f"no leader: nobody holds {snap.prefix}leader (no leader/all process running, or "
            "none can campaign); periodic ticks, pollers and singleton services are stopped",
            [f"instances still reporting leadership: {names}"] if claimants else [],
        )
    data: dict[str, Any] = {"epoch": lock.epoch, "ttl_s": round(pttl / 1000, 1)}
    if pttl == -1:
        return Check(
            "leader",
            "fail",
            f"the lock (epoch {lock.epoch}) has no expiry: left by an old static leader? the next "
            "campaign replaces it",
            data=data,
        )
    if len(claimants) > 1:
        return Check(
            "leader",
            "fail",
            f"{len(claimants)} live instances report leading: a takeover within the last "
            "heartbeat interval (run again), or a misconfiguration (a static leader beside "
            "elected ones)",
            [f"reporting leadership: {names}"],
            data,
        )
    holder = next((i for i in claimants if (i.record or {}).get("epoch") == lock.epoch), None)
    if holder is None:
        return Check(
            "leader",
            "fail",
            f"the lock is held (epoch {lock.epoch}, ttl {pttl / 1000:.1f}s) but no live instance "
            "reports leading with it (a takeover within the last heartbeat interval: run again; "
            "or a process with another key prefix or app)",
            data=data,
        )
    rec = holder.record or {}
    age = rec.get("lease_age_s")
    lease_age = None if age is None else round(float(age) + holder.age_s(snap.now_ms), 1)
    renewed = snap.lease_state.get("renewed_ms")
    since_renew = None if not renewed else round((snap.now_ms - int(renewed)) / 1000, 1)
    data.update(instance=holder.name, lease_age_s=lease_age, renewed_s_ago=since_renew)
    return Check(
        "leader",
        "ok",
        f"{holder.name} leads: epoch {lock.epoch}, lease age {lease_age}s, ttl "
        f"{pttl / 1000:.1f}s, renewed {since_renew}s ago",
        data=data,
    )


def check_epochs(snap: Snapshot, app: App, limits: Limits) -> Check:
    """The lock's epoch is at most the epoch counter, and every instance reporting leadership
    reports the lock's epoch."""
    lock, counter = snap.lock, snap.epoch_counter
    data: dict[str, Any] = {"lock": lock.epoch if lock else None, "counter": counter}
    if lock is None:
        return Check("epochs", "ok", f"no lease held; epoch counter {counter}", data=data)
    if counter is None or lock.epoch > counter:
        return Check(
            "epochs",
            "fail",
            f"the lock's epoch {lock.epoch} is above the epoch counter ({counter}): the counter "
            "was deleted or rewritten; fencing still holds, but epochs may repeat",
            data=data,
        )
    wrong = [
        f"{i.name} reports leading with epoch {(i.record or {}).get('epoch')}"
        for i in _leading(snap)
        if (i.record or {}).get("epoch") != lock.epoch
    ]
    if wrong:
        return Check(
            "epochs",
            "fail",
            f"instances report leading with an epoch other than the lock's ({lock.epoch}): an "
            "old leader that has not noticed its loss yet (run again), or a split brain",
            wrong,
            data,
        )
    return Check(
        "epochs",
        "ok",
        f"lock epoch {lock.epoch} ≤ counter {counter}; the leader reports epoch {lock.epoch}",
        data=data,
    )


def check_eviction(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Redis never evicts keys (an evicted lease is a second leader, an evicted job is lost)."""
    policy = snap.policy
    data = {"maxmemory_policy": policy, "source": snap.policy_source}
    if policy == NOEVICTION:
        return Check("eviction", "ok", f"maxmemory-policy {NOEVICTION}", data=data)
    if policy is None:
        return Check(
            "eviction",
            "warn",
            f"cannot read maxmemory-policy ({snap.policy_source}); make sure it is {NOEVICTION}",
            data=data,
        )
    text = (
        f"maxmemory-policy is {policy}, not {NOEVICTION}: an evicted lease is a second leader, "
        "an evicted job is lost"
    )
    if limits.allow_eviction:
        return Check("eviction", "warn", f"{text} (allowed by {ALLOW_EVICTION})", data=data)
    return Check("eviction", "fail", text, data=data)


def check_heartbeats(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Every registered instance heartbeats: its record has not expired and its last heartbeat
    is younger than ``stale_s``."""
    if not snap.instances:
        return Check("heartbeats", "fail", "no instance is registered: is any worker running?")
    stale = [i for i in snap.instances if i.record is None or i.age_s(snap.now_ms) > limits.stale_s]
    roles: dict[str, int] = {}
    for i in snap.live:
        kind = str((i.record or {}).get("role", "?"))
        roles[kind] = roles.get(kind, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in sorted(roles.items()))
    data = {"registered": len(snap.instances), "stale": [i.id for i in stale], "roles": roles}
    if stale:
        return Check(
            "heartbeats",
            "fail",
            f"{len(stale)} of {_n(len(snap.instances), 'registered instance')} stopped "
            "heartbeating (frozen, partitioned or killed; the leader re-queues their jobs)",
            [
                f"{i.name} ({i.id}): last heartbeat {i.age_s(snap.now_ms):.1f}s ago"
                + (", record expired" if i.record is None else "")
                for i in stale
            ],
            data,
        )
    oldest = max(i.age_s(snap.now_ms) for i in snap.instances)
    return Check(
        "heartbeats",
        "ok",
        f"{_n(len(snap.instances), 'instance')} heartbeating ({mix}); oldest heartbeat "
        f"{oldest:.1f}s ago",
        data=data,
    )


def check_versions(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Every live instance runs the same app (when records name it) and framework version."""
    versions: dict[str, list[str]] = {}
    apps: dict[str, list[str]] = {}
    for i in snap.live:
        rec = i.record or {}
        versions.setdefault(str(rec.get("version", "?")), []).append(i.name)
        if rec.get("app") is not None:
            apps.setdefault(str(rec["app"]), []).append(i.name)
    data = {"versions": versions, "apps": apps, "doctor_app": app.name}
    if not snap.live:
        return Check("versions", "warn", "no live instance to compare", data=data)
    details = [f"version {v}: {', '.join(sorted(n))}" for v, n in sorted(versions.items())]
    details += [f"app {a}: {', '.join(sorted(n))}" for a, n in sorted(apps.items())]
    if len(versions) > 1 or len(apps) > 1:
        return Check(
            "versions",
            "fail",
            "instances run different versions: finish the rollout (never run old and new "
            "all-in-one workers together)",
            details,
            data,
        )
    if apps and app.name not in apps:
        return Check(
            "versions",
            "fail",
            f"the instances run app {next(iter(apps))!r}, this doctor loaded {app.name!r} "
            "(WORKER_APP): its job checks would be wrong",
            details,
            data,
        )
    (version,) = versions
    named = f" of app {next(iter(apps))}" if apps else ""
    return Check(
        "versions",
        "ok",
        f"all {len(snap.live)} live instances run version {version}{named}",
        data=data,
    )


def check_clock_skew(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Every host's clock agrees with the Redis server's. Each instance measures its offset to
    the server's clock on every heartbeat (server ``TIME`` minus the midpoint of its own clock
    around the round trip, exact within half the round trip). It fails when any instance's
    offset, the leader's included, certainly exceeds ``max_skew_s`` (its size minus that
    uncertainty): a single instance off by 30 s fails as well as two that disagree."""
    measured = [
        (i, i.offset_ms or 0.0, float((i.record or {}).get("clock_rtt_ms") or 0.0) / 2)
        for i in snap.live
        if i.offset_ms is not None
    ]
    if not measured:
        return Check(
            "clock-skew",
            "warn",
            "not measured yet (instances measure their clock on each heartbeat after the first; "
            "older versions never do)",
        )
    limit_ms = limits.max_skew_s * 1000
    worst = max(measured, key=lambda m: abs(m[1]))
    spread = max(m[1] for m in measured) - min(m[1] for m in measured)
    off = [m for m in measured if abs(m[1]) - m[2] > limit_ms]
    data = {
        "spread_ms": round(spread, 1),
        "max_offset_to_redis_ms": round(worst[1], 1),
        "uncertainty_ms": round(worst[2], 1),
        "offsets_ms": {m[0].name: m[1] for m in measured},
        "off": [m[0].id for m in off],
        "limit_ms": limit_ms,
    }
    text = (
        f"largest offset to Redis {worst[1]:+.0f} ms ± {worst[2]:.0f} ms ({worst[0].name}), "
        f"spread {spread:.0f} ms across {_n(len(measured), 'instance')} "
        f"(limit {limit_ms:.0f} ms)"
    )
    if off:
        return Check(
            "clock-skew",
            "fail",
            f"{len(off)} of {_n(len(measured), 'instance')} off the Redis clock: {text}; code "
            "that reads its host's clock (jobs, services, log times) disagrees with Redis and "
            "the other hosts: run NTP/chrony everywhere",
            [f"{m[0].name} ({m[0].id}): {m[1]:+.0f} ms ± {m[2]:.0f} ms" for m in off],
            data,
        )
    missing = len(snap.live) - len(measured)
    if missing:
        text += f"; {missing} instances not measured yet"
    return Check("clock-skew", "ok", text, data=data)


def check_readiness(snap: Snapshot, app: App, limits: Limits) -> Check:
    """No live instance reports failing dependency checks (``@app.health_check``)."""
    unready = [(i, (i.record or {}).get("unready") or []) for i in snap.live]
    failing = [(i, reasons) for i, reasons in unready if reasons]
    if failing:
        return Check(
            "readiness",
            "fail",
            f"{_n(len(failing), 'instance')} report failing dependency checks (/readyz 503)",
            [f"{i.name}: {'; '.join(map(str, reasons))}" for i, reasons in failing],
            {"failing": {i.name: reasons for i, reasons in failing}},
        )
    declared = len(app.health_checks)
    return Check(
        "readiness",
        "ok",
        f"no instance reports a failing dependency check ({declared} declared)",
    )


def check_periodic_schedule(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Every declared periodic job's last enqueued tick keeps up with its schedule (the leader
    records it within about a second of each tick)."""
    if not app.periodics:
        return Check("periodic-schedule", "ok", "no periodic jobs declared")
    late = []
    for job in app.periodics.values():
        last = snap.periodic_last.get(job.name)
        due = job.schedule.latest(snap.now_ms)
        if last is None:
            late.append(f"{job.name}: no tick ever recorded (no leader has run this job)")
        elif last < due and snap.now_ms - due > limits.tick_grace_s * 1000:
            late.append(
                f"{job.name}: last tick {_iso(last)}, the tick due at {_iso(due)} is "
                f"{(snap.now_ms - due) / 1000:.0f}s late"
            )
    if late:
        return Check(
            "periodic-schedule",
            "fail",
            f"{len(late)} of {_n(len(app.periodics), 'periodic job')} behind their schedule (is a "
            "leader running this app?)",
            late,
        )
    return Check(
        "periodic-schedule", "ok", f"{_n(len(app.periodics), 'periodic job')} ticking on schedule"
    )


def check_periodic_success(snap: Snapshot, app: App, limits: Limits) -> Check:
    """No periodic job's last success is older than its ``max_staleness``; jobs whose latest
    run failed are listed (a warning unless they are stale)."""
    if not app.periodics:
        return Check("periodic-success", "ok", "no periodic jobs declared")
    stale, failing = [], []
    for job in app.periodics.values():
        runs = snap.periodic_runs.get(job.name)
        f = freshness(job, runs, snap.now_ms)
        failure = runs.failure if runs is not None else None
        success = runs.success if runs is not None else None
        last_failed = failure is not None and (
            success is None or int(failure.get("at_ms", 0)) > int(success.get("at_ms", 0))
        )
        error = (
            f"; last failure {_ago(failure.get('at_ms'), snap.now_ms)} ({failure.get('error')}, "
            f"tick {_iso(failure.get('tick_ms'))}, on {failure.get('instance')})"
            if failure is not None and last_failed
            else ""
        )
        if f.stale:
            stale.append(f"{job.name}: {f.explain(job.max_staleness_s)}{error}")
        elif last_failed:
            failing.append(f"{job.name}: latest run failed{error}")
    bounded = sum(1 for j in app.periodics.values() if j.max_staleness_s is not None)
    if stale:
        return Check(
            "periodic-success",
            "fail",
            f"{_n(len(stale), 'periodic job')} not succeeded within max_staleness",
            stale + failing,
        )
    if failing:
        return Check(
            "periodic-success",
            "warn",
            f"{_n(len(failing), 'periodic job')} failed on the latest run (within max_staleness)",
            failing,
        )
    return Check(
        "periodic-success",
        "ok",
        f"no periodic job failing or stale ({bounded} of {len(app.periodics)} declare "
        "max_staleness)",
    )


def check_pollers(snap: Snapshot, app: App, limits: Limits) -> Check:
    """No poller's oldest due item has waited longer than ``max_lag_s``."""
    if not app.pollers:
        return Check("pollers", "ok", "no pollers declared")
    lags: dict[str, float] = {}
    for name, heads in snap.poller_heads.items():
        due = [h for h in heads if h is not None and h <= snap.now_ms]
        lags[name] = (snap.now_ms - min(due)) / 1000 if due else 0.0
    behind = {n: lag for n, lag in lags.items() if lag > limits.max_lag_s}
    worst = max(lags.values(), default=0.0)
    data = {"lag_s": {n: round(v, 1) for n, v in lags.items()}, "limit_s": limits.max_lag_s}
    if behind:
        return Check(
            "pollers",
            "fail",
            f"{_n(len(behind), 'poller')} lagging more than {limits.max_lag_s:g}s (no leader "
            "dispatching, or consumers too few for the item rate)",
            [f"{n}: oldest due item waits {v:.0f}s" for n, v in sorted(behind.items())],
            data,
        )
    return Check(
        "pollers",
        "ok",
        f"{_n(len(lags), 'poller')} keeping up (oldest due item {worst:.1f}s; limit "
        f"{limits.max_lag_s:g}s)",
        data=data,
    )


def check_queue(snap: Snapshot, app: App, limits: Limits) -> Check:
    """The oldest due job in any queue has not waited longer than ``max_lag_s`` (claimed jobs
    are parked in the future, so they do not count)."""
    head = snap.queue_head_ms
    lag = (snap.now_ms - head) / 1000 if head is not None and head <= snap.now_ms else 0.0
    data = {"lag_s": round(lag, 1), "limit_s": limits.max_lag_s}
    if lag > limits.max_lag_s:
        return Check(
            "queue-lag",
            "fail",
            f"the oldest due job has waited {lag:.0f}s (limit {limits.max_lag_s:g}s): too few "
            "consumers, or none running",
            data=data,
        )
    return Check("queue-lag", "ok", f"oldest due job waits {lag:.1f}s", data=data)


def check_dead_letters(snap: Snapshot, app: App, limits: Limits) -> Check:
    """No dead-lettered jobs wait for a decision."""
    n = snap.dead_letters
    if n:
        return Check(
            "dead-letters",
            "fail",
            f"{_n(n, 'dead-lettered job')}: inspect with `python -m worker dead`, then "
            "--retry JOB_ID, --retry-all or --purge",
            data={"count": n},
        )
    return Check("dead-letters", "ok", "no dead-lettered jobs", data={"count": 0})


def check_orphaned_holds(snap: Snapshot, app: App, limits: Limits) -> Check:
    """No holds set (the jobs an instance is running) belongs to an instance that is no longer
    registered: its jobs stay claimed until their in-progress markers expire."""
    registered = {i.id for i in snap.instances}
    orphans = {i: n for i, n in snap.holds.items() if i not in registered}
    if orphans:
        return Check(
            "orphaned-holds",
            "fail",
            f"{_n(len(orphans), 'holds set')} of unregistered instances; their jobs wait for "
            "their claims to expire (up to the largest job timeout + 10 s)",
            [f"{i}: {n} jobs" for i, n in sorted(orphans.items())],
            {"orphans": orphans},
        )
    return Check(
        "orphaned-holds", "ok", f"{_n(len(snap.holds), 'holds set')}, all of registered instances"
    )


async def read_attached(redis: Redis) -> int | None:
    """Replicas attached to the primary, as the WAIT policy counts them (``None``: unreadable)."""
    try:
        return attached_replicas(await server.replication_info(redis))
    except ResponseError:
        return None


def check_durability(snap: Snapshot, app: App, limits: Limits) -> Check:
    """Whether the primary's replicas give the WAIT policy what it waits for: with ``auto``
    and none attached, writes go on unconfirmed (a failover can lose them); with a strict
    number and too few, durable writes stop."""
    rep = limits.replication
    policy = "auto" if rep.adaptive else str(rep.replicas)
    data = {"policy": policy, "wait_for": rep.replicas, "attached": snap.attached_replicas}
    if not rep.enabled:
        return Check(
            "durability", "ok", "no WAIT policy: writes are not confirmed by replicas", data=data
        )
    if snap.attached_replicas is None:
        return Check("durability", "warn", "cannot read INFO replication", data=data)
    ok, text = describe(snap.attached_replicas, rep.replicas, rep.adaptive)
    return Check("durability", "ok" if ok else "fail", text, data=data)


CHECKS: Sequence[Callable[[Snapshot, App, Limits], Check]] = (
    check_leader,
    check_epochs,
    check_eviction,
    check_durability,
    check_heartbeats,
    check_versions,
    check_clock_skew,
    check_readiness,
    check_periodic_schedule,
    check_periodic_success,
    check_pollers,
    check_queue,
    check_dead_letters,
    check_orphaned_holds,
)


# -- output -------------------------------------------------------------------------------------


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _iso(at_ms: Any) -> str | None:
    if at_ms is None:
        return None
    return dt.datetime.fromtimestamp(int(at_ms) / 1000, dt.UTC).isoformat(timespec="seconds")


def _ago(at_ms: Any, now_ms: int) -> str:
    return "?" if at_ms is None else f"{max(0.0, (now_ms - int(at_ms)) / 1000):.0f}s ago"


def render(report: Report) -> str:
    """The checklist: one line per check (✓ ok, ! warning, ✗ failed), details indented."""
    width = max(len(c.name) for c in report.checks)
    out = [f"worker doctor: prefix {report.prefix!r}, at {_iso(report.at_ms)} (Redis clock)", ""]
    for c in report.checks:
        out.append(f"{MARKS[c.status]} {c.name:<{width}}  {c.summary}")
        out += [f"  {' ' * width}    {line}" for line in c.details]
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in MARKS}
    out += [
        "",
        f"{counts['ok']} ok, {counts['warn']} warnings, {counts['fail']} failed"
        + ("" if report.ok else f": {', '.join(c.name for c in report.checks if not c.ok)}"),
    ]
    return "\n".join(out)
