"""The doctor's checks of the instances: heartbeats, versions, clocks, readiness, holds."""

from __future__ import annotations

from worker.core.verdict import Check, Limits, num
from worker.ops.model import ClusterSnapshot, Declared


def check_heartbeats(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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
            f"{len(stale)} of {num(len(snap.instances), 'registered instance')} stopped "
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
        f"{num(len(snap.instances), 'instance')} heartbeating ({mix}); oldest heartbeat "
        f"{oldest:.1f}s ago",
        data=data,
    )


def check_versions(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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


def check_clock_skew(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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
        f"spread {spread:.0f} ms across {num(len(measured), 'instance')} "
        f"(limit {limit_ms:.0f} ms)"
    )
    if off:
        return Check(
            "clock-skew",
            "fail",
            f"{len(off)} of {num(len(measured), 'instance')} off the Redis clock: {text}; code "
            "that reads its host's clock (jobs, services, log times) disagrees with Redis and "
            "the other hosts: run NTP/chrony everywhere",
            [f"{m[0].name} ({m[0].id}): {m[1]:+.0f} ms ± {m[2]:.0f} ms" for m in off],
            data,
        )
    missing = len(snap.live) - len(measured)
    if missing:
        text += f"; {missing} instances not measured yet"
    return Check("clock-skew", "ok", text, data=data)


def check_readiness(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
    """No live instance reports failing dependency checks (``@app.health_check``)."""
    unready = [(i, (i.record or {}).get("unready") or []) for i in snap.live]
    failing = [(i, reasons) for i, reasons in unready if reasons]
    if failing:
        return Check(
            "readiness",
            "fail",
            f"{num(len(failing), 'instance')} report failing dependency checks (/readyz 503)",
            [f"{i.name}: {'; '.join(map(str, reasons))}" for i, reasons in failing],
            {"failing": {i.name: reasons for i, reasons in failing}},
        )
    declared = len(app.health_checks)
    return Check(
        "readiness",
        "ok",
        f"no instance reports a failing dependency check ({declared} declared)",
    )


def check_orphaned_holds(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
    """No holds set (the jobs an instance is running) belongs to an instance that is no longer
    registered: its jobs stay claimed until their in-progress markers expire."""
    registered = {i.id for i in snap.instances}
    orphans = {i: n for i, n in snap.holds.items() if i not in registered}
    if orphans:
        return Check(
            "orphaned-holds",
            "fail",
            f"{num(len(orphans), 'holds set')} of unregistered instances; their jobs wait for "
            "their claims to expire (up to the largest job timeout + 10 s)",
            [f"{i}: {n} jobs" for i, n in sorted(orphans.items())],
            {"orphans": orphans},
        )
    return Check(
        "orphaned-holds",
        "ok",
        f"{num(len(snap.holds), 'holds set')}, all of registered instances",
    )


def check_neighbours(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
    """No process of another database of this server uses this key prefix: Pub/Sub is
    server-wide, so channel names carry the database (``@db<n>``, none in database 0); a
    channel of this prefix with another database's name means another app (or this one,
    misconfigured) runs there with the same prefix. Give each app its own prefix."""
    found = snap.neighbours
    data = {"channels": found}
    if found is None:
        return Check("neighbours", "warn", "cannot read PUBSUB CHANNELS (ACL?)", data=data)
    if not found:
        return Check(
            "neighbours", "ok", f"no other database of this server uses {snap.prefix!r}", data=data
        )
    return Check(
        "neighbours",
        "fail",
        f"processes in another database of this server use the key prefix {snap.prefix!r}: "
        "another app (or this one, misconfigured). A database separates keys, not Pub/Sub or "
        "the server's memory and CPU: give each app its own WORKER_KEY_PREFIX",
        [f"listening on {c}" for c in found],
        data,
    )
