"""Periodic jobs' state on Redis: last ticks, run outcomes, and the leader's fenced tick enqueue."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.core import budget as B
from worker.core import malformed as M
from worker.core.jobdefs import is_duty_lane
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s
from worker.storage.fenced import FENCE, FencedBase
from worker.storage.jobs import NewJob


class DueTicks(NamedTuple):
    """One periodic job's part of an :meth:`FencedStore.enqueue_ticks` call: the newest due
    tick to record (even when the policy skips it), the ticks to enqueue as jobs scored at
    their tick, the queue, and the last tick the caller knows is recorded (-1 if none)."""

    name: str
    advance_to: int
    ticks: Sequence[NewJob]
    queue: str
    known_last: int = -1


@dataclass(frozen=True)
class TickOutcome:
    enqueued: int
    duplicate: int
    skipped: int
    #: Redis's recorded last tick was behind the one the caller knew (it lost confirmed
    #: writes): nothing was written for the job; read the state again and plan anew.
    rolled_back: bool = False


@dataclass(frozen=True)
class PeriodicRuns:
    """How a periodic job's runs ended, cluster-wide: the most recent success and failure
    (``{at_ms, tick_ms, instance[, error]}``) and the end of the first failure since the last
    success."""

    success: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    failing_since_ms: int | None = None


#: Run by :meth:`PeriodicOps.periodic_result` (below).
PERIODIC_RESULT = """
-- Record how a run of a periodic job ended (the consumer that ran it, once per run's end): the
-- most recent success or failure, and since when the job has been failing without a success.
-- KEYS[1] -> periodic results hash
-- ARGV[1] -> job name
-- ARGV[2] -> outcome: "success" or "failure"
-- ARGV[3] -> the record (JSON: at_ms, tick_ms, instance, error)
-- ARGV[4] -> when the run ended (ms)
-- Returns: 1
redis.call('HSET', KEYS[1], ARGV[1] .. ':' .. ARGV[2], ARGV[3])
if ARGV[2] == 'success' then
  redis.call('HDEL', KEYS[1], ARGV[1] .. ':failing_since')
else
  redis.call('HSETNX', KEYS[1], ARGV[1] .. ':failing_since', ARGV[4])
end
return 1
"""


#: Run by :meth:`FencedPeriodicOps.enqueue_ticks` (below).
ENQUEUE_TICKS = (
    """
-- Fenced. Enqueue the due ticks of several periodic jobs in one step (one call per tick
-- instant, whatever the number of jobs): each tick as an arq job with a deterministic id,
-- unless it is at or before the job's recorded last tick, its id already has a job or a
-- result, or the job is paused (its ticks are skipped, not caught up on resume); then record
-- each job's newest due tick (planned: enqueued or skipped) and newest enqueued tick, and wake
-- one consumer (the earliest tick enqueued to the wake marker, ZADD LT).
-- KEYS[1] -> leader lock
-- KEYS[2] -> periodic state hash (name -> newest planned tick ms)
-- KEYS[3] -> paused set ("periodic:<name>", "poller:<name>")
-- KEYS[4] -> enqueued hash (name -> newest tick enqueued as a job, ms)
-- KEYS[5..] -> the queues the jobs go to, then last the wake marker (the duty marker when
--              every queue is a duty lane)
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix ("arq:job:")
-- ARGV[3] -> arq result key prefix ("arq:result:")
-- ARGV[4] -> job key TTL in ms
-- ARGV[5] -> wake channel, '' for none (duty lanes: consumers of earlier versions read none)
-- ARGV[6..] -> per periodic job: name, newest due tick (recorded as last even if the policy
--              skipped it), its queue's index in KEYS, the last tick the caller knows is
--              recorded (-1 if none), n, then n triples (tick ms, job id, serialized arq job),
--              ascending
-- A recorded last tick *below* the one the caller knows means Redis lost writes it had
-- confirmed (a failover to a replica that missed them, with the lease still valid there): the
-- job is left untouched and reported as rolled back, so the caller reads the state again and
-- enqueues the lost ticks per its catch-up policy instead of skipping past them.
-- Returns: per job, in order: enqueued, deduplicated (id existed), skipped (tick <= last),
-- rolled back (1: nothing written for the job, 0 otherwise)
"""
    + FENCE
    + """
local out, records, enqueued_at = {}, {}, {}
local earliest = nil
local i = 6
while i <= #ARGV do
  local name, advance = ARGV[i], tonumber(ARGV[i + 1])
  local queue, known = KEYS[tonumber(ARGV[i + 2])], tonumber(ARGV[i + 3])
  local n = tonumber(ARGV[i + 4])
  local last = tonumber(redis.call('HGET', KEYS[2], name) or '-1')
  local paused = redis.call('SISMEMBER', KEYS[3], 'periodic:' .. name) == 1
  local enqueued, dup, skipped, behind = 0, 0, 0, 0
  local adds = {}
  local todo = n
  if last < known then
    behind, todo = 1, 0
  end
  for j = i + 5, i + 4 + 3 * todo, 3 do
    local tick, id = tonumber(ARGV[j]), ARGV[j + 1]
    if tick <= last or paused then
      skipped = skipped + 1
    elseif redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
      dup = dup + 1
    else
      redis.call('SET', ARGV[2] .. id, ARGV[j + 2], 'PX', ARGV[4])
      adds[#adds + 1] = ARGV[j]
      adds[#adds + 1] = id
      enqueued = enqueued + 1
      if earliest == nil or tick < earliest then
        earliest = tick
      end
    end
  end
  if #adds > 0 then
    redis.call('ZADD', queue, unpack(adds))
    enqueued_at[#enqueued_at + 1] = name
    enqueued_at[#enqueued_at + 1] = adds[#adds - 1]
  end
  if advance > last and behind == 0 then
    records[#records + 1] = name
    records[#records + 1] = string.format('%d', advance)
  end
  out[#out + 1] = enqueued
  out[#out + 1] = dup
  out[#out + 1] = skipped
  out[#out + 1] = behind
  i = i + 5 + 3 * n
end
if earliest ~= nil then
  redis.call('ZADD', KEYS[#KEYS], 'LT', earliest, 'wake')
  if ARGV[5] ~= '' then
    redis.call('PUBLISH', ARGV[5], '+' .. string.format('%d', earliest))
  end
end
if #records > 0 then
  redis.call('HSET', KEYS[2], unpack(records))
end
if #enqueued_at > 0 then
  redis.call('HSET', KEYS[4], unpack(enqueued_at))
end
return out
"""
)


class PeriodicOps(StoreBase):
    """Periodic state any process reads or writes: last ticks and how runs ended."""

    async def periodic_last(self) -> dict[str, int]:
        """The newest planned tick (ms) per periodic job: enqueued or skipped (where the
        enqueuer resumes; see :attr:`Keys.periodic_state`)."""
        raw = await self.redis.hgetall(self.keys.periodic_state)
        return {_s(k): int(v) for k, v in raw.items()}

    async def periodic_enqueued(self) -> dict[str, int]:
        """The newest tick (ms) enqueued as a job per periodic job; a job that never had one
        is absent. A field that is not a whole number is skipped and logged once."""
        raw = await self.redis.hgetall(self.keys.periodic_enqueued)
        out: dict[str, int] = {}
        for k, v in raw.items():
            at = M.time_ms(v)
            if at is None:
                M.skip("periodic tick", self.keys.periodic_enqueued, _s(k), f"not a time: {_s(v)}")
            else:
                out[_s(k)] = at
        return out

    async def periodic_result(
        self, name: str, outcome: str, record: Mapping[str, Any], at_ms: int
    ) -> None:
        """Record how a run of periodic job ``name`` ended (``success`` or ``failure``)."""
        await self._script(PERIODIC_RESULT)(
            keys=[self.keys.periodic_runs], args=[name, outcome, json.dumps(record), at_ms]
        )

    async def periodic_runs(self) -> dict[str, PeriodicRuns]:
        """How the runs of every periodic job ended (see :class:`PeriodicRuns`)."""
        raw = {_s(k): _s(v) for k, v in (await self.redis.hgetall(self.keys.periodic_runs)).items()}
        fields: dict[str, dict[str, Any]] = {}
        for key, value in raw.items():
            name, _, kind = key.rpartition(":")
            read = M.time_ms(value) if kind == "failing_since" else _run_record(value)
            if read is None:
                M.skip("periodic run", self.keys.periodic_runs, key, "not a time or a JSON object")
                continue  # a foreign or damaged field: skipped
            fields.setdefault(name, {})[kind] = read
        return {
            name: PeriodicRuns(f.get("success"), f.get("failure"), f.get("failing_since"))
            for name, f in fields.items()
        }


def _run_record(raw: str) -> dict[str, Any] | None:
    """A ``periodic:runs`` record (``{at_ms, tick_ms, instance[, error]}``) within the decode
    budget, its ``at_ms`` a time in range; ``None`` for anything else."""
    try:
        record = B.json_record(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    if "at_ms" in record:
        at = M.time_ms(record["at_ms"])
        if at is None:
            return None
        record["at_ms"] = at
    return record


class FencedPeriodicOps(FencedBase):
    """The leader's periodic write: enqueueing due ticks."""

    async def enqueue_ticks(self, due: Sequence[DueTicks], ttl_ms: int) -> list[TickOutcome]:
        """Enqueue the ticks of several periodic jobs in one step (``periodic.ENQUEUE_TICKS``); a
        job whose recorded last tick is behind ``known_last`` comes back ``rolled_back``."""
        queues: list[str] = []
        for _, _, _, queue, _ in due:
            if queue not in queues:
                queues.append(queue)
        # ticks in duty lanes only: on the duty marker, which consumers whose shared slots are
        # all busy wait on too; no pub/sub (consumers of earlier versions read no lanes)
        duty = all(map(is_duty_lane, queues))
        args: list[Any] = [K.ARQ_JOB, K.ARQ_RESULT, ttl_ms, "" if duty else self.keys.wake]
        for name, advance_to, ticks, queue, known_last in due:
            args += [name, advance_to, queues.index(queue) + 5, known_last, len(ticks)]
            for t in ticks:
                args += [t.score_ms, t.job_id, t.payload]
        keys = [
            self.keys.periodic_state,
            self.keys.paused,
            self.keys.periodic_enqueued,
            *(self.keys.queue_of(q) for q in queues),
            self.keys.wake_duty_marker if duty else self.keys.wake_marker,
        ]
        raw = await self._run(ENQUEUE_TICKS, keys, args)
        return [
            TickOutcome(int(raw[i]), int(raw[i + 1]), int(raw[i + 2]), raw[i + 3] == 1)
            for i in range(0, len(raw), 4)
        ]
