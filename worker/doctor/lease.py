"""The doctor's checks of leadership and Redis: one leader, epochs, eviction, durability."""

from __future__ import annotations

from typing import Any

from worker.app import App
from worker.doctor.verdict import Check, Limits
from worker.durability import describe
from worker.preflight import ALLOW_EVICTION, NOEVICTION
from worker.snapshot import ClusterSnapshot, Instance


def leading(snap: ClusterSnapshot) -> list[Instance]:
    return [i for i in snap.live if (i.record or {}).get("is_leader")]


def check_leader(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
    """Exactly one leader: the lock is held, with a TTL, by the one live instance that reports
    leading with its epoch."""
    lock, pttl = snap.lock, snap.lock_pttl_ms
    claimants = leading(snap)
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


def check_epochs(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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
        for i in leading(snap)
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


def check_eviction(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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


def check_durability(snap: ClusterSnapshot, app: App, limits: Limits) -> Check:
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
