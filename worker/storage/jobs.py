"""A job's records on Redis: the unique enqueue, the batched finish, queue heads, payloads."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.storage import keys as K
from worker.storage.base import StoreBase, _s, _score


@dataclass(frozen=True)
class NewJob:
    """An arq job record to write: its id, serialized payload and (for ticks) its score."""

    job_id: str
    payload: bytes
    score_ms: int = 0


@dataclass(slots=True)  # one per run: not frozen, whose __init__ costs 3x
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
    #: ``failed`` only: the failure record (JSON, see :meth:`Keys.failure`) and its TTL
    failure: bytes | None = None
    failure_ttl_ms: int = 0
    #: ``done``/``failed``: the task the app defines ("" for none: not counted per task) and
    #: the run's time in ms, for the per-task counters
    task: str = ""
    run_ms: int = 0


@dataclass(frozen=True)
class Retention:
    """How many recent job ends FINISH keeps indexed: ``failures`` entries of
    :attr:`Keys.failures`, none older than ``failures_ms``; ``done`` of :attr:`Keys.done`."""

    failures: int = 1000
    failures_ms: int = 86_400_000
    done: int = 1000


#: The defaults of the ``WORKER_FAILURES_KEEP*`` / ``WORKER_DONE_KEEP`` settings.
DEFAULT_RETENTION = Retention()


@dataclass(frozen=True)
class FinishOutcome:
    done: int
    retried: int
    refused: int
    #: confirmed by the replicas the WAIT policy requires (else: send the runs again)
    replicated: bool = True


#: Run by :meth:`JobOps.unique_enqueue` (below).
UNIQUE_ENQUEUE = """
-- Enqueue an arq job unless a job or result with the same id exists (what arq's enqueue_job
-- does with WATCH/MULTI, in one round trip).
-- KEYS[1] -> arq queue
-- KEYS[2] -> wake marker (one idle consumer takes it: the earliest due time, ZADD LT)
-- ARGV[1] -> job id
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq result key prefix
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> score (due time, ms)
-- ARGV[6] -> serialized arq job
-- ARGV[7] -> wake channel (consumers of earlier versions hear the due time, '+' marked)
-- Returns: 1 if enqueued, 0 if the id exists.
if redis.call('EXISTS', ARGV[2] .. ARGV[1], ARGV[3] .. ARGV[1]) > 0 then
  return 0
end
redis.call('SET', ARGV[2] .. ARGV[1], ARGV[6], 'PX', ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[5], ARGV[1])
redis.call('ZADD', KEYS[2], 'LT', ARGV[5], 'wake')
redis.call('PUBLISH', ARGV[7], '+' .. ARGV[5])
return 1
"""


#: FINISH's statistics: ``count_end`` counts a finished run in its queue's per-minute
#: throughput and its task's counters; ``write_counts`` writes the batch's counts.
FINISH_STATISTICS = (
    """
-- Statistics, per batch. Per queue: one HINCRBY per outcome in the minute, one PEXPIRE. Per
-- task: one HINCRBY per outcome in the minute, one for the summed run time and one per
-- run-time bucket met in the 10-minute slot, one PEXPIRE.
local BUCKETS = {"""
    + ", ".join(str(b) for b in K.TASK_BUCKETS_MS)
    + """}
local function bucket(run_ms)
  for k, bound in ipairs(BUCKETS) do
    if run_ms <= bound then
      return k
    end
  end
  return #BUCKETS + 1
end
local counts, tasks = {}, {}
local function count_end(q, op, task, run_ms)
  counts[q] = counts[q] or {done = 0, failed = 0}
  counts[q][op] = counts[q][op] + 1
  if task ~= '' then
    local t = tasks[task] or {d = 0, f = 0, ms = 0, b = {}}
    tasks[task] = t
    run_ms = math.max(tonumber(run_ms) or 0, 0)
    if op == 'done' then t.d = t.d + 1 else t.f = t.f + 1 end
    t.ms = t.ms + run_ms
    local k = bucket(run_ms)
    t.b[k] = (t.b[k] or 0) + 1
  end
