"""``python -m worker status``: the cluster as Redis sees it, as a table or JSON.

The apps on the key prefix (one is right; several share a queue and a leader lock), instances
with app, role and heartbeat age, the leader with epoch and lease, queue depth, periodic
last/next tick and last success/failure (time, tick, error class), poller backlog per shard,
initializer state, dead letters and the server's eviction policy. No secrets: the Redis URL is
masked.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from arq.connections import ArqRedis

from worker.app import App
from worker.core.clock import Clock
from worker.core.ids import duty
from worker.duties.periodic import PeriodicDef, freshness
from worker.ops import snapshot
from worker.ops.snapshot import ClusterSnapshot
from worker.runtime.preflight import NOEVICTION, eviction_verdict
from worker.storage import keys as K
from worker.storage import open_store


def _iso(tick_ms: int | None) -> str | None:
    if tick_ms is None:
        return None
    return dt.datetime.fromtimestamp(tick_ms / 1000, dt.UTC).isoformat(timespec="seconds")


async def collect(
    redis: ArqRedis,
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


def view(snap: ClusterSnapshot, app: App, *, allow_eviction: bool = False) -> dict[str, Any]:
    """``status``'s document (``--json``; the console's ``cluster``) of one snapshot (pure)."""
    now = snap.now_ms
    queues = [
        {
            "name": q.key,
            "queue": q.name,
            "depth": q.depth,
            "due": q.due,
            "oldest_due_age_s": _lag(q.head_ms, now),
        }
        for q in snap.queues
    ]
    instances = _instances(snap)
    apps: dict[str, int] = {}
    for inst in instances:
        if inst["alive"] and isinstance(inst.get("app"), str):
            apps[inst["app"]] = apps.get(inst["app"], 0) + 1
    return {
        "at": _iso(now),
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
        "periodic": [_periodic(snap, pd) for pd in app.periodics.values()],
        "pollers": [_poller(snap, p.name, p.task) for p in app.pollers.values()],
        "initializers": [_initializer(snap, i.name, i.version) for i in app.initializers.values()],
        "per_key_services": [
            {
                "name": name,
                "processes": processes,
                "keys": {k: _name_of(instances, o) for k, o in leased.items()},
            }
            for name, (processes, leased) in snap.per_key.items()
        ],
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
            "oldest_due_age_s": _lag(
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


def _name_of(instances: list[dict[str, Any]], instance_id: str) -> Any:
    return next((i.get("name") for i in instances if i.get("id") == instance_id), instance_id)


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


def _periodic(snap: ClusterSnapshot, pd: PeriodicDef) -> dict[str, Any]:
    run = snap.periodic_runs.get(pd.name)
    fresh = freshness(pd, run, snap.now_ms)
    last = snap.periodic_enqueued.get(pd.name)
    upcoming = pd.schedule.next(snap.now_ms)
    return {
        "name": pd.name,
        "schedule": pd.schedule.describe(),
        # the newest tick enqueued as a job: None when none ever was (not the schedule's
        # previous slot, which a new job records as planned without running it)
        "last_tick": _iso(last),
        "last_tick_ms": last,
        "last_tick_age_s": None if last is None else round((snap.now_ms - last) / 1000, 1),
        "next_tick": _iso(upcoming),
        "next_tick_ms": upcoming,
        "last_success": _run_end(run.success if run else None),
        "last_failure": _run_end(run.failure if run else None),
        "failing_since": _iso(run.failing_since_ms if run else None),
        "success_age_s": None if fresh.success_age_s is None else round(fresh.success_age_s, 1),
        "max_staleness_s": pd.max_staleness_s,
        "stale": fresh.stale,
        "catch_up": pd.catch_up,
        "queue": pd.queue,
        "paused": duty("periodic", pd.name) in snap.paused,
    }


def _poller(snap: ClusterSnapshot, name: str, task: str) -> dict[str, Any]:
    state = snap.pollers[name]
    shards: list[dict[str, Any]] = [
        {"shard": s, "waiting": w, "due": d, "lag_s": _lag(head, snap.now_ms)}
        for s, ((w, d), head) in enumerate(zip(state.shards, state.heads, strict=True))
    ]
    lags = [s["lag_s"] for s in shards if s["lag_s"] is not None]
    return {
        "name": name,
        "task": task,
        "paused": duty("poller", name) in snap.paused,
        "in_flight": state.in_flight,
        "waiting": sum(s["waiting"] for s in shards),
        "due": sum(s["due"] for s in shards),
        "lag_s": max(lags) if lags else None,
        "shards": shards,
    }


def _initializer(snap: ClusterSnapshot, name: str, version: str) -> dict[str, Any]:
    st = snap.initializers.get(name, {})
    return {
        "name": name,
        "version": version,
        "stored_version": st.get("version"),
        "done": st.get("done") == "1" and st.get("version") == version,
        "batches": int(st.get("batches", 0)),
        "items": int(st.get("items", 0)),
        "cursor": st.get("cursor") or None,
    }


def _lag(head_ms: int | None, now_ms: int) -> float | None:
    """How long the oldest due entry of a sorted set (its lowest score) has waited, in
    seconds; ``None`` when nothing is due."""
    if head_ms is None or head_ms > now_ms:
        return None
    return round((now_ms - head_ms) / 1000, 1)


def _run_end(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """A recorded run end with readable times."""
    if rec is None:
        return None
    return {**rec, "at": _iso(rec.get("at_ms")), "tick": _iso(rec.get("tick_ms"))}


def _ago(at_iso: str | None, now_iso: str) -> str | None:
    if at_iso is None:
        return None
    delta = dt.datetime.fromisoformat(now_iso) - dt.datetime.fromisoformat(at_iso)
    return f"{max(0, round(delta.total_seconds()))}s ago"


def _failure_cell(rec: dict[str, Any] | None, now_iso: str) -> str | None:
    if rec is None:
        return None
    return f"{_ago(rec.get('at'), now_iso)} {rec.get('error') or '?'}"


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [[("-" if c is None else str(c)) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [
        fmt.format(*headers),
        fmt.format(*("-" * w for w in widths)),
        *(fmt.format(*r) for r in cells),
    ]


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
    out += _table(
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
    out += _periodic_table(status)
    if status["pollers"]:
        out += [
            "",
            *_table(
                ["POLLER", "TASK", "WAITING", "DUE", "IN FLIGHT", "PER SHARD (due)"],
                [
                    [
                        p["name"] + (" (PAUSED)" if p.get("paused") else ""),
                        p["task"],
                        p["waiting"],
                        p["due"],
                        p["in_flight"],
                        " ".join(str(s["due"]) for s in p["shards"]),
                    ]
                    for p in status["pollers"]
                ],
            ),
        ]
    out += _initializer_table(status)
    for sv in status.get("per_key_services", []):
        out += [
            "",
            f"per_key service {sv['name']}: {len(sv['keys'])} keys running "
            f"on {sv['processes']} processes",
            *_table(["KEY", "INSTANCE"], [[k, o] for k, o in sv["keys"].items()]),
        ]
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
        out.append(f"queue {q['name']}: {q['depth']} jobs ({q['due']} due)")
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
    return ["", *_table(head, rows)]


def _periodic_table(status: dict[str, Any]) -> list[str]:
    if not status["periodic"]:
        return []
    return [
        "",
        *_table(
            ["PERIODIC", "SCHEDULE", "LAST TICK", "NEXT TICK", "LAST SUCCESS", "LAST FAILURE"],
            [
                [
                    p["name"] + (" (PAUSED)" if p.get("paused") else ""),
                    p["schedule"],
                    p["last_tick"] or "never",
                    p["next_tick"],
                    (_ago((p.get("last_success") or {}).get("at"), status["at"]) or "-")
                    + (" STALE" if p.get("stale") else ""),
                    _failure_cell(p.get("last_failure"), status["at"]),
                ]
                for p in status["periodic"]
            ],
        ),
    ]


def _initializer_table(status: dict[str, Any]) -> list[str]:
    if not status["initializers"]:
        return []
    return [
        "",
        *_table(
            ["INITIALIZER", "VERSION", "DONE", "BATCHES", "ITEMS", "CURSOR"],
            [
                [
                    i["name"],
                    i["version"],
                    "yes" if i["done"] else "no",
                    i["batches"],
                    i["items"],
                    i["cursor"],
                ]
                for i in status["initializers"]
            ],
        ),
    ]
