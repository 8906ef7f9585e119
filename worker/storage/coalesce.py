"""Coalesced enqueues on Redis: enqueues of one key folded into few runs (``COALESCE``), and
the start gates: ``keep_last``'s one run at a time per key (``KEEP_LAST_ADMIT``), ``throttle``'s
one start per key and period (``THROTTLE_ADMIT``).

A key's state is one hash, :meth:`Keys.coalesce` (in the job's queue shard, so in its Cluster
slot): ``p`` the pending job (the last one enqueued for the key), ``f`` when its debounce
began (ms), ``t`` the end of the throttle period (ms), ``r`` the ``keep_last`` job that runs or
ran last, ``s`` / ``sj`` the last ``throttle`` start (ms) and its job. A job is *pending* while
it is in its queue, its record is there and no consumer holds it (no in-progress marker): CLAIM
sets the marker and reads the record in one step, so a record replaced while the job is
pending is the one that runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.core.flow import Coalesce
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s

#: ``COALESCE``'s answers: a new job, the pending one (its record replaced), or dropped.
NEW, FOLDED, DROPPED = 1, 2, 0


@dataclass(frozen=True)
class Coalesced:
    """What one coalesced enqueue did: ``NEW`` (``job_id`` enqueued), ``FOLDED`` (into the
    pending ``job_id``) or ``DROPPED`` (throttled: ``job_id`` is ``None``)."""

    code: int
    job_id: str | None


#: Run by :meth:`CoalesceOps.coalesce_enqueue` (below).
COALESCE = """
-- One enqueue of a coalescing key, in its mode. "replace" / "keep_last": a pending job of the
-- key gets the new record (its due time kept); else the new job is enqueued. "debounce": the
-- pending job gets the new record and is due ARGV[10] ms from now, but no later than ARGV[11]
-- ms after the enqueue that made it; else a new job, due so. "throttle": dropped while the
-- period an accepted enqueue opened lasts (ARGV[12] ms), else the new job is enqueued and
-- opens the next one. A new job is written, queued and announced as UNIQUE_ENQUEUE does.
-- KEYS[1] -> arq queue
-- KEYS[2] -> wake marker
-- KEYS[3] -> the key's state hash (Keys.coalesce)
-- ARGV[1] -> mode: replace | debounce | throttle | keep_last
-- ARGV[2] -> the new job's id
-- ARGV[3] -> arq job key prefix
-- ARGV[4] -> arq in-progress key prefix
-- ARGV[5] -> a record's TTL past its due time, ms
-- ARGV[6] -> now ms (the server's clock)
-- ARGV[7] -> the due time the call asked for, ms
-- ARGV[8] -> serialized arq job
-- ARGV[9] -> wake channel
-- ARGV[10] -> debounce ms
-- ARGV[11] -> most wait ms after the first enqueue (-1: none)
-- ARGV[12] -> throttle period ms
-- Returns: {1, new id} | {2, the pending job's id} | {0, ""} (dropped)
local mode, now, due = ARGV[1], tonumber(ARGV[6]), tonumber(ARGV[7])
local function pending()
  local id = redis.call('HGET', KEYS[3], 'p')
  if id and redis.call('ZSCORE', KEYS[1], id) and redis.call('EXISTS', ARGV[4] .. id) == 0
      and redis.call('EXISTS', ARGV[3] .. id) == 1 then
    return id
  end
  return nil
end
local function keep(ms)
  if redis.call('PTTL', KEYS[3]) < ms then
    redis.call('PEXPIRE', KEYS[3], ms)
  end
end
local function write(id, score)
  local ttl = tonumber(ARGV[5]) + math.max(0, score - now)
  redis.call('SET', ARGV[3] .. id, ARGV[8], 'PX', ttl)
  keep(ttl + tonumber(ARGV[12]))
end
local function enqueue(score)
  local id = ARGV[2]
  write(id, score)
  redis.call('ZADD', KEYS[1], score, id)
  redis.call('ZADD', KEYS[2], 'LT', score, 'wake')
  redis.call('PUBLISH', ARGV[9], '+' .. string.format('%d', score))
  redis.call('HSET', KEYS[3], 'p', id)
  return {1, id}
end
if mode == 'throttle' then
  if now < tonumber(redis.call('HGET', KEYS[3], 't') or '0') then
    return {0, ''}
  end
  redis.call('HSET', KEYS[3], 't', string.format('%d', now + tonumber(ARGV[12])))
  return enqueue(due)
end
local id = pending()
if mode == 'debounce' then
  local first = now
  if id then
    first = tonumber(redis.call('HGET', KEYS[3], 'f') or now)
  end
  local score = now + tonumber(ARGV[10])
  if tonumber(ARGV[11]) >= 0 then
    score = math.min(score, first + tonumber(ARGV[11]))
  end
  if id then
    write(id, score)
    redis.call('ZADD', KEYS[1], 'XX', score, id)
    return {2, id}
  end
  redis.call('HSET', KEYS[3], 'f', string.format('%d', now))
  return enqueue(score)
end
if id then
  write(id, tonumber(redis.call('ZSCORE', KEYS[1], id)))
  return {2, id}
end
return enqueue(due)
"""

#: Run by :meth:`CoalesceOps.keep_last_admit` (below).
KEEP_LAST_ADMIT = """
-- May a keep_last job start? Not while another job of its key runs (the one last admitted,
-- whose in-progress marker still exists: a consumer that died holds it until its claim is
-- reaped or expires); else it becomes the one that runs.
-- KEYS[1] -> the key's state hash (Keys.coalesce)
-- ARGV[1] -> arq in-progress key prefix
-- ARGV[2] -> the job's id
-- ARGV[3] -> the state's least TTL, ms
-- Returns: 1 (start it) or 0 (another runs: wait)
local running = redis.call('HGET', KEYS[1], 'r')
if running and running ~= ARGV[2] and redis.call('EXISTS', ARGV[1] .. running) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'r', ARGV[2])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
"""


#: Run by :meth:`CoalesceOps.throttle_admit` (below).
THROTTLE_ADMIT = """
-- May a throttled job start? Not before the period since the key's last start is over (unless
-- it is that start's own job, run again); else it is the key's last start.
-- KEYS[1] -> the key's state hash (Keys.coalesce)
-- ARGV[1] -> now ms (the server's clock)
-- ARGV[2] -> the period, ms
-- ARGV[3] -> the job's id
-- ARGV[4] -> the state's least TTL, ms
-- Returns: 0 (start it) or the time (ms) it may start at
local now = tonumber(ARGV[1])
local last = tonumber(redis.call('HGET', KEYS[1], 's') or '')
if last and now < last + tonumber(ARGV[2]) and redis.call('HGET', KEYS[1], 'sj') ~= ARGV[3] then
  return last + tonumber(ARGV[2])
end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'sj', ARGV[3])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return 0
"""


class CoalesceOps(StoreBase):
    """Coalesced enqueues and the start gates of ``keep_last`` and ``throttle``."""

    async def coalesce_enqueue(
        self,
        how: Coalesce,
        state_key: str,
        job_id: str,
        payload: bytes,
        *,
        now_ms: int,
        due_ms: int,
        ttl_ms: int,
        queue: str = K.DEFAULT_QUEUE,
    ) -> Coalesced:
        """Enqueue one job of a coalescing key (``Keys.coalesce``) as ``how`` says (see
        ``coalesce.COALESCE``); with a WAIT policy, acknowledged as ``unique_enqueue`` is."""
        max_wait = -1 if how.max_wait_s == float("inf") else round(how.max_wait_s * 1000)
        (code, jid), acked = await self._eval(
            self._script(COALESCE),
            [self.keys.queue_of(queue), self.keys.wake_marker, state_key],
            [
                how.mode,
                job_id,
                K.ARQ_JOB,
                K.ARQ_IN_PROGRESS,
                ttl_ms,
                now_ms,
                due_ms,
                payload,
                self.keys.wake,
                round(how.debounce_s * 1000),
                max_wait,
                round(how.throttle_s * 1000),
            ],
            probe=True,
        )
        if not self.replicated(acked):
            raise self._short("coalesced enqueue", acked)
        return Coalesced(int(code), _s(jid) if int(code) != DROPPED else None)

    async def keep_last_admit(self, state_key: str, job_id: str, ttl_ms: int) -> bool:
        """Whether a ``keep_last`` job may start now: no other job of its key runs (see
        ``coalesce.KEEP_LAST_ADMIT``)."""
        ok, _ = await self._eval(
            self._script(KEEP_LAST_ADMIT), [state_key], [K.ARQ_IN_PROGRESS, job_id, ttl_ms]
        )
        return bool(ok)

    async def throttle_admit(
        self, state_key: str, job_id: str, now_ms: int, period_ms: int, ttl_ms: int
    ) -> int | None:
        """``None`` when a ``throttle`` job may start now, else the time (ms) it may start at
        (see ``coalesce.THROTTLE_ADMIT``)."""
        at, _ = await self._eval(
            self._script(THROTTLE_ADMIT), [state_key], [now_ms, period_ms, job_id, ttl_ms]
        )
        return int(at) or None
