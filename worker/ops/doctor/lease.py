"""The doctor's checks of leadership and Redis: one leader, epochs, eviction, durability."""

from __future__ import annotations

from typing import Any

from worker.core import malformed as M
from worker.core.durability import describe
from worker.core.ids import EPOCH_AHEAD_MS
from worker.core.verdict import Check, Limits
from worker.duties import kinds
from worker.ops.model import ClusterSnapshot, Declared, Instance
from worker.runtime.preflight import ALLOW_EVICTION, NOEVICTION


def leading(snap: ClusterSnapshot) -> list[Instance]:
    return [i for i in snap.live if (i.record or {}).get("is_leader")]


#: Roles that campaign for the lease.
CANDIDATES = ("leader", "all")


def _renewed_ms(snap: ClusterSnapshot) -> int | None:
    """The server time of the last acquire or renew (``None``: none, or unreadable)."""
    return M.time_ms(snap.lease_state.get("renewed_ms") or "x")


def check_leader(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
    """Exactly one leader: the lock is held, with a TTL, by the one live instance that reports
    leading with its epoch. Without one: how long since the last lease was renewed, and how
    many candidates are live (live candidates and no leader for longer than a lease TTL:
    their campaigns fail, see their logs and ``worker_leaderless_seconds``)."""
    lock, pttl = snap.lock, snap.lock_pttl_ms
    claimants = leading(snap)
    names = ", ".join(f"{i.name} (epoch {(i.record or {}).get('epoch')})" for i in claimants)
    if lock is None:
        candidates = [i for i in snap.live if (i.record or {}).get("role") in CANDIDATES]
        renewed = _renewed_ms(snap)
        since = "" if renewed is None else f" for {(snap.now_ms - renewed) / 1000:.1f}s"
        why = "no leader/all process running, or none can campaign"
        if candidates:
            why = f"{len(candidates)} live candidates cannot acquire it: see their logs"
        held = " (it holds a value the framework never writes)" if pttl != -2 else ""
        return Check(
            "leader",
            "fail",
            f"no leader{since}: nobody holds {snap.prefix}leader{held} ({why}); "
            f"{_stopped()} and singleton services are stopped",
            [f"instances still reporting leadership: {names}"] if claimants else [],
            {
                "candidates": [i.name for i in candidates],
                "leaderless_ms": renewed and (snap.now_ms - renewed),
            },
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
    renewed = _renewed_ms(snap)
    since_renew = None if renewed is None else round((snap.now_ms - renewed) / 1000, 1)
    data.update(instance=holder.name, lease_age_s=lease_age, renewed_s_ago=since_renew)
    return Check(
        "leader",
        "ok",
        f"{holder.name} leads: epoch {lock.epoch}, lease age {lease_age}s, ttl "
        f"{pttl / 1000:.1f}s, renewed {since_renew}s ago",
        data=data,
    )


def check_epochs(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
    """The lock's epoch is at most the epoch counter, and every instance reporting leadership
    reports the lock's epoch."""
    lock, counter = snap.lock, snap.epoch_counter
    data: dict[str, Any] = {"lock": lock.epoch if lock else None, "counter": counter}
    if isinstance(counter, str) or (counter or 0) > snap.now_ms + EPOCH_AHEAD_MS:
        return Check(
            "epochs",
            "fail",
            f"the epoch counter {snap.prefix}leader:epoch holds {counter!r}: not an epoch the "
            "framework issues (an integer below 2^53, at most a day ahead of the server's "
            "clock); written by hand or another program? The next acquisition repairs it "
            "(docs/fencing.md)",
            data=data,
        )
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


def check_eviction(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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


def check_durability(snap: ClusterSnapshot, app: Declared, limits: Limits) -> Check:
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


def _stopped() -> str:
    """What stops without a leader, named by the duty kinds: ``periodic jobs, pollers, …``."""
    return ", ".join(k.plural for k in kinds.pausable())
