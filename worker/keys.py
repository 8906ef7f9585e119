"""Every Redis key name the framework uses and the text of every Lua script it runs.

Only names and script text live here; :mod:`worker.store` is the one place that calls the
scripts (arguments packed once, results typed) and :mod:`worker.ids` builds and parses ids.

All keys live under one configurable prefix (``WORKER_KEY_PREFIX``, default ``worker:``) so
several apps can share a Redis. The only exceptions are arq's own per-job keys
(``arq:job:<id>``, ``arq:in-progress:<id>``, ``arq:result:<id>``, ``arq:retry:<id>``), whose
prefixes arq fixes; the job ids the framework generates carry the prefix, so they do not clash.

Each script opens with a ``KEYS[n] ->`` / ``ARGV[n] ->`` / ``Returns:`` header. Scripts marked
*fenced* begin by comparing the leader lock with the caller's lock value and answer with the
error ``FENCED ...`` when it differs; Redis runs a script atomically, so a leader that lost its
lease (paused, partitioned, replaced) can never write through one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from arq.constants import (
    abort_jobs_ss,
    in_progress_key_prefix,
    job_key_prefix,
    result_key_prefix,
    retry_key_prefix,
)

from worker.ids import hash_tag

__all__ = [
    "ACQUIRE",
    "BOOT",
    "BROADCAST",
    "CHECKPOINT",
    "CLAIM",
    "CLAIM_STATIC",
    "DEAD_ADD",
    "DEAD_RETRY",
    "DEFAULT_QUEUE",
    "DISPATCH",
    "ENQUEUE_TICKS",
    "FENCE_ERROR",
    "FINISH",
    "HANDOFF",
    "HEARTBEAT",
    "HISTORY_KEEP",
    "INFLIGHT_CLEAR",
    "INIT_BEGIN",
    "LEASES_RENEW",
    "LEASES_TAKE",
    "LEASE_RELEASE",
    "LEASE_RENEW",
    "PERIODIC_RESULT",
    "POLL_REQUEUE",
    "POLL_SWEEP",
    "POLL_UNSCHEDULE",
    "RATE_TAKE",
    "REAP",
    "RELEASE",
    "RENEW",
    "SLOT_TAKE",
    "TIME",
    "UNIQUE_ENQUEUE",
    "Keys",
]

ARQ_JOB = job_key_prefix
ARQ_RESULT = result_key_prefix
ARQ_IN_PROGRESS = in_progress_key_prefix
ARQ_RETRY = retry_key_prefix
ARQ_ABORT = abort_jobs_ss

#: The queue jobs go to unless their task names another.
DEFAULT_QUEUE = "default"

#: Prefix of the error a fenced script answers with when the caller no longer holds the lock.
FENCE_ERROR = "FENCED"

#: Leadership changes kept in ``<prefix>leader:history`` (newest first).
HISTORY_KEEP = 100
#: How long the per-minute throughput counters of an hour are kept after their last write.
STATS_TTL_MS = 2 * 3600 * 1000


@dataclass(frozen=True)
class Keys:
    """Key names under one prefix. Pure functions of their arguments; no Redis access."""

    prefix: str = "worker:"

    # -- queues (arq's sorted sets of job ids scored by due time in ms) ------------------------
    @property
    def queue(self) -> str:
        """The default queue (named ``default``)."""
        return f"{self.prefix}queue"

    def queue_of(self, name: str) -> str:
        """A named queue: ``default`` is :attr:`queue`, any other ``<prefix>queue:<name>``."""
        return self.queue if name == DEFAULT_QUEUE else f"{self.prefix}queue:{name}"

    # -- leadership --------------------------------------------------------------------------
    @property
    def leader(self) -> str:
        """The lease: value ``<epoch>:<token>``, PX = leader TTL."""
        return f"{self.prefix}leader"

    @property
    def leader_epoch(self) -> str:
        """Counter INCRed on every acquisition; never decreases while Redis keeps its data."""
        return f"{self.prefix}leader:epoch"

    @property
    def leader_channel(self) -> str:
        """Pub/sub channel a releasing leader publishes on so standbys campaign at once."""
        return f"{self.prefix}leader:released"

    @property
    def leader_announce(self) -> str:
        """Pub/sub channel every acquisition is announced on (``<epoch>:<token>``): a leader
        hearing another value steps down at once instead of at its next renew."""
        return f"{self.prefix}leader:acquired"

    @property
    def leader_state(self) -> str:
        """Hash about the current lease: ``epoch``, ``renewed_ms`` (server time of the last
        acquire/renew) and ``released`` (the epoch released cleanly), so an acquisition knows
        how long the previous holder may still believe it leads."""
        return f"{self.prefix}leader:state"

    @property
    def leader_history(self) -> str:
        """List of the last :data:`HISTORY_KEEP` leadership changes, newest first, each
        ``<epoch>|<server ms>|<reason>|<instance>`` (written by ACQUIRE and RELEASE; parsed by
        ``Store.leader_history``)."""
        return f"{self.prefix}leader:history"

    @property
    def leader_handoff(self) -> str:
        """A planned handoff request: value = the epoch it targets, short PX. The leader of that
        epoch sees it on its next renew (or at once, on :attr:`leader_handoff_channel`),
        releases the lease and stays a standby for a while, so another candidate takes over."""
        return f"{self.prefix}leader:handoff"

    @property
    def leader_handoff_channel(self) -> str:
        """Pub/sub channel a handoff request is published on (the targeted epoch)."""
        return f"{self.prefix}leader:handoff-requested"

    @property
    def boot(self) -> str:
        """Marker ``<random id>:<created ms>`` written once per Redis dataset: a process that
        saw it and finds it gone knows Redis lost its data."""
        return f"{self.prefix}boot"

    @property
    def probe(self) -> str:
        """Counter INCRed only to measure replication: a ``WAIT`` right after it confirms that
        the replicas have every write the primary made before it (see ``Store.confirm``)."""
        return f"{self.prefix}probe"

    @property
    def slot_tag(self) -> str:
        """The Redis Cluster hash tag the prefix starts with (``{shop}``), or ``""``: every job
        id must then start with it, so arq's per-job keys share the app's slot."""
        return hash_tag(self.prefix)

    @property
    def abort(self) -> str:
        """The app's sorted set of abort requests (``Client.abort``): ``<prefix>abort``, not
        arq's shared ``arq:abort`` (``Job.abort()``), which holds every app's job ids and which a
        Redis user limited to the app's keys cannot (and must not) reach."""
        return f"{self.prefix}abort"

    @property
    def wake(self) -> str:
        """Pub/sub channel every enqueue publishes the earliest due time (ms) on, so idle
        consumers claim at once instead of at their next poll."""
        return f"{self.prefix}wake"

    # -- periodic jobs ------------------------------------------------------------------------
    @property
    def periodic_state(self) -> str:
        """Hash: periodic job name -> last enqueued tick (epoch ms)."""
        return f"{self.prefix}periodic:last"

    @property
    def periodic_runs(self) -> str:
        """Hash of how periodic runs ended, written by the consumers that ran them:
        ``<name>:success`` and ``<name>:failure`` -> JSON ``{at_ms, tick_ms, instance[,
        error]}`` of the most recent such end, ``<name>:failing_since`` -> end time (ms) of
        the first failure since the last success."""
        return f"{self.prefix}periodic:runs"

    # -- pollers ------------------------------------------------------------------------------
    def poll_shard(self, poller: str, shard: int) -> str:
        """Sorted set of items due for polling, scored by due time (epoch ms).

        The poller name is a Redis Cluster hash tag so one poller's shards, its in-flight hash
        and a dispatch script's keys could share a slot; spreading pollers across a cluster
        would give each shard its own tag (see README, "Scale").
        """
        return f"{self.prefix}poll:{{{poller}}}:{shard}"

    def poll_inflight(self, poller: str) -> str:
        """Hash: item -> id of the arq job currently carrying it."""
        return f"{self.prefix}poll:{{{poller}}}:inflight"

    def poll_removed(self, poller: str) -> str:
        """Hash: item -> id of the job that carried it when the app removed it (that job's
        failure must not put the item back)."""
        return f"{self.prefix}poll:{{{poller}}}:removed"

    # -- initializers -------------------------------------------------------------------------
    def init_state(self, name: str) -> str:
        """Hash: version, cursor, batches, items, done, started_ms, finished_ms, epoch."""
        return f"{self.prefix}init:{name}"

    # -- instance registry --------------------------------------------------------------------
    @property
    def instances(self) -> str:
        """Sorted set: instance id -> last heartbeat (epoch ms). Outlives the instance hash."""
        return f"{self.prefix}instances"

    @property
    def apps(self) -> str:
        """Hash: app name -> its manifest (JSON, see :mod:`worker.manifest`), written by every
        process at start; admin commands describe the running app from it."""
        return f"{self.prefix}apps"

    def instance(self, instance_id: str) -> str:
        """Hash describing one live process; expires at about twice the heartbeat interval."""
        return f"{self.prefix}instance:{instance_id}"

    def holds(self, instance_id: str) -> str:
        """Set of arq job ids the instance is running (for orphan recovery)."""
        return f"{self.prefix}instance:{instance_id}:jobs"

    @property
    def holds_pattern(self) -> str:
        """SCAN pattern of every holds set (``doctor`` looks for ones nobody owns)."""
        return f"{self.prefix}instance:*:jobs"

    def holds_owner(self, key: str) -> str | None:
        """The instance id of a holds set key, or ``None`` if ``key`` is not one."""
        head, tail = f"{self.prefix}instance:", ":jobs"
        if key.startswith(head) and key.endswith(tail) and len(key) > len(head) + len(tail):
            return key[len(head) : -len(tail)]
        return None

    def arq_health(self, instance_id: str) -> str:
        """arq's health-check key, one per instance (arq issue #291)."""
        return f"{self.prefix}arq-health:{instance_id}"

    @property
    def paused(self) -> str:
        """Set of paused duties: ``periodic:<name>`` (ticks skipped), ``poller:<name>``
        (nothing dispatched). ``python -m worker pause|resume`` edits it."""
        return f"{self.prefix}paused"

    # -- per_key services ---------------------------------------------------------------------
    def service_members(self, service: str) -> str:
        """Sorted set: instance id -> last round (epoch ms) of processes running the service."""
        return f"{self.prefix}svc:{service}:members"

    def service_lease(self, service: str, key: str) -> str:
        """Lease of one key of a per_key service: value = owning instance id, PX = lease TTL."""
        return f"{self.prefix}svc:{service}:lease:{key}"

    # -- broadcasts ---------------------------------------------------------------------------
    def broadcast(self, topic: str) -> str:
        """Stream of a broadcast topic's recent messages (capped; see ``BROADCAST``): entry
        fields ``seq``, ``origin``, ``chain``, ``data``. The stream id is the read cursor."""
        return f"{self.prefix}bcast:{topic}"

    # -- job helpers --------------------------------------------------------------------------
    def mutex(self, name: str) -> str:
        return f"{self.prefix}mutex:{name}"

    def once(self, name: str) -> str:
        return f"{self.prefix}once:{name}"

    # -- cluster-wide limits ------------------------------------------------------------------
    def limit_slots(self, task: str) -> str:
        """Sorted set: job id -> lease expiry (ms) of each run holding a concurrency slot."""
        return f"{self.prefix}limit:{task}:slots"

    def limit_rate(self, task: str) -> str:
        """The rate limiter's theoretical arrival time (ms) for ``task``."""
        return f"{self.prefix}limit:{task}:rate"

    # -- throughput and the operators' log ------------------------------------------------------
    def stats(self, queue: str, hour: int) -> str:
        """Hash of one queue's finished runs in one hour (``hour`` = epoch ms // 3,600,000):
        ``<minute>:done`` and ``<minute>:failed`` -> count, ``minute`` = epoch ms // 60,000.
        Written by FINISH (one HINCRBY per batch and outcome); expires
        :data:`STATS_TTL_MS` after its last write, so each hour's key goes by itself."""
        return f"{self.prefix}stats:{queue}:{hour}"

    @property
    def audit(self) -> str:
        """List of the operators' recent actions (console and CLI), newest first, JSON each."""
        return f"{self.prefix}audit"

    # -- dead letters -------------------------------------------------------------------------
    @property
    def dead(self) -> str:
        """Sorted set: job id -> time it was set aside (epoch ms)."""
        return f"{self.prefix}dead"

    @property
    def dead_jobs(self) -> str:
        """Hash: job id -> JSON record {reason, payload (base64), at}."""
        return f"{self.prefix}dead:jobs"

    @property
    def dead_index(self) -> str:
        """Hash: job id -> the same JSON record without its payload (what a listing reads)."""
        return f"{self.prefix}dead:index"


