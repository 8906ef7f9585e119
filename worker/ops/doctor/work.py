"""The doctor's checks of the work: queues, dead letters, queue shards (each duty kind's own
checks are the kind's, see :mod:`worker.duties.kinds`)."""

from __future__ import annotations

from worker.core.ids import parse_epoch
from worker.core.verdict import Check, Limits, num
from worker.ops.model import ClusterSnapshot, Declared


def check_queue(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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


def check_dead_letters(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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


def check_shards(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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
