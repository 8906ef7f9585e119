"""The outbox relay's Redis side: the leader's fenced move of committed outbox rows into the
queues (see :mod:`worker.outbox` and :mod:`worker.duties.outbox`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from worker.storage import keys as K
from worker.storage.fenced import FENCE, FencedBase
from worker.storage.jobs import NewJob

#: How long a moved row's job id is remembered (``<prefix>outbox:moved``): a row relayed
#: again within it (its delete after the move was lost, a deposed relay) is not a second
#: job, even when the first one ended and its result is gone.
MOVED_KEEP_MS = 24 * 3600 * 1000

#: Run by :meth:`FencedOutboxOps.relay_outbox` (below).
RELAY_OUTBOX = (
    """
-- Fenced. Move outbox rows into their queues, each as an arq job with the id its row names,
-- unless that id was moved before (within MOVED_KEEP_MS) or has a job or a result; remember
-- each moved id, forget those moved longer ago than the keep, wake idle consumers.
-- KEYS[1] -> leader lock
-- KEYS[2] -> moved ids (sorted set: job id -> ms it was moved)
-- KEYS[3] -> wake marker
-- KEYS[4..] -> the queues the jobs go to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix, ARGV[3] -> arq result key prefix
-- ARGV[4] -> wake channel
-- ARGV[5] -> now (ms), ARGV[6] -> how long moved ids are kept (ms)
-- ARGV[7 + 5k ..] -> job k: queue index in KEYS, id, job key TTL ms, score (ms), payload
-- Returns: per job 1 if moved now, 0 if it was moved before or its id exists.
"""
    + FENCE
    + """
local now = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[6]))
local out = {}
local earliest = nil
for i = 7, #ARGV, 5 do
  local id = ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[2], id)
      or redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
    out[#out + 1] = 0
  else
    local score = ARGV[i + 3]
    redis.call('SET', ARGV[2] .. id, ARGV[i + 4], 'PX', ARGV[i + 2])
    redis.call('ZADD', KEYS[tonumber(ARGV[i])], score, id)
    redis.call('ZADD', KEYS[2], now, id)
    if earliest == nil or tonumber(score) < tonumber(earliest) then
      earliest = score
    end
    out[#out + 1] = 1
  end
end
if earliest ~= nil then
  redis.call('PUBLISH', ARGV[4], '+' .. earliest)
  redis.call('ZADD', KEYS[3], 'LT', earliest, 'wake')
end
return out
"""
)


class OutboxJob(NamedTuple):
    """One row's job: the record, the queue it waits in and its job key's TTL."""

    job: NewJob
    queue: str
    ttl_ms: int


class FencedOutboxOps(FencedBase):
    """The relay's one write: outbox rows into the queues, under the lease."""

    @property
    def outbox_moved(self) -> str:
        """Sorted set: job id -> ms its outbox row was moved, kept :data:`MOVED_KEEP_MS`."""
        return f"{self.keys.prefix}outbox:moved"

    async def relay_outbox(self, jobs: Sequence[OutboxJob], now_ms: int) -> list[bool]:
        """Write each job unless its id was moved before or exists, in one fenced script
        call; per job whether it was written now. Done only once Redis confirmed it: with a
        WAIT policy the replicas too (:class:`NotReplicated` otherwise; a retry of the same
        rows cannot duplicate them). A lease no longer this process's raises
        :class:`LeadershipLost` and writes nothing."""
        if not jobs:
            return []
        queues: dict[str, int] = {}
        args: list[str | int | bytes] = [
            K.ARQ_JOB, K.ARQ_RESULT, self.keys.wake, now_ms, MOVED_KEEP_MS
        ]  # fmt: skip
        for q in jobs:
            index = queues.setdefault(self.keys.queue_of(q.queue), len(queues) + 4)
            args += [index, q.job.job_id, q.ttl_ms, q.job.score_ms, q.job.payload]
        keys = [self.outbox_moved, self.keys.wake_marker, *queues]
        out = await self._run(RELAY_OUTBOX, keys, args)
        written = [bool(x) for x in out]
        if not all(written):
            await self.store.confirm("outbox relay (an id exists)")  # the one holding it
        return written
