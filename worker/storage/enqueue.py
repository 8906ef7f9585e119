"""The batched unique enqueue: many arq jobs written in one script call (``enqueue_many``;
fair tasks' jobs into their flow keys' queues, :mod:`worker.storage.fair`),
and the queue heads the leader reads to find jobs a producer wrote without an announcement (a
plain arq client: the record and a ``ZADD``; the announcement is :mod:`worker.storage.wake`'s)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from worker.core import codec
from worker.core.serializer import Serialize
from worker.core.workflow import Ready, parents_value, step_job_id
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s, _score
from worker.storage.jobs import NewJob

#: A batch's announcement, shared by both scripts below: ``announce(channel, score)`` publishes
#: each distinct due time once ('+' marked, for consumers of earlier versions) and keeps the
#: earliest; ``wake(marker)`` puts the earliest on the wake marker (one ``ZADD LT``).
ANNOUNCE = """
local published, earliest = {}, nil
local function announce(channel, score)
  if not published[score] then
    published[score] = true
    redis.call('PUBLISH', channel, '+' .. score)
    if earliest == nil or tonumber(score) < tonumber(earliest) then
      earliest = score
    end
  end
end
local function wake(marker)
  if earliest ~= nil then
    redis.call('ZADD', marker, 'LT', earliest, 'wake')
  end
end
"""

#: Run by :meth:`EnqueueOps.enqueue_batch` (below).
ENQUEUE_MANY = (
    ANNOUNCE
    + """
