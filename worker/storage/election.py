"""The leader lease on Redis: acquire, renew, release, hand off, history, boot marker."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from worker.core import malformed as M
from worker.core.ids import EPOCH_AHEAD_MS, EPOCH_LIMIT, LockValue, parse_epoch
from worker.storage import keys as K
from worker.storage import resharding
from worker.storage.leases import LeaseOps

#: How long a renew waits out ``TRYAGAIN`` (a resharding of the app's slot) before it renews
#: the lock alone.
RENEW_PATIENCE_S = 0.1


def _text(value: object, limit: int = 200) -> str:
    """A value read from Redis as text, for a log line or a view: never raises, at most
    ``limit`` characters."""
    raw = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return raw[:limit]


@dataclass(frozen=True)
class Acquired:
    """A won campaign: the new lock value, and how long singleton services must wait (ms)
    because the previous lease was not released cleanly (see ``election.ACQUIRE``)."""

    lock: LockValue
    gap_ms: int
    #: a lock without expiry this acquisition replaced (left by an old static leader), or "".
    replaced: str = ""
    #: confirmed by the replicas the WAIT policy requires (a lease that is not may be lost
    #: with the primary: its holder must not act on it).
    replicated: bool = True
    #: what the script found malformed and did not use (``counter``: repaired; ``floor``:
    #: the caller's, ignored); see ``election.ACQUIRE``
    malformed: tuple[str, ...] = ()


class Renewal(IntEnum):
    """What a renew of the lease found (``election.RENEW``); truthy when the lease was renewed."""

    LOST = 0
    RENEWED = 1
    #: renewed, and an operator asked this epoch to hand the lease over (``election.HANDOFF``)
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
    """A lost campaign: the lock another process holds (its epoch raises the caller's floor)
    and its remaining TTL, ms (unless renewed, the lock is free then)."""

    holder: LockValue | None
    pttl_ms: int | None = None
    #: the caller's floor, when the script found it malformed and ignored it
    malformed: tuple[str, ...] = ()


#: Lua: ``epoch_of(text, now)``, an epoch read from Redis or given by a caller, validated as
#: :func:`worker.core.ids.parse_epoch` does and at most :data:`worker.core.ids.EPOCH_AHEAD_MS`
#: ahead of
#: the server's clock ``now`` (ms): its number, or ``nil`` for anything else (``1e+14``, a
#: 20-digit number, one a year ahead). Epochs are written with ``string.format('%d', n)``,
#: never with ``..`` (which writes a double of 15 digits or more as ``1e+14``).
EPOCH_OF = f"""
local function epoch_of(v, now)
  if type(v) ~= 'string' or #v > 16 or not string.match(v, '^%d+$') then
    return nil
  end
  local n = tonumber(v)
  if n >= {EPOCH_LIMIT} or n > now + {EPOCH_AHEAD_MS} then
    return nil
  end
  return n
end
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

#: ACQUIRE's refusal: ``refuse`` answers a campaign while another process holds the lock,
#: raising the epoch counter to the caller's valid floor.
ACQUIRE_REFUSAL = """
local function refuse(current, pttl)
  -- the holder's epoch came from the counter: only a floor above it needs the counter read
  -- (a standby's refused campaign, once per lease TTL, stays three commands)
  local held = string.match(current, '^(%d+):') or '0'
  if #ARGV[3] > #held or (#ARGV[3] == #held and ARGV[3] > held) then
    local floor = epoch_of(ARGV[3], server_ms())
    if not floor then
      return {'', pttl, current, 'floor'}
    end
    local counter = redis.call('GET', KEYS[2])
    if not (counter and string.match(counter, '^%d+$') and tonumber(counter) >= floor) then
      redis.call('SET', KEYS[2], string.format('%d', floor))
    end
  end
  return {'', pttl, current, ''}
end
"""

#: ACQUIRE's gap: ``gap_after`` reads how the previous lease ended (the lease state) and
#: answers how long singleton services wait, and why this acquisition happens.
ACQUIRE_GAP = """
local function gap_after(current, stale, raw, floor, now)
  local prev = redis.call('HMGET', KEYS[3], 'epoch', 'renewed_ms', 'released', 'released_why')
  local bound = tonumber(ARGV[4])
  local gap = bound
  local why = 'first'
  local renewed = prev[2] and epoch_of(prev[2], now)
  if stale then
    gap = bound
    why = 'replaced'
  elseif current then
    gap = 0
    why = 'retried'
  elseif prev[1] and prev[3] == prev[1] then
    gap = 0
    why = 'after release'
    if prev[4] == 'handoff' then
      why = 'after handoff'
    end
  elseif prev[2] then
    -- an unreadable renew time: wait the whole bound
    gap = renewed and math.max(0, renewed + bound - now) or bound
    why = 'after expiry'
  elseif raw then
    why = 'after expiry'
  elseif floor > 0 then
    why = 'data loss'
  end
  if why == 'first' and redis.call('LLEN', KEYS[4]) == 0 then
    gap = 0  -- a fresh cluster: no epoch, no lease state, no history; nobody can hold a lease
  end
  return gap, why
end
"""

#: ACQUIRE's record of a new lease: ``record`` writes the lease state, voids a handoff
#: request, appends to the history and announces the lock.
ACQUIRE_RECORD = """
local function record(value, epoch, at, why)
  redis.call('HSET', KEYS[3], 'epoch', epoch, 'renewed_ms', at, 'released', '', 'released_why', '')
  redis.call('DEL', KEYS[5])
  redis.call('LPUSH', KEYS[4], epoch .. '|' .. at .. '|' .. why .. '|' .. ARGV[6])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[7]) - 1)
  redis.call('PUBLISH', ARGV[5], value)
end
"""

#: Run by :meth:`ElectionOps.acquire` (below): with :data:`EPOCH_OF`,
#: :data:`ACQUIRE_REFUSAL`, :data:`ACQUIRE_GAP` and :data:`ACQUIRE_RECORD`.
ACQUIRE = (
    """
-- Acquire the leader lease if nobody holds it; a new epoch for every acquisition: the fencing
-- token of that leadership, max(counter + 1, the caller's floor + 1, the server's clock in ms).
-- Strictly increasing within a dataset; after any data loss (restart from an old snapshot, a
-- failover to a lagging replica, FLUSHALL) at least the clock, hence above every epoch issued
-- before it, as long as the clock does not go back and leaderships never came faster than one
-- per millisecond (the counter then never runs ahead of the clock). Epochs stay far below 2^53
-- (Lua numbers are doubles): ms since 1970 plus one per leadership.
-- The counter and the floor are input: each must be an integer below 2^53 and at most a day
-- ahead of the server's clock (epoch_of). A malformed counter (not an integer, huge, far in
-- the future: written by hand or by another program) is repaired: the epoch is issued from
-- max(clock, valid floor + 1) and the counter overwritten; a malformed floor is ignored. Both
-- are named in the answer (the caller logs and counts them). A lock
-- holding the caller's own token is an acquisition whose reply the caller never got (client
-- timeout): it is replaced by a fresh one, so the caller's deadline is measured from this call.
-- A lock without expiry (left by an old static leader) is stale and replaced too.
-- Every acquisition is announced, appended to the history (why: first, after release, after
-- handoff, after expiry, replaced, retried, data loss), and answers how long singleton
-- services must wait: a lease that was not released cleanly (expired, deleted, lost with
-- Redis's data, stale) may still be believed held by its old holder until that holder's renew
-- deadline plus stop grace; a fresh cluster (no epoch counter, lease state or history, and a
-- caller that saw no epoch) has no previous holder and no gap. A pending handoff request is
-- void (it targeted an older epoch).
-- KEYS[1] -> leader lock
-- KEYS[2] -> epoch counter
-- KEYS[3] -> lease state hash (epoch, renewed_ms, released, released_why)
-- KEYS[4] -> history list
-- KEYS[5] -> handoff request
-- ARGV[1] -> random token of the campaigning process
-- ARGV[2] -> lease TTL in ms
-- ARGV[3] -> epoch floor: the highest epoch the caller has seen (0 if none)
-- ARGV[4] -> safety bound in ms: renew deadline + stop grace of a holder
-- ARGV[5] -> announce channel
-- ARGV[6] -> the caller's instance name (for the history)
-- ARGV[7] -> history entries kept
-- ARGV[8] -> "1": a subscribed standby's steady look: a lock with a TTL refuses it unread,
--            {"", its PTTL, ""}
-- Returns: {lock value "<epoch>:<token>", gap in ms before singleton services may start,
-- the stale lock value it replaced or "", what was malformed ("counter", "floor", comma
-- separated, or "")}; or, when another process holds the lock, {"", the lock's PTTL in ms,
-- the holder's lock value, what was malformed} (the caller learns the current epoch, and when
-- to campaign next; the epoch counter is raised to the caller's valid floor).
"""
    + EPOCH_OF
    + ACQUIRE_REFUSAL
    + ACQUIRE_GAP
    + ACQUIRE_RECORD
    + """
if ARGV[8] == '1' then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then
    return {'', left, '', ''}
  end
end
local current = redis.call('GET', KEYS[1])
local pttl = current and redis.call('PTTL', KEYS[1])
local stale = pttl == -1
local mine = current and string.sub(current, -(#ARGV[1] + 1)) == ':' .. ARGV[1]
if current and not stale and not mine then
  return refuse(current, pttl)
end
local raw = redis.call('GET', KEYS[2])
local now = server_ms()
local bad = {}
local floor = 0
if ARGV[3] ~= '0' then
  floor = epoch_of(ARGV[3], now)
  if not floor then
    floor = 0
    table.insert(bad, 'floor')
  end
end
local counter = raw and epoch_of(raw, now)
if raw and not counter then
  table.insert(bad, 'counter')
end
local gap, why = gap_after(current, stale, raw, floor, now)
local epoch = string.format('%d', math.max((counter or 0) + 1, floor + 1, now))
redis.call('SET', KEYS[2], epoch)
local value = epoch .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
record(value, epoch, string.format('%d', now), why)
return {value, gap, stale and current or '', table.concat(bad, ',')}
"""
)


#: Run by :meth:`ElectionOps.renew_lock` (below).
RENEW = """
-- Renew the leader lease: compare the whole value, *replace* the TTL (never add to it) and
-- record the server time of the renew (read by the next acquisition, see ACQUIRE). Also tell
-- the leader whether an operator asked it to hand the lease over (see HANDOFF).
-- KEYS[1] -> leader lock
-- KEYS[2] -> lease state hash
-- KEYS[3] -> handoff request
-- ARGV[1] -> lock value held by the caller
-- ARGV[2] -> lease TTL in ms
-- ARGV[3] -> the caller's epoch
-- Returns: 1 if renewed, 2 if renewed and a handoff of this epoch is requested, 0 if the lock
-- is not (or no longer) the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('HSET', KEYS[2], 'renewed_ms', string.format('%d', now))
  if redis.call('GET', KEYS[3]) == ARGV[3] then
    return 2
  end
  return 1
end
return 0
"""


#: Run by :meth:`ElectionOps.renew_lock` (below) while the app's hash slot is being migrated.
RENEW_LOCK = """
-- Renew the leader lease by its lock alone: RENEW while a Redis Cluster resharding moves the
-- app's hash slot, which refuses a script over several keys (TRYAGAIN) until it has ended but
-- carries a single-key one through to whichever node holds the key (ASK). Not recorded in the
-- lease state, and no handoff answer: the next RENEW after the migration does both.
-- KEYS[1] -> leader lock
-- ARGV[1] -> lock value held by the caller
-- ARGV[2] -> lease TTL in ms
-- Returns: 1 if renewed, 0 if the lock is not (or no longer) the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


#: Run by :meth:`ElectionOps.release_lock` (below).
RELEASE = """
-- Release the lease if it is the caller's, record the clean release (the next holder need not
-- wait for this one, see ACQUIRE) and why, append it to the history, void a handoff request
-- (it is being served) and tell standbys at once.
-- KEYS[1] -> leader lock
-- KEYS[2] -> lease state hash
-- KEYS[3] -> history list
-- KEYS[4] -> handoff request
-- ARGV[1] -> lock value held by the caller
-- ARGV[2] -> pub/sub channel standbys listen on
-- ARGV[3] -> the caller's epoch
-- ARGV[4] -> why: "released" (shutdown) or "handoff"
-- ARGV[5] -> the caller's instance name (for the history)
-- ARGV[6] -> history entries kept
-- Returns: 1 if released, 0 if the lock was not the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local t = redis.call('TIME')
  local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call('DEL', KEYS[1], KEYS[4])
  redis.call('HSET', KEYS[2], 'released', ARGV[3], 'released_why', ARGV[4])
  redis.call('LPUSH', KEYS[3], ARGV[3] .. '|' .. now .. '|' .. ARGV[4] .. '|' .. ARGV[5])
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[6]) - 1)
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
return 0
"""


#: Run by :meth:`ElectionOps.request_handoff` (below).
HANDOFF = f"""
-- Ask the current leader to hand the lease over (an operator's planned handoff): record the
-- request for the current epoch and publish it; the leader of that epoch releases the lease
-- (RELEASE, reason "handoff") and stays a standby for a while. The request expires unseen
-- when no leader acts on it.
-- KEYS[1] -> leader lock
-- KEYS[2] -> handoff request
-- ARGV[1] -> how long the request stands, ms
-- ARGV[2] -> handoff channel
-- Returns: the epoch the request targets, or 0 when nobody holds the lease (or its value is
-- not a lock value the framework writes).
local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
local epoch = string.match(current, '^(%d+):')
if not epoch or #epoch > 16 or tonumber(epoch) >= {EPOCH_LIMIT} then
  return 0
end
redis.call('SET', KEYS[2], epoch, 'PX', ARGV[1])
redis.call('PUBLISH', ARGV[2], epoch)
return tonumber(epoch)
"""


#: Run by :meth:`ElectionOps.claim_static` (below).
CLAIM_STATIC = (
    EPOCH_OF
    + """
-- Always-leader mode (single node, tests): take the lock unconditionally so fenced scripts
-- work unchanged. It expires like any lease (the static leader renews it with RENEW), so a
-- killed static leader cannot block a later election. The epoch is made as ACQUIRE makes it
-- (counter + 1, at least the server's clock in ms: never back, not even after a data loss; a
-- malformed counter is repaired as ACQUIRE repairs it).
-- KEYS[1] -> leader lock
-- KEYS[2] -> epoch counter
-- ARGV[1] -> random token
-- ARGV[2] -> lease TTL in ms
-- Returns: the lock value "<epoch>:<token>".
local raw = redis.call('GET', KEYS[2])
local now = server_ms()
local counter = raw and epoch_of(raw, now)
local epoch = string.format('%d', math.max((counter or 0) + 1, now))
redis.call('SET', KEYS[2], epoch)
local value = epoch .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""
)


