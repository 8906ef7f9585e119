"""The typed Redis gateway: one async method per script or protocol step, results typed.

This is the only module that packs ``KEYS``/``ARGV`` for the scripts in :mod:`worker.keys`
(asynq's ``RDB`` is the model: each script paired with exactly one method). :class:`Store`
holds the unfenced operations any process may run; :class:`FencedStore` wraps the writes only
the leader may make, reads the lock value from a :class:`~worker.views.LeaderView`, and maps a
refusal to :class:`~worker.errors.LeadershipLost` after telling the view (stepping down is
that one call).

Durable writes (``WORKER_REDIS_WAIT_REPLICAS`` > 0, see docs/architecture.md §5.8): the lease's
acquire and renew, fenced singleton writes, claims and finishes, enqueues, poll schedules,
``once``/mutex/per-key leases are each sent with ``WAIT n timeout`` in the same round trip (one
connection, so the ``WAIT`` covers the write). ``WAIT`` cannot run inside a script, and it
confirms only what its own connection wrote: a call that may have written nothing (a refused
re-send, a deduplicated enqueue) adds an ``INCR`` of :attr:`Keys.probe` first, since
replication is one ordered stream and a replica that has the probe has everything before it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker import keys as K
from worker import malformed as M
from worker.connection import Replication
from worker.errors import LeadershipLost, NotReplicated
from worker.ids import JobIds, LockValue
from worker.views import LeaderView

#: Leases renewed or taken per script call (bounds one call's size for very many keys).
LEASE_BATCH = 5000


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _score(key: str, member: Any, value: Any) -> int | None:
    """A sorted-set score as whole ms; one that is not finite (written by someone else) is
    logged once: ``-inf`` reads as 0 (due since ever), ``+inf`` as ``None`` (never)."""
    number = float(value)
    if math.isfinite(number):
        return int(number)
    M.skip("score", key, _s(member), f"score {number}")
    return 0 if number < 0 else None


def _object(key: str, raw: Any) -> dict[str, Any] | None:
    """A JSON object record, ``None`` when absent; one that is not a JSON object (written by
    someone else) is logged once and reads as absent."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        M.skip("JSON object", key, key, f"{type(exc).__name__}: {exc}")
        return None
    if not isinstance(value, dict):
        M.skip("JSON object", key, key, f"a JSON {type(value).__name__}, not an object")
        return None
    return value


def _entry(key: str, entry_id: Any, fields: Mapping[Any, Any]) -> BroadcastEntry:
    """A broadcast stream entry; its ``seq`` is ``None`` when it is not a whole number (an
    entry this framework did not write: its readers skip it)."""
    f = {_s(k): v for k, v in fields.items()}
    chain = _s(f.get("chain", b""))
    data = f.get("data", b"")
    seq = _s(f.get("seq", b""))
    return BroadcastEntry(
        key,
        _s(entry_id),
        int(seq) if seq.isascii() and seq.isdigit() and len(seq) < 19 else None,
        _s(f.get("origin", b"")),
        tuple(chain.split(",")) if chain else (),
        data if isinstance(data, bytes) else str(data).encode(),
    )


# -- typed results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewJob:
    """An arq job record to write: its id, serialized payload and (for ticks) its score."""

    job_id: str
    payload: bytes
    score_ms: int = 0


class DueTicks(NamedTuple):
    """One periodic job's part of an :meth:`FencedStore.enqueue_ticks` call: the newest due
    tick to record (even when the policy skips it), the ticks to enqueue as jobs scored at
    their tick, the queue, and the last tick the caller knows is recorded (-1 if none)."""

    name: str
    advance_to: int
    ticks: Sequence[NewJob]
    queue: str
    known_last: int = -1


@dataclass(frozen=True)
class Acquired:
    """A won campaign: the new lock value, and how long singleton services must wait (ms)
    because the previous lease was not released cleanly (see ``keys.ACQUIRE``)."""

    lock: LockValue
    gap_ms: int
    #: a lock without expiry this acquisition replaced (left by an old static leader), or "".
    replaced: str = ""
    #: confirmed by the replicas the WAIT policy requires (a lease that is not may be lost
    #: with the primary: its holder must not act on it).
    replicated: bool = True


class Renewal(IntEnum):
    """What a renew of the lease found (``keys.RENEW``); truthy when the lease was renewed."""

    LOST = 0
    RENEWED = 1
    #: renewed, and an operator asked this epoch to hand the lease over (``keys.HANDOFF``)
    HANDOFF = 2


@dataclass(frozen=True)
class LeaderChange:
    """One entry of the leadership history (``keys.leader_history``): ``epoch`` acquired or
    given up at ``at_ms`` (the server's clock) by ``instance``, and why (``first``, ``after
    release``, ``after handoff``, ``after expiry``, ``replaced``, ``retried``, ``data loss``
    for an acquisition; ``released``, ``handoff`` for a release)."""

    epoch: int
    at_ms: int
    reason: str
    instance: str

    def __str__(self) -> str:
        return f"{self.epoch}|{self.at_ms}|{self.reason}|{self.instance}"

    @classmethod
    def parse(cls, raw: str | bytes) -> LeaderChange | None:
        """The entry ACQUIRE or RELEASE wrote (``<epoch>|<ms>|<reason>|<instance>``; the
        instance name is last and may hold anything), ``None`` if unreadable (its time past
        year 9999 included)."""
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        parts = text.split("|", 3)
        if len(parts) != 4 or not (parts[0].isascii() and parts[0].isdigit()):
            return None
        at_ms = M.time_ms(parts[1]) if parts[1].isascii() and parts[1].isdigit() else None
        if at_ms is None or len(parts[0]) > 18:
            return None
        return cls(int(parts[0]), at_ms, parts[2], parts[3])


@dataclass(frozen=True)
class Refused:
    """A lost campaign: the lock another process holds (its epoch raises the caller's floor)."""

    holder: LockValue | None


@dataclass(frozen=True)
class TickOutcome:
    enqueued: int
    duplicate: int
    skipped: int
    #: Redis's recorded last tick was behind the one the caller knew (it lost confirmed
    #: writes): nothing was written for the job; read the state again and plan anew.
    rolled_back: bool = False


@dataclass(frozen=True)
class DispatchOutcome:
    dispatched: int
    in_flight: int
    duplicate: int
    gone: int


@dataclass(frozen=True)
class InitProgress:
    done: bool
    cursor: str | None
    batches: int
    items: int


@dataclass(frozen=True)
class PeriodicRuns:
    """How a periodic job's runs ended, cluster-wide: the most recent success and failure
    (``{at_ms, tick_ms, instance[, error]}``) and the end of the first failure since the last
    success."""

    success: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    failing_since_ms: int | None = None


@dataclass(frozen=True)
class Stale:
    instance_id: str
    heartbeat_ms: int


#: ``Claimed.size`` of a job id outside the app's Redis Cluster hash slot or outside the Redis
#: user's ACL key patterns (see ``keys.CLAIM``).
FOREIGN = -2


@dataclass(frozen=True)
class Claimed:
    """A job this consumer now holds. ``payload`` is ``None`` when it was not read: ``size`` is
    then 0 (missing: the job expired), -1 (not a string), :data:`FOREIGN` (an id outside the
    app's hash slot or its Redis user's key patterns: taken off the queue, not claimed) or its
    size (larger than allowed)."""

    job_id: str
    score_ms: int
    try_: int  # -1: the try counter is unusable
    payload: bytes | None
    size: int
    queue: str = K.DEFAULT_QUEUE


