"""Dead letters on Redis: set aside, listed, read, re-queued, forgotten."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from worker.storage import keys as K
from worker.storage.base import StoreBase, _object, _s
from worker.storage.replies import members

#: Run by :meth:`DeadOps.add_dead` (below).
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


#: Run by :meth:`DeadOps.dead_retry` (below).
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


class DeadOps(StoreBase):
    """Dead letters: set aside, list, read, re-queue, forget."""

    async def add_dead(
        self, job_id: str, record: Mapping[str, Any], at_ms: int, max_entries: int
    ) -> int:
        """Set a job aside (its record, and the record without ``payload_b64`` in the index
        listings read); returns how many of the oldest entries the cap dropped."""
        index = {k: v for k, v in record.items() if k != "payload_b64"}
        dropped = await self._script(DEAD_ADD)(
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
        ids = members(await self.redis.zrevrange(self.keys.dead, offset, offset + limit - 1))
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
            self._script(DEAD_RETRY),
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

    async def dead_count(self) -> int:
        return int(await self.redis.zcard(self.keys.dead))
