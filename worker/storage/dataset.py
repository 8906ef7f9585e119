"""The dataset itself: its boot marker (a process that saw another marker knows Redis lost its
data) and the server's clock where the app's keys live."""

from __future__ import annotations

from worker.storage.base import StoreBase, _s

#: Run by :meth:`DatasetOps.boot_marker` (below).
BOOT = """
-- The dataset's boot marker: read it, or create it when missing (a fresh or emptied Redis).
-- KEYS[1] -> boot marker
-- ARGV[1] -> candidate marker "<random id>:<created ms>"
-- Returns: {marker, 1 if created now else 0}.
local v = redis.call('GET', KEYS[1])
if v then
  return {v, 0}
end
redis.call('SET', KEYS[1], ARGV[1])
return {ARGV[1], 1}
"""


#: Run by :meth:`DatasetOps.server_time_ms` (below).
TIME = """
-- The server's clock, read where the app's keys live (a Redis Cluster routes the call by
-- KEYS[1] to the node serving the app's slot, the node whose clock the lease scripts read;
-- a plain TIME would go to whichever node the client picked).
-- KEYS[1] -> any key of the app (the leader lock)
-- Returns: {seconds, microseconds}
return redis.call('TIME')
"""


class DatasetOps(StoreBase):
    """The dataset's boot marker and the server's clock."""

    async def boot_marker(self, candidate: str) -> tuple[str, bool]:
        """The dataset's boot marker, created from ``candidate`` if missing: ``(marker,
        created)``. A process that saw another marker before knows Redis lost its data."""
        marker, created = await self._script(BOOT)(keys=[self.keys.boot], args=[candidate])
        return _s(marker), int(created) == 1

    async def server_time_ms(self) -> float:
        """The server's clock (``TIME``, on the node of the app's keys) in ms."""
        sec, usec = await self._script(TIME)(keys=[self.keys.leader])
        return int(sec) * 1000 + int(usec) / 1000