@dataclass(frozen=True)
class Claims:
    jobs: list[Claimed]
    aborts_pending: int
    #: the claim is confirmed by the replicas the WAIT policy requires: the jobs may run
    replicated: bool = True
    #: in-progress markers found stale (no TTL: taken over; longer than any job: cut down)
    stale: int = 0


@dataclass(frozen=True)
class Finish:
    """How one run ended: ``done`` (succeeded) or ``failed`` (will not run again), ``result``
    kept for ``result_ttl_ms`` if any; or ``retry`` / ``defer`` (at ``score_ms`` if given,
    else where it was)."""

    op: str
    job_id: str
    token: str
    result: bytes | None = None
    result_ttl_ms: int = 0
    score_ms: int | None = None
    queue: str = K.DEFAULT_QUEUE


@dataclass(frozen=True)
class BroadcastEntry:
    """One message of a broadcast topic's stream (see ``keys.BROADCAST``): ``entry_id`` is
    the readers' cursor, ``seq`` the topic's message number, ``chain`` the topics whose
    handlers caused it."""

    key: str
    entry_id: str
    seq: int | None
    origin: str
    chain: tuple[str, ...]
    payload: bytes


@dataclass(frozen=True)
class FinishOutcome:
    done: int
    retried: int
    refused: int
    #: confirmed by the replicas the WAIT policy requires (else: send the runs again)
    replicated: bool = True