end
local function write_counts()
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
  if next(tasks) == nil then
    return
  end
  local per_task = KEYS[5 + 2 * n]
  local slot = 's' .. math.floor(tonumber(ARGV[6]) / 10) .. ':'
  for name, t in pairs(tasks) do
    for kind, count in pairs({d = t.d, f = t.f}) do
      if count > 0 then
        redis.call('HINCRBY', per_task, ARGV[6] .. ':' .. name .. ':' .. kind, count)
      end
    end
    redis.call('HINCRBY', per_task, slot .. name .. ':ms', t.ms)
    for k, count in pairs(t.b) do
      redis.call('HINCRBY', per_task, slot .. name .. ':' .. k, count)
    end
  end
  redis.call('PEXPIRE', per_task, ARGV[8])
end
"""
)

#: FINISH's retention of the recent completions (``keep_completions``) and failures
#: (``keep_failures``, their records deleted with them).
FINISH_RETENTION = """
-- Retention. The recent completions keep the ARGV[11] newest; the recent failures lose those
-- older than ARGV[13] ms, then the oldest beyond ARGV[12], their records deleted with them: at
-- most TRIM_MAX more than the batch adds, each way (a call costs what its batch brings).
local TRIM_MAX = 1000
local function forget_failures(ids)
  if #ids == 0 then
    return
  end
  local records = {}
  for i, id in ipairs(ids) do
    records[i] = ARGV[10] .. id
  end
  redis.call('DEL', unpack(records))
  redis.call('ZREM', KEYS[4], unpack(ids))
end
local function keep_completions()
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[11]) + 1))
end
local function keep_failures(now, added)
  local most = TRIM_MAX + added
  local oldest = string.format('(%d', tonumber(now) - tonumber(ARGV[13]))
  forget_failures(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', oldest, 'LIMIT', 0, most))
  local excess = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[12])
  if excess > 0 then
    forget_failures(redis.call('ZRANGE', KEYS[4], 0, math.min(excess, most) - 1))
  end
