"""``python -m worker status``: the cluster as Redis sees it, as a table or JSON.

The apps on the key prefix (one is right; several share a queue and a leader lock), instances
with app, role and heartbeat age, the leader with epoch and lease, queue depth, each duty
kind's rows (as the kind describes them, see :mod:`worker.duties.kinds`), dead letters and the
server's eviction policy. No secrets: the Redis URL is masked.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from worker.app import App
from worker.core.clock import Clock
from worker.core.dutykinds import RowContext, iso, lag, table
from worker.core.ids import paused_queues
from worker.duties import kinds
from worker.ops import schedules_view, snapshot
from worker.ops.snapshot import ClusterSnapshot
from worker.runtime.preflight import NOEVICTION, eviction_verdict
from worker.storage import keys as K
from worker.storage.store import open_store


async def collect(
    redis: Redis,
    keys: K.Keys,
    app: App,
    clock: Clock | None = None,
    *,
    allow_eviction: bool = False,
) -> dict[str, Any]:
    """Read the cluster's state from Redis (read-only). ``allow_eviction``: this deployment's
    ``WORKER_ALLOW_EVICTION``, to judge the server's eviction policy."""
    snap = await snapshot.read(open_store(redis, keys, None), app, clock, checks=False)
    return view(snap, app, allow_eviction=allow_eviction)


def _flows(snap: ClusterSnapshot, queue: str) -> dict[str, Any]:
    """A fair queue's flow keys: ``{"flows": {"active": n, "backlog": {key: jobs}}}`` (the
    next ones served; a job without a flow key waits under ``""``); nothing for another."""
    flows = snap.flows.get(queue)
    if flows is None:
        return {}
    return {"flows": {"active": flows.active, "backlog": flows.backlog}}


def view(snap: ClusterSnapshot, app: App, *, allow_eviction: bool = False) -> dict[str, Any]:
    """``status``'s document (``--json``; the console's ``cluster``) of one snapshot (pure)."""
    now, paused = snap.now_ms, paused_queues(snap.paused, (q.name for q in snap.queues))
    queues = [
        {
            "name": q.key,
            "queue": q.name,
            "depth": q.depth,
            "due": q.due,
            "oldest_due_age_s": lag(q.head_ms, now),
            "paused": q.name in paused,
            **_flows(snap, q.name),
        }
        for q in snap.queues
    ]
    instances = _instances(snap)
    context = RowContext(now, snap.paused, instances)
    apps: dict[str, int] = {}
    for inst in instances:
        if inst["alive"] and isinstance(inst.get("app"), str):
            apps[inst["app"]] = apps.get(inst["app"], 0) + 1
    return {
        "at": iso(now),
        "redis": {
            "maxmemory_policy": snap.policy,
            "source": snap.policy_source,
            "ok": snap.policy == NOEVICTION,
            "eviction_allowed": allow_eviction,
            "verdict": eviction_verdict(snap.policy, allow_eviction),
        },
        "prefix": snap.prefix,
        "described_app": app.name,
        "apps": dict(sorted(apps.items())),
        "instances": instances,
        "leader": _leader(snap, instances),
        "queue": {k: queues[0][k] for k in ("name", "depth", "due")},
        "queues": queues,
        **{k.status_key: k.rows(snap.duties[k.name], app, context) for k in kinds.KINDS},
        "schedules": schedules_view.rows(snap),
        "dead_letters": snap.dead_letters,
        **({"shards": _shards(snap)} if snap.shards else {}),
    }


