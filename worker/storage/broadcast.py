"""Broadcast topics on Redis: capped streams appended to and read after cursors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.storage.base import StoreBase, _s
from worker.storage.replies import stream_reads


def _entry(key: str, entry_id: Any, fields: Mapping[Any, Any]) -> BroadcastEntry:
    """A broadcast stream entry; its ``seq`` is ``None`` when it is not a whole number (an
    entry this framework did not write: its readers skip it)."""
    f = {_s(k): v for k, v in fields.items()}
    chain = _s(f.get("chain", b""))
    data = f.get("data", b"")
    seq = _s(f.get("seq", b""))
    return BroadcastEntry(
        key,
        _s(entry_id),
        int(seq) if seq.isascii() and seq.isdigit() and len(seq) < 19 else None,
        _s(f.get("origin", b"")),
        tuple(chain.split(",")) if chain else (),
        data if isinstance(data, bytes) else str(data).encode(),
    )


@dataclass(frozen=True)
class BroadcastEntry:
    """One message of a broadcast topic's stream (see ``broadcast.BROADCAST``): ``entry_id`` is
    the readers' cursor, ``seq`` the topic's message number, ``chain`` the topics whose
    handlers caused it."""

    key: str
    entry_id: str
    seq: int | None
    origin: str
    chain: tuple[str, ...]
    payload: bytes


#: Run by :meth:`BroadcastOps.broadcast` (below).
BROADCAST = """
-- Append a message to a broadcast topic's stream, numbered one above the newest entry's
-- sequence (the newest entry always survives the cap, so numbers never repeat while the
-- stream exists), and cap the stream at ARGV[1] entries (exact MAXLEN: small streams). The
-- entry id is every reader's cursor; XREAD BLOCK on the stream is the wake-up.
-- KEYS[1] -> the topic's stream
-- ARGV[1] -> history: entries kept (MAXLEN)
-- ARGV[2] -> origin: the sender's instance id (or a client's id)
-- ARGV[3] -> chain: comma-separated topics whose handlers caused this message ("" if none)
-- ARGV[4] -> payload (serialized {"data": ...})
-- An entry whose seq is not a whole number (not written here) is passed over: the number
-- follows the newest valid one among the kept entries.
-- Returns: {entry id, sequence number}.
local function seq_of(entry)
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'seq' then
      local n = tonumber(fields[i + 1])
      if n and n >= 0 and n < 2 ^ 53 and n == math.floor(n) then
        return n
      end
    end
  end
  return nil
end
local seq = 1
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if newest[1] and not seq_of(newest[1]) then
  newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])
end
for _, entry in ipairs(newest) do
  local n = seq_of(entry)
  if n then
    seq = n + 1
    break
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[1], '*',
  'seq', seq, 'origin', ARGV[2], 'chain', ARGV[3], 'data', ARGV[4])
return {id, seq}
"""


class BroadcastOps(StoreBase):
    """Broadcast topics' streams: append, newest, read after cursors."""

    async def broadcast(
        self, topic: str, payload: bytes, *, origin: str, chain: Sequence[str], history: int
    ) -> tuple[str, int]:
        """Append a message to ``topic``'s stream, capped at ``history`` entries: ``(entry
        id, sequence number)`` (see ``broadcast.BROADCAST``); :class:`NotReplicated` when the
        replicas did not confirm it (a failover could lose it: send it again)."""
        (entry_id, seq), acked = await self._eval(
            self._script(BROADCAST),
            [self.keys.broadcast(topic)],
            [history, origin, ",".join(chain), payload],
        )
        if not self.replicated(acked):
            raise self._short("broadcast", acked)
        return _s(entry_id), int(seq)

    async def broadcast_newest(
        self, stream_keys: Sequence[str]
    ) -> dict[str, BroadcastEntry | None]:
        """The newest message of each stream (``None``: the stream is empty or absent)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in stream_keys:
                pipe.xrevrange(key, "+", "-", count=1)
            raw = await pipe.execute()
        return {
            key: _entry(key, rows[0][0], rows[0][1]) if rows else None
            for key, rows in zip(stream_keys, raw, strict=True)
        }

    async def broadcast_read(
        self, cursors: Mapping[str, str], *, count: int, block_ms: int
    ) -> list[BroadcastEntry]:
        """Messages after each stream's cursor (``XREAD BLOCK``: waits up to ``block_ms`` for
        the first), up to ``count`` per stream, oldest first per stream."""
        streams: dict[Any, Any] = dict(cursors)
        raw = await self.redis.xread(streams, count=count, block=block_ms)
        return [
            _entry(_s(key), entry_id, fields)
            for key, rows in stream_reads(raw)
            for entry_id, fields in rows
        ]
