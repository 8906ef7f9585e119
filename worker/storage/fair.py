"""Fair queues on Redis: a fair task's jobs wait per flow key and are taken round-robin.

A job of a fair task (``@app.task(fair=True)``) does not go into its queue at enqueue: it waits
in its flow key's own queue, ``<prefix>fair:<queue>:<flow key>`` (job id -> due ms: FIFO within
the key), and the key joins the queue's ring, ``<prefix>fair:<queue>`` (flow key -> pass). A
consumer serving the queue moves jobs into the queue proper, as many as it has free slots, one
at a time from the ring's key of lowest pass whose first job is due (stride scheduling: each
move adds 1 / the key's weight to its pass; a key joins at the ring's lowest pass), and claims
them there as any job (``CLAIM``): from then on a job is an ordinary one (its claim, retries,
deferrals, finish, orphan recovery and cancel are unchanged). Every key lives under the queue
shard's prefix (one Cluster slot per shard); a job's shard is its flow key's unless its
``shard_key`` or ``unique_key`` names another. arq's own workers never see a job before it is
moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.core.ids import paused_queue
from worker.storage.base import StoreBase, _s

#: Most ring entries with nothing due one ``FAIR_MOVE`` passes over (bounds its run time:
#: flow keys holding only deferred jobs).
FAIR_SKIPS = 100

#: Run by :meth:`FairOps.fair_move` (below).
FAIR_MOVE = """
-- Move up to ARGV[2] due jobs of a fair queue from its flow keys' queues into the queue proper
-- (at their due time in whole ms: FAIR_ENQUEUE orders a key's ties by fractions), round-robin:
-- each from the ring's flow key of lowest pass whose first job is due, whose pass then grows by
-- 1 / its weight. A flow key whose queue is empty leaves the ring; one with nothing due yet is
-- passed over (at most FAIR_SKIPS per call). Jobs already due in the queue proper count against
-- ARGV[2] (it never holds more than a claim's worth of moved jobs waiting). A paused queue (its
-- entry or "queue:*" in the paused set) moves none.
-- KEYS[1] -> the queue
-- KEYS[2] -> its ring
-- KEYS[3] -> the paused set
-- ARGV[1] -> now ms
-- ARGV[2] -> most jobs to have due in the queue (the caller's free slots)
-- ARGV[3] -> the queue's entry in the paused set ("queue:<name>")
-- ARGV[4] -> flow queue key prefix ("<ring>:")
-- ARGV[5..] -> flow key, weight pairs (a flow key not named weighs 1)
-- Returns: jobs moved
local paused = redis.call('SMISMEMBER', KEYS[3], 'queue:*', ARGV[3])
if paused[1] == 1 or paused[2] == 1 then
  return 0
end
local now = tonumber(ARGV[1])
local want = tonumber(ARGV[2]) - redis.call('ZCOUNT', KEYS[1], '-inf', now)
local weights = {}
for i = 5, #ARGV, 2 do
  weights[ARGV[i]] = tonumber(ARGV[i + 1])
end
local moved, skipped = 0, 0
while moved < want and skipped < FAIR_SKIPS do
  local head = redis.call('ZRANGE', KEYS[2], skipped, skipped)
  if #head == 0 then
    break
  end
  local key = head[1]
  local flow = ARGV[4] .. key
  local first = redis.call('ZRANGE', flow, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', KEYS[2], key)
  elseif tonumber(first[2]) > now then
    skipped = skipped + 1
  else
    redis.call('ZREM', flow, first[1])
    redis.call('ZADD', KEYS[1], string.format('%d', math.floor(tonumber(first[2]))), first[1])
    moved = moved + 1
    if redis.call('EXISTS', flow) == 0 then
      redis.call('ZREM', KEYS[2], key)
    else
      redis.call('ZINCRBY', KEYS[2], 1 / (weights[key] or 1), key)
    end
  end
end
return moved
""".replace("FAIR_SKIPS", str(FAIR_SKIPS))


@dataclass(frozen=True)
class FlowBacklog:
    """One flow key of a fair queue: the jobs waiting in its queue (not yet moved)."""

    flow_key: str
    jobs: int


class FairOps(StoreBase):
    """Fair queues: move jobs round-robin from their flow keys' queues, read the backlog (the
    enqueue is :meth:`~worker.storage.enqueue.EnqueueOps.fair_enqueue`)."""

    async def fair_move(
        self, queue: str, now_ms: int, most: int, weights: Mapping[str, int] | None = None
    ) -> int:
        """Move up to ``most`` due jobs of fair ``queue`` into it, round-robin across its flow
        keys (see ``fair.FAIR_MOVE``); how many. Not durable by itself: the ``CLAIM`` that
        follows is, and a move lost in a failover leaves the job in its flow key's queue."""
        ring = self.keys.fair(queue)
        flat = [x for kv in (weights or {}).items() for x in kv]
        moved = await self._script(FAIR_MOVE)(
            keys=[self.keys.queue_of(queue), ring, self.keys.paused],
            args=[now_ms, most, paused_queue(queue), f"{ring}:", *flat],
        )
        return int(moved)

    async def fair_waiting(self, queues: Sequence[str]) -> bool:
        """Whether any of fair ``queues`` has a flow key with jobs not yet moved (one
        ``EXISTS`` of the rings): what an idle consumer looks at besides its queues' heads."""
        if not queues:
            return False
        return bool(await self.redis.exists(*(self.keys.fair(q) for q in queues)))

    async def fair_backlog(self, queue: str, most: int = 20) -> tuple[int, list[FlowBacklog]]:
        """Fair ``queue``'s active flow keys (how many) and the backlog of up to ``most`` of
        them, in ring order (next served first): ``ZCARD``/``ZRANGE`` of the ring, one ``ZCARD``
        per key shown, one round trip each."""
        ring = self.keys.fair(queue)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(ring)
            pipe.zrange(ring, 0, most - 1)
            active, names = await pipe.execute()
        flows = [_s(n) for n in names]
        if not flows:
            return int(active), []
        async with self.redis.pipeline(transaction=False) as pipe:
            for f in flows:
                pipe.zcard(self.keys.fair(queue, f))
            counts = await pipe.execute()
        return int(active), [FlowBacklog(f, int(c)) for f, c in zip(flows, counts, strict=True)]
