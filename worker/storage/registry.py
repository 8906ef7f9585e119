"""The instance registry on Redis: heartbeats, records, stale instances, the fenced reap."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.storage import keys as K
from worker.storage.base import StoreBase, _object, _s, _score
from worker.storage.fenced import FENCE, TOKEN_FENCE, FencedBase
from worker.storage.replies import scored


@dataclass(frozen=True)
class Beat:
    """A heartbeat's answer: the server's clock (ms; ``None`` when the caller gave the score)
    and, when the script read it, the boot marker and whether it was created now."""

    server_ms: float | None
    boot: tuple[str, bool] | None = None


@dataclass(frozen=True)
class Stale:
    instance_id: str
    heartbeat_ms: int


#: Run by :meth:`RegistryOps.heartbeat` (below).
HEARTBEAT = """
-- Write an instance's record and its heartbeat score, on the server's clock: the orphan
-- reaper and doctor judge silence on that one clock, whatever the hosts' clocks say. When
-- both the record and the score were gone (the first beat, a beat after the record expired
-- and the instance was reaped, or Redis lost its data), also read the dataset's boot marker,
-- creating it when missing (see BOOT): one script and four commands per beat otherwise.
-- KEYS[1] -> the instance's record
-- KEYS[2] -> instances sorted set
-- KEYS[3] -> boot marker
-- ARGV[1] -> instance id
-- ARGV[2] -> record (JSON)
-- ARGV[3] -> record TTL ms
-- ARGV[4] -> score ms, or "" for the server's clock (read with TIME: a caller whose copy of
--            the server's clock is fresh passes it instead, one command less)
-- ARGV[5] -> candidate boot marker "<random id>:<created ms>"
-- Returns: {seconds, microseconds} of the server's clock when read ("", "" otherwise: the
-- caller's clock-offset estimate), then the boot marker ("" when not read) and 1 if it was
-- created now, else 0.
local t = {'', ''}
local score = ARGV[4]
if score == '' then
  t = redis.call('TIME')
  score = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local old = redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3], 'GET')
local added = redis.call('ZADD', KEYS[2], score, ARGV[1])
local marker, created = '', 0
if not old and added == 1 then
  marker = redis.call('GET', KEYS[3])
  if not marker then
    redis.call('SET', KEYS[3], ARGV[5])
    marker, created = ARGV[5], 1
  end
end
return {t[1], t[2], marker, created}
"""


#: Run by :meth:`RegistryOps.touch_heartbeat` (below).
TOUCH = """
-- Move a registered instance's heartbeat score to the server's clock as the write lands
-- (ZADD XX CH). A score dated by the caller is as old as the wait before it reached the server
-- (a starved process, a connection still being made to a new primary): a live instance would
-- look silent that long, and be reaped.
-- KEYS[1] -> instances sorted set
-- ARGV[1] -> instance id
-- Returns: 1 if registered (its score now the server's clock), 0 when it is not (reaped, or
-- Redis lost its data). CH counts 0 for a score already at this millisecond (two beats in one
-- ms): only then is the member looked up.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now, ARGV[1]) == 1 then
  return 1
