"""What the WAIT policy sees of the primary's replicas (``WORKER_REDIS_WAIT_REPLICAS``).

``auto`` (the default with a Sentinel or Cluster URL) waits for the replicas *attached* to the
primary, up to one: a write counts as done once one replica confirmed it, or at once when the
primary has no replica to ask (a promoted node whose peer is gone). Then the process goes on
*degraded*: it says so once (WARNING), exports ``worker_redis_durability_degraded`` 1, ``doctor``
fails its ``durability`` check and the console shows a banner; a failover in that state can lose
what was written since. It waits again from the first write after a replica attaches.

"Attached" is Redis's own notion (``min-replicas-max-lag``): a replica ``online`` in
``INFO replication`` whose last acknowledgement is at most :data:`ATTACHED_MAX_LAG_S` old. One
that froze or lost its link still counts for that long (its writes wait and fail as with a
strict number), then no longer. Every durable round trip reads ``INFO replication`` just
before its ``WAIT``, so the decision is about the replicas of the primary that took the write.
A primary that had a replica and lost it stays strict for :data:`LOST_GRACE_S` first (see
:class:`ReplicaView`: it may be a primary being failed over away from).

An explicit number (``WORKER_REDIS_WAIT_REPLICAS=1``) is strict: every durable write needs that
many confirmations, and with fewer replicas attached leadership, ticks, poll dispatch, enqueues
and job starts stop (``NotReplicated``) until enough are back.
"""

from __future__ import annotations

from typing import Any

import structlog

from worker.core.clock import Clock, SystemClock

log = structlog.get_logger("worker.durability")

#: What this process last said of each primary (by replication id): degraded or not. Every
#: store (one per queue shard, one per client) keeps a view of its own; the line is said once
#: per change of a primary, not once per view.
_SAID: dict[str, bool] = {}


def _say(replid: str, degraded: bool, attached: int, wanted: int) -> None:
    if _SAID.get(replid, False) == degraded:
        return
    _SAID.pop(replid, None)
    _SAID[replid] = degraded
    while len(_SAID) > 64:
        del _SAID[next(iter(_SAID))]
    if degraded:
        log.warning(
            "durability degraded: the primary has no attached replica, so durable writes "
            "go on unconfirmed (WORKER_REDIS_WAIT_REPLICAS=auto); a failover now can lose "
            "them. Waiting again once a replica attaches",
            attached=attached,
            wanted=wanted,
        )
    else:
        log.info("durability restored: a replica attached; durable writes wait for it")


#: A primary that lost its last replica stays strict this long before going on without one.
LOST_GRACE_S = 3.0
#: A replica whose last acknowledgement is older than this is not counted as attached (Redis's
#: ``min-replicas-max-lag`` default).
ATTACHED_MAX_LAG_S = 10


def attached_replicas(info: dict[str, Any]) -> int:
    """Replicas attached to the primary, from its ``INFO replication`` (parsed by redis-py):
    ``online`` ones whose lag is at most :data:`ATTACHED_MAX_LAG_S`."""
    count = 0
    for key, value in info.items():
        if not (key.startswith("slave") and key[5:].isdigit() and isinstance(value, dict)):
            continue
        try:
            lag = int(value.get("lag", 0))
        except (TypeError, ValueError):
            lag = 0
        if value.get("state") == "online" and lag <= ATTACHED_MAX_LAG_S:
            count += 1
    return count


class ReplicaView:
    """The attached replicas the last durable round trip saw, shared by every store of a
    process (one per :class:`~worker.core.redisurl.Replication`); logs each change of state.

    A primary that *loses* its last replica (it had one at an earlier look: same replication
    id) stays strict for ``grace_s`` before going on without one: that is what a failover away
    from a live primary looks like from it (its replica promoted), and in that time the
    Sentinels name the new primary and the workers move to it (their pools ask every second),
    so what it would acknowledge unconfirmed, and lose, is refused instead. A promoted node
    (a new replication id) or one first seen without replicas is trusted at once."""

    def __init__(self, grace_s: float = LOST_GRACE_S, clock: Clock | None = None) -> None:
        self.grace_s = grace_s
        self.clock: Clock = clock or SystemClock()
        #: per primary (replication id): replicas at the last look, when it lost its last one
        self._seen: dict[str, tuple[int, float | None]] = {}
        #: replicas attached at the last look (``None``: not looked yet)
        self.attached: int | None = None
        #: the last look found fewer replicas than the policy's maximum: writes go on unconfirmed
        self.degraded = False
        #: ``INFO replication`` was refused once (said once)
        self.unreadable = False

    def expect(self, wanted: int) -> int:
        """How many confirmations to ask the next ``WAIT`` for: the last look's count; none
        before the first look (a primary without replicas must not cost the first write a
        whole timeout: with one attached, a second ``WAIT`` follows at once)."""
        return 0 if self.attached is None else min(wanted, self.attached)

    def forget(self) -> None:
        """The connection failed (a failover?): the next ``WAIT`` asks for none first, so a
        promoted node without replicas does not cost a whole timeout."""
        self.attached = None

    def peek(self, info: Any, wanted: int) -> int:
        """The confirmations ``info`` allows, up to ``wanted``, without recording it."""
        return min(wanted, attached_replicas(info)) if isinstance(info, dict) else wanted

    def observe(self, info: Any, wanted: int) -> int:
        """Record ``INFO replication`` (or the error reading it) and return how many
        confirmations a write needs: the attached replicas, up to ``wanted``. Unreadable: all
        ``wanted`` (strict)."""
        if not isinstance(info, dict):
            if not self.unreadable:
                self.unreadable = True
                log.warning(
                    "cannot read INFO replication (grant +info); durable writes wait for "
                    "WORKER_REDIS_WAIT_REPLICAS strictly",
                    error=str(info),
                )
            return wanted
        attached = attached_replicas(info)
        self.attached = attached
        replid = str(info.get("master_replid", ""))
        had, lost_at = self._seen.pop(replid, (0, None))
        if attached:
            lost_at = None
        elif had and lost_at is None:
            lost_at = self.clock.monotonic()
        self._seen[replid] = (attached, lost_at)
        while len(self._seen) > 8:  # the primaries of the last failovers
            del self._seen[next(iter(self._seen))]
        if lost_at is not None and self.clock.monotonic() - lost_at < self.grace_s:
            return wanted  # this primary just lost its replicas: strict for a while
        degraded = attached < wanted
        if degraded != self.degraded or degraded != _SAID.get(replid, False):
            _say(replid, degraded, attached, wanted)
        self.degraded = degraded
        return min(wanted, attached)


def describe(attached: int, wanted: int, adaptive: bool) -> tuple[bool, str]:
    """Whether a primary with ``attached`` replicas gives the policy (``wanted`` replicas,
    ``adaptive`` or strict) its durability, and one line saying so."""
    if wanted == 0:
        return True, "WORKER_REDIS_WAIT_REPLICAS=0: writes are not confirmed by replicas"
    if attached >= wanted:
        return True, f"{attached} replica(s) attached; durable writes wait for {wanted}"
    if adaptive:
        return False, (
            f"{attached} replica(s) attached: durable writes go on unconfirmed "
            "(WORKER_REDIS_WAIT_REPLICAS=auto); a failover now can lose them"
        )
    return False, (
        f"{attached} replica(s) attached but WORKER_REDIS_WAIT_REPLICAS={wanted}: leadership, "
        "ticks, enqueues and job starts stop (NotReplicated) until enough are back"
    )
