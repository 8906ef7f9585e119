"""Initializers' state on Redis: the progress hash and the leader's fenced begin and checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from worker.storage.base import StoreBase, _s
from worker.storage.fenced import FENCE, FencedBase


@dataclass(frozen=True)
class InitProgress:
    done: bool
    cursor: str | None
    batches: int
    items: int


#: Run by :meth:`FencedInitializerOps.init_begin` (below).
INIT_BEGIN = (
    """
-- Fenced. Start (or resume) an initializer run for a version; a different stored version is
-- discarded so the new version runs from the start.
-- KEYS[1] -> leader lock
-- KEYS[2] -> initializer state hash
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> version
-- ARGV[3] -> now ms
-- ARGV[4] -> leader epoch
-- Returns: {done ("1"/"0"), cursor ("" = from the start), batches, items}
"""
    + FENCE
    + """
if redis.call('HGET', KEYS[2], 'version') ~= ARGV[2] then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'version', ARGV[2], 'cursor', '', 'batches', 0, 'items', 0,
             'done', 0, 'started_ms', ARGV[3])
end
redis.call('HSET', KEYS[2], 'epoch', ARGV[4], 'resumed_ms', ARGV[3])
local s = redis.call('HMGET', KEYS[2], 'done', 'cursor', 'batches', 'items')
return {s[1] or '0', s[2] or '', s[3] or '0', s[4] or '0'}
"""
)


#: Run by :meth:`FencedInitializerOps.checkpoint` (below).
CHECKPOINT = (
    """
-- Fenced. Write one initializer batch (items into poll shards) and its checkpoint
-- atomically: a leader that dies after this never redoes the batch, and one that dies before
-- it left nothing half-written.
-- KEYS[1] -> leader lock
-- KEYS[2] -> initializer state hash
-- KEYS[3..] -> poll shard sorted sets the batch writes to
-- ARGV[1] -> caller's lock value
-- ARGV[2] -> version
-- ARGV[3] -> cursor the batch started from (compare-and-set guard)
-- ARGV[4] -> cursor after this batch
-- ARGV[5] -> "1" if this is the last batch
-- ARGV[6] -> now ms
-- ARGV[7..] -> triples: shard index into KEYS (3-based), due ms, item
-- Returns: {items added, batches so far}; error "CURSOR" if the stored cursor moved.
"""
    + FENCE
    + """
if redis.call('HGET', KEYS[2], 'version') ~= ARGV[2]
   or redis.call('HGET', KEYS[2], 'cursor') ~= ARGV[3] then
  return redis.error_reply('CURSOR initializer checkpoint moved underneath this run')
end
local added = 0
for i = 7, #ARGV, 3 do
  added = added + redis.call('ZADD', KEYS[tonumber(ARGV[i])], 'NX', ARGV[i + 1], ARGV[i + 2])
end
redis.call('HSET', KEYS[2], 'cursor', ARGV[4], 'updated_ms', ARGV[6])
redis.call('HINCRBY', KEYS[2], 'items', added)
local batches = redis.call('HINCRBY', KEYS[2], 'batches', 1)
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'done', 1, 'finished_ms', ARGV[6])
end
return {added, batches}
"""
)


class InitializerOps(StoreBase):
    """Initializer state as operators read it."""

    async def init_state(self, name: str) -> dict[str, str]:
        raw = await self.redis.hgetall(self.keys.init_state(name))
        return {_s(k): _s(v) for k, v in raw.items()}


class FencedInitializerOps(FencedBase):
    """The leader's initializer writes: begin or resume, checkpoint a batch."""

    async def init_begin(self, name: str, version: str, now_ms: int) -> InitProgress:
        """Start or resume initializer ``name`` at ``version`` (``initializer.INIT_BEGIN``)."""
        epoch = self.leader.lock.epoch if self.leader.lock else 0
        done, cursor, batches, items = await self._run(
            INIT_BEGIN, [self.keys.init_state(name)], [version, now_ms, epoch]
        )
        return InitProgress(_s(done) == "1", _s(cursor) or None, int(batches), int(items))

    async def checkpoint(
        self,
        name: str,
        version: str,
        cursor: str | None,
        next_cursor: str,
        *,
        last: bool,
        now_ms: int,
        items: Sequence[tuple[str, int, str]],
    ) -> int:
        """Write one initializer batch (``(shard key, due ms, item)``) with its checkpoint;
        returns how many items were new (``initializer.CHECKPOINT``)."""
        shard_keys: list[str] = []
        index: dict[str, int] = {}
        args: list[Any] = [version, cursor or "", next_cursor, "1" if last else "0", now_ms]
        for shard_key, due_ms, item in items:
            if shard_key not in index:
                shard_keys.append(shard_key)
                index[shard_key] = len(shard_keys) + 2  # KEYS index, after lock and state
            args += [index[shard_key], due_ms, item]
        keys = [self.keys.init_state(name), *shard_keys]
        added, _batches = await self._run(CHECKPOINT, keys, args)
        return int(added)
