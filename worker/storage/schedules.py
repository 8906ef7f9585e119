"""Run-time schedules on Redis: their definitions, versions, state and the leader's fenced tick
enqueue, and :class:`Schedules`, the client's ``client.schedules``.

Each upsert or removal raises one counter (:attr:`Keys.schedules_gen`) in the same script, so
the leader learns that the set changed with one ``GET`` per loop and re-reads it only then.
Each definition carries the counter's value of its upsert as its version; the tick script
enqueues a tick only while the schedule still exists with the version the leader planned it
with, in the same fenced step: a removed schedule never ticks again, a changed one never ticks
on its old definition.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from worker.core import malformed as M
from worker.core import schedule_spec as S
from worker.storage import keys as K
from worker.storage.base import StoreBase, _s
from worker.storage.fenced import FENCE, FencedBase
from worker.storage.jobs import NewJob

#: Run by :meth:`ScheduleOps.schedule_upsert` (below).
UPSERT = """
-- Create or replace a schedule: store its definition with a new version (the raised counter).
-- KEYS[1] -> definitions hash, KEYS[2] -> versions hash, KEYS[3] -> change counter
-- ARGV[1] -> name, ARGV[2] -> definition (JSON)
-- Returns: the new version
local v = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], v)
return v
"""

#: Run by :meth:`ScheduleOps.schedule_remove` (below).
REMOVE = """
-- Remove a schedule, its version, its tick state and its pause (a schedule made again under the
-- name starts unpaused); raise the change counter.
-- KEYS[1] -> definitions hash, KEYS[2] -> versions hash, KEYS[3] -> change counter,
-- KEYS[4] -> last planned ticks hash, KEYS[5] -> newest enqueued tick hash,
-- KEYS[6] -> overlap counts hash, KEYS[7] -> paused set
-- ARGV[1] -> name
-- Returns: 1 if it existed, else 0
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
for k = 4, 6 do
  redis.call('HDEL', KEYS[k], ARGV[1])
end
redis.call('SREM', KEYS[7], 'schedule:' .. ARGV[1])
redis.call('INCR', KEYS[3])
return existed
"""


class DueScheduleTicks(NamedTuple):
    """One schedule's part of an :meth:`FencedScheduleOps.enqueue_schedule_ticks` call: as
    :class:`~worker.storage.periodic.DueTicks`, with the definition's version and whether a
    tick is skipped while the previous run has not ended."""

    name: str
    version: int
    advance_to: int
    ticks: Sequence[NewJob]
    queue: str
    known_last: int
    skip_overlap: bool


@dataclass(frozen=True)
class ScheduleOutcome:
    enqueued: int
    duplicate: int
    skipped: int
    #: ticks skipped because the previous run had not ended (``overlap="skip"``)
    overlapped: int
    #: the schedule was removed or changed since it was read: nothing written for it
    stale: bool
    #: Redis's recorded last tick is behind the one the caller knew: nothing written
    rolled_back: bool


#: Run by :meth:`FencedScheduleOps.enqueue_schedule_ticks` (below).
ENQUEUE_SCHEDULE_TICKS = (
    """
-- Fenced. Enqueue the due ticks of several run-time schedules in one step, each tick as an arq
-- job with a deterministic id, only while the schedule exists with the version the caller
-- planned with; unless a tick is at or before the recorded last tick, or its id has a job or a
-- result; with overlap skip, unless the newest enqueued tick's job has not ended (skipped and
-- counted); a paused schedule's ticks are skipped, not caught up on resume. Then record the newest
-- due tick, the newest enqueued job id, and wake consumers.
-- KEYS[1] -> leader lock
-- KEYS[2] -> versions hash
-- KEYS[3] -> last planned ticks hash
-- KEYS[4] -> newest enqueued tick hash (name -> job id)
-- KEYS[5] -> overlap counts hash
-- KEYS[6] -> paused set ("schedule:<name>")
-- KEYS[7..] -> the queues the jobs go to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq job key prefix, ARGV[3] -> arq result key prefix
-- ARGV[4] -> job key TTL in ms, ARGV[5] -> wake channel
-- ARGV[6..] -> per schedule: name, version, newest due tick, queue's index in KEYS, the last
--              tick the caller knows is recorded (-1 if none), skip overlap (1/0), n, then n
--              triples (tick ms, job id, serialized arq job), ascending
-- Returns: per schedule: enqueued, deduplicated, skipped, overlapped, stale (1/0), rolled
-- back (1/0)
"""
    + FENCE
    + """
