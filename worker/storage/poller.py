"""Pollers' state on Redis: shards of due items, in-flight items, fenced dispatch and sweep."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import Pipeline

from worker.core import malformed as M
from worker.core.jobdefs import is_duty_lane
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s, _score
from worker.storage.fenced import FENCE, FencedBase
from worker.storage.jobs import NewJob


@dataclass(frozen=True)
class DispatchOutcome:
    dispatched: int
    in_flight: int
    duplicate: int
    gone: int


#: Run by :meth:`PollerOps.unschedule_item` (below).
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


#: Run by :meth:`PollerOps.inflight_clear` (below).
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


#: Run by :meth:`PollerOps.poll_requeue` (below).
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


#: Run by :meth:`FencedPollerOps.dispatch` (below).
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
-- KEYS[6] -> wake marker (the duty marker for a duty lane; ZADD LT: one consumer claims)
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq result key prefix
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> now in ms (items scored above it are not due)
-- ARGV[6] -> push-back delay in ms for items still in flight
-- ARGV[7] -> wake channel, '' for none (a duty lane: consumers of earlier versions read none)
-- ARGV[8] -> poller name
-- ARGV[9..] -> triples: item, job id, serialized arq job
-- Returns: {dispatched, still_in_flight, duplicate_ids, no_longer_due}
"""
    + FENCE
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
  redis.call('ZADD', KEYS[6], 'LT', ARGV[5], 'wake')
  if ARGV[7] ~= '' then
    redis.call('PUBLISH', ARGV[7], '+' .. ARGV[5])
  end
end
return {sent, busy, dup, gone}
"""
)


#: Run by :meth:`FencedPollerOps.poll_sweep` (below).
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
    + FENCE
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


class PollerOps(StoreBase):
    """Poller state any process touches: shards, in-flight and removed items."""

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
        return int(await self._script(POLL_UNSCHEDULE)(keys=keys, args=[item, K.ARQ_JOB])) == 1

    async def inflight_clear(self, poller: str, item: str, job_id: str | None) -> bool:
        """Forget ``item``'s in-flight job: the entry equal to ``job_id``, or (``None``) an
        entry whose job no longer exists."""
        keys = [self.keys.poll_inflight(poller), self.keys.poll_removed(poller)]
        done = await self._script(INFLIGHT_CLEAR)(keys=keys, args=[item, job_id or "", K.ARQ_JOB])
        return int(done) == 1

    async def poll_requeue(
        self, shard_key: str, poller: str, item: str, job_id: str, due_ms: int
    ) -> int:
        """Put back an item whose job ``job_id`` failed for good (``poller.POLL_REQUEUE``: 1 put
        back, 0 waiting already, -1 removed by the app, -2 carried by another job)."""
        keys = [shard_key, self.keys.poll_inflight(poller), self.keys.poll_removed(poller)]
        out, acked = await self._eval(
            self._script(POLL_REQUEUE), keys, [item, job_id, due_ms], probe=True
        )
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


class FencedPollerOps(FencedBase):
    """The leader's poller writes: dispatching due items, sweeping ended ones."""

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
        """Move due ``items`` of one shard into ``queue``, one job each (``poller.DISPATCH``)."""
        duty = is_duty_lane(queue)  # on the duty marker alone (no consumer before reads lanes)
        args: list[Any] = [
            K.ARQ_JOB, K.ARQ_RESULT, ttl_ms, now_ms, busy_defer_ms,
            "" if duty else self.keys.wake, poller,
        ]  # fmt: skip
        for item, job in items:
            args += [item, job.job_id, job.payload]
        keys = [
            self.keys.poll_inflight(poller),
            self.keys.queue_of(queue),
            shard_key,
            self.keys.paused,
            self.keys.wake_duty_marker if duty else self.keys.wake_marker,
        ]
        sent, busy, dup, gone = await self._run(DISPATCH, keys, args)
        return DispatchOutcome(int(sent), int(busy), int(dup), int(gone))

    async def poll_sweep(
        self, poller: str, ended: Sequence[tuple[str, str, str]], due_ms: int
    ) -> tuple[int, int]:
        """Put back items (``(item, job id, shard key)``) whose job ended unreported, due at
        ``due_ms`` (``poller.POLL_SWEEP``): ``(put back, forgotten)``."""
        shard_keys: list[str] = []
        args: list[Any] = [K.ARQ_JOB, due_ms]
        for item, job_id, shard_key in ended:
            if shard_key not in shard_keys:
                shard_keys.append(shard_key)
            args += [item, job_id, shard_keys.index(shard_key) + 4]  # after lock, hashes
        keys = [self.keys.poll_inflight(poller), self.keys.poll_removed(poller), *shard_keys]
        back, dropped = await self._run(POLL_SWEEP, keys, args)
        return int(back), int(dropped)