end
"""

#: FINISH's indexes: ``index_ends`` adds the batch's completions (``succeeded``) and failures
#: (``failed``) to the recent ones, then applies :data:`FINISH_RETENTION`.
FINISH_INDEXES = """
-- Indexes. A "done" id joins the recent completions, a "failed" one with a failure record the
-- recent failures, scored now (one ZADD per CHUNK ids), each index then trimmed (retention).
local CHUNK = 1000
local succeeded, failed = {}, {}
local function zadd(key, ids, score)
  for i = 1, #ids, CHUNK do
    local args = {}
    for j = i, math.min(i + CHUNK - 1, #ids) do
      args[#args + 1] = score
      args[#args + 1] = ids[j]
    end
    redis.call('ZADD', key, unpack(args))
  end
end
local function index_ends(now)
  if #succeeded > 0 then
    zadd(KEYS[3], succeeded, now)
    keep_completions()
  end
  if #failed > 0 then
    zadd(KEYS[4], failed, now)
    keep_failures(now, #failed)
  end
end
"""

#: FINISH's transitions: each run's end while its claim holds, then the batch's deletions and
#: queue removals in one call each.
FINISH_TRANSITIONS = """
-- Transitions. A run whose marker no longer holds its token is refused (nothing written).
-- "done" / "failed": the result kept (if any), a failure record kept (PX) and noted for the
-- index, the job, marker and try counter deleted, off its queue (and the abort requests),
-- counted. "retry" / "defer": the marker deleted, the job back at the given score ("" for
-- where it is; the earliest is announced: per kind of queue, 1 a queue, 2 a duty lane), "defer"
-- giving back its try.
local done, retried, refused = 0, 0, 0
local ids, dels = {}, {}
local finished = {}
local earliest = {}
for i = 14, #ARGV, 10 do
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
    if op == 'done' then
      succeeded[#succeeded + 1] = id
    elseif ARGV[i + 6] ~= '' then
      redis.call('SET', ARGV[10] .. id, ARGV[i + 6], 'PX', ARGV[i + 7])
      failed[#failed + 1] = id
    end
    dels[#dels + 1] = ARGV[1] .. id
    dels[#dels + 1] = ARGV[2] .. id
    dels[#dels + 1] = ARGV[3] .. id
    finished[queue] = finished[queue] or {}
    table.insert(finished[queue], id)
    count_end(q, op, ARGV[i + 8], ARGV[i + 9])
    done = done + 1
  else
    dels[#dels + 1] = ARGV[2] .. id
    if op == 'defer' then
      redis.call('DECR', ARGV[3] .. id)
    end
    if data ~= '' then
      redis.call('ZADD', queue, 'XX', data, id)
      local lane = string.sub(queue, -5) == ':duty' and 2 or 1
      if earliest[lane] == nil or tonumber(data) < earliest[lane] then
        earliest[lane] = tonumber(data)
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
"""

#: Run by :meth:`JobOps.finish` (below): :data:`FINISH_TRANSITIONS`, then
#: :data:`FINISH_INDEXES` (with :data:`FINISH_RETENTION`) and :data:`FINISH_STATISTICS`.
FINISH = (
    """
-- Finish a batch of job runs, each only while the caller's claim holds (the in-progress marker
-- still equals its claim token): a run whose job was handed to another consumer meanwhile (it
-- was reaped after a pause) writes nothing. "done" (succeeded) and "failed" (will not run
-- again): keep the result (if any), delete the job, its try counter and marker, take it off its
-- queue, and count it in its queue's per-minute counters (one HINCRBY per queue and outcome per
-- batch). A "done" id joins the recent completions (one ZADD and one trim by rank per batch);
-- a "failed" run with a failure record keeps it (PX) and joins the recent failures, which are
-- then trimmed by age and by count, the trimmed ids' records deleted with them (at most
-- TRIM_MAX more than the batch adds, each way: a call costs what its batch brings). "retry":
-- drop the marker and put the job back at the given score (its original one, or later when
-- deferred) so it runs again; "defer" does the same and also gives back the try the claim
-- counted (the job did not run: a cluster-wide limit was reached). Either way the id leaves
-- the caller's holds set.
-- KEYS[1] -> the caller's holds set
-- KEYS[2] -> arq abort sorted set
-- KEYS[3] -> recent completions (sorted set: id -> finished ms)
-- KEYS[4] -> recent failures (sorted set: id -> finished ms)
-- KEYS[5..4+n] -> the queues the jobs are in
-- KEYS[5+n..4+2n] -> each queue's throughput hash for the current hour (same order)
-- KEYS[5+2n] -> the per-task counters' hash for the current hour (Keys.task_stats)
-- KEYS[6+2n], KEYS[7+2n] -> the wake marker, the duty lanes' marker (a job put back is
--                          announced like a new one: one consumer takes it, ZADD LT)
-- ARGV[1] -> arq job key prefix
-- ARGV[2] -> arq in-progress key prefix
-- ARGV[3] -> arq retry key prefix
-- ARGV[4] -> arq result key prefix
-- ARGV[5] -> wake channel (consumers of earlier versions hear a job put back, '+' marked)
-- ARGV[6] -> the current minute (epoch ms // 60000): the counters' field prefix
-- ARGV[7] -> n, the number of queues
-- ARGV[8] -> the counters' TTL in ms
-- ARGV[9] -> now (epoch ms): the score of the recent completions and failures
-- ARGV[10] -> failure record key prefix
-- ARGV[11] -> recent completions kept
-- ARGV[12] -> recent failures kept
-- ARGV[13] -> recent failures' age limit in ms
-- ARGV[14..] -> groups of ten: op ("done" | "failed" | "retry" | "defer"), job id, claim
--              token, result payload ("" for none) or the score to run again at, result TTL in
--              ms ("" for none), the index of the job's queue in KEYS, failure record ("" for
--              none), its TTL in ms, task ("" for none: not counted per task), run time in ms
-- Returns: {done, retried, refused (claim lost)} ("done" counts failed runs too)
"""
    + FINISH_STATISTICS
    + FINISH_RETENTION
    + FINISH_INDEXES
    + FINISH_TRANSITIONS
    + """
index_ends(ARGV[9])
write_counts()
if #ids > 0 then
  redis.call('SREM', KEYS[1], unpack(ids))
end
for lane, due in pairs(earliest) do
  redis.call('ZADD', KEYS[#KEYS - 2 + lane], 'LT', due, 'wake')
end
if earliest[1] ~= nil then
  redis.call('PUBLISH', ARGV[5], '+' .. string.format('%d', earliest[1]))
end
return {done, retried, refused}
"""
)


class JobOps(StoreBase):
    """A job's records: the unique enqueue, the batched finish, queue heads, payloads."""

    async def unique_enqueue(self, job: NewJob, ttl_ms: int, queue: str = K.DEFAULT_QUEUE) -> bool:
        """Write an arq job into ``queue`` unless its id is taken (queued, running or kept).

        With a WAIT policy the answer is acknowledged: ``True`` once the replicas have the job,
        ``False`` once they have the job that holds the id; :class:`NotReplicated` otherwise."""
        ok, acked = await self._eval(
            self._script(UNIQUE_ENQUEUE),
            [self.keys.queue_of(queue), self.keys.wake_marker],
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

    async def finish(
        self,
        instance_id: str,
        runs: Sequence[Finish],
        *,
        now_ms: int,
        resend: bool = False,
        retention: Retention = DEFAULT_RETENTION,
    ) -> FinishOutcome:
        """Finish runs whose claims still hold, counting finished runs per queue in the
        minute of ``now_ms``, indexing the completions and failures (kept as ``retention``
        says; see ``jobs.FINISH``). ``resend``: these runs were sent before without a
        confirmation (they may have been applied: the probe makes the ``WAIT`` measure now)."""
        queues: list[str] = []
        groups: list[Any] = []
        for f in runs:
            failure: Any = ""
            failure_ttl: Any = ""
            if f.op in ("done", "failed"):
                data: Any = f.result if f.result is not None else ""
                ttl: Any = f.result_ttl_ms if f.result is not None else ""
                if f.op == "failed" and f.failure is not None:
                    failure, failure_ttl = f.failure, max(f.failure_ttl_ms, 1)
            else:
                data, ttl = ("" if f.score_ms is None else f.score_ms), ""
            if f.queue not in queues:
                queues.append(f.queue)
            q = queues.index(f.queue) + 5
            task = f.task if f.op in ("done", "failed") else ""
            groups += [f.op, f.job_id, f.token, data, ttl, q, failure, failure_ttl, task, f.run_ms]
        minute, hour = now_ms // 60_000, now_ms // 3_600_000
        args: list[Any] = [
            K.ARQ_JOB, K.ARQ_IN_PROGRESS, K.ARQ_RETRY, K.ARQ_RESULT, self.keys.wake,
            minute, len(queues), K.STATS_TTL_MS, now_ms, self.keys.failure(""),
            retention.done, retention.failures, retention.failures_ms, *groups,
        ]  # fmt: skip
        (done, retried, refused), acked = await self._eval(
            self._script(FINISH),
            [
                self.keys.holds(instance_id),
                self.keys.abort,
                self.keys.done,
                self.keys.failures,
                *(self.keys.queue_of(q) for q in queues),
                *(self.keys.stats(q, hour) for q in queues),
                self.keys.task_stats(hour),
                self.keys.wake_marker,
                self.keys.wake_duty_marker,
            ],
            args,
            probe=resend,
        )
        return FinishOutcome(int(done), int(retried), int(refused), self.replicated(acked))

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

    async def pop_due(self, queue: str, now_ms: int) -> tuple[str, bytes | None] | None:
        """Take the first job due at ``now_ms`` off ``queue`` with its record (what the test
        harness runs inline): ``(job id, its payload or None)``, ``None`` when none is due."""
        key = self.keys.queue_of(queue)
        due = await self.redis.zrangebyscore(key, "-inf", now_ms, 0, 1)
        if not due:
            return None
        job_id = _s(due[0])
        await self.redis.zrem(key, job_id)
        raw = await self.redis.get(K.ARQ_JOB + job_id)
        await self.redis.delete(K.ARQ_JOB + job_id)
        return job_id, (bytes(raw) if raw is not None else None)

    async def job_payload(self, job_id: str) -> bytes | None:
        raw = await self.redis.get(K.ARQ_JOB + job_id)
        return bytes(raw) if raw is not None else None

    async def set_health(self, instance_id: str, text: str, ttl_ms: int) -> None:
        """arq's health-check record, one key per instance
        (github.com/python-arq/arq/issues/291)."""
        await self.redis.set(self.keys.arq_health(instance_id), text, px=ttl_ms)

    async def clear_health(self, instance_id: str) -> None:
        await self.redis.delete(self.keys.arq_health(instance_id))