end
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 1
end
return 0
"""


#: What REAP and REAP_SHARD both do, as a Lua function: ``release_held(holds, first, due)``
#: drops the in-progress marker (prefix ARGV[2]) of each job of the ``holds`` set that is still
#: in one of the queues KEYS[first..] and still claimed by instance ARGV[3] (its claim tokens
#: start with "<instance id>/"), makes it due at ``due``, deletes ``holds`` and returns how
#: many it released.
RELEASE_HELD = """
local function release_held(holds, first, due)
  local released = 0
  local prefix = ARGV[3] .. '/'
  for _, id in ipairs(redis.call('SMEMBERS', holds)) do
    for q = first, #KEYS do
      if redis.call('ZSCORE', KEYS[q], id) then
        local claim = redis.call('GET', ARGV[2] .. id)
        if claim and string.sub(claim, 1, #prefix) == prefix then
          released = released + redis.call('DEL', ARGV[2] .. id)
          redis.call('ZADD', KEYS[q], 'XX', due, id)
        end
        break
      end
    end
  end
  redis.call('DEL', holds)
  return released
end
"""


#: Run by :meth:`FencedRegistryOps.reap` (below).
REAP = (
    """
-- Fenced. Make the jobs of a dead instance available again: drop the in-progress marker of
-- each job that is still queued and still claimed by that instance (its claim tokens start
-- with "<instance id>/") and make it due now (a claimed job is parked in the future, see
-- CLAIM), then forget the instance. A run of that instance that wakes up later finds its
-- claim gone and can no longer finish the job (see FINISH).
-- KEYS[1] -> leader lock
-- KEYS[2] -> the dead instance's holds set
-- KEYS[3] -> instances sorted set
-- KEYS[4..] -> the queues its jobs can be in
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> arq in-progress key prefix
-- ARGV[3] -> instance id
-- ARGV[4] -> heartbeat score the caller judged stale (guard against a late heartbeat)
-- ARGV[5] -> now ms: the score released jobs are due at
-- ARGV[6] -> wake channel
-- Returns: number of jobs released, or -1 if the instance heartbeated meanwhile.
"""
    + FENCE
    + RELEASE_HELD
    + """
local score = redis.call('ZSCORE', KEYS[3], ARGV[3])
if score and tonumber(score) > tonumber(ARGV[4]) then
  return -1
end
local released = release_held(KEYS[2], 4, ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[3])
if released > 0 then
  redis.call('PUBLISH', ARGV[6], ARGV[5])
end
return released
"""
)


#: Run by :meth:`FencedRegistryOps.reap_shard` (below).
REAP_SHARD = (
    """
-- Fenced by token. In a queue shard other than home: make the jobs a dead instance claimed
-- there available again, as REAP does in the home shard (whose heartbeat guard already
-- judged it dead), and forget its holds set there.
-- KEYS[1] -> the shard's fence
-- KEYS[2] -> the dead instance's holds set in this shard
-- KEYS[3..] -> the shard's queues
-- ARGV[1] -> the caller's token (its lease epoch)
-- ARGV[2] -> arq in-progress key prefix
-- ARGV[3] -> instance id
-- ARGV[4] -> now ms: the score released jobs are due at
-- ARGV[5] -> the shard's wake channel
-- Returns: number of jobs released
"""
    + TOKEN_FENCE
    + RELEASE_HELD
    + """
local released = release_held(KEYS[2], 3, ARGV[4])
if released > 0 then
  redis.call('PUBLISH', ARGV[5], ARGV[4])
end
return released
"""
)


class RegistryOps(StoreBase):
    """The instance registry: heartbeats, records, stale instances."""

    async def heartbeat(
        self,
        instance_id: str,
        record: Mapping[str, Any],
        ttl_ms: int,
        score_ms: int | None = None,
        *,
        boot: str = "",
    ) -> Beat:
        """Write the instance's record and heartbeat score (the server's clock, read with
        ``TIME``, unless ``score_ms`` gives it, ``registry.HEARTBEAT``); returns the server's
        clock read in the same script (for the clock-offset estimate) and, when the record and
        the score were both gone, the dataset's boot marker (created from ``boot`` if
        missing)."""
        score = "" if score_ms is None else score_ms
        sec, usec, marker, created = await self._script(HEARTBEAT)(
            keys=[self.keys.instance(instance_id), self.keys.instances, self.keys.boot],
            args=[instance_id, json.dumps(record, default=str), ttl_ms, score, boot],
        )
        server_ms = int(sec) * 1000 + int(usec) / 1000 if _s(sec) else None
        return Beat(server_ms, (_s(marker), int(created) == 1) if _s(marker) else None)

    async def touch_heartbeat(self, instance_id: str) -> bool:
        """Move a registered instance's heartbeat score to the server's clock now
        (``registry.TOUCH``, one round trip); ``False`` when it is not registered (reaped, or
        Redis lost its data): the caller then writes the whole record (:meth:`heartbeat`)."""
        changed = await self._script(TOUCH)(keys=[self.keys.instances], args=[instance_id])
        return bool(int(changed))

    async def deregister(self, instance_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.instance(instance_id), self.keys.holds(instance_id))
            pipe.zrem(self.keys.instances, instance_id)
            await pipe.execute()

    async def stale_instances(self, cutoff_ms: int) -> list[Stale]:
        raw = await self.redis.zrangebyscore(
            self.keys.instances, "-inf", cutoff_ms, withscores=True
        )
        return [
            Stale(_s(i), _score(self.keys.instances, i, score) or 0) for i, score in scored(raw)
        ]

    async def instances(self) -> list[tuple[str, int, dict[str, Any] | None]]:
        """Every registered instance: ``(id, last heartbeat ms on the server's clock, record or
        None if expired)``. Records are also found by ``SCAN``, so an instance missing from the
        heartbeat sorted set (reaped while alive) still counts; its time is then the record's
        ``heartbeat_ms`` corrected by its measured clock offset. A record that is not a JSON
        object reads as expired (and is logged once)."""
        members: dict[str, int | None] = {
            _s(m): _score(self.keys.instances, m, score) or 0
            for m, score in scored(
                await self.redis.zrange(self.keys.instances, 0, -1, withscores=True)
            )
        }
        head = self.keys.instance("")
        async for key in self.redis.scan_iter(match=f"{head}*", count=1000):
            name = _s(key)
            if self.keys.holds_owner(name) is None:
                members.setdefault(name[len(head) :], None)  # record only: time from it
        ids = list(members)
        raw = await self.redis.mget([self.keys.instance(i) for i in ids]) if ids else []
        out = []
        for i, blob in zip(ids, raw, strict=True):
            rec, score = _object(self.keys.instance(i), blob), members[i]
            if score is None:
                if rec is None:
                    continue  # expired between SCAN and MGET, or unreadable
                beat, offset = rec.get("heartbeat_ms"), rec.get("clock_offset_ms") or 0
                if not isinstance(beat, int | float) or not isinstance(offset, int | float):
                    continue
                score = round(beat + offset)
            out.append((i, score, rec))
        return out

    async def live_apps(self) -> dict[str, int]:
        """Live instances (their record has not expired) per app name. Records without an app
        name (written by older versions) are not counted."""
        counts: dict[str, int] = {}
        for _, _, rec in await self.instances():
            app = rec.get("app") if rec is not None else None
            if isinstance(app, str):
                counts[app] = counts.get(app, 0) + 1
        return counts


class FencedRegistryOps(FencedBase):
    """The leader's reaping of dead instances' jobs."""

    async def reap(
        self,
        instance_id: str,
        judged_ms: int,
        now_ms: int,
        queues: Sequence[str] = (K.DEFAULT_QUEUE,),
    ) -> int | None:
        """Release the jobs of a dead instance (due at ``now_ms``, in whichever of ``queues``
        they are); ``None`` if it heartbeated meanwhile."""
        keys = [
            self.keys.holds(instance_id),
            self.keys.instances,
            *(self.keys.queue_of(q) for q in queues),
        ]
        args = [K.ARQ_IN_PROGRESS, instance_id, judged_ms, now_ms, self.keys.wake]
        released = int(await self._run(REAP, keys, args))
        return None if released < 0 else released

    async def reap_shard(
        self, instance_id: str, now_ms: int, queues: Sequence[str] = (K.DEFAULT_QUEUE,)
    ) -> int:
        """In a queue shard other than home, fenced by the lease epoch (``REAP_SHARD``):
        release the jobs a dead instance claimed there (due at ``now_ms``)."""
        keys = [self.keys.holds(instance_id), *(self.keys.queue_of(q) for q in queues)]
        args = [K.ARQ_IN_PROGRESS, instance_id, now_ms, self.keys.wake]
        return int(await self._run_token(REAP_SHARD, keys, args))
