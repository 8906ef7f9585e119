"""Claims on Redis: a consumer takes due jobs under its token, confirms and releases them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from worker.core.ids import paused_queue
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s, _score

#: Most due jobs held by someone else one CLAIM reads past (bounds the script's run time): only
#: more than that many running under arq's own Workers at a queue's head hold back the rest.
CLAIM_SKIPS = 1000


#: ``Claimed.size`` of a job id outside the app's Redis Cluster hash slot or outside the Redis
#: user's ACL key patterns (see ``claims.CLAIM``).
FOREIGN = -2


@dataclass(slots=True)  # one per job claimed: not frozen, whose __init__ costs 3x
class Claimed:
    """A job this consumer now holds. ``payload`` is ``None`` when it was not read: ``size`` is
    then 0 (missing: the job expired), -1 (not a string), :data:`FOREIGN` (an id outside the
    app's hash slot or its Redis user's key patterns: taken off the queue, not claimed) or its
    size (larger than allowed)."""

    job_id: str
    score_ms: int
    try_: int  # -1: the try counter is unusable
    payload: bytes | None
    size: int
    queue: str = K.DEFAULT_QUEUE
    #: an abort request was pending for it when it was claimed: it must not run
    aborted: bool = False


@dataclass(frozen=True)
class Claims:
    jobs: list[Claimed]
    aborts_pending: int
    #: the claim is confirmed by the replicas the WAIT policy requires: the jobs may run
    replicated: bool = True
    #: in-progress markers found stale (no TTL: taken over; longer than any job: cut down)
    stale: int = 0


#: Run by :meth:`ClaimOps.release_own` (below).
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


#: CLAIM's ids it never touches: ``foreign`` takes an id outside the app's hash slot or its
#: Redis user's key patterns (``denied``) off its queue and reports it (size ``FOREIGN``).
CLAIM_FOREIGN = """
local function foreign(q, id, score)
  redis.call('ZREM', KEYS[q], id)
  left = left - 1
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = id, score, -1, -2, q, 0
end
local function denied(err)
  local text = type(err) == 'table' and tostring(err.err) or tostring(err)
  return string.find(text, 'ACL', 1, true) or string.find(text, 'NOPERM', 1, true)
    or string.find(text, 'ermission', 1, true)
end
"""

#: CLAIM's in-progress marker: ``mark`` sets it under the caller's token (``mine``), takes over
#: a stale one or leaves one someone else holds (``held``, cut down when too long), or finds
#: the id's keys out of the Redis user's reach (``foreign``).
CLAIM_MARKER = """
local function mark(id)
  local marker = ARGV[8] .. id
  local ok, set = pcall(redis.call, 'SET', marker, ARGV[3], 'NX', 'PX', ttl)
  if not ok then
    if not denied(set) then
      error(set)
    end
    return 'foreign'
  elseif set then
    return 'mine'
  end
  local pttl = redis.call('PTTL', marker)
  if pttl == -1 then
    redis.call('SET', marker, ARGV[3], 'XX', 'PX', ttl)
    out[2] = out[2] + 1
    return 'mine'
  end
  if pttl > ttl then
    redis.call('PEXPIRE', marker, ttl)
    out[2] = out[2] + 1
  end
  return 'held'
end
"""

#: CLAIM's read of a claimed job: ``read`` counts the try, reads at most ARGV[6] + 1 bytes of
#: the payload and reports the job (a first try: one ``SET NX PX``, arq's ``INCR`` + ``EXPIRE``).
CLAIM_READ = """
local function read(q, id, score)
  local counter = ARGV[9] .. id
  local ok, try = pcall(redis.call, 'SET', counter, 1, 'NX', 'PX', ARGV[10])
  if ok and try then
    try = 1
  else
    ok, try = pcall(redis.call, 'INCR', counter)
    if not ok then
      try = -1
    elseif try == 1 then
      redis.call('PEXPIRE', counter, ARGV[10])
    end
  end
  local okp, payload = pcall(redis.call, 'GETRANGE', ARGV[7] .. id, 0, max)
  if not okp then
    payload = -1
  elseif #payload == 0 then
    payload = 0
  elseif #payload > max then
    payload = redis.call('STRLEN', ARGV[7] .. id)
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = id, score, try, payload, q
  out[n + 6] = (asked and redis.call('ZSCORE', KEYS[2], id)) and 1 or 0