# ---------------------------------------------------------------------------------------------
# Leadership
# ---------------------------------------------------------------------------------------------

ACQUIRE = """
-- Acquire the leader lease if nobody holds it; a new epoch for every acquisition, above any
-- epoch the caller has seen (so epochs never go backwards across a Redis data loss). A lock
-- holding the caller's own token is an acquisition whose reply the caller never got (client
-- timeout): it is replaced by a fresh one, so the caller's deadline is measured from this call.
-- A lock without expiry (left by an old static leader) is stale and replaced too.
-- Every acquisition is announced, appended to the history (why: first, after release, after
-- handoff, after expiry, replaced, retried, data loss), and answers how long singleton
-- services must wait: a lease that was not released cleanly (expired, deleted, lost with
-- Redis's data, stale) may still be believed held by its old holder until that holder's renew
-- deadline plus stop grace. A pending handoff request is void (it targeted an older epoch).
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
-- Returns: {lock value "<epoch>:<token>", gap in ms before singleton services may start,
-- the stale lock value it replaced or ""}; or, when another process holds the lock, {"", 0,
-- the holder's lock value} (the caller learns the current epoch; the epoch counter is raised
-- to the caller's floor).
local current = redis.call('GET', KEYS[1])
local floor = tonumber(ARGV[3])
local stale = current and redis.call('PTTL', KEYS[1]) == -1
local mine = current and string.sub(current, -(#ARGV[1] + 1)) == ':' .. ARGV[1]
local counter = redis.call('GET', KEYS[2])
if current and not stale and not mine then
  if tonumber(counter or '0') < floor then
    redis.call('SET', KEYS[2], floor)
  end
  return {'', 0, current}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = redis.call('HMGET', KEYS[3], 'epoch', 'renewed_ms', 'released', 'released_why')
local bound = tonumber(ARGV[4])
local gap = bound
local why = 'first'
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
  gap = math.max(0, tonumber(prev[2]) + bound - now)
  why = 'after expiry'
elseif counter then
  why = 'after expiry'
elseif floor > 0 then
  why = 'data loss'
end
local epoch = redis.call('INCR', KEYS[2])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
local value = epoch .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
redis.call('HSET', KEYS[3], 'epoch', epoch, 'renewed_ms', now, 'released', '', 'released_why', '')
redis.call('DEL', KEYS[5])
redis.call('LPUSH', KEYS[4], epoch .. '|' .. now .. '|' .. why .. '|' .. ARGV[6])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[7]) - 1)
redis.call('PUBLISH', ARGV[5], value)
if stale then
  return {value, gap, current}
end
return {value, gap, ''}
"""

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
  redis.call('HSET', KEYS[2], 'renewed_ms', now)
  if redis.call('GET', KEYS[3]) == ARGV[3] then
    return 2
  end
  return 1