class Store:
    """Every unfenced Redis operation of the framework (see module docstring)."""

    def __init__(self, redis: Redis, keys: K.Keys, replication: Replication | None = None) -> None:
        self.redis = redis
        self.keys = keys
        #: the WAIT policy of durable writes (no WAIT when it asks for 0 replicas)
        self.replication = replication or Replication()
        self.ids = JobIds(keys.prefix)
        r = redis
        self._acquire = r.register_script(K.ACQUIRE)
        self._handoff = r.register_script(K.HANDOFF)
        self._renew = r.register_script(K.RENEW)
        self._claim_static = r.register_script(K.CLAIM_STATIC)
        self._release = r.register_script(K.RELEASE)
        self._lease_renew = r.register_script(K.LEASE_RENEW)
        self._lease_release = r.register_script(K.LEASE_RELEASE)
        self._leases_renew = r.register_script(K.LEASES_RENEW)
        self._leases_take = r.register_script(K.LEASES_TAKE)
        self._unique_enqueue = r.register_script(K.UNIQUE_ENQUEUE)
        self._inflight_clear = r.register_script(K.INFLIGHT_CLEAR)
        self._poll_unschedule = r.register_script(K.POLL_UNSCHEDULE)
        self._poll_requeue = r.register_script(K.POLL_REQUEUE)
        self._dead_retry = r.register_script(K.DEAD_RETRY)
        self._boot = r.register_script(K.BOOT)
        self._heartbeat = r.register_script(K.HEARTBEAT)
        self._claim = r.register_script(K.CLAIM)
        self._release_own = r.register_script(K.RELEASE_OWN)
        self._finish = r.register_script(K.FINISH)
        self._dead_add = r.register_script(K.DEAD_ADD)
        self._slot_take = r.register_script(K.SLOT_TAKE)
        self._rate_take = r.register_script(K.RATE_TAKE)
        self._broadcast = r.register_script(K.BROADCAST)
        self._periodic_result = r.register_script(K.PERIODIC_RESULT)
        self._time = r.register_script(K.TIME)
        # fenced scripts, run through FencedStore
        self.enqueue_ticks_script = r.register_script(K.ENQUEUE_TICKS)
        self.dispatch_script = r.register_script(K.DISPATCH)
        self.init_begin_script = r.register_script(K.INIT_BEGIN)
        self.checkpoint_script = r.register_script(K.CHECKPOINT)
        self.reap_script = r.register_script(K.REAP)
        self.poll_sweep_script = r.register_script(K.POLL_SWEEP)

    # -- durable writes (WAIT) ----------------------------------------------------------------
    def with_redis(self, redis: Redis) -> Store:
        """The same store (keys, WAIT policy) over another connection pool."""
        return Store(redis, self.keys, self.replication)

    def _short(self, what: str, acked: int) -> NotReplicated:
        rep = self.replication
        return NotReplicated(what, acked, rep.replicas, rep.timeout_ms)

    async def _durable(
        self,
        build: Callable[[Pipeline], object],
        *,
        scripts: Sequence[AsyncScript] = (),
        probe: bool = False,
    ) -> tuple[list[Any], int]:
        """Run the commands ``build`` queues in one round trip, followed (when the WAIT policy
        asks for replicas) by ``[INCR probe,] [INFO replication,] WAIT n timeout`` on the same
        connection: ``(their results, replicas that confirmed)``. A failed command raises; a
        script the server does not know (``NOSCRIPT``: a new primary, a restart) is loaded and
        the round trip repeated. Without a policy the acknowledgement is vacuous: ``replicas``
        (0). An adaptive policy (``auto``) needs only the replicas ``INFO`` shows attached, up
        to ``replicas`` (see :mod:`worker.durability`): none attached counts as confirmed."""
        rep = self.replication
        asked = rep.view.expect(rep.replicas) if rep.adaptive else rep.replicas
        for attempt in range(2):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    build(pipe)
                    if rep.enabled:
                        if probe:
                            pipe.incr(self.keys.probe)
                        if rep.adaptive:
                            pipe.info("replication")
                        pipe.wait(asked, rep.timeout_ms)
                    out = await pipe.execute(raise_on_error=False)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                rep.view.forget()  # a failover? the next primary's replicas are unknown
                raise
            if attempt == 0 and scripts and any(isinstance(r, NoScriptError) for r in out):
                for script in scripts:
                    await self.redis.script_load(script.script)
                if rep.adaptive:  # a new primary (scripts unknown): ask for what it has
                    asked = min(asked, rep.view.peek(out[-2], rep.replicas))
                continue
            break
        acked = rep.replicas
        if rep.enabled:
            raw = out.pop()
            info = out.pop() if rep.adaptive else None
            probed = out.pop() if probe else None
            if isinstance(probed, Exception):  # READONLY: a demoted primary
                raise RedisConnectionError(f"probe write refused: {probed}")
            if isinstance(raw, Exception):  # "WAIT cannot be used with replica instances"
                raise RedisConnectionError(f"WAIT refused: {raw}")
            acked = int(raw)
            if rep.adaptive:
                acked = await self._adapt(acked, asked, rep.view.observe(info, rep.replicas))
        for result in out:
            if isinstance(result, Exception):
                raise result
        return out, acked

    async def _adapt(self, acked: int, asked: int, needed: int) -> int:
        """The acknowledgement under an adaptive policy: ``needed`` replicas were attached
        when the write was made (``asked`` were waited for). Enough: counts as the policy's
        full number; a replica attached since the last look: wait for it now (a probe covers
        every earlier write)."""
        if acked < needed and asked < needed:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(self.keys.probe)
                pipe.wait(needed, self.replication.timeout_ms)
                _, raw = await pipe.execute()
            acked = int(raw)
        return self.replication.replicas if acked >= needed else acked

    async def _eval(
        self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any], *, probe: bool = False
    ) -> tuple[Any, int]:
        """One script call and its acknowledgement (see :meth:`_durable`); without a WAIT
        policy exactly the plain ``EVALSHA`` it always was."""
        if not self.replication.enabled:
            return await script(keys=list(keys), args=list(args)), 0
        out, acked = await self._durable(
            lambda pipe: pipe.evalsha(script.sha, len(keys), *keys, *args),
            scripts=(script,),
            probe=probe,
        )
        return out[0], acked

    def replicated(self, acked: int) -> bool:
        """Whether ``acked`` replicas satisfy the WAIT policy."""
        return acked >= self.replication.replicas

    async def confirm(self, what: str = "write") -> None:
        """Wait until the replicas have every write the primary made so far (``INCR probe``,
        ``WAIT``); :class:`NotReplicated` when too few confirm. No-op without a policy."""
        if not self.replication.enabled:
            return
        _, acked = await self._durable(lambda pipe: None, probe=True)
        if not self.replicated(acked):
            raise self._short(what, acked)

    # -- the leader lock ----------------------------------------------------------------------
    async def acquire(
        self,
        token: str,
        ttl_ms: int,
        *,
        floor: int = 0,
        bound_ms: int = 0,
        instance: str = "",
    ) -> Acquired | Refused:
        """Take the lease with a new epoch above ``floor`` if free, announcing it and noting
        it (by ``instance``) in the history; ``bound_ms`` is a holder's renew deadline + stop
        grace (see ``keys.ACQUIRE``)."""
        k = self.keys
        (value, gap, other), acked = await self._eval(
            self._acquire,
            [k.leader, k.leader_epoch, k.leader_state, k.leader_history, k.leader_handoff],
            [token, ttl_ms, floor, bound_ms, k.leader_announce, instance, K.HISTORY_KEEP],
        )
        lock = LockValue.parse(value) if value else None
        if lock is None:
            return Refused(LockValue.parse(other))
        return Acquired(lock, int(gap), _s(other), self.replicated(acked))

    async def renew_lock(self, lock: LockValue, ttl_ms: int) -> Renewal:
        """Replace the lease's TTL if it is still ``lock`` (and record when, server time);
        :attr:`Renewal.HANDOFF` when an operator asked this epoch to hand over.
        :class:`NotReplicated` when renewed but not confirmed (a failed renew, not a lost lease)."""
        done, acked = await self._eval(
            self._renew,
            [self.keys.leader, self.keys.leader_state, self.keys.leader_handoff],
            [str(lock), ttl_ms, lock.epoch],
        )
        renewal = Renewal(int(done))
        if renewal and not self.replicated(acked):
            raise self._short("lease renew", acked)
        return renewal

    async def release_lock(
        self, lock: LockValue, *, reason: str = "released", instance: str = ""
    ) -> bool:
        """Delete the lease if it is ``lock``, record the clean release (``reason``:
        ``released`` or ``handoff``) in the lease state and the history, wake the standbys."""
        k = self.keys
        done = await self._release(
            keys=[k.leader, k.leader_state, k.leader_history, k.leader_handoff],
            args=[str(lock), k.leader_channel, lock.epoch, reason, instance, K.HISTORY_KEEP],
        )
        return bool(done)

    async def drop_lock(self, lock: LockValue) -> bool:
        """Delete the lease if it is ``lock`` and wake the standbys, recording *no* clean
        release: the next holder waits out this holder's safety bound (``keys.ACQUIRE``)."""
        dropped = await self.release_lease(self.keys.leader, str(lock))
        if dropped:
            await self.redis.publish(self.keys.leader_channel, str(lock.epoch))
        return dropped

    async def request_handoff(self, ttl_ms: int) -> int | None:
        """Ask the current leader to hand the lease over (``keys.HANDOFF``): the epoch the
        request targets, ``None`` when nobody holds the lease."""
        epoch = await self._handoff(
            keys=[self.keys.leader, self.keys.leader_handoff],
            args=[ttl_ms, self.keys.leader_handoff_channel],
        )
        return int(epoch) or None

    async def leader_history(self, limit: int = K.HISTORY_KEEP) -> list[LeaderChange]:
        """The most recent leadership changes, newest first."""
        out = []
        for raw in await self.redis.lrange(self.keys.leader_history, 0, limit - 1):
            change = LeaderChange.parse(raw)
            if change is None:
                M.skip("leadership change", self.keys.leader_history, raw, "unreadable")
            else:
                out.append(change)
        return out

    async def claim_static(self, token: str, ttl_ms: int) -> LockValue:
        """Always-leader mode: take the lock unconditionally (it expires unless renewed)."""
        raw = await self._claim_static(
            keys=[self.keys.leader, self.keys.leader_epoch], args=[token, ttl_ms]
        )
        value = LockValue.parse(raw)
        assert value is not None, raw
        return value

    async def read_lock(self) -> tuple[LockValue | None, int]:
        """The current lock value and its PTTL in ms (-1: no expiry, -2: absent)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.leader)
            pipe.pttl(self.keys.leader)
            raw, pttl = await pipe.execute()
        return LockValue.parse(raw), int(pttl)

    async def boot_marker(self, candidate: str) -> tuple[str, bool]:
        """The dataset's boot marker, created from ``candidate`` if missing: ``(marker,
        created)``. A process that saw another marker before knows Redis lost its data."""
        marker, created = await self._boot(keys=[self.keys.boot], args=[candidate])
        return _s(marker), int(created) == 1

    # -- leases in general (per_key services, mutexes) ---------------------------------------
    async def take_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Take a free lease (a mutex); :class:`NotReplicated` when taken but not confirmed."""
        if not self.replication.enabled:
            return bool(await self.redis.set(key, owner, nx=True, px=ttl_ms))
        (taken,), acked = await self._durable(lambda p: p.set(key, owner, nx=True, px=ttl_ms))
        if taken and not self.replicated(acked):
            raise self._short("lease", acked)
        return bool(taken)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        done, acked = await self._eval(self._lease_renew, [key], [owner, ttl_ms])
        if int(done) == 1 and not self.replicated(acked):
            raise self._short("lease renew", acked)
        return int(done) == 1

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many leases of ``owner`` in one step; per key whether it is still held."""
        out: list[bool] = []
        for i in range(0, len(keys), LEASE_BATCH):
            raw, acked = await self._eval(
                self._leases_renew, keys[i : i + LEASE_BATCH], [owner, ttl_ms]
            )
            if any(int(v) == 1 for v in raw) and not self.replicated(acked):
                raise self._short("lease renew", acked)
            out += [int(v) == 1 for v in raw]
        return out

    async def take_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Take many free leases for ``owner`` in one step; per key whether it was taken."""
        out: list[bool] = []
        for i in range(0, len(keys), LEASE_BATCH):
            raw, acked = await self._eval(
                self._leases_take, keys[i : i + LEASE_BATCH], [owner, ttl_ms]
            )
            if any(int(v) == 1 for v in raw) and not self.replicated(acked):
                raise self._short("lease", acked)
            out += [int(v) == 1 for v in raw]
        return out

    async def release_lease(self, key: str, owner: str) -> bool:
        return int(await self._lease_release(keys=[key], args=[owner])) == 1

    async def once(self, name: str, ttl_ms: int) -> bool:
        """Mark ``name`` seen; ``True`` only for the first caller within the TTL (and, with a
        WAIT policy, only once the mark is confirmed: :class:`NotReplicated` otherwise)."""
        key = self.keys.once(name)
        if not self.replication.enabled:
            return bool(await self.redis.set(key, b"1", nx=True, px=ttl_ms))
        (first,), acked = await self._durable(lambda p: p.set(key, b"1", nx=True, px=ttl_ms))
        if first and not self.replicated(acked):
            raise self._short("once", acked)
        return bool(first)

    async def forget(self, name: str) -> None:
        await self.redis.delete(self.keys.once(name))

    # -- enqueueing ---------------------------------------------------------------------------
    async def unique_enqueue(self, job: NewJob, ttl_ms: int, queue: str = K.DEFAULT_QUEUE) -> bool:
        """Write an arq job into ``queue`` unless its id is taken (queued, running or kept).

        With a WAIT policy the answer is acknowledged: ``True`` once the replicas have the job,
        ``False`` once they have the job that holds the id; :class:`NotReplicated` otherwise."""
        ok, acked = await self._eval(
            self._unique_enqueue,
            [self.keys.queue_of(queue)],
            [
                job.job_id,
                K.ARQ_JOB,
                K.ARQ_RESULT,
                ttl_ms,
                job.score_ms,
                job.payload,
                self.keys.wake,
            ],
        )
        if not ok and self.replication.enabled:
            await self.confirm("enqueue (the id exists)")
        elif not self.replicated(acked):
            raise self._short("enqueue", acked)
        return bool(ok)

    # -- pollers ------------------------------------------------------------------------------
    async def due_items(self, shard_key: str, now_ms: int, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` items of a shard due at ``now_ms``, oldest first (read-only)."""
        due = await self.redis.zrangebyscore(
            shard_key, "-inf", now_ms, start=0, num=limit, withscores=True
        )
        return [(_s(item), _score(shard_key, item, score) or 0) for item, score in due]

    async def schedule_items(self, by_shard: Mapping[str, Mapping[str, int]]) -> int:
        """ZADD items (item -> due ms) into their shard keys in one round trip; new items."""
        if not by_shard:
            return 0

        def build(pipe: Pipeline) -> None:
            for key, mapping in by_shard.items():
                pipe.zadd(key, dict(mapping))

        added, acked = await self._durable(build, probe=True)
        if not self.replicated(acked):
            raise self._short("poll schedule", acked)
        return int(sum(added))

    async def unschedule_item(self, shard_key: str, poller: str, item: str) -> bool:
        """Take ``item`` off its shard, or mark it removed while a job carries it (``keys.
        POLL_UNSCHEDULE``); whether the poller held it."""
        keys = [shard_key, self.keys.poll_inflight(poller), self.keys.poll_removed(poller)]
        return int(await self._poll_unschedule(keys=keys, args=[item, K.ARQ_JOB])) == 1

    async def inflight_clear(self, poller: str, item: str, job_id: str | None) -> bool:
        """Forget ``item``'s in-flight job: the entry equal to ``job_id``, or (``None``) an
        entry whose job no longer exists."""
        keys = [self.keys.poll_inflight(poller), self.keys.poll_removed(poller)]
        done = await self._inflight_clear(keys=keys, args=[item, job_id or "", K.ARQ_JOB])
        return int(done) == 1

    async def poll_requeue(
        self, shard_key: str, poller: str, item: str, job_id: str, due_ms: int
    ) -> int:
        """Put back an item whose job ``job_id`` failed for good (``keys.POLL_REQUEUE``: 1 put
        back, 0 waiting already, -1 removed by the app, -2 carried by another job)."""
        keys = [shard_key, self.keys.poll_inflight(poller), self.keys.poll_removed(poller)]
        out, acked = await self._eval(self._poll_requeue, keys, [item, job_id, due_ms], probe=True)
        if not self.replicated(acked):
            raise self._short("poll requeue", acked)
        return int(out)

    async def inflight_ended(
        self, poller: str, cursor: int, count: int
    ) -> tuple[int, list[tuple[str, str]]]:
        """One ``HSCAN`` step of the in-flight hash: ``(next cursor, [(item, job id)])`` of the
        entries whose job record no longer exists (read-only)."""
        key = self.keys.poll_inflight(poller)
        cursor, raw = await self.redis.hscan(key, cursor, count=count)
        entries: list[tuple[str, str]] = []
        for k, v in raw.items():
            try:
                entries.append((_s(k), _s(v)))
            except UnicodeDecodeError:  # not written by a dispatch: left alone
                M.skip("poll in-flight entry", key, k, "not UTF-8")
        if not entries:
            return int(cursor), []
        async with self.redis.pipeline(transaction=False) as pipe:
            for _, job_id in entries:
                pipe.exists(K.ARQ_JOB + job_id)
            live = await pipe.execute()
        return int(cursor), [e for e, n in zip(entries, live, strict=True) if not n]

    async def shard_backlog(self, shard_keys: Sequence[str], now_ms: int) -> list[tuple[int, int]]:
        """Per shard key: ``(waiting, due)``."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in shard_keys:
                pipe.zcard(key)
                pipe.zcount(key, "-inf", now_ms)
            raw = await pipe.execute()
        return [(int(raw[2 * i]), int(raw[2 * i + 1])) for i in range(len(shard_keys))]

    async def poll_in_flight(self, poller: str) -> int:
        """Items whose dispatched job still exists (entries can outlive a job arq gave up on,
        so each job is checked)."""
        ids = [K.ARQ_JOB + _s(v) for v in await self.redis.hvals(self.keys.poll_inflight(poller))]
        live = 0
        for i in range(0, len(ids), 1000):
            live += int(await self.redis.exists(*ids[i : i + 1000]))
        return live

    # -- periodic -----------------------------------------------------------------------------
    async def periodic_last(self) -> dict[str, int]:
        """Last enqueued tick (ms) per periodic job."""
        raw = await self.redis.hgetall(self.keys.periodic_state)
        return {_s(k): int(v) for k, v in raw.items()}

    async def periodic_result(
        self, name: str, outcome: str, record: Mapping[str, Any], at_ms: int
    ) -> None:
        """Record how a run of periodic job ``name`` ended (``success`` or ``failure``)."""
        await self._periodic_result(
            keys=[self.keys.periodic_runs], args=[name, outcome, json.dumps(record), at_ms]
        )

    async def periodic_runs(self) -> dict[str, PeriodicRuns]:
        """How the runs of every periodic job ended (see :class:`PeriodicRuns`)."""
        raw = {_s(k): _s(v) for k, v in (await self.redis.hgetall(self.keys.periodic_runs)).items()}
        fields: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            name, _, kind = key.rpartition(":")
            try:
                fields.setdefault(name, {})[kind] = (
                    int(value) if kind == "failing_since" else json.loads(value)
                )
            except ValueError:
                continue  # a foreign or damaged field: ignore it
        return {
            name: PeriodicRuns(f.get("success"), f.get("failure"), f.get("failing_since"))
            for name, f in fields.items()
        }

    # -- initializers -------------------------------------------------------------------------
    async def init_state(self, name: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.keys.init_state(name))
        return {_s(k): _s(v) for k, v in raw.items()}

    # -- instance registry --------------------------------------------------------------------
    async def heartbeat(
        self, instance_id: str, record: Mapping[str, Any], ttl_ms: int, score_ms: int | None = None
    ) -> float:
        """Write the instance's record and heartbeat score (the server's clock unless
        ``score_ms`` says otherwise, ``keys.HEARTBEAT``); returns the server's clock (``TIME``,
        in ms) read in the same script, for the clock-offset estimate."""
        score = "" if score_ms is None else score_ms
        sec, usec = await self._heartbeat(
            keys=[self.keys.instance(instance_id), self.keys.instances],
            args=[instance_id, json.dumps(record, default=str), ttl_ms, score],
        )
        return int(sec) * 1000 + int(usec) / 1000

    async def deregister(self, instance_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.instance(instance_id), self.keys.holds(instance_id))
            pipe.zrem(self.keys.instances, instance_id)
            await pipe.execute()

    async def stale_instances(self, cutoff_ms: int) -> list[Stale]:
        raw = await self.redis.zrangebyscore(
            self.keys.instances, "-inf", cutoff_ms, withscores=True
        )
        return [Stale(_s(i), _score(self.keys.instances, i, score) or 0) for i, score in raw]

    async def instances(self) -> list[tuple[str, int, dict[str, Any] | None]]:
        """Every registered instance: ``(id, last heartbeat ms on the server's clock, record or
        None if expired)``. Records are also found by ``SCAN``, so an instance missing from the
        heartbeat sorted set (reaped while alive) still counts; its time is then the record's
        ``heartbeat_ms`` corrected by its measured clock offset. A record that is not a JSON
        object reads as expired (and is logged once)."""
        members: dict[str, int | None] = {
            _s(m): _score(self.keys.instances, m, score) or 0
            for m, score in await self.redis.zrange(self.keys.instances, 0, -1, withscores=True)
        }
        head = self.keys.instance("")
        async for key in self.redis.scan_iter(match=f"{head}*", count=1000):
            name = _s(key)
            if self.keys.holds_owner(name) is None:
                members.setdefault(name[len(head) :], None)  # record only: time from it
        ids = list(members)
        raw = await self.redis.mget([self.keys.instance(i) for i in ids]) if ids else []
        out = []
        for i, blob in zip(ids, raw, strict=True):
            rec, score = _object(self.keys.instance(i), blob), members[i]
            if score is None:
                if rec is None:
                    continue  # expired between SCAN and MGET, or unreadable
                beat, offset = rec.get("heartbeat_ms"), rec.get("clock_offset_ms") or 0
                if not isinstance(beat, int | float) or not isinstance(offset, int | float):
                    continue
                score = round(beat + offset)
            out.append((i, score, rec))
        return out

    async def live_apps(self) -> dict[str, int]:
        """Live instances (their record has not expired) per app name. Records without an app
        name (written by older versions) are not counted."""
        counts: dict[str, int] = {}
        for _, _, rec in await self.instances():
            app = rec.get("app") if rec is not None else None
            if isinstance(app, str):
                counts[app] = counts.get(app, 0) + 1
        return counts

    async def write_manifest(self, app: str, manifest: str) -> None:
        """Record ``app``'s manifest (JSON) for admin commands (``<prefix>apps``)."""
        await self.redis.hset(self.keys.apps, app, manifest)

    async def manifests(self) -> dict[str, dict[str, Any]]:
        """Every recorded app manifest by app name (unreadable entries are skipped)."""
        out: dict[str, dict[str, Any]] = {}
        for name, raw in (await self.redis.hgetall(self.keys.apps)).items():
            try:
                data = json.loads(raw)
            except ValueError:
                continue
            if isinstance(data, dict):
                out[_s(name)] = data
        return out

    async def holds_sets(self) -> dict[str, int]:
        """Every holds set in Redis: instance id -> number of job ids in it (``SCAN``)."""
        found: dict[str, int] = {}
        async for key in self.redis.scan_iter(match=self.keys.holds_pattern, count=1000):
            owner = self.keys.holds_owner(_s(key))
            if owner is not None:
                found[owner] = int(await self.redis.scard(key))
        return found

    async def server_time_ms(self) -> float:
        """The server's clock (``TIME``, on the node of the app's keys) in ms."""
        sec, usec = await self._time(keys=[self.keys.leader])
        return int(sec) * 1000 + int(usec) / 1000

    async def lease_counters(self) -> tuple[int | None, dict[str, str]]:
        """The epoch counter and the lease state hash (``epoch``, ``renewed_ms``, ``released``)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.leader_epoch)
            pipe.hgetall(self.keys.leader_state)
            counter, state = await pipe.execute()
        return (
            int(counter) if counter is not None else None,
            {_s(k): _s(v) for k, v in state.items()},
        )

    async def queue_depths(self, queues: Sequence[str], now_ms: int) -> list[tuple[int, int]]:
        """Per queue: ``(due and not claimed, all)`` (claimed jobs are parked in the future)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                key = self.keys.queue_of(q)
                pipe.zcount(key, "-inf", now_ms)
                pipe.zcard(key)
            raw = await pipe.execute()
        return [(int(raw[2 * i]), int(raw[2 * i + 1])) for i in range(len(queues))]

    async def queue_heads(self, keys: Sequence[str]) -> list[int | None]:
        """The earliest score (ms) of each sorted set, ``None`` where it is empty (or holds
        only entries scored ``+inf``: never due)."""
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrange(key, 0, 0, withscores=True)
            heads = await pipe.execute()
        return [
            _score(key, h[0][0], h[0][1]) if h else None for key, h in zip(keys, heads, strict=True)
        ]

    async def dead_count(self) -> int:
        return int(await self.redis.zcard(self.keys.dead))

    async def service_keys(self, service: str) -> tuple[int, dict[str, str]]:
        """A ``per_key`` service for operators: its member processes and each leased key's
        owner (instance id), read with ``ZCARD``, ``SCAN`` and ``MGET``."""
        lease_keys = [
            _s(k) async for k in self.redis.scan_iter(match=self.keys.service_lease(service, "*"))
        ]
        owners = await self.redis.mget(lease_keys) if lease_keys else []
        head = len(self.keys.service_lease(service, ""))
        pairs = sorted(zip(lease_keys, owners, strict=True))
        leased = {k[head:]: _s(o) for k, o in pairs if o is not None}
        return int(await self.redis.zcard(self.keys.service_members(service))), leased

    async def set_holds(self, instance_id: str, job_ids: Iterable[str], ttl_ms: int) -> None:
        """Replace the set of job ids ``instance_id`` is running (for orphan recovery)."""
        key = self.keys.holds(instance_id)
        held = list(job_ids)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if held:
                pipe.sadd(key, *held)
                pipe.pexpire(key, ttl_ms)
            await pipe.execute()

    # -- per_key services ---------------------------------------------------------------------
    async def service_round(
        self, service: str, instance_id: str, now_ms: int, stale_before_ms: int
    ) -> list[str]:
        """Announce ``instance_id`` as running ``service``; drop stale members; list members."""
        key = self.keys.service_members(service)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {instance_id: now_ms})
            pipe.zremrangebyscore(key, "-inf", stale_before_ms)
            pipe.zrange(key, 0, -1)
            _, _, members = await pipe.execute()
        return [_s(m) for m in members]

    async def service_leave(self, service: str, instance_id: str) -> None:
        await self.redis.zrem(self.keys.service_members(service), instance_id)

    # -- broadcasts -------------------------------------------------------------------------------
    async def broadcast(
        self, topic: str, payload: bytes, *, origin: str, chain: Sequence[str], history: int
    ) -> tuple[str, int]:
        """Append a message to ``topic``'s stream, capped at ``history`` entries: ``(entry
        id, sequence number)`` (see ``keys.BROADCAST``); :class:`NotReplicated` when the
        replicas did not confirm it (a failover could lose it: send it again)."""
        (entry_id, seq), acked = await self._eval(
            self._broadcast,
            [self.keys.broadcast(topic)],
            [history, origin, ",".join(chain), payload],
        )
        if not self.replicated(acked):
            raise self._short("broadcast", acked)
        return _s(entry_id), int(seq)

    async def broadcast_newest(
        self, stream_keys: Sequence[str]
    ) -> dict[str, BroadcastEntry | None]:
        """The newest message of each stream (``None``: the stream is empty or absent)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in stream_keys:
                pipe.xrevrange(key, "+", "-", count=1)
            raw = await pipe.execute()
        return {
            key: _entry(key, rows[0][0], rows[0][1]) if rows else None
            for key, rows in zip(stream_keys, raw, strict=True)
        }

    async def broadcast_read(
        self, cursors: Mapping[str, str], *, count: int, block_ms: int
    ) -> list[BroadcastEntry]:
        """Messages after each stream's cursor (``XREAD BLOCK``: waits up to ``block_ms`` for
        the first), up to ``count`` per stream, oldest first per stream."""
        streams: dict[Any, Any] = dict(cursors)
        raw = await self.redis.xread(streams, count=count, block=block_ms)
        if isinstance(raw, dict):  # RESP3: {key: [entries]}
            found = [(key, rows[0] if rows else []) for key, rows in raw.items()]
        else:  # RESP2: [[key, entries], ...]
            found = raw or []
        return [
            _entry(_s(key), entry_id, fields) for key, rows in found for entry_id, fields in rows
        ]

    # -- the consumer ---------------------------------------------------------------------------
    async def release_own(
        self,
        instance_id: str,
        known: Iterable[str],
        now_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> int:
        """Make the jobs ``instance_id`` holds but does not know about due again (a claim
        whose reply was lost; see ``keys.RELEASE_OWN``): how many. :class:`NotReplicated`
        when the replicas did not confirm it (a failover could bring the claims back)."""
        released, acked = await self._eval(
            self._release_own,
            [self.keys.holds(instance_id), *(self.keys.queue_of(q) for q in queues)],
            [K.ARQ_IN_PROGRESS, instance_id, now_ms, self.keys.wake, *known],
            probe=True,
        )
        if not self.replicated(acked):
            raise self._short("release of unknown claims", acked)
        return int(released)

    async def claim(
        self,
        instance_id: str,
        token: str,
        *,
        now_ms: int,
        limit: int,
        in_progress_ttl_ms: int,
        holds_ttl_ms: int,
        max_payload: int,
        retry_ttl_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> Claims:
        """Claim up to ``limit`` due jobs under ``token`` from ``queues``, highest priority
        first (see ``keys.CLAIM``)."""
        raw, acked = await self._eval(
            self._claim,
            [
                self.keys.holds(instance_id),
                self.keys.abort,
                *(self.keys.queue_of(q) for q in queues),
            ],
            [
                now_ms,
                limit,
                token,
                in_progress_ttl_ms,
                holds_ttl_ms,
                max_payload,
                K.ARQ_JOB,
                K.ARQ_IN_PROGRESS,
                K.ARQ_RETRY,
                retry_ttl_ms,
                self.keys.slot_tag,
            ],
        )
        jobs = []
        for i in range(2, len(raw), 5):
            data = raw[i + 3]
            payload: bytes | None
            if isinstance(data, bytes):
                payload = data
            elif isinstance(data, str):
                payload = data.encode()
            else:
                payload = None
            size = len(payload) if payload is not None else int(data)
            queue = queues[int(raw[i + 4]) - 3]
            score = _score(self.keys.queue_of(queue), raw[i], raw[i + 1]) or 0  # -inf: due
            jobs.append(Claimed(_s(raw[i]), score, int(raw[i + 2]), payload, size, queue))
        return Claims(jobs, int(raw[0]), self.replicated(acked), stale=int(raw[1]))

    async def confirm_claims(self, job_ids: Sequence[str]) -> tuple[list[str | None], bool]:
        """The claim tokens of ``job_ids`` now, and whether the replicas have every write made
        so far (``MGET``, ``INCR probe``, ``WAIT`` in one round trip): claims whose ``CLAIM``
        was not confirmed may run once this confirms them with their tokens unchanged."""
        out, acked = await self._durable(
            lambda p: p.mget([K.ARQ_IN_PROGRESS + j for j in job_ids]), probe=True
        )
        tokens = [None if v is None else _s(v) for v in out[0]]
        return tokens, self.replicated(acked)

    async def finish(
        self, instance_id: str, runs: Sequence[Finish], *, now_ms: int, resend: bool = False
    ) -> FinishOutcome:
        """Finish runs whose claims still hold, counting finished runs per queue in the
        minute of ``now_ms`` (see ``keys.FINISH``). ``resend``: these runs were sent before
        without a confirmation (they may have been applied: the probe makes the ``WAIT``
        measure now)."""
        queues: list[str] = []
        groups: list[Any] = []
        for f in runs:
            if f.op in ("done", "failed"):
                data: Any = f.result if f.result is not None else ""
                ttl: Any = f.result_ttl_ms if f.result is not None else ""
            else:
                data, ttl = ("" if f.score_ms is None else f.score_ms), ""
            if f.queue not in queues:
                queues.append(f.queue)
            groups += [f.op, f.job_id, f.token, data, ttl, queues.index(f.queue) + 3]
        minute, hour = now_ms // 60_000, now_ms // 3_600_000
        args: list[Any] = [
            K.ARQ_JOB, K.ARQ_IN_PROGRESS, K.ARQ_RETRY, K.ARQ_RESULT, self.keys.wake,
            minute, len(queues), K.STATS_TTL_MS, *groups,
        ]  # fmt: skip
        (done, retried, refused), acked = await self._eval(
            self._finish,
            [
                self.keys.holds(instance_id),
                self.keys.abort,
                *(self.keys.queue_of(q) for q in queues),
                *(self.keys.stats(q, hour) for q in queues),
            ],
            args,
            probe=resend,
        )
        return FinishOutcome(int(done), int(retried), int(refused), self.replicated(acked))

    async def throughput(
        self, queues: Sequence[str], now_ms: int, minutes: int = 60
    ) -> dict[str, list[tuple[int, int, int]]]:
        """Per queue, the last ``minutes`` minutes up to ``now_ms``, oldest first: ``(minute
        start ms, done, failed)`` from the counters FINISH keeps (two hashes per queue)."""
        hour = now_ms // 3_600_000
        hours = range(hour - (minutes + 59) // 60, hour + 1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                for h in hours:
                    pipe.hgetall(self.keys.stats(q, h))
            raw = await pipe.execute()
        last = now_ms // 60_000
        out: dict[str, list[tuple[int, int, int]]] = {}
        for i, q in enumerate(queues):
            fields: dict[str, int] = {}
            for part in raw[i * len(hours) : (i + 1) * len(hours)]:
                fields.update({_s(k): int(v) for k, v in part.items()})
            out[q] = [
                (m * 60_000, fields.get(f"{m}:done", 0), fields.get(f"{m}:failed", 0))
                for m in range(last - minutes + 1, last + 1)
            ]
        return out

    async def queue_head(self, queues: Sequence[str] = (K.DEFAULT_QUEUE,)) -> int | None:
        """The earliest score in ``queues`` (ms), ``None`` when empty: one command per queue
        in one round trip, what an idle consumer looks at between announcements."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zrange(self.keys.queue_of(q), 0, 0, withscores=True)
            heads = await pipe.execute()
        found = [
            _score(self.keys.queue_of(q), h[0][0], h[0][1]) if h else None
            for q, h in zip(queues, heads, strict=True)
        ]
        scores = [s for s in found if s is not None]
        return min(scores) if scores else None

    # -- cluster-wide limits ------------------------------------------------------------------
    async def take_slot(self, task: str, job_id: str, now_ms: int, lease_ms: int, most: int) -> int:
        """Take (or keep) a concurrency slot of ``task``: 0, or ms until one may free up."""
        wait = await self._slot_take(
            keys=[self.keys.limit_slots(task)], args=[job_id, now_ms, now_ms + lease_ms, most]
        )
        return int(wait)

    async def renew_slots(self, slots: Mapping[str, Sequence[str]], until_ms: int) -> None:
        """Extend the leases of the slots held (task -> job ids) to ``until_ms``."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for task, job_ids in slots.items():
                pipe.zadd(self.keys.limit_slots(task), dict.fromkeys(job_ids, until_ms), xx=True)
            await pipe.execute()

    async def release_slot(self, task: str, job_id: str) -> None:
        await self.redis.zrem(self.keys.limit_slots(task), job_id)

    async def take_rate(self, task: str, now_ms: int, jobs: int, per_s: float) -> int:
        """Count one start under ``jobs`` per ``per_s``: 0, or ms to wait."""
        interval = per_s * 1000 / jobs
        wait = await self._rate_take(
            keys=[self.keys.limit_rate(task)], args=[now_ms, interval, per_s * 1000 - interval]
        )
        return int(wait)

    async def claim_tokens(self, job_ids: Sequence[str]) -> list[str | None]:
        """The in-progress marker (claim token) of each job, ``None`` where there is none."""
        if not job_ids:
            return []
        raw = await self.redis.mget([K.ARQ_IN_PROGRESS + j for j in job_ids])
        return [None if v is None else _s(v) for v in raw]

    async def abort_requests(self) -> list[str]:
        """Job ids someone asked to abort (``Client.abort``, in ``<prefix>abort``)."""
        return [_s(v) for v in await self.redis.zrange(self.keys.abort, 0, -1)]

    async def aborts_handled(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            await self.redis.zrem(self.keys.abort, *job_ids)

    async def raise_try(self, job_id: str, job_try: int, ttl_ms: int) -> None:
        """A job enqueued with an explicit try number counts from there (arq semantics)."""
        await self.redis.set(K.ARQ_RETRY + job_id, job_try, px=ttl_ms)

    async def payload_digest(self, job_id: str, size: int, keep: int) -> tuple[str, bytes]:
        """sha256 of a (large) payload read in bounded chunks, and its first ``keep`` bytes."""
        digest = hashlib.sha256()
        head = b""
        chunk = 1 << 20
        for start in range(0, max(size, 0), chunk):
            part = await self.redis.getrange(K.ARQ_JOB + job_id, start, start + chunk - 1)
            if not part:
                break
            digest.update(part)
            if len(head) < keep:
                head += part[: keep - len(head)]
        return digest.hexdigest(), head

    async def set_health(self, instance_id: str, text: str, ttl_ms: int) -> None:
        """arq's health-check record, one key per instance (arq issue #291)."""
        await self.redis.set(self.keys.arq_health(instance_id), text, px=ttl_ms)

    async def clear_health(self, instance_id: str) -> None:
        await self.redis.delete(self.keys.arq_health(instance_id))

    # -- operations on schedules ---------------------------------------------------------------
    async def pause(self, duty: str) -> bool:
        """Pause ``periodic:<name>`` or ``poller:<name>`` cluster-wide; ``True`` if it was not."""
        return bool(await self.redis.sadd(self.keys.paused, duty))

    async def resume(self, duty: str) -> bool:
        return bool(await self.redis.srem(self.keys.paused, duty))

    async def paused(self) -> set[str]:
        return {_s(m) for m in await self.redis.smembers(self.keys.paused)}

    # -- jobs and dead letters ----------------------------------------------------------------
    async def job_payload(self, job_id: str) -> bytes | None:
        raw = await self.redis.get(K.ARQ_JOB + job_id)
        return bytes(raw) if raw is not None else None

    async def add_dead(
        self, job_id: str, record: Mapping[str, Any], at_ms: int, max_entries: int
    ) -> int:
        """Set a job aside (its record, and the record without ``payload_b64`` in the index
        listings read); returns how many of the oldest entries the cap dropped."""
        index = {k: v for k, v in record.items() if k != "payload_b64"}
        dropped = await self._dead_add(
            keys=[self.keys.dead, self.keys.dead_jobs, self.keys.dead_index],
            args=[job_id, json.dumps(record), at_ms, max_entries, json.dumps(index)],
        )
        return int(dropped)

    async def dead_records(
        self, limit: int, offset: int = 0
    ) -> list[tuple[str, dict[str, Any] | None]]:
        """Dead letters newest first, ``limit`` from ``offset``: ``(job id, record without its
        payload, or None)``. Reads the index; only entries set aside before it existed are
        read whole (their payload dropped here)."""
        ids = await self.redis.zrevrange(self.keys.dead, offset, offset + limit - 1)
        if not ids:
            return []
        raw = await self.redis.hmget(self.keys.dead_index, ids)
        old = [i for i, rec in zip(ids, raw, strict=True) if rec is None]
        legacy = await self.redis.hmget(self.keys.dead_jobs, old) if old else []
        whole = dict(zip(old, legacy, strict=True))
        out: list[tuple[str, dict[str, Any] | None]] = []
        for i, rec in zip(ids, raw, strict=True):
            key = self.keys.dead_index if rec is not None else self.keys.dead_jobs
            record = _object(key, rec if rec is not None else whole.get(i))
            if record is not None:
                record.pop("payload_b64", None)
            out.append((_s(i), record))
        return out

    async def dead_record(self, job_id: str) -> dict[str, Any] | None:
        """One dead letter's whole record (payload included), ``None`` if absent or unreadable."""
        return _object(self.keys.dead_jobs, await self.redis.hget(self.keys.dead_jobs, job_id))

    async def dead_retry(
        self, job_id: str, payload: bytes, ttl_ms: int, now_ms: int, queue: str = K.DEFAULT_QUEUE
    ) -> int:
        """Re-queue a dead letter: 1 re-queued, 0 the id is live, -1 not a dead letter."""
        result, acked = await self._eval(
            self._dead_retry,
            [self.keys.queue_of(queue), self.keys.dead, self.keys.dead_jobs, self.keys.dead_index],
            [
                job_id,
                payload,
                K.ARQ_JOB,
                K.ARQ_RESULT,
                K.ARQ_RETRY,
                ttl_ms,
                now_ms,
                self.keys.wake,
            ],
        )
        if int(result) == 1 and not self.replicated(acked):
            raise self._short("dead-letter re-queue", acked)
        return int(result)

    async def dead_purge(self) -> int:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zcard(self.keys.dead)
            pipe.delete(self.keys.dead, self.keys.dead_jobs, self.keys.dead_index)
            count, _ = await pipe.execute()
        return int(count)

    async def dead_remove(self, job_ids: Sequence[str]) -> int:
        """Forget the given dead letters; returns how many were dead-lettered."""
        if not job_ids:
            return 0
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self.keys.dead, *job_ids)
            pipe.hdel(self.keys.dead_jobs, *job_ids)
            pipe.hdel(self.keys.dead_index, *job_ids)
            removed, _, _ = await pipe.execute()
        return int(removed)

    # -- the operators' log -------------------------------------------------------------------
    async def audit(self, entry: Mapping[str, Any], keep: int) -> None:
        """Append an operator's action (JSON) to the capped log, newest first."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(self.keys.audit, json.dumps(entry, default=str))
            pipe.ltrim(self.keys.audit, 0, keep - 1)
            await pipe.execute()

    async def audit_log(self, limit: int) -> list[dict[str, Any]]:
        """The most recent operator actions, newest first."""
        out = []
        for raw in await self.redis.lrange(self.keys.audit, 0, limit - 1):
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out


class FencedStore:
    """The writes only the leader may make, each checked against the lock in the same script.

    A refusal (the lock is not, or no longer, this process's) tells the :class:`LeaderView`
    (which steps down) and raises :class:`LeadershipLost`.
    """

    def __init__(self, store: Store, leader: LeaderView) -> None:
        self.store = store
        self.leader = leader
        self.keys = store.keys
        self.ids = store.ids

    async def _run(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a fenced script; with a WAIT policy it counts as done only once the replicas
        confirm it (:class:`NotReplicated` otherwise: the component restarts and reads the
        state again, and a retry of the same ticks or items cannot duplicate them)."""
        lock = self.leader.lock
        if lock is None:
            raise LeadershipLost("not leading")
        try:
            result, acked = await self.store._eval(
                script, [self.keys.leader, *keys], [str(lock), *args], probe=True
            )
        except ResponseError as exc:
            if str(exc).startswith(K.FENCE_ERROR):
                self.leader.lost(f"fenced write refused: {exc}")
                raise LeadershipLost(str(exc)) from None
            raise
        if not self.store.replicated(acked):
            raise self.store._short("fenced write", acked)
        return result

    async def enqueue_ticks(self, due: Sequence[DueTicks], ttl_ms: int) -> list[TickOutcome]:
        """Enqueue the ticks of several periodic jobs in one step (``keys.ENQUEUE_TICKS``); a
        job whose recorded last tick is behind ``known_last`` comes back ``rolled_back``."""
        args: list[Any] = [K.ARQ_JOB, K.ARQ_RESULT, ttl_ms, self.keys.wake]
        queues: list[str] = []
        for name, advance_to, ticks, queue, known_last in due:
            if queue not in queues:
                queues.append(queue)
            args += [name, advance_to, queues.index(queue) + 4, known_last, len(ticks)]
            for t in ticks:
                args += [t.score_ms, t.job_id, t.payload]
        keys = [
            self.keys.periodic_state,
            self.keys.paused,
            *(self.keys.queue_of(q) for q in queues),
        ]
        raw = await self._run(self.store.enqueue_ticks_script, keys, args)
        return [
            TickOutcome(int(raw[i]), int(raw[i + 1]), int(raw[i + 2]), raw[i + 3] == 1)
            for i in range(0, len(raw), 4)
        ]

    async def dispatch(
        self,
        poller: str,
        shard_key: str,
        now_ms: int,
        busy_defer_ms: int,
        items: Sequence[tuple[str, NewJob]],
        ttl_ms: int,
        queue: str = K.DEFAULT_QUEUE,
    ) -> DispatchOutcome:
        """Move due ``items`` of one shard into ``queue``, one job each (``keys.DISPATCH``)."""
        args: list[Any] = [
            K.ARQ_JOB, K.ARQ_RESULT, ttl_ms, now_ms, busy_defer_ms, self.keys.wake, poller,
        ]  # fmt: skip
        for item, job in items:
            args += [item, job.job_id, job.payload]
        keys = [
            self.keys.poll_inflight(poller),
            self.keys.queue_of(queue),
            shard_key,
            self.keys.paused,
        ]
        sent, busy, dup, gone = await self._run(self.store.dispatch_script, keys, args)
        return DispatchOutcome(int(sent), int(busy), int(dup), int(gone))

    async def poll_sweep(
        self, poller: str, ended: Sequence[tuple[str, str, str]], due_ms: int
    ) -> tuple[int, int]:
        """Put back items (``(item, job id, shard key)``) whose job ended unreported, due at
        ``due_ms`` (``keys.POLL_SWEEP``): ``(put back, forgotten)``."""
        shard_keys: list[str] = []
        args: list[Any] = [K.ARQ_JOB, due_ms]
        for item, job_id, shard_key in ended:
            if shard_key not in shard_keys:
                shard_keys.append(shard_key)
            args += [item, job_id, shard_keys.index(shard_key) + 4]  # after lock, hashes
        keys = [self.keys.poll_inflight(poller), self.keys.poll_removed(poller), *shard_keys]
        back, dropped = await self._run(self.store.poll_sweep_script, keys, args)
        return int(back), int(dropped)

    async def init_begin(self, name: str, version: str, now_ms: int) -> InitProgress:
        """Start or resume initializer ``name`` at ``version`` (``keys.INIT_BEGIN``)."""
        epoch = self.leader.lock.epoch if self.leader.lock else 0
        done, cursor, batches, items = await self._run(
            self.store.init_begin_script, [self.keys.init_state(name)], [version, now_ms, epoch]
        )
        return InitProgress(_s(done) == "1", _s(cursor) or None, int(batches), int(items))

    async def checkpoint(
        self,
        name: str,
        version: str,
        cursor: str | None,
        next_cursor: str,
        *,
        last: bool,
        now_ms: int,
        items: Sequence[tuple[str, int, str]],
    ) -> int:
        """Write one initializer batch (``(shard key, due ms, item)``) with its checkpoint;
        returns how many items were new (``keys.CHECKPOINT``)."""
        shard_keys: list[str] = []
        index: dict[str, int] = {}
        args: list[Any] = [version, cursor or "", next_cursor, "1" if last else "0", now_ms]
        for shard_key, due_ms, item in items:
            if shard_key not in index:
                shard_keys.append(shard_key)
                index[shard_key] = len(shard_keys) + 2  # KEYS index, after lock and state
            args += [index[shard_key], due_ms, item]
        keys = [self.keys.init_state(name), *shard_keys]
        added, _batches = await self._run(self.store.checkpoint_script, keys, args)
        return int(added)

    def pipeline(self) -> FencedPipeline:
        """A redis-py transaction pipeline whose ``execute()`` commits only while the lease is
        still this process's (see :class:`FencedPipeline`)."""
        return FencedPipeline(self)

    async def reap(
        self,
        instance_id: str,
        judged_ms: int,
        now_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> int | None:
        """Release the jobs of a dead instance (due at ``now_ms``, in whichever of ``queues``
        they are); ``None`` if it heartbeated meanwhile."""
        keys = [
            self.keys.holds(instance_id),
            self.keys.instances,
            *(self.keys.queue_of(q) for q in queues),
        ]
        args = [K.ARQ_IN_PROGRESS, instance_id, judged_ms, now_ms, self.keys.wake]
        released = int(await self._run(self.store.reap_script, keys, args))
        return None if released < 0 else released


class FencedPipeline(Pipeline):
    """Queue commands as on any redis-py pipeline; :meth:`execute` runs them in one
    ``MULTI``/``EXEC`` guarded by ``WATCH`` on the leader lock, after checking that the lock
    still holds this process's value: a leader that lost its lease (paused, partitioned,
    replaced) cannot commit. A refusal tells the lease and raises :class:`LeadershipLost`.
    """

    #: A renew touches the lock and aborts a watched transaction: retry that many times.
    ATTEMPTS = 5

    def __init__(self, fenced: FencedStore) -> None:
        redis = fenced.store.redis
        super().__init__(redis.connection_pool, redis.response_callbacks, True, None)
        self._fenced = fenced

    def _refuse(self, reason: str) -> LeadershipLost:
        self._fenced.leader.lost(f"fenced write refused: {reason}")
        return LeadershipLost(reason)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued, self.command_stack = self.command_stack, []
        lock = self._fenced.leader.lock
        if lock is None or not self._fenced.leader.is_leading():
            await self.reset()  # type: ignore[no-untyped-call]
            raise LeadershipLost("not leading")
        key = self._fenced.keys.leader
        for _ in range(self.ATTEMPTS):
            await self.watch(key)
            current = LockValue.parse(await self.get(key))  # immediate while watching
            if current != lock:
                await self.reset()  # type: ignore[no-untyped-call]
                raise self._refuse("the leader lock is no longer this process's")
            self.multi()  # type: ignore[no-untyped-call]
            self.command_stack = list(queued)
            try:
                out = await super().execute(raise_on_error)
            except WatchError:
                continue  # the lock was touched meanwhile (a renew): check again
            await self._fenced.store.confirm("fenced pipeline")  # WAIT policy (no-op without)
            return out
        raise self._refuse("the leader lock kept changing under a fenced write")
