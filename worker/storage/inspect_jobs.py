"""What the jobs listing and a job's detail read on Redis (bounded pages of a queue, the
records of a page's jobs in one round trip, the running ids) and the two job actions' writes:
cancelling a job that has not started, running an ended one again.

Every read here costs what it returns: a page is one ``ZRANGEBYSCORE … LIMIT`` (or
``ZREVRANGEBYSCORE``) and one pipeline of ``MGET``\\ s over the page's ids; nothing scans a
whole queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.storage import keys as K
from worker.storage.base import StoreBase, _object, _s, _score
from worker.storage.replies import scored


@dataclass(frozen=True)
class JobRecord:
    """arq's records of one job as they are now: its payload (``None``: gone), its claim
    marker (``None``: not running), its try counter and, when asked for, its result."""

    job_id: str
    payload: bytes | None
    marker: str | None
    tries: int | None
    result: bytes | None = None
    #: read in part (``head_bytes``): each record's whole size and its last bytes (``None``
    #: when read whole); ``payload`` and ``result`` are then its first bytes
    payload_size: int | None = None
    payload_tail: bytes | None = None
    result_size: int | None = None
    result_tail: bytes | None = None

    @property
    def payload_cut(self) -> bool:
        """Whether ``payload`` is only the head of a longer record."""
        return self.payload is not None and (self.payload_size or 0) > len(self.payload)

    @property
    def result_cut(self) -> bool:
        """Whether ``result`` is only the head of a longer record."""
        return self.result is not None and (self.result_size or 0) > len(self.result)


@dataclass(frozen=True)
class JobPlace:
    """Where a job id is: the queue holding it and its score (``None``: in no queue), whether
    an abort was asked for it, and its dead letter's time (``None``: not dead)."""

    queue: str | None
    score_ms: int | None
    abort_ms: int | None
    dead_ms: int | None


#: Run by :meth:`InspectJobOps.cancel_queued` (below).
CANCEL_QUEUED = """
-- Cancel a job that has not started: when no consumer holds its claim marker and a queue holds
-- it, take it off the queue, delete its record and try counter, and keep the given result
-- (arq's record of a failed run with a CancelledError, as arq writes for a job aborted before
-- it starts). When a consumer holds it (it runs), record an abort request for it instead: the
-- consumer's claim check cancels it. Abort requests older than a day are dropped (a job that
-- ended without its consumer seeing the request leaves one behind).
-- KEYS[1] -> the app's abort sorted set
-- KEYS[2..] -> the queues the job can be in
-- ARGV[1] -> job id
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq in-progress key prefix
-- ARGV[4] -> arq retry key prefix
-- ARGV[5] -> arq result key prefix
-- ARGV[6] -> the result record to keep ("" for none)
-- ARGV[7] -> its TTL in ms
-- ARGV[8] -> now ms
-- Returns: 1 cancelled before it started, 2 running (abort requested), 0 found nowhere
local id = ARGV[1]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[8]) - 86400000)
if redis.call('EXISTS', ARGV[3] .. id) == 1 then
  redis.call('ZADD', KEYS[1], ARGV[8], id)
  return 2
end
for q = 2, #KEYS do
  if redis.call('ZREM', KEYS[q], id) == 1 then
    redis.call('DEL', ARGV[2] .. id, ARGV[4] .. id)
    if ARGV[6] ~= '' then
      redis.call('SET', ARGV[5] .. id, ARGV[6], 'PX', ARGV[7])
    end
    redis.call('ZREM', KEYS[1], id)
    return 1
  end
end
return 0
"""


#: Run by :meth:`InspectJobOps.rerun_ended` (below).
RERUN_ENDED = """
-- Run an ended job again under its own id (``job ID --retry``): when it has no record, no claim
-- marker and its result is still kept, delete the result and try counter, write the given job
-- record and make it due now (announced like any enqueue).
-- KEYS[1] -> the queue to run it in
-- ARGV[1] -> job id
-- ARGV[2] -> arq job key prefix
-- ARGV[3] -> arq in-progress key prefix
-- ARGV[4] -> arq retry key prefix
-- ARGV[5] -> arq result key prefix
-- ARGV[6] -> the job record
-- ARGV[7] -> its TTL in ms
-- ARGV[8] -> now ms (its score)
-- ARGV[9] -> wake channel
-- Returns: 1 queued again, 0 live (queued or running), -1 no result left to run it from
local id = ARGV[1]
if redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
  return 0
end
if redis.call('DEL', ARGV[5] .. id) == 0 then
  return -1
end
redis.call('DEL', ARGV[4] .. id)
redis.call('SET', ARGV[2] .. id, ARGV[6], 'PX', ARGV[7])
redis.call('ZADD', KEYS[1], ARGV[8], id)
redis.call('PUBLISH', ARGV[9], ARGV[8])
return 1
"""