-- Enqueue a batch of arq jobs, each unless a job or result with its id exists (what
-- UNIQUE_ENQUEUE does for one): a later job of the batch with an id an earlier one took is
-- refused like one already in Redis. The earliest due time of the jobs written goes to the wake
-- marker (one ZADD LT: one idle consumer takes it), and each distinct due time is published
-- once, '+' marked, on the wake channel for consumers of earlier versions (a batch due now:
-- one PUBLISH).
-- KEYS    -> the arq queues the jobs go to (job i names its queue by index), then last the
--            wake marker
-- ARGV[1] -> arq job key prefix
-- ARGV[2] -> arq result key prefix
-- ARGV[3] -> wake channel
-- ARGV[4 + 5k ..] -> job k: queue index (1-based), id, job key TTL ms, score (ms), payload
-- Returns: per job 1 if enqueued, 0 if its id exists.
local out = {}
for i = 4, #ARGV, 5 do
  local id = ARGV[i + 1]
  if redis.call('EXISTS', ARGV[1] .. id, ARGV[2] .. id) > 0 then
    out[#out + 1] = 0
  else
    local score = ARGV[i + 3]
    redis.call('SET', ARGV[1] .. id, ARGV[i + 4], 'PX', ARGV[i + 2])
    redis.call('ZADD', KEYS[tonumber(ARGV[i])], score, id)
    announce(ARGV[3], score)
    out[#out + 1] = 1
  end
end
wake(KEYS[#KEYS])
return out
"""
)


#: Run by :meth:`EnqueueOps.fair_enqueue` (below); see :mod:`worker.storage.fair`.
FAIR_ENQUEUE = (
    ANNOUNCE
    + """
-- Enqueue a batch of fair tasks' jobs, each unless a job or result with its id exists (as
-- ENQUEUE_MANY): the job waits in its flow key's queue, scored by its due time, and the flow key
-- joins the ring at the ring's lowest pass unless it is there already. The earliest due time
-- written goes to the wake marker (ZADD LT) and each distinct one is published once.
-- KEYS    -> the rings and flow queues the jobs name (by index), then last the wake marker
-- ARGV[1] -> arq job key prefix
-- ARGV[2] -> arq result key prefix
-- ARGV[3] -> wake channel
-- ARGV[4 + 7k ..] -> job k: ring index, flow queue index, flow key, id, job key TTL ms,
--                    score (ms), payload
-- Returns: per job 1 if enqueued, 0 if its id exists.
-- A job due in the same millisecond as the flow queue's last one is scored 1/1024 ms after it
-- (FIFO within a key; ids would order ties), up to 1,024 such jobs a millisecond.
local function after(flow, score)
  local last = redis.call('ZRANGE', flow, -1, -1, 'WITHSCORES')
  local at = tonumber(last[2] or '-1')
  if at >= score and at + 1 / 1024 < score + 1 then
    score = at + 1 / 1024
  end
  return string.format('%.17g', score)
end
local out = {}
for i = 4, #ARGV, 7 do
  local id = ARGV[i + 3]
  if redis.call('EXISTS', ARGV[1] .. id, ARGV[2] .. id) > 0 then
    out[#out + 1] = 0
  else
    local ring, flow, score = KEYS[tonumber(ARGV[i])], KEYS[tonumber(ARGV[i + 1])], ARGV[i + 5]
    redis.call('SET', ARGV[1] .. id, ARGV[i + 6], 'PX', ARGV[i + 4])
    redis.call('ZADD', flow, after(flow, tonumber(score)), id)
    if not redis.call('ZSCORE', ring, ARGV[i + 2]) then
      local low = redis.call('ZRANGE', ring, 0, 0, 'WITHSCORES')
      redis.call('ZADD', ring, low[2] or 0, ARGV[i + 2])
    end
    announce(ARGV[3], score)
    out[#out + 1] = 1
  end
end
wake(KEYS[#KEYS])
return out
"""
)


@dataclass(frozen=True)
class QueuedJob:
    """One job of a batch: the record, the queue it waits in and its job key's TTL; ``flow``:
    a fair task's job, its flow key ("" for none): it waits in that key's flow queue."""

    job: NewJob
    queue: str
    ttl_ms: int
    flow: str | None = None


class EnqueueOps(StoreBase):
    """The batched unique enqueue (one round trip per batch)."""

    async def enqueue_batch(self, batch: Sequence[QueuedJob]) -> list[bool]:
        """Write each job of ``batch`` unless its id is taken (queued, running, kept, or by an
        earlier job of the batch), in one script call; per job whether it was written.

        With a WAIT policy one ``WAIT`` covers the batch (and, when an id was taken, the job
        that holds it); :class:`NotReplicated` when too few replicas confirm."""
        if not batch:
            return []
        queues: dict[str, int] = {}
        args: list[str | int | bytes] = [K.ARQ_JOB, K.ARQ_RESULT, self.keys.wake]
        for q in batch:
            index = queues.setdefault(self.keys.queue_of(q.queue), len(queues) + 1)
            args += [index, q.job.job_id, q.ttl_ms, q.job.score_ms, q.job.payload]
        keys = [*queues, self.keys.wake_marker]
        out, acked = await self._eval(self._script(ENQUEUE_MANY), keys, args)
        written = [bool(x) for x in out]
        if not all(written) and self.replication.enabled:
            await self.confirm("enqueue (an id exists)")
        elif not self.replicated(acked):
            raise self._short("enqueue", acked)
        return written

    async def fair_enqueue(self, batch: Sequence[QueuedJob]) -> list[bool]:
        """Write each fair job of ``batch`` (``flow`` set) into its flow key's queue unless its
        id is taken, in one script call; per job whether it was written (as
        :meth:`enqueue_batch`, WAIT policy included)."""
        if not batch:
            return []
        index: dict[str, int] = {}
        args: list[str | int | bytes] = [K.ARQ_JOB, K.ARQ_RESULT, self.keys.wake]
        for q in batch:
            flow = q.flow or ""
            ring = index.setdefault(self.keys.fair(q.queue), len(index) + 1)
            mine = index.setdefault(self.keys.fair(q.queue, flow), len(index) + 1)
            args += [ring, mine, flow, q.job.job_id, q.ttl_ms, q.job.score_ms, q.job.payload]
        out, acked = await self._eval(
            self._script(FAIR_ENQUEUE), [*index, self.keys.wake_marker], args
        )
        written = [bool(x) for x in out]
        if not all(written) and self.replication.enabled:
            await self.confirm("enqueue (an id exists)")
        elif not self.replicated(acked):
            raise self._short("enqueue", acked)
        return written

    async def heads(self, queues: Sequence[str]) -> list[tuple[str, int] | None]:
        """Per queue its first job, ``(id, score ms)``, ``None`` when empty (or only never-due
        entries): one ``ZRANGE`` per queue in one round trip (claimed jobs are parked at
        their claim's expiry, so a head due long ago is one nobody took)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zrange(self.keys.queue_of(q), 0, 0, withscores=True)
            raw = await pipe.execute()
        out: list[tuple[str, int] | None] = []
        for q, head in zip(queues, raw, strict=True):
            score = _score(self.keys.queue_of(q), head[0][0], head[0][1]) if head else None
            out.append((_s(head[0][0]), score) if head and score is not None else None)
        return out

    async def enqueue_steps(
        self, workflow_id: str, steps: Sequence[Ready], now_ms: int, serialize: Serialize,
        expires_ms: int, context_steps: frozenset[str] = frozenset(),
    ) -> list[bool]:  # fmt: skip
        """Enqueue workflow steps under their deterministic ids (a repeat writes nothing): each
        given its parents' results first (one, or the list), or in its record's
        ``wf_parents`` when its task takes them through ``ctx.parents`` (in
        ``context_steps``)."""
        jobs = []
        for s in steps:
            args, extra = s.args, None
            if s.parents:
                value = parents_value(s.many, s.parents)
                if s.function in context_steps:
                    extra = {"wf_parents": value}
                else:
                    args = (value, *args)
            payload = codec.encode_job(s.function, args, s.kwargs, now_ms, serialize, extra=extra)
            jid = step_job_id(self.keys.prefix, workflow_id, s.index)
            jobs.append(QueuedJob(NewJob(jid, payload, now_ms), s.queue, expires_ms))
        return await self.enqueue_batch(jobs)


async def send_chunk(batch: Sequence[tuple[EnqueueOps, QueuedJob]]) -> list[str | None]:
    """``enqueue_many``'s chunk: each shard's part in one script call (the shards at once, a
    fair task's jobs apart: they go to their flow queues); per job its id, or ``None`` when
    its id was taken."""
    parts: dict[tuple[int, bool], tuple[EnqueueOps, list[int]]] = {}
    for i, (store, q) in enumerate(batch):
        parts.setdefault((id(store), q.flow is not None), (store, []))[1].append(i)
    written = await asyncio.gather(
        *(
            (s.fair_enqueue if fair else s.enqueue_batch)([batch[i][1] for i in idx])
            for (_, fair), (s, idx) in parts.items()
        )
    )
    out: list[str | None] = [None] * len(batch)
    for (_, idx), oks in zip(parts.values(), written, strict=True):
        for i, ok in zip(idx, oks, strict=True):
            out[i] = batch[i][1].job.job_id if ok else None
    return out