end
return 0
"""

HANDOFF = """
-- Ask the current leader to hand the lease over (an operator's planned handoff): record the
-- request for the current epoch and publish it; the leader of that epoch releases the lease
-- (RELEASE, reason "handoff") and stays a standby for a while. The request expires unseen
-- when no leader acts on it.
-- KEYS[1] -> leader lock
-- KEYS[2] -> handoff request
-- ARGV[1] -> how long the request stands, ms
-- ARGV[2] -> handoff channel
-- Returns: the epoch the request targets, or 0 when nobody holds the lease.
local current = redis.call('GET', KEYS[1])
if not current then
  return 0
end
local epoch = string.match(current, '^(%d+):')
if not epoch then
  return 0
end
redis.call('SET', KEYS[2], epoch, 'PX', ARGV[1])
redis.call('PUBLISH', ARGV[2], epoch)
return tonumber(epoch)
"""

LEASE_RENEW = """
-- Renew a lease (the leader lock, a per_key service lease): compare the whole value, then
-- *replace* the TTL (never add to it).
-- KEYS[1] -> the lease key
-- ARGV[1] -> value held by the caller
-- ARGV[2] -> lease TTL in ms
-- Returns: 1 if renewed, 0 if the lease is not (or no longer) the caller's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

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
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('DEL', KEYS[1], KEYS[4])
  redis.call('HSET', KEYS[2], 'released', ARGV[3], 'released_why', ARGV[4])
  redis.call('LPUSH', KEYS[3], ARGV[3] .. '|' .. now .. '|' .. ARGV[4] .. '|' .. ARGV[5])
  redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[6]) - 1)
  redis.call('PUBLISH', ARGV[2], ARGV[1])
  return 1
end
return 0
"""

TIME = """
-- The server's clock, read where the app's keys live (a Redis Cluster routes the call by
-- KEYS[1] to the node serving the app's slot, the node whose clock the lease scripts read;
-- a plain TIME would go to whichever node the client picked).
-- KEYS[1] -> any key of the app (the leader lock)
-- Returns: {seconds, microseconds}
return redis.call('TIME')
"""

CLAIM_STATIC = """
-- Always-leader mode (single node, tests): take the lock unconditionally so fenced scripts
-- work unchanged. It expires like any lease (the static leader renews it with RENEW), so a
-- killed static leader cannot block a later election.
-- KEYS[1] -> leader lock
-- KEYS[2] -> epoch counter
-- ARGV[1] -> random token
-- ARGV[2] -> lease TTL in ms
-- Returns: the lock value "<epoch>:<token>".
local epoch = redis.call('INCR', KEYS[2])
local value = epoch .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
"""

_FENCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED leader lock is not held by this process')
end
"""

# ---------------------------------------------------------------------------------------------
# Fenced singleton writes
# ---------------------------------------------------------------------------------------------

