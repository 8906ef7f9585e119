"""Cluster-wide limits on Redis: a task's concurrency slots and its rate."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from worker.storage.base import StoreBase

#: Run by :meth:`LimitOps.take_slot` (below).
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


#: Run by :meth:`LimitOps.take_rate` (below).
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


class LimitOps(StoreBase):
    """Cluster-wide concurrency slots and rate limits of tasks, and of one flow key of a task
    (``flow``: ``max_concurrency_per_key``, ``rate_per_key``)."""

    async def take_slot(
        self, task: str, job_id: str, now_ms: int, lease_ms: int, most: int, flow: str | None = None
    ) -> int:
        """Take (or keep) a concurrency slot of ``task`` (of its flow key ``flow``): 0, or ms
        until one may free up."""
        wait = await self._script(SLOT_TAKE)(
            keys=[self.keys.limit_slots(task, flow)],
            args=[job_id, now_ms, now_ms + lease_ms, most],
        )
        return int(wait)

    async def renew_slots(
        self, slots: Mapping[tuple[str, str | None], Sequence[str]], until_ms: int
    ) -> None:
        """Extend the leases of the slots held ((task, flow key or None) -> job ids) to
        ``until_ms``."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for (task, flow), job_ids in slots.items():
                key = self.keys.limit_slots(task, flow)
                pipe.zadd(key, dict.fromkeys(job_ids, until_ms), xx=True)
            await pipe.execute()

    async def release_slot(self, task: str, job_id: str, flow: str | None = None) -> None:
        await self.redis.zrem(self.keys.limit_slots(task, flow), job_id)

    async def take_rate(
        self, task: str, now_ms: int, jobs: int, per_s: float, flow: str | None = None
    ) -> int:
        """Count one start under ``jobs`` per ``per_s`` (of flow key ``flow``): 0, or ms to wait."""
        interval = per_s * 1000 / jobs
        wait = await self._script(RATE_TAKE)(
            keys=[self.keys.limit_rate(task, flow)],
            args=[now_ms, interval, per_s * 1000 - interval],
        )
        return int(wait)