def _shards(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    """Each queue shard (``WORKER_QUEUE_SHARDS`` > 1): where it lives and its backlog."""
    return [
        {
            "shard": sh.index,
            "prefix": sh.prefix,
            "slot": sh.slot,
            "node": sh.node,
            "depth": sh.depth,
            "due": sh.due,
            "queues": {q.name: {"depth": q.depth, "due": q.due} for q in sh.queues},
            "oldest_due_age_s": lag(
                min((q.head_ms for q in sh.queues if q.head_ms is not None), default=None),
                snap.now_ms,
            ),
            "dead_letters": sh.dead_letters,
        }
        for sh in snap.shards
    ]


def _instances(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    out = []
    for inst in snap.instances:
        info: dict[str, Any] = dict(inst.record) if inst.record is not None else {"id": inst.id}
        info["heartbeat_age_s"] = round((snap.now_ms - inst.heartbeat_ms) / 1000, 1)
        info["alive"] = inst.record is not None
        out.append(info)
    out.sort(key=lambda i: (str(i.get("role", "")), str(i.get("name", ""))))
    return out


def _leader(snap: ClusterSnapshot, instances: list[dict[str, Any]]) -> dict[str, Any]:
    lock, pttl = snap.lock, snap.lock_pttl_ms
    leader: dict[str, Any] = {"held": lock is not None}
    if lock is not None:
        leader["epoch"] = lock.epoch
        leader["ttl_remaining_s"] = round(pttl / 1000, 1) if pttl > 0 else None
        # left by an old static leader; the next campaign replaces it (see election.ACQUIRE)
        leader["no_expiry"] = pttl == -1
        holder = next(
            (i for i in instances if i.get("is_leader") and i.get("epoch") == lock.epoch), None
        )
        leader["instance"] = holder.get("name") if holder else None
        leader["lease_age_s"] = holder.get("lease_age_s") if holder else None
    return leader


def _apps_line(apps: dict[str, int], prefix: str) -> str:
    """Which apps live instances on this prefix belong to; several is a misconfiguration."""
    if not apps:
        return f"app: no live instances on key prefix {prefix!r}"
    if len(apps) == 1:
        ((name, n),) = apps.items()
        return f"app: {name} ({n} live instance{'' if n == 1 else 's'}) on key prefix {prefix!r}"
    listed = ", ".join(f"{name} ({n})" for name, n in apps.items())
    return (
        f"apps: {listed} SHARE key prefix {prefix!r} (one queue, one leader lock): give each "
        "app its own WORKER_KEY_PREFIX"
    )


def render(status: dict[str, Any]) -> str:
    """A readable multi-table view of :func:`collect`'s result."""
    out: list[str] = [f"cluster status at {status['at']}", "", *_summary(status)]
    out += table(
        ["INSTANCE", "APP", "ROLE", "LEADER", "IN FLIGHT", "HEARTBEAT", "HOST", "PID", "VERSION"],
        [
            [
                i.get("name", i.get("id")),
                i.get("app"),
                i.get("role"),
                f"yes (epoch {i.get('epoch')})" if i.get("is_leader") else "",
                i.get("in_flight"),
                f"{i['heartbeat_age_s']}s ago" + ("" if i["alive"] else " STALE"),
                i.get("host"),
                i.get("pid"),
                i.get("version"),
            ]
            for i in status["instances"]
        ],
    )
    out += _shard_table(status)
    for kind in kinds.KINDS:
        out += kind.render(status.get(kind.status_key, []), status["at"])
    out += schedules_view.table(status, table)
    return "\n".join(out)


def _summary(status: dict[str, Any]) -> list[str]:
    """The lines above the tables: apps, Redis, leader, queues, dead letters."""
    out: list[str] = []
    apps: dict[str, int] | None = status.get("apps")
    if apps is not None:
        out.append(_apps_line(apps, status.get("prefix", "?")))
    rd = status.get("redis")
    if rd is not None:
        verdict = "" if rd["ok"] else f" ({rd['verdict']})"
        out.append(f"redis: maxmemory-policy {rd['maxmemory_policy'] or 'unknown'}{verdict}")
    ld = status["leader"]
    if ld["held"]:
        ttl = f"ttl {ld.get('ttl_remaining_s')}s"
        if ld.get("no_expiry"):
            ttl = "ttl NONE: a lock without expiry (an old static leader?); a campaign replaces it"
        out.append(
            f"leader: {ld.get('instance') or '?'}  epoch {ld['epoch']}  "
            f"lease age {ld.get('lease_age_s')}s  {ttl}"
        )
    else:
        out.append("leader: none")
    for q in status.get("queues") or [status["queue"]]:
        pause = " PAUSED (no job starts; enqueues go on)" if q.get("paused") else ""
        out.append(f"queue {q['name']}: {q['depth']} jobs ({q['due']} due){pause}")
        if "flows" in q:  # a fair queue: its flow keys' jobs, not moved into it yet
            f = q["flows"]
            shown = ", ".join(f"{k or '(none)'}: {n}" for k, n in f["backlog"].items())
            out.append(f"  flow keys: {f['active']} active, waiting: {shown or '-'}")
    return [*out, f"dead letters: {status['dead_letters']}", ""]


def _shard_table(status: dict[str, Any]) -> list[str]:
    """The queue shards (only with more than one): slot, node, backlog each."""
    shards = status.get("shards")
    if not shards:
        return []
    rows = [
        [s["shard"], s["prefix"], s["slot"], s["node"], s["depth"], s["due"], s["oldest_due_age_s"]]
        for s in shards
    ]
    head = ["SHARD", "PREFIX", "SLOT", "NODE", "JOBS", "DUE", "OLDEST DUE (s)"]
    return ["", *table(head, rows)]