local out = {}
local earliest = nil
local i = 6
while i <= #ARGV do
  local name, version, advance = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local queue, known = KEYS[tonumber(ARGV[i + 3])], tonumber(ARGV[i + 4])
  local skip_overlap, n = ARGV[i + 5] == '1', tonumber(ARGV[i + 6])
  local enqueued, dup, skipped, overlapped, stale, behind = 0, 0, 0, 0, 0, 0
  local last = tonumber(redis.call('HGET', KEYS[3], name) or '-1') or -1
  if last < 0 or last > 253402300799999 then
    last = -1  -- not a time (written by someone else): as if none was recorded
  end
  local todo = n
  local paused = redis.call('SISMEMBER', KEYS[6], 'schedule:' .. name) == 1
  if redis.call('HGET', KEYS[2], name) ~= version then
    stale, todo = 1, 0
  elseif last < known then
    behind, todo = 1, 0
  end
  local newest = nil
  for j = i + 7, i + 6 + 3 * todo, 3 do
    local tick, id = tonumber(ARGV[j]), ARGV[j + 1]
    local prev = newest or redis.call('HGET', KEYS[4], name)
    if tick <= last or paused then
      skipped = skipped + 1
    elseif redis.call('EXISTS', ARGV[2] .. id, ARGV[3] .. id) > 0 then
      dup = dup + 1
    elseif skip_overlap and prev and redis.call('EXISTS', ARGV[2] .. prev) == 1 then
      overlapped = overlapped + 1
    else
      redis.call('SET', ARGV[2] .. id, ARGV[j + 2], 'PX', ARGV[4])
      redis.call('ZADD', queue, ARGV[j], id)
      newest = id
      enqueued = enqueued + 1
      if earliest == nil or tick < earliest then
        earliest = tick
      end
    end
  end
  if stale == 0 and behind == 0 then
    if advance > last then
      redis.call('HSET', KEYS[3], name, string.format('%d', advance))
    end
    if newest then
      redis.call('HSET', KEYS[4], name, newest)
    end
    if overlapped > 0 then
      redis.call('HINCRBY', KEYS[5], name, overlapped)
    end
  end
  out[#out + 1] = enqueued
  out[#out + 1] = dup
  out[#out + 1] = skipped
  out[#out + 1] = overlapped
  out[#out + 1] = stale
  out[#out + 1] = behind
  i = i + 7 + 3 * n
end
if earliest ~= nil then
  redis.call('PUBLISH', ARGV[5], string.format('%d', earliest))
end
return out
"""
)


class ScheduleOps(StoreBase):
    """Run-time schedules any process reads or writes."""

    async def schedules_gen(self) -> int:
        """The change counter (0 before any change; a value that is not a count reads as -1,
        so a reader re-reads every time until the next change rewrites it)."""
        raw = await self.redis.get(self.keys.schedules_gen)
        if raw is None:
            return 0
        value = M.count(raw)
        if value is None:
            M.skip("schedule counter", self.keys.schedules_gen, _s(raw)[:64], "not a count")
            return -1
        return value

    async def schedule_upsert(self, spec: S.ScheduleSpec) -> int:
        """Store ``spec``; its new version."""
        keys = [self.keys.schedules, self.keys.schedule_versions, self.keys.schedules_gen]
        return int(await self._script(UPSERT)(keys=keys, args=[spec.name, S.encode(spec)]))

    async def schedule_remove(self, name: str) -> bool:
        """Remove schedule ``name`` and its state; whether it existed."""
        k = self.keys
        keys = [k.schedules, k.schedule_versions, k.schedules_gen]
        keys += [k.schedule_state, k.schedule_enqueued, k.schedule_overlaps, k.paused]
        return int(await self._script(REMOVE)(keys=keys, args=[name])) == 1

    async def schedules_read(
        self, known: Mapping[str, S.ScheduleSpec] | None = None
    ) -> dict[str, S.ScheduleSpec]:
        """Every stored schedule, each checked (:func:`worker.core.schedule_spec.decode`); a
        malformed one is skipped, logged once and counted (:mod:`worker.core.malformed`).

        With ``known`` (what the caller read before), only the definitions whose version
        moved are read and decoded again (the leader's re-read after a change costs the
        versions hash and the changed records, not every record)."""
        if known is None:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.keys.schedules)
                pipe.hgetall(self.keys.schedule_versions)
                defs, versions = await pipe.execute()
        else:
            versions = await self.redis.hgetall(self.keys.schedule_versions)
            stale = [n for n, v in versions.items() if _unchanged(known, n, v) is None]
            defs = {}
            for i in range(0, len(stale), 1000):
                chunk = stale[i : i + 1000]
                got = await self.redis.hmget(self.keys.schedules, chunk)
                defs.update({n: raw for n, raw in zip(chunk, got, strict=True) if raw is not None})
        out: dict[str, S.ScheduleSpec] = {}
        for raw_name, raw_version in versions.items():
            same = _unchanged(known, raw_name, raw_version) if known is not None else None
            if same is not None:
                out[same.name] = same
                continue
            raw = defs.get(raw_name)
            if raw is None:
                continue  # removed meanwhile, or a version without a definition
            name, version = _s(raw_name), M.count(raw_version)
            try:
                if version is None:
                    raise ValueError("its version is not a count")
                out[name] = S.decode(name, raw, version)
            except ValueError as exc:
                M.skip("schedule", self.keys.schedules, name[:100], str(exc))
        for raw_name in defs.keys() - versions.keys():
            M.skip("schedule", self.keys.schedules, _s(raw_name)[:100], "no version")
        return out

    async def schedule_state(self) -> dict[str, int]:
        """The newest planned tick (ms) per schedule; a field that is not a time is skipped."""
        return self._times(
            self.keys.schedule_state, await self.redis.hgetall(self.keys.schedule_state)
        )

    async def schedule_overlaps(self) -> dict[str, int]:
        """Ticks skipped per schedule because the previous run had not ended."""
        raw = await self.redis.hgetall(self.keys.schedule_overlaps)
        return {_s(k): n for k, v in raw.items() if (n := M.count(v)) is not None}

    def _times(self, key: str, raw: dict[Any, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, v in raw.items():
            at = M.time_ms(v)
            if at is None:
                M.skip("schedule tick", key, _s(k)[:100], f"not a time: {_s(v)[:64]}")
            else:
                out[_s(k)] = at
        return out


def _unchanged(
    known: Mapping[str, S.ScheduleSpec], raw_name: bytes | str, raw_version: bytes | str
) -> S.ScheduleSpec | None:
    """The known schedule of ``raw_name`` when its stored version is the known one."""
    spec = known.get(_s(raw_name))
    return spec if spec is not None and M.count(raw_version) == spec.version else None


class FencedScheduleOps(FencedBase):
    """The leader's write for run-time schedules: enqueueing due ticks."""

    async def enqueue_schedule_ticks(
        self, due: Sequence[DueScheduleTicks], ttl_ms: int
    ) -> list[ScheduleOutcome]:
        """Enqueue the ticks of several schedules in one fenced step."""
        args: list[Any] = [K.ARQ_JOB, K.ARQ_RESULT, ttl_ms, self.keys.wake]
        queues: list[str] = []
        for d in due:
            if d.queue not in queues:
                queues.append(d.queue)
            args += [d.name, d.version, d.advance_to, queues.index(d.queue) + 7, d.known_last]
            args += [1 if d.skip_overlap else 0, len(d.ticks)]
            for t in d.ticks:
                args += [t.score_ms, t.job_id, t.payload]
        keys = [
            self.keys.schedule_versions,
            self.keys.schedule_state,
            self.keys.schedule_enqueued,
            self.keys.schedule_overlaps,
            self.keys.paused,
            *(self.keys.queue_of(q) for q in queues),
        ]
        raw = [int(x) for x in await self._run(ENQUEUE_SCHEDULE_TICKS, keys, args)]
        return [
            ScheduleOutcome(
                raw[i], raw[i + 1], raw[i + 2], raw[i + 3], raw[i + 4] == 1, raw[i + 5] == 1
            )
            for i in range(0, len(raw), 6)
        ]


class Schedules:
    """``client.schedules``: create, change, remove and read run-time schedules.

    ``upsert`` refuses a task the client's app does not declare (``check``, the client's
    :meth:`~worker.client.Client.check_function`) and any definition :func:`build` refuses.
    A change takes effect at the schedule's next tick, on whichever process leads.
    """

    def __init__(self, store: ScheduleOps, check: Callable[[str], None]) -> None:
        self.store = store
        self.check = check

    async def upsert(
        self,
        name: str,
        task: str,
        *args: Any,
        cron: str | None = None,
        every: float | dt.timedelta | None = None,
        tz: str = "UTC",
        catch_up: str = "all",
        catch_up_limit: int = 10,
        overlap: str = "allow",
        **kwargs: Any,
    ) -> S.ScheduleSpec:
        """Create schedule ``name`` or replace its definition: ``task(*args, **kwargs)`` once
        per tick of ``cron`` (in ``tz``) or ``every`` (seconds or a timedelta). Returns the
        stored definition with its new version."""
        spec = S.build(
            name, task, args, kwargs, cron=cron, every=every, tz=tz, catch_up=catch_up,
            catch_up_limit=catch_up_limit, overlap=overlap,
        )  # fmt: skip
        self.check(task)
        version = await self.store.schedule_upsert(spec)
        return S.ScheduleSpec(**{**spec.__dict__, "version": version})

    async def remove(self, name: str) -> bool:
        """Remove schedule ``name``: no tick of it is enqueued from now on. Whether it existed."""
        return await self.store.schedule_remove(name)

    async def list(self) -> list[S.ScheduleSpec]:
        """Every stored schedule, by name (malformed records skipped)."""
        found = await self.store.schedules_read()
        return [found[n] for n in sorted(found)]

    async def get(self, name: str) -> S.ScheduleSpec | None:
        """Schedule ``name``, or ``None``."""
        return (await self.store.schedules_read()).get(name)