Part = tuple[bytes | None, int | None, bytes | None]


def _records(raw: list[Any], kind: int, n: int, head: int | None, tail: int) -> list[Part]:
    """Each job's record of the ``kind``-th record kind out of a :meth:`job_records` reply:
    ``(bytes, size, tail)`` (whole: ``(bytes, None, None)``; absent: all ``None``)."""
    if head is None:
        return [
            (bytes(v), None, None) if v is not None else (None, None, None) for v in raw[2 + kind]
        ]
    out: list[Part] = []
    base = 2 + kind * n * 3
    for i in range(n):
        first, size, last = raw[base + 3 * i : base + 3 * i + 3]
        if not size:
            out.append((None, None, None))  # absent (an empty record is none either)
            continue
        cut = int(size) > len(first)
        out.append((bytes(first), int(size), bytes(last) if cut and tail else None))
    return out


class InspectJobOps(StoreBase):
    """Bounded reads of jobs for the listing and the detail; cancelling a job not started and
    running an ended one again."""

    async def queue_entries(
        self,
        queue: str,
        *,
        low: float | str,
        high: float | str,
        offset: int,
        count: int,
        newest_first: bool = False,
    ) -> list[tuple[str, int]]:
        """Up to ``count`` ids of ``queue`` scored in ``[low, high]`` after skipping ``offset``
        of them, with their scores (ms): one ``ZRANGEBYSCORE … LIMIT`` (``newest_first``:
        ``ZREVRANGEBYSCORE``, ``high`` first)."""
        key = self.keys.queue_of(queue)
        if newest_first:
            raw = await self.redis.zrevrangebyscore(
                key, high, low, start=offset, num=count, withscores=True
            )
        else:
            raw = await self.redis.zrangebyscore(
                key, low, high, start=offset, num=count, withscores=True
            )
        out = []
        for member, score in scored(raw):
            s = _score(key, member, score)
            out.append((_s(member), s if s is not None else 2**62))
        return out

    async def job_records(
        self,
        job_ids: Sequence[str],
        *,
        results: bool = False,
        head_bytes: int | None = None,
        tail_bytes: int = 0,
    ) -> list[JobRecord]:
        """arq's records of ``job_ids`` (payload, claim marker, try counter; ``results``: the
        result too) in one round trip: one ``MGET`` each. ``head_bytes``: read at most that
        many bytes of each payload and result (``GETRANGE``), with its size (``STRLEN``) and
        its last ``tail_bytes`` (when longer than the head): a page of 4 MiB jobs costs a
        few KiB a job, never a whole payload."""
        if not job_ids:
            return []
        kinds = [K.ARQ_JOB, K.ARQ_RESULT] if results else [K.ARQ_JOB]
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.mget([K.ARQ_IN_PROGRESS + j for j in job_ids])
            pipe.mget([K.ARQ_RETRY + j for j in job_ids])
            for kind in kinds:
                if head_bytes is None:
                    pipe.mget([kind + j for j in job_ids])
                    continue
                for j in job_ids:
                    pipe.getrange(kind + j, 0, head_bytes - 1)
                    pipe.strlen(kind + j)
                    pipe.getrange(kind + j, -max(tail_bytes, 1), -1)
            raw = await pipe.execute()
        per = [_records(raw, k, len(job_ids), head_bytes, tail_bytes) for k in range(len(kinds))]
        found = []
        for i, job_id in enumerate(job_ids):
            marker, tries = raw[0][i], raw[1][i]
            payload, size, tail = per[0][i]
            result, rsize, rtail = per[1][i] if results else (None, None, None)
            found.append(
                JobRecord(
                    job_id,
                    payload,
                    _s(marker) if marker is not None else None,
                    int(tries) if tries is not None and _s(tries).lstrip("-").isdigit() else None,
                    result,
                    size,
                    tail,
                    rsize,
                    rtail,
                )
            )
        return found

    async def running_ids(self, instance_ids: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """``(job id, instance id)`` of every job held in ``instance_ids``' holds sets (each
        bounded by its consumer's concurrency), sorted by job id; ``None``: the instances with
        a heartbeat (``<prefix>instances``: no ``SCAN``, so it costs the same however many keys
        Redis holds)."""
        if instance_ids is None:
            instance_ids = [_s(m) for m in await self.redis.zrange(self.keys.instances, 0, -1)]
        if not instance_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in instance_ids:
                pipe.smembers(self.keys.holds(i))
            raw = await pipe.execute()
        return sorted((_s(j), i) for i, ids in zip(instance_ids, raw, strict=True) for j in ids)

    async def dead_page(self, before_ms: int | None, count: int) -> list[tuple[str, int]]:
        """Up to ``count`` dead letters set aside before ``before_ms`` (``None``: any time),
        newest first, with their times: one ``ZREVRANGEBYSCORE … LIMIT``."""
        high: float | str = "+inf" if before_ms is None else f"({before_ms}"
        raw = await self.redis.zrevrangebyscore(
            self.keys.dead, high, "-inf", start=0, num=count, withscores=True
        )
        return [(_s(m), int(s)) for m, s in scored(raw)]

    async def dead_entries(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The dead letters' records without their payloads (one ``HMGET`` of the index)."""
        if not job_ids:
            return []
        raw = await self.redis.hmget(self.keys.dead_index, list(job_ids))
        return [_object(self.keys.dead_index, v) for v in raw]

    async def progress_many(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The last reported progress of each of ``job_ids`` (``None`` where none), one
        ``MGET``."""
        if not job_ids:
            return []
        keys = [self.keys.progress(j) for j in job_ids]
        return [_object(k, v) for k, v in zip(keys, await self.redis.mget(keys), strict=True)]

    async def queues_of(self, job_ids: Sequence[str], queues: Sequence[str]) -> list[str | None]:
        """The queue (of ``queues``) holding each of ``job_ids``, ``None`` where none does: one
        round trip of ``ZMSCORE`` per queue."""
        if not job_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zmscore(self.keys.queue_of(q), list(job_ids))
            raw = await pipe.execute()
        out: list[str | None] = [None] * len(job_ids)
        for q, scores in zip(queues, raw, strict=True):
            for i, s in enumerate(scores):
                if s is not None and out[i] is None:
                    out[i] = q
        return out

    async def job_place(self, job_id: str, queues: Sequence[str]) -> JobPlace:
        """Which of ``queues`` holds ``job_id`` (and its score), its abort request and its
        dead letter's time: one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.zscore(self.keys.queue_of(q), job_id)
            pipe.zscore(self.keys.abort, job_id)
            pipe.zscore(self.keys.dead, job_id)
            raw = await pipe.execute()
        queue, score = None, None
        for q, s in zip(queues, raw, strict=False):
            if s is not None:
                queue, score = q, _score(self.keys.queue_of(q), job_id, s)
                break
        abort, dead = raw[len(queues)], raw[len(queues) + 1]
        return JobPlace(
            queue,
            score,
            int(abort) if abort is not None else None,
            int(dead) if dead is not None else None,
        )

    async def cancel_queued(
        self,
        job_id: str,
        queues: Sequence[str],
        *,
        result: bytes | None,
        result_ttl_ms: int,
        now_ms: int,
    ) -> int:
        """Cancel ``job_id`` (see ``inspect_jobs.CANCEL_QUEUED``): 1 taken off its queue before
        it started (``result`` kept for ``result_ttl_ms``), 2 running (an abort request is
        recorded), 0 found in no queue."""
        out, acked = await self._eval(
            self._script(CANCEL_QUEUED),
            [self.keys.abort, *(self.keys.queue_of(q) for q in queues)],
            [
                job_id,
                K.ARQ_JOB,
                K.ARQ_IN_PROGRESS,
                K.ARQ_RETRY,
                K.ARQ_RESULT,
                result if result is not None else "",
                max(1, result_ttl_ms),
                now_ms,
            ],
        )
        if not self.replicated(acked):
            raise self._short("cancel", acked)
        return int(out)

    async def rerun_ended(
        self, job_id: str, queue: str, payload: bytes, ttl_ms: int, now_ms: int
    ) -> int:
        """Queue an ended job again under its id from ``payload`` (see
        ``inspect_jobs.RERUN_ENDED``): 1 queued, 0 live, -1 its result is gone."""
        out, acked = await self._eval(
            self._script(RERUN_ENDED),
            [self.keys.queue_of(queue)],
            [
                job_id,
                K.ARQ_JOB,
                K.ARQ_IN_PROGRESS,
                K.ARQ_RETRY,
                K.ARQ_RESULT,
                payload,
                ttl_ms,
                now_ms,
                self.keys.wake,
            ],
        )
        if not self.replicated(acked):
            raise self._short("retry", acked)
        return int(out)