class ElectionOps(LeaseOps):
    """The leader lease: campaigns, renewals, releases, handoffs, history."""

    async def acquire(
        self,
        token: str,
        ttl_ms: int,
        *,
        floor: int = 0,
        bound_ms: int = 0,
        instance: str = "",
        peek: bool = False,
    ) -> Acquired | Refused:
        """Take the lease with a new epoch above ``floor`` if free, announcing it and noting
        it (by ``instance``) in the history; ``bound_ms`` is a holder's renew deadline + stop
        grace (see ``election.ACQUIRE``). ``peek``: a lock with a TTL refuses without being
        read (one command: a :class:`Refused` without holder), for a standby that learns
        epochs from the announcements and holds no lost acquisition of its own."""
        k = self.keys
        (value, gap, other, bad), acked = await self._eval(
            self._script(ACQUIRE),
            [k.leader, k.leader_epoch, k.leader_state, k.leader_history, k.leader_handoff],
            [
                token,
                ttl_ms,
                floor,
                bound_ms,
                k.leader_announce,
                instance,
                K.HISTORY_KEEP,
                "1" if peek else "",
            ],
        )
        malformed = tuple(_text(bad).split(",")) if bad else ()
        lock = LockValue.parse(value) if value else None
        if lock is None:
            holder = LockValue.parse(other) if other else None
            if other and holder is None:
                M.skip("leader lock", k.leader, _text(other), "not <epoch>:<token>")
            return Refused(holder, int(gap), malformed)
        return Acquired(lock, int(gap), _text(other), self.replicated(acked), malformed)

    async def renew_lock(self, lock: LockValue, ttl_ms: int) -> Renewal:
        """Replace the lease's TTL if it is still ``lock`` (and record when, server time);
        :attr:`Renewal.HANDOFF` when an operator asked this epoch to hand over.
        :class:`NotReplicated` when renewed but not confirmed (a failed renew, not a lost lease).
        While a resharding moves the app's hash slot (``RENEW`` refused, ``TRYAGAIN``, for
        :data:`RENEW_PATIENCE_S`), the lock alone is renewed (``RENEW_LOCK``)."""
        try:
            with resharding.patience(RENEW_PATIENCE_S):
                done, acked = await self._eval(
                    self._script(RENEW),
                    [self.keys.leader, self.keys.leader_state, self.keys.leader_handoff],
                    [str(lock), ttl_ms, lock.epoch],
                )
        except resharding.SlotMigrating:  # the lock alone can be renewed (RENEW_LOCK)
            done, acked = await self._eval(
                self._script(RENEW_LOCK), [self.keys.leader], [str(lock), ttl_ms]
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
        done = await self._script(RELEASE)(
            keys=[k.leader, k.leader_state, k.leader_history, k.leader_handoff],
            args=[str(lock), k.leader_channel, lock.epoch, reason, instance, K.HISTORY_KEEP],
        )
        return bool(done)

    async def drop_lock(self, lock: LockValue) -> bool:
        """Delete the lease if it is ``lock`` and wake the standbys, recording *no* clean
        release: the next holder waits out this holder's safety bound (``election.ACQUIRE``)."""
        dropped = await self.release_lease(self.keys.leader, str(lock))
        if dropped:
            await self.redis.publish(self.keys.leader_channel, str(lock.epoch))
        return dropped

    async def request_handoff(self, ttl_ms: int) -> int | None:
        """Ask the current leader to hand the lease over (``election.HANDOFF``): the epoch the
        request targets, ``None`` when nobody holds the lease."""
        epoch = await self._script(HANDOFF)(
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
        raw = await self._script(CLAIM_STATIC)(
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
        lock = LockValue.parse(raw)
        if raw is not None and lock is None:
            M.skip("leader lock", self.keys.leader, _text(raw), "not <epoch>:<token>")
        return lock, int(pttl)

    async def read_fence(self) -> str | None:
        """This queue shard's fence as written (``keys.fence``; at most 40 characters)."""
        raw = await self.redis.get(self.keys.fence)
        return None if raw is None else _text(raw, 40)

    async def lease_counters(self) -> tuple[int | str | None, dict[str, str]]:
        """The epoch counter (its text, at most 40 characters, when it is not an epoch the
        framework writes: :func:`worker.core.ids.parse_epoch`) and the lease state hash
        (``epoch``, ``renewed_ms``, ``released``)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.leader_epoch)
            pipe.hgetall(self.keys.leader_state)
            counter, state = await pipe.execute()
        epoch = parse_epoch(counter)
        return (
            epoch if epoch is not None or counter is None else _text(counter, 40),
            {_text(k): _text(v) for k, v in list(state.items())[:20]},
        )