end
"""

#: CLAIM's round: the queues in priority order (``open``: not paused), due ids read past those
#: held by others (``mark``), each claimed one parked at the marker's expiry (one ``ZADD XX``).
CLAIM_QUEUES = """
for q = 3, #KEYS - 1 do
  if left <= 0 or skips <= 0 then
    break
  end
  local offset = 0
  while open[q] and left > 0 and skips > 0 do
    local due = redis.call(
      'ZRANGEBYSCORE', KEYS[q], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', offset, left)
    if #due == 0 then
      break
    end
    local parked = {}
    for i = 1, #due, 2 do
      local id = due[i]
      -- an id outside the slot: its job keys live in another slot, reading them would fail
      -- the whole script
      local got = 'foreign'
      if tag == '' or string.sub(id, 1, #tag) == tag then
        got = mark(id)
      end
      if got == 'foreign' then
        foreign(q, id, due[i + 1])
      elseif got == 'held' then
        offset = offset + 1
        skips = skips - 1
      else
        claimed[#claimed + 1] = id
        parked[#parked + 1] = park
        parked[#parked + 1] = id
        left = left - 1
        read(q, id, due[i + 1])
      end
    end
    if #parked > 0 then
      redis.call('ZADD', KEYS[q], 'XX', unpack(parked))
    end
  end
end
"""

#: Run by :meth:`ClaimOps.claim` (below): its state, then :data:`CLAIM_FOREIGN`,
#: :data:`CLAIM_MARKER`, :data:`CLAIM_READ`, :data:`CLAIM_QUEUES`, then the holds set.
CLAIM = (
    """
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
-- taken off the queue, never touched, like an id outside the app's Cluster slot). A paused
-- queue (its "queue:<name>" or "queue:*" in the paused set, read once per call) is skipped.
-- KEYS[1] -> the caller's holds set
-- KEYS[2] -> the app's abort sorted set
-- KEYS[3..n-1] -> the queues, highest priority first
-- KEYS[n] -> the paused set
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
-- ARGV[12..] -> the queues' entries in the paused set ("queue:<name>"), as KEYS[3..n-1]
-- Returns: {pending abort requests, stale markers taken over or cut down, then per claimed
-- job: id, score, try (-1: the counter is unusable), payload (a string) or its size (a number:
-- 0 missing, -1 wrong type, -2 an id outside the app's hash slot or ACL key patterns, taken
-- off the queue and never touched, else too big), the index of its queue in KEYS, 1 when an
-- abort request for it is pending (it must not run; ZSCORE only while the set is not empty)
-- else 0}
local out = {redis.call('ZCARD', KEYS[2]), 0}
local asked = out[1] > 0
local claimed = {}
local left = tonumber(ARGV[2])
local max = tonumber(ARGV[6])
local ttl = tonumber(ARGV[4])
local park = tonumber(ARGV[1]) + ttl
local tag = ARGV[11] or ''
local skips = CLAIM_SKIPS
local open = {}
local paused = redis.call('SMISMEMBER', KEYS[#KEYS], 'queue:*', unpack(ARGV, 12))
for q = 3, #KEYS - 1 do
  open[q] = paused[1] == 0 and paused[q - 1] == 0
end
"""
    + CLAIM_FOREIGN
    + CLAIM_MARKER
    + CLAIM_READ
    + CLAIM_QUEUES
    + """
if #claimed > 0 then
  redis.call('SADD', KEYS[1], unpack(claimed))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return out
"""
).replace("CLAIM_SKIPS", str(CLAIM_SKIPS))


class ClaimOps(StoreBase):
    """Claiming due jobs under a token, confirming and releasing claims, abort requests."""

    async def release_own(
        self,
        instance_id: str,
        known: Iterable[str],
        now_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> int:
        """Make the jobs ``instance_id`` holds but does not know about due again (a claim
        whose reply was lost; see ``claims.RELEASE_OWN``): how many. :class:`NotReplicated`
        when the replicas did not confirm it (a failover could bring the claims back)."""
        released, acked = await self._eval(
            self._script(RELEASE_OWN),
            [self.keys.holds(instance_id), *(self.keys.queue_of(q) for q in queues)],
            [K.ARQ_IN_PROGRESS, instance_id, now_ms, self.keys.wake, *known],
            probe=True,
        )
        if not self.replicated(acked):
            raise self._short("release of unknown claims", acked)
        return int(released)

    async def claim(
        self,
        instance_id: str,
        token: str,
        *,
        now_ms: int,
        limit: int,
        in_progress_ttl_ms: int,
        holds_ttl_ms: int,
        max_payload: int,
        retry_ttl_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> Claims:
        """Claim up to ``limit`` due jobs under ``token`` from ``queues``, highest priority
        first, paused ones skipped (see ``claims.CLAIM``)."""
        raw, acked = await self._eval(
            self._script(CLAIM),
            [
                self.keys.holds(instance_id),
                self.keys.abort,
                *(self.keys.queue_of(q) for q in queues),
                self.keys.paused,
            ],
            [
                now_ms,
                limit,
                token,
                in_progress_ttl_ms,
                holds_ttl_ms,
                max_payload,
                K.ARQ_JOB,
                K.ARQ_IN_PROGRESS,
                K.ARQ_RETRY,
                retry_ttl_ms,
                self.keys.slot_tag,
                *(paused_queue(q) for q in queues),
            ],
        )
        jobs, named = [], [(q, self.keys.queue_of(q)) for q in queues]  # index: the reply's - 3
        for i in range(2, len(raw), 6):
            data = raw[i + 3]
            data = data.encode() if isinstance(data, str) else data
            payload = data if isinstance(data, bytes) else None
            size = len(payload) if payload is not None else int(data)
            queue, key = named[int(raw[i + 4]) - 3]
            score = _score(key, raw[i], raw[i + 1]) or 0  # -inf: due
            aborted = bool(int(raw[i + 5]))
            jobs.append(Claimed(_s(raw[i]), score, int(raw[i + 2]), payload, size, queue, aborted))
        return Claims(jobs, int(raw[0]), self.replicated(acked), stale=int(raw[1]))

    async def confirm_claims(self, job_ids: Sequence[str]) -> tuple[list[str | None], bool]:
        """The claim tokens of ``job_ids`` now, and whether the replicas have every write made
        so far (``MGET``, ``INCR probe``, ``WAIT`` in one round trip): claims whose ``CLAIM``
        was not confirmed may run once this confirms them with their tokens unchanged."""
        out, acked = await self._durable(
            lambda p: p.mget([K.ARQ_IN_PROGRESS + j for j in job_ids]), probe=True
        )
        tokens = [None if v is None else _s(v) for v in out[0]]
        return tokens, self.replicated(acked)

    async def claim_tokens(self, job_ids: Sequence[str]) -> list[str | None]:
        """The in-progress marker (claim token) of each job, ``None`` where there is none."""
        if not job_ids:
            return []
        raw = await self.redis.mget([K.ARQ_IN_PROGRESS + j for j in job_ids])
        return [None if v is None else _s(v) for v in raw]

    async def request_abort(self, job_id: str, at_ms: int) -> None:
        """Ask for ``job_id`` to be aborted (``Client.abort``, in ``<prefix>abort``)."""
        await self.redis.zadd(self.keys.abort, {job_id: at_ms})

    async def abort_requests(self, job_ids: Sequence[str]) -> list[str]:
        """Those of ``job_ids`` someone asked to abort (``Client.abort``, ``job ID --cancel``,
        in ``<prefix>abort``): one ``ZMSCORE``, as long as the ids asked about whatever else the
        set holds."""
        if not job_ids:
            return []
        scores = await self.redis.zmscore(self.keys.abort, list(job_ids))
        return [j for j, s in zip(job_ids, scores, strict=True) if s is not None]

    async def claim_check(self, job_ids: Sequence[str]) -> tuple[list[str | None], list[str]]:
        """The claim token of each of ``job_ids`` (``None`` where there is none) and those of
        them with an abort request, in one round trip (``MGET`` and ``ZMSCORE``): what a
        consumer's claim check reads while its jobs run."""
        if not job_ids:
            return [], []
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.mget([K.ARQ_IN_PROGRESS + j for j in job_ids])
            pipe.zmscore(self.keys.abort, list(job_ids))
            tokens, scores = await pipe.execute()
        return (
            [None if v is None else _s(v) for v in tokens],
            [j for j, s in zip(job_ids, scores, strict=True) if s is not None],
        )