ENQUEUE_TICKS = (
    """
-- Fenced. Enqueue the due ticks of several periodic jobs in one step (one call per tick
-- instant, whatever the number of jobs): each tick as an arq job with a deterministic id,
-- unless it is at or before the job's recorded last tick, its id already has a job or a
-- result, or the job is paused (its ticks are skipped, not caught up on resume); then record
-- each job's newest due tick and wake idle consumers.
-- KEYS[1] -> leader lock
-- KEYS[2] -> periodic state hash (name -> last tick ms)
-- KEYS[3] -> paused set ("periodic:<name>", "poller:<name>")
-- KEYS[4..] -> the queues the jobs go to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix ("arq:job:")
-- ARGV[3] -> arq result key prefix ("arq:result:")
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> wake channel
-- ARGV[6..] -> per periodic job: name, newest due tick (recorded as last even if the policy
--              skipped it), its queue's index in KEYS, the last tick the caller knows is
--              recorded (-1 if none), n, then n triples (tick ms, job id, serialized arq job),
--              ascending
-- A recorded last tick *below* the one the caller knows means Redis lost writes it had
-- confirmed (a failover to a replica that missed them, with the lease still valid there): the
-- job is left untouched and reported as rolled back, so the caller reads the state again and
-- enqueues the lost ticks per its catch-up policy instead of skipping past them.
-- Returns: per job, in order: enqueued, deduplicated (id existed), skipped (tick <= last),
-- rolled back (1: nothing written for the job, 0 otherwise)
"""
    + _FENCE
    + """
local out, records = {}, {}
local earliest = nil
local i = 6
while i <= #ARGV do
  local name, advance = ARGV[i], tonumber(ARGV[i + 1])
  local queue, known = KEYS[tonumber(ARGV[i + 2])], tonumber(ARGV[i + 3])
  local n = tonumber(ARGV[i + 4])
  local last = tonumber(redis.call('HGET', KEYS[2], name) or '-1')
  local paused = redis.call('SISMEMBER', KEYS[3], 'periodic:' .. name) == 1
  local enqueued, dup, skipped, behind = 0, 0, 0, 0
  local adds = {}
  local todo = n
  if last < known then
    behind, todo = 1, 0
  end
  for j = i + 5, i + 4 + 3 * todo, 3 do
    local tick, id = tonumber(ARGV[j]), ARGV[j + 1]
    if tick <= last or paused then
      skipped = skipped + 1
    elseif redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
      dup = dup + 1
    else
      redis.call('SET', ARGV[2] .. id, ARGV[j + 2], 'PX', ARGV[4])
      adds[#adds + 1] = ARGV[j]
      adds[#adds + 1] = id
      enqueued = enqueued + 1
      if earliest == nil or tick < earliest then
        earliest = tick
      end
    end
  end
  if #adds > 0 then
    redis.call('ZADD', queue, unpack(adds))
  end
  if advance > last and behind == 0 then
    records[#records + 1] = name
    records[#records + 1] = string.format('%d', advance)
  end
  out[#out + 1] = enqueued
  out[#out + 1] = dup
  out[#out + 1] = skipped
  out[#out + 1] = behind
  i = i + 5 + 3 * n
end
if earliest ~= nil then
  redis.call('PUBLISH', ARGV[5], string.format('%d', earliest))
end
if #records > 0 then
  redis.call('HSET', KEYS[2], unpack(records))
end
return out
"""
)

DISPATCH = (
    """
-- Fenced. Move due items of one poller shard into the arq queue, one job per item; an item
-- whose previous job still exists (queued or running) is left in the shard, pushed back by
-- ARGV[6] ms, so it is never in flight twice.
-- KEYS[1] -> leader lock
-- KEYS[2] -> poller in-flight hash (item -> job id)
-- KEYS[3] -> arq queue
-- KEYS[4] -> shard sorted set (item -> due ms)
-- KEYS[5] -> paused set (a paused poller dispatches nothing: "poller:<name>")
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq result key prefix
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> now in ms (items scored above it are not due)
-- ARGV[6] -> push-back delay in ms for items still in flight
-- ARGV[7] -> wake channel
-- ARGV[8] -> poller name
-- ARGV[9..] -> triples: item, job id, serialized arq job
-- Returns: {dispatched, still_in_flight, duplicate_ids, no_longer_due}
"""
    + _FENCE
    + """
local now = tonumber(ARGV[5])
local sent, busy, dup, gone = 0, 0, 0, 0
if redis.call('SISMEMBER', KEYS[5], 'poller:' .. ARGV[8]) == 1 then
  return {0, 0, 0, 0}
end
for i = 9, #ARGV, 3 do
  local item, id = ARGV[i], ARGV[i + 1]
  local score = redis.call('ZSCORE', KEYS[4], item)
  if (not score) or tonumber(score) > now then
    gone = gone + 1
  else
    local current = redis.call('HGET', KEYS[2], item)
    if current and redis.call('EXISTS', ARGV[2] .. current) == 1 then
      redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), item)
      busy = busy + 1
    elseif redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
      redis.call('ZREM', KEYS[4], item)
      dup = dup + 1
    else
      redis.call('ZREM', KEYS[4], item)
      redis.call('SET', ARGV[2] .. id, ARGV[i + 2], 'PX', ARGV[4])
      redis.call('ZADD', KEYS[3], now, id)
      redis.call('HSET', KEYS[2], item, id)
      sent = sent + 1
    end
  end
end
if sent > 0 then
  redis.call('PUBLISH', ARGV[7], ARGV[5])
end
return {sent, busy, dup, gone}
"""
)

INIT_BEGIN = (
    """
-- Fenced. Start (or resume) an initializer run for a version; a different stored version is
-- discarded so the new version runs from the start.
-- KEYS[1] -> leader lock
-- KEYS[2] -> initializer state hash
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> version
-- ARGV[3] -> now ms
-- ARGV[4] -> leader epoch
-- Returns: {done ("1"/"0"), cursor ("" = from the start), batches, items}
"""
    + _FENCE
    + """
if redis.call('HGET', KEYS[2], 'version') ~= ARGV[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'version', ARGV[2], 'cursor', '', 'batches', 0, 'items', 0,
             'done', 0, 'started_ms', ARGV[3])
end
redis.call('HSET', KEYS[2], 'epoch', ARGV[4], 'resumed_ms', ARGV[3])
local s = redis.call('HMGET', KEYS[2], 'done', 'cursor', 'batches', 'items')
return {s[1] or '0', s[2] or '', s[3] or '0', s[4] or '0'}
"""
)

CHECKPOINT = (
    """
-- Fenced. Write one initializer batch (items into poller shards) and its checkpoint
-- atomically: a leader that dies after this never redoes the batch, and one that dies before
-- it left nothing half-written.
-- KEYS[1] -> leader lock
-- KEYS[2] -> initializer state hash
-- KEYS[3..] -> poller shard sorted sets the batch writes to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> version
-- ARGV[3] -> cursor the batch started from (compare-and-set guard)
-- ARGV[4] -> cursor after this batch
-- ARGV[5] -> "1" if this is the last batch
-- ARGV[6] -> now ms
-- ARGV[7..] -> triples: shard index into KEYS (3-based), due ms, item
-- Returns: {items added, batches so far}; error "CURSOR" if the stored cursor moved.
"""
    + _FENCE
    + """
if redis.call('HGET', KEYS[2], 'version') ~= ARGV[2]
   or redis.call('HGET', KEYS[2], 'cursor') ~= ARGV[3] then
  return redis.error_reply('CURSOR initializer checkpoint moved underneath this run')
end
local added = 0
for i = 7, #ARGV, 3 do
  added = added + redis.call('ZADD', KEYS[tonumber(ARGV[i])], 'NX', ARGV[i + 1], ARGV[i + 2])
end
redis.call('HSET', KEYS[2], 'cursor', ARGV[4], 'updated_ms', ARGV[6])
redis.call('HINCRBY', KEYS[2], 'items', added)
local batches = redis.call('HINCRBY', KEYS[2], 'batches', 1)
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'done', 1, 'finished_ms', ARGV[6])
end
return {added, batches}
"""
)

