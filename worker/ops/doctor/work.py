"""The doctor's checks of the work: periodic schedules and successes, pollers, queues, dead
letters."""

from __future__ import annotations

from worker.app import App
from worker.core.ids import parse_epoch
from worker.duties.periodic import freshness
from worker.ops.doctor.verdict import Check, Limits, ago, iso, num
from worker.ops.snapshot import ClusterSnapshot


def check_periodic_schedule(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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
                f"{job.name}: last tick {iso(last)}, the tick due at {iso(due)} is "
                f"{(snap.now_ms - due) / 1000:.0f}s late"
            )
    if late:
        return Check(
            "periodic-schedule",
            "fail",
            f"{len(late)} of {num(len(app.periodics), 'periodic job')} behind their schedule (is a "
            "leader running this app?)",
            late,
        )
    return Check(
        "periodic-schedule",
        "ok",
        f"{num(len(app.periodics), 'periodic job')} ticking on schedule",
    )


def check_periodic_success(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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
            f"; last failure {ago(failure.get('at_ms'), snap.now_ms)} ({failure.get('error')}, "
            f"tick {iso(failure.get('tick_ms'))}, on {failure.get('instance')})"
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
            f"{num(len(stale), 'periodic job')} not succeeded within max_staleness",
            stale + failing,
        )
    if failing:
        return Check(
            "periodic-success",
            "warn",
            f"{num(len(failing), 'periodic job')} failed on the latest run (within max_staleness)",
            failing,
        )
    return Check(
        "periodic-success",
        "ok",
        f"no periodic job failing or stale ({bounded} of {len(app.periodics)} declare "
        "max_staleness)",
    )


def check_pollers(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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
            f"{num(len(behind), 'poller')} lagging more than {limits.max_lag_s:g}s (no leader "
            "dispatching, or consumers too few for the item rate)",
            [f"{n}: oldest due item waits {v:.0f}s" for n, v in sorted(behind.items())],
            data,
        )
    return Check(
        "pollers",
        "ok",
        f"{num(len(lags), 'poller')} keeping up (oldest due item {worst:.1f}s; limit "
        f"{limits.max_lag_s:g}s)",
        data=data,
    )


def check_queue(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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


def check_dead_letters(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
    """No dead-lettered jobs wait for a decision."""
    n = snap.dead_letters
    if n:
        return Check(
            "dead-letters",
            "fail",
            f"{num(n, 'dead-lettered job')}: inspect with `python -m worker dead`, then "
            "--retry JOB_ID, --retry-all or --purge",
            data={"count": n},
        )
    return Check("dead-letters", "ok", "no dead-lettered jobs", data={"count": 0})


def check_shards(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
    """Queue shards (``WORKER_QUEUE_SHARDS`` > 1) are served by distinct cluster primaries:
    two shards on one primary share its CPU (a failure if the cluster has a primary to spare,
    a warning if it has fewer primaries than shards, or is no cluster at all)."""
    fenced = _fenced_out(snap)
    if fenced:
        return Check(
            "shards",
            "fail",
            f"{num(len(fenced), 'queue shard')} fenced against the leader: writes of the "
            "leader there (reaping a dead consumer's claims) are refused and skipped. Nothing "
            "the framework writes does this: delete the fence key (the leader writes it again)",
            fenced,
            {"fenced": fenced},
        )
    n = len(snap.shards)
    by_node: dict[str, list[int]] = {}
    for sh in snap.shards:
        by_node.setdefault(sh.node or "?", []).append(sh.index)
    data = {"shards": n, "masters": snap.cluster_masters, "by_node": by_node}
    if snap.cluster_masters == 0:
        return Check(
            "shards",
            "warn",
            f"{n} queue shards on a server that is not a Redis Cluster: they share its CPU "
            "(WORKER_QUEUE_SHARDS pays off on a cluster; 1 is the plain layout)",
            data=data,
        )
    shared = {node: idx for node, idx in by_node.items() if len(idx) > 1}
    if not shared:
        return Check("shards", "ok", f"{n} queue shards on {n} distinct primaries", data=data)
    details = [
        f"{node} serves shards {', '.join(map(str, idx))} (slots "
        f"{', '.join(str(snap.shards[i].slot) for i in idx)})"
        for node, idx in shared.items()
    ]
    if snap.cluster_masters < n:
        return Check(
            "shards",
            "warn",
            f"{n} queue shards but only {num(snap.cluster_masters, 'primary', 'primaries')}: "
            "some share one (add primaries, or set WORKER_QUEUE_SHARDS to their number)",
            details,
            data,
        )
    return Check(
        "shards",
        "fail",
        f"{n} queue shards on {len(by_node)} of {snap.cluster_masters} primaries: move the "
        "slots named below to an idle primary (redis-cli --cluster reshard, or CLUSTER "
        "SETSLOT) so each shard has its own",
        details,
        data,
    )


def _fenced_out(snap: ClusterSnapshot) -> list[str]:
    """Queue shards whose fence is not an epoch, or is above the lease's epoch."""
    out = []
    epoch = snap.lock.epoch if snap.lock is not None else None
    for sh in snap.shards[1:]:
        if sh.fence is None:
            continue
        fence = parse_epoch(sh.fence)
        if fence is None:
            out.append(f"shard {sh.index}: {sh.prefix}fence holds {sh.fence!r}, not an epoch")
        elif epoch is not None and fence > epoch:
            out.append(
                f"shard {sh.index}: {sh.prefix}fence {fence} is above the lease's epoch {epoch}"
            )
    return out