HEARTBEAT = """
-- Write an instance's record and its heartbeat score, on the server's clock: the orphan
-- reaper and doctor judge silence on that one clock, whatever the hosts' clocks say.
-- KEYS[1] -> the instance's record
-- KEYS[2] -> instances sorted set
-- ARGV[1] -> instance id
-- ARGV[2] -> record (JSON)
-- ARGV[3] -> record TTL ms
-- ARGV[4] -> score ms, or "" for the server's clock (tests pass one)
-- Returns: the server's clock {seconds, microseconds} (the caller's clock-offset estimate).
local t = redis.call('TIME')
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
local score = ARGV[4]
if score == '' then
  score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZADD', KEYS[2], score, ARGV[1])
return t
"""

REAP = (
    """
-- Fenced. Make the jobs of a dead instance available again: drop the in-progress marker of
-- each job that is still queued and still claimed by that instance (its claim tokens start
-- with "<instance id>/") and make it due now (a claimed job is parked in the future, see
-- CLAIM), then forget the instance. A run of that instance that wakes up later finds its
-- claim gone and can no longer finish the job (see FINISH).
-- KEYS[1] -> leader lock
-- KEYS[2] -> the dead instance's holds set
-- KEYS[3] -> instances sorted set
-- KEYS[4..] -> the queues its jobs can be in
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq in-progress key prefix
-- ARGV[3] -> instance id
-- ARGV[4] -> heartbeat score the caller judged stale (guard against a late heartbeat)
-- ARGV[5] -> now ms: the score released jobs are due at
-- ARGV[6] -> wake channel
-- Returns: number of jobs released, or -1 if the instance heartbeated meanwhile.
"""
    + _FENCE
    + """
local score = redis.call('ZSCORE', KEYS[3], ARGV[3])
if score and tonumber(score) > tonumber(ARGV[4]) then
  return -1
end
local released = 0
local prefix = ARGV[3] .. '/'
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  for q = 4, #KEYS do
    if redis.call('ZSCORE', KEYS[q], id) then
      local claim = redis.call('GET', ARGV[2] .. id)
      if claim and string.sub(claim, 1, #prefix) == prefix then
        released = released + redis.call('DEL', ARGV[2] .. id)
        redis.call('ZADD', KEYS[q], 'XX', ARGV[5], id)
      end
      break
    end
  end
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[3])
if released > 0 then
  redis.call('PUBLISH', ARGV[6], ARGV[5])
end
return released
"""
)

# ---------------------------------------------------------------------------------------------
# Unfenced helpers (any process)
# ---------------------------------------------------------------------------------------------

RELEASE_OWN = """
-- Give back the claims of this instance that it does not know about: a CLAIM whose reply was
-- lost (the connection dropped, the primary failed over after replicating it) holds jobs no run
-- of the instance will ever finish, and they would wait for their markers to expire. Per id in
-- the instance's holds set that is not among the runs the instance knows (ARGV[5..]), still
-- queued and claimed with a token of this instance ("<instance id>/"): drop the marker and make
-- the job due now; then forget the released ids in the holds set.
-- KEYS[1] -> the instance's holds set
-- KEYS[2..] -> the queues its jobs can be in
-- ARGV[1] -> arq in-progress key prefix
-- ARGV[2] -> instance id
-- ARGV[3] -> now ms: the score released jobs are due at
-- ARGV[4] -> wake channel
-- ARGV[5..] -> job ids the instance knows it holds (running, held or ending)
-- Returns: number of jobs released
local known = {}
for i = 5, #ARGV do
  known[ARGV[i]] = true
end
local released = 0
local prefix = ARGV[2] .. '/'
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if not known[id] then
    for q = 2, #KEYS do
      if redis.call('ZSCORE', KEYS[q], id) then
        local claim = redis.call('GET', ARGV[1] .. id)
        if claim and string.sub(claim, 1, #prefix) == prefix then
          released = released + redis.call('DEL', ARGV[1] .. id)
          redis.call('ZADD', KEYS[q], 'XX', ARGV[3], id)
          redis.call('SREM', KEYS[1], id)
        end
        break
      end
    end
  end
end
if released > 0 then
  redis.call('PUBLISH', ARGV[4], ARGV[3])
end
return released
"""

PERIODIC_RESULT = """
-- Record how a run of a periodic job ended (the consumer that ran it, once per run's end): the
-- most recent success or failure, and since when the job has been failing without a success.
-- KEYS[1] -> periodic results hash
-- ARGV[1] -> job name
-- ARGV[2] -> outcome: "success" or "failure"
-- ARGV[3] -> the record (JSON: at_ms, tick_ms, instance, error)
-- ARGV[4] -> when the run ended (ms)
-- Returns: 1
redis.call('HSET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], ARGV[3])
if ARGV[2] == 'success' then
  redis.call('HDEL', KEYS[1], ARGV[1] .. ':failing_since')
else
  redis.call('HSETNX', KEYS[1], ARGV[1] .. ':failing_since', ARGV[4])
end
return 1
"""

UNIQUE_ENQUEUE = """
-- Enqueue an arq job unless a job or result with the same id exists (what arq's enqueue_job
-- does with WATCH/MULTI, in one round trip).
-- KEYS[1] -> arq queue
-- ARGV[1] -> job id
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq result key prefix
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> score (due time, ms)
-- ARGV[6] -> serialized arq job
-- ARGV[7] -> wake channel (idle consumers hear the due time)
-- Returns: 1 if enqueued, 0 if the id exists.
if redis.call('EXISTS', ARGV[2] .. ARGV[1], ARGV[3] .. ARGV[1]) > 0 then
  return 0
end
redis.call('SET', ARGV[2] .. ARGV[1], ARGV[6], 'PX', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[5], ARGV[1])
redis.call('PUBLISH', ARGV[7], ARGV[5])
return 1
"""

INFLIGHT_CLEAR = """
-- Forget a poll item's in-flight job id once that job has ended, so the hash holds only
-- items whose job may still exist.
-- KEYS[1] -> poller in-flight hash
-- KEYS[2] -> poller removed hash (a removal mark of that job is forgotten with it)
-- ARGV[1] -> item
-- ARGV[2] -> the job id that ended, or "" to clear only if the recorded job no longer exists
-- ARGV[3] -> arq job key prefix
-- Returns: 1 if the entry was removed, 0 otherwise.
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then
  return 0
end
if (ARGV[2] ~= '' and current == ARGV[2])
   or (ARGV[2] == '' and redis.call('EXISTS', ARGV[3] .. current) == 0) then
  if redis.call('HGET', KEYS[2], ARGV[1]) == current then
    redis.call('HDEL', KEYS[2], ARGV[1])
  end
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

POLL_UNSCHEDULE = """
-- Stop polling an item: take it off its shard; while a job still carries it, mark it removed
-- (that job's failure then does not put it back), else forget its in-flight entry.
-- KEYS[1] -> shard sorted set
-- KEYS[2] -> poller in-flight hash
-- KEYS[3] -> poller removed hash
-- ARGV[1] -> item
-- ARGV[2] -> arq job key prefix
-- Returns: 1 if the item was waiting or in flight, 0 if the poller did not hold it.
local waiting = redis.call('ZREM', KEYS[1], ARGV[1])
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and redis.call('EXISTS', ARGV[2] .. current) == 1 then
  redis.call('HSET', KEYS[3], ARGV[1], current)
  return 1
end
if current then
  redis.call('HDEL', KEYS[2], ARGV[1])
end
redis.call('HDEL', KEYS[3], ARGV[1])
return waiting
"""

POLL_REQUEUE = """
-- A poll item's job failed for good (it raised, used up its retries, was aborted): put the
-- item back into its shard, due at ARGV[3], unless the app rescheduled it (it waits already),
-- removed it while the job ran, or another job carries it now. The in-flight entry stays, so
-- the item is not dispatched again while the failed job's record still exists.
-- KEYS[1] -> shard sorted set
-- KEYS[2] -> poller in-flight hash
-- KEYS[3] -> poller removed hash
-- ARGV[1] -> item
-- ARGV[2] -> id of the job that failed
-- ARGV[3] -> due ms
-- Returns: 1 put back, 0 already waiting, -1 removed by the app (the mark stays until the
-- entry goes), -2 carried by another job.
local removed = redis.call('HGET', KEYS[3], ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if removed then
    redis.call('HDEL', KEYS[3], ARGV[1])  -- a schedule after the remove wins
  end
  return 0
end
if removed == ARGV[2] then
  return -1
end
if removed then
  redis.call('HDEL', KEYS[3], ARGV[1])  -- the mark of an older job
end
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current and current ~= ARGV[2] then
  return -2
end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

POLL_SWEEP = (
    """
-- Fenced. Put back poll items whose job ended without saying how (dead-lettered before it ran:
-- expired, malformed, retries used up by crashes; its consumer died before reporting; its
-- record lost): each entry still names that job, the job record is gone, the item is not
-- waiting and the app did not remove it. The entry is forgotten either way.
-- KEYS[1] -> leader lock
-- KEYS[2] -> poller in-flight hash
-- KEYS[3] -> poller removed hash
-- KEYS[4..] -> shard sorted sets the items belong to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> due ms of the items put back
-- ARGV[4..] -> triples: item, job id, KEYS index of the item's shard
-- Returns: {put back, forgotten without putting back}
"""
    + _FENCE
    + """
local back, dropped = 0, 0
for i = 4, #ARGV, 3 do
  local item, id, shard = ARGV[i], ARGV[i + 1], KEYS[tonumber(ARGV[i + 2])]
  if redis.call('HGET', KEYS[2], item) == id and redis.call('EXISTS', ARGV[2] .. id) == 0 then
    redis.call('HDEL', KEYS[2], item)
    local removed = redis.call('HGET', KEYS[3], item)
    if removed then
      redis.call('HDEL', KEYS[3], item)
    end
    if removed ~= id and not redis.call('ZSCORE', shard, item) then
      redis.call('ZADD', shard, ARGV[3], item)
      back = back + 1
    else
      dropped = dropped + 1
    end
  end
end
return {back, dropped}
"""
)

DEAD_RETRY = """
-- Put a dead-lettered job back on the queue with its original payload and id; its tries start
-- over. Refused while a job with that id exists (queued or running).
-- KEYS[1] -> arq queue
-- KEYS[2] -> dead-letter sorted set
-- KEYS[3] -> dead-letter records hash
-- KEYS[4] -> dead-letter index hash (records without payloads)
-- ARGV[1] -> job id
-- ARGV[2] -> raw payload (decoded from the record by the caller)
-- ARGV[3] -> arq job key prefix
-- ARGV[4] -> arq result key prefix
-- ARGV[5] -> arq retry key prefix
-- ARGV[6] -> job key TTL in ms
-- ARGV[7] -> score (now, ms)
-- ARGV[8] -> wake channel
-- Returns: 1 if re-queued, 0 if the id is live, -1 if it is not in the dead-letter set.
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return -1
end
if redis.call('EXISTS', ARGV[3] .. ARGV[1]) == 1 then
  return 0
end
redis.call('DEL', ARGV[4] .. ARGV[1], ARGV[5] .. ARGV[1])
redis.call('SET', ARGV[3] .. ARGV[1], ARGV[2], 'PX', ARGV[6])
redis.call('ZADD', KEYS[1], ARGV[7], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[8], ARGV[7])
return 1
"""

LEASES_RENEW = """
-- Renew many leases of one owner at once (a per_key service's round): compare each value,
-- *replace* its TTL.
-- KEYS[1..] -> the lease keys
-- ARGV[1] -> the owner's value
-- ARGV[2] -> lease TTL in ms
-- Returns: per key, 1 if renewed, 0 if it is not (or no longer) the owner's.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

LEASES_TAKE = """
-- Take many free leases for one owner at once.
-- KEYS[1..] -> the lease keys
-- ARGV[1] -> the owner's value
-- ARGV[2] -> lease TTL in ms
-- Returns: per key, 1 if taken, 0 if someone holds it.
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
end
return out
"""

LEASE_RELEASE = """
-- Release a lease (a mutex, a per_key service lease) only if it still holds the caller's value.
-- KEYS[1] -> the lease key
-- ARGV[1] -> value held by the caller
-- Returns: 1 if released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

BROADCAST = """
-- Append a message to a broadcast topic's stream, numbered one above the newest entry's
-- sequence (the newest entry always survives the cap, so numbers never repeat while the
-- stream exists), and cap the stream at ARGV[1] entries (exact MAXLEN: small streams). The
-- entry id is every reader's cursor; XREAD BLOCK on the stream is the wake-up.
-- KEYS[1] -> the topic's stream
-- ARGV[1] -> history: entries kept (MAXLEN)
-- ARGV[2] -> origin: the sender's instance id (or a client's id)
-- ARGV[3] -> chain: comma-separated topics whose handlers caused this message ("" if none)
-- ARGV[4] -> payload (serialized {"data": ...})
-- An entry whose seq is not a whole number (not written here) is passed over: the number
-- follows the newest valid one among the kept entries.
-- Returns: {entry id, sequence number}.
local function seq_of(entry)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'seq' then
      local n = tonumber(fields[i + 1])
      if n and n >= 0 and n < 2 ^ 53 and n == math.floor(n) then
        return n
      end
    end
  end
  return nil
end
local seq = 1
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if newest[1] and not seq_of(newest[1]) then
  newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])
end
for _, entry in ipairs(newest) do
  local n = seq_of(entry)
  if n then
    seq = n + 1
    break
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*',
  'seq', seq, 'origin', ARGV[2], 'chain', ARGV[3], 'data', ARGV[4])
return {id, seq}
"""

BOOT = """
-- The dataset's boot marker: read it, or create it when missing (a fresh or emptied Redis).
-- KEYS[1] -> boot marker
-- ARGV[1] -> candidate marker "<random id>:<created ms>"
-- Returns: {marker, 1 if created now else 0}.
local v = redis.call('GET', KEYS[1])
if v then
  return {v, 0}
end
redis.call('SET', KEYS[1], ARGV[1])
return {ARGV[1], 1}
"""

# ---------------------------------------------------------------------------------------------
# The consumer: claiming and finishing jobs in batches, on arq's records
# ---------------------------------------------------------------------------------------------

#: Most due jobs held by someone else one CLAIM reads past (bounds the script's run time): only
#: more than that many running under arq's own Workers at a queue's head hold back the rest.
CLAIM_SKIPS = 1000

CLAIM = """
-- Claim up to ARGV[2] due jobs for one consumer, from its queues in priority order (the first
-- queue is drained before the next is read): per job an in-progress marker holding the
-- caller's claim token (SET NX: a job claimed by anyone else, arq's own Worker included, is
-- skipped, and the claim reads on past it: skipped jobs never use up the limit; at most
-- CLAIM_SKIPS of them per call), its try counter incremented, and at most ARGV[6] + 1 bytes of
-- its payload (a larger payload is reported by its size and never read whole). A marker with
-- no TTL is stale (arq's Worker and this script always set one): the claim takes it over. A
-- marker with more left than ARGV[4] (longer than any job of the app can run) is cut down to
-- ARGV[4]. Claimed jobs stay in their queue but are parked at the marker's expiry (ARGV[1] +
-- ARGV[4]): the next claim reads only claimable ids, and a job whose consumer died with nobody
-- to reap it becomes due again when its marker expires (arq's own fallback). Claimed ids join
-- the caller's holds set in the same step, so orphan recovery knows them from the first
-- instant. Per-job errors (a record of the wrong type) are reported, never fail the batch; so
-- is a job id whose keys the caller's Redis user may not touch (outside its ACL key patterns:
-- taken off the queue, never touched, like an id outside the app's Cluster slot).
-- KEYS[1] -> the caller's holds set
-- KEYS[2] -> the app's abort sorted set
-- KEYS[3..] -> the queues, highest priority first
-- ARGV[1] -> now ms (jobs scored at or below are due)
-- ARGV[2] -> most jobs to claim
-- ARGV[3] -> claim token "<instance id>/<sequence>"
-- ARGV[4] -> in-progress marker TTL in ms (the app's longest job timeout + 10 s)
-- ARGV[5] -> holds set TTL in ms
-- ARGV[6] -> largest payload to read, bytes
-- ARGV[7] -> arq job key prefix
-- ARGV[8] -> arq in-progress key prefix
-- ARGV[9] -> arq retry key prefix
-- ARGV[10] -> retry counter TTL in ms
-- ARGV[11] -> the hash tag every job id must start with ("{app}": Redis Cluster, where a job's
--             keys must share the app's slot), or "" for no check
-- Returns: {pending abort requests, stale markers taken over or cut down, then per claimed
-- job: id, score, try (-1: the counter is unusable), payload (a string) or its size (a number:
-- 0 missing, -1 wrong type, -2 an id outside the app's hash slot or ACL key patterns, taken
-- off the queue and never touched, else too big), the index of its queue in KEYS}
local out = {redis.call('ZCARD', KEYS[2]), 0}
local claimed = {}
local left = tonumber(ARGV[2])
local max = tonumber(ARGV[6])
local ttl = tonumber(ARGV[4])
local park = tonumber(ARGV[1]) + ttl
local tag = ARGV[11] or ''
local skips = CLAIM_SKIPS
local function foreign(q, id, score)
  redis.call('ZREM', KEYS[q], id)
  left = left - 1
  out[#out + 1] = id
  out[#out + 1] = score
  out[#out + 1] = -1
  out[#out + 1] = -2
  out[#out + 1] = q
end
local function denied(err)
  local text = type(err) == 'table' and tostring(err.err) or tostring(err)
  return string.find(text, 'ACL', 1, true) or string.find(text, 'NOPERM', 1, true)
    or string.find(text, 'ermission', 1, true)
end
for q = 3, #KEYS do
  if left <= 0 or skips <= 0 then
    break
  end
  local offset = 0
  while left > 0 and skips > 0 do
    local due = redis.call(
      'ZRANGEBYSCORE', KEYS[q], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', offset, left)
    if #due == 0 then
      break
    end
    local parked = {}
    for i = 1, #due, 2 do
      local id = due[i]
      local mine = false
      if tag ~= '' and string.sub(id, 1, #tag) ~= tag then
        -- its job keys live in another slot: reading them would fail the whole script
        foreign(q, id, due[i + 1])
      else
        local marker = ARGV[8] .. id
        local ok, set = pcall(redis.call, 'SET', marker, ARGV[3], 'NX', 'PX', ttl)
        if not ok then
          if not denied(set) then
            error(set)
          end
          foreign(q, id, due[i + 1])
        elseif set then
          mine = true
        else
          local pttl = redis.call('PTTL', marker)
          if pttl == -1 then
            redis.call('SET', marker, ARGV[3], 'XX', 'PX', ttl)
            out[2] = out[2] + 1
            mine = true
          else
            if pttl > ttl then
              redis.call('PEXPIRE', marker, ttl)
              out[2] = out[2] + 1
            end
            offset = offset + 1
            skips = skips - 1
          end
        end
      end
      if mine then
        claimed[#claimed + 1] = id
        parked[#parked + 1] = park
        parked[#parked + 1] = id
        left = left - 1
        local ok, try = pcall(redis.call, 'INCR', ARGV[9] .. id)
        if not ok then
          try = -1
        elseif try == 1 then
          redis.call('PEXPIRE', ARGV[9] .. id, ARGV[10])
        end
        local okp, payload = pcall(redis.call, 'GETRANGE', ARGV[7] .. id, 0, max)
        if not okp then
          payload = -1
        elseif #payload == 0 then
          payload = 0
        elseif #payload > max then
          payload = redis.call('STRLEN', ARGV[7] .. id)
        end
        out[#out + 1] = id
        out[#out + 1] = due[i + 1]
        out[#out + 1] = try
        out[#out + 1] = payload
        out[#out + 1] = q
      end
    end
    if #parked > 0 then
      redis.call('ZADD', KEYS[q], 'XX', unpack(parked))
    end
  end
end
if #claimed > 0 then
  redis.call('SADD', KEYS[1], unpack(claimed))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return out
""".replace("CLAIM_SKIPS", str(CLAIM_SKIPS))

FINISH = """
-- Finish a batch of job runs, each only while the caller's claim holds (the in-progress marker
-- still equals its claim token): a run whose job was handed to another consumer meanwhile (it
-- was reaped after a pause) writes nothing. "done" (succeeded) and "failed" (will not run
-- again): keep the result (if any), delete the job, its try counter and marker, take it off its
-- queue, and count it in its queue's per-minute counters (one HINCRBY per queue and outcome per
-- batch). "retry": drop the marker and put the job back at the given score (its original one,
-- or later when deferred) so it runs again; "defer" does the same and also gives back the try
-- the claim counted (the job did not run: a cluster-wide limit was reached). Either way the id
-- leaves the caller's holds set.
-- KEYS[1] -> the caller's holds set
-- KEYS[2] -> arq abort sorted set
-- KEYS[3..2+n] -> the queues the jobs are in
-- KEYS[3+n..2+2n] -> each queue's throughput hash for the current hour (same order)
-- ARGV[1] -> arq job key prefix
-- ARGV[2] -> arq in-progress key prefix
-- ARGV[3] -> arq retry key prefix
-- ARGV[4] -> arq result key prefix
-- ARGV[5] -> wake channel (a job put back is announced like a new one)
-- ARGV[6] -> the current minute (epoch ms // 60000): the counters' field prefix
-- ARGV[7] -> n, the number of queues
-- ARGV[8] -> the counters' TTL in ms
-- ARGV[9..] -> groups of six: op ("done" | "failed" | "retry" | "defer"), job id, claim token,
--              result payload ("" for none) or the score to run again at, result TTL in ms (""
--              for none), the index of the job's queue in KEYS
-- Returns: {done, retried, refused (claim lost)} ("done" counts failed runs too)
local done, retried, refused = 0, 0, 0
local ids, dels = {}, {}
local finished = {}
local counts = {}
local earliest = nil
for i = 9, #ARGV, 6 do
  local op, id, token, data, ttl = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local q = tonumber(ARGV[i + 5])
  local queue = KEYS[q]
  ids[#ids + 1] = id
  if redis.call('GET', ARGV[2] .. id) ~= token then
    refused = refused + 1
  elseif op == 'done' or op == 'failed' then
    if data ~= '' then
      redis.call('SET', ARGV[4] .. id, data, 'PX', ttl)
    end
    dels[#dels + 1] = ARGV[1] .. id
    dels[#dels + 1] = ARGV[2] .. id
    dels[#dels + 1] = ARGV[3] .. id
    finished[queue] = finished[queue] or {}
    table.insert(finished[queue], id)
    counts[q] = counts[q] or {done = 0, failed = 0}
    counts[q][op] = counts[q][op] + 1
    done = done + 1
  else
    dels[#dels + 1] = ARGV[2] .. id
    if op == 'defer' then
      redis.call('DECR', ARGV[3] .. id)
    end
    if data ~= '' then
      redis.call('ZADD', queue, 'XX', data, id)
      if earliest == nil or tonumber(data) < earliest then
        earliest = tonumber(data)
      end
    end
    retried = retried + 1
  end
end
if #dels > 0 then
  redis.call('DEL', unpack(dels))
end
local aborts = redis.call('ZCARD', KEYS[2]) > 0
for queue, gone in pairs(finished) do
  redis.call('ZREM', queue, unpack(gone))
  if aborts then
    redis.call('ZREM', KEYS[2], unpack(gone))
  end
end
local n = tonumber(ARGV[7])
for q, c in pairs(counts) do
  local stats = KEYS[q + n]
  for outcome, count in pairs(c) do
    if count > 0 then
      redis.call('HINCRBY', stats, ARGV[6] .. ':' .. outcome, count)
    end
  end
  redis.call('PEXPIRE', stats, ARGV[8])
end
if #ids > 0 then
  redis.call('SREM', KEYS[1], unpack(ids))
end
if earliest ~= nil then
  redis.call('PUBLISH', ARGV[5], string.format('%d', earliest))
end
return {done, retried, refused}
"""

DEAD_ADD = """
-- Set a job aside in the bounded dead-letter set; the oldest entries beyond the cap go.
-- KEYS[1] -> dead-letter sorted set (job id -> time set aside)
-- KEYS[2] -> dead-letter records hash (job id -> JSON)
-- KEYS[3] -> dead-letter index hash (job id -> JSON without the payload: listings read it)
-- ARGV[1] -> job id
-- ARGV[2] -> record (JSON)
-- ARGV[3] -> now ms
-- ARGV[4] -> most entries kept
-- ARGV[5] -> the record without its payload (JSON)
-- Returns: how many old entries were dropped.
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[4])
if over <= 0 then
  return 0
end
-- the oldest, never the entry just added (entries of the same millisecond sort by id)
local old = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, over)) do
  if id ~= ARGV[1] and #old < over then
    old[#old + 1] = id
  end
end
redis.call('ZREM', KEYS[1], unpack(old))
redis.call('HDEL', KEYS[2], unpack(old))
redis.call('HDEL', KEYS[3], unpack(old))
return #old
"""

# ---------------------------------------------------------------------------------------------
# Cluster-wide limits (worker.limits)
# ---------------------------------------------------------------------------------------------

SLOT_TAKE = """
-- Take a concurrency slot for a run: slots whose lease expired (a dead holder) are dropped
-- first; a run already holding one keeps it (renewed).
-- KEYS[1] -> the task's slots sorted set (job id -> lease expiry ms)
-- ARGV[1] -> job id
-- ARGV[2] -> now ms
-- ARGV[3] -> lease expiry ms
-- ARGV[4] -> most slots
-- Returns: 0 when taken, else ms until the earliest slot's lease ends (at least 1).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 0
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(first[2]) - tonumber(ARGV[2]))
"""

RATE_TAKE = """
-- One start under a rate limit (generic cell rate algorithm): N per period, bursts up to N.
-- KEYS[1] -> the task's theoretical arrival time (ms)
-- ARGV[1] -> now ms
-- ARGV[2] -> emission interval ms (period / N)
-- ARGV[3] -> burst tolerance ms (period - interval)
-- Returns: 0 when allowed (and counted), else ms to wait.
local now = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or ARGV[1])
if tat < now then
  tat = now
end
local wait = tat - tonumber(ARGV[3]) - now
if wait > 0 then
  return math.ceil(wait)
end
local nxt = tat + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', math.ceil(nxt - now) + 1000)
return 0
"""
