"""Leases in general (per_key services, mutexes, ``once``) and per_key service members."""

from __future__ import annotations

from collections.abc import Sequence

from worker.storage.base import StoreBase, _s

#: Leases renewed or taken per script call (bounds one call's size for very many keys).
LEASE_BATCH = 5000


#: Run by :meth:`LeaseOps.renew_leases` (below).
LEASES_RENEW = """
-- Renew many leases of one owner at once (a per_key service's round): compare each value,
-- *replace* its TTL.
-- KEYS[1..] -> the lease keys
-- ARGV[1] -> the owner's value
-- ARGV[2] -> lease TTL in ms
-- Returns: per key, 1 if renewed, 0 if it is not (or no longer) the owner's.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""


#: Run by :meth:`LeaseOps.take_leases` (below).
LEASES_TAKE = """
-- Take many free leases for one owner at once.
-- KEYS[1..] -> the lease keys
-- ARGV[1] -> the owner's value
-- ARGV[2] -> lease TTL in ms
-- Returns: per key, 1 if taken, 0 if someone holds it.
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
end
return out
"""


#: Run by :meth:`LeaseOps.release_lease` (below).
LEASE_RELEASE = """
-- Release a lease (a mutex, a per_key service lease) only if it still holds the caller's value.
-- KEYS[1] -> the lease key
-- ARGV[1] -> value held by the caller
-- Returns: 1 if released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class LeaseOps(StoreBase):
    """Leases in general: per_key services' keys and members, mutexes, ``once`` marks."""

    async def take_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        """Take a free lease (a mutex); :class:`NotReplicated` when taken but not confirmed."""
        if not self.replication.enabled:
            return bool(await self.redis.set(key, owner, nx=True, px=ttl_ms))
        (taken,), acked = await self._durable(lambda p: p.set(key, owner, nx=True, px=ttl_ms))
        if taken and not self.replicated(acked):
            raise self._short("lease", acked)
        return bool(taken)

    async def renew_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Renew many leases of ``owner`` in one step; per key whether it is still held."""
        out: list[bool] = []
        for i in range(0, len(keys), LEASE_BATCH):
            raw, acked = await self._eval(
                self._script(LEASES_RENEW), keys[i : i + LEASE_BATCH], [owner, ttl_ms]
            )
            if any(int(v) == 1 for v in raw) and not self.replicated(acked):
                raise self._short("lease renew", acked)
            out += [int(v) == 1 for v in raw]
        return out

    async def take_leases(self, keys: Sequence[str], owner: str, ttl_ms: int) -> list[bool]:
        """Take many free leases for ``owner`` in one step; per key whether it was taken."""
        out: list[bool] = []
        for i in range(0, len(keys), LEASE_BATCH):
            raw, acked = await self._eval(
                self._script(LEASES_TAKE), keys[i : i + LEASE_BATCH], [owner, ttl_ms]
            )
            if any(int(v) == 1 for v in raw) and not self.replicated(acked):
                raise self._short("lease", acked)
            out += [int(v) == 1 for v in raw]
        return out

    async def release_lease(self, key: str, owner: str) -> bool:
        return int(await self._script(LEASE_RELEASE)(keys=[key], args=[owner])) == 1

    async def once(self, name: str, ttl_ms: int) -> bool:
        """Mark ``name`` seen; ``True`` only for the first caller within the TTL (and, with a
        WAIT policy, only once the mark is confirmed: :class:`NotReplicated` otherwise)."""
        key = self.keys.once(name)
        if not self.replication.enabled:
            return bool(await self.redis.set(key, b"1", nx=True, px=ttl_ms))
        (first,), acked = await self._durable(lambda p: p.set(key, b"1", nx=True, px=ttl_ms))
        if first and not self.replicated(acked):
            raise self._short("once", acked)
        return bool(first)

    async def forget(self, name: str) -> None:
        await self.redis.delete(self.keys.once(name))

    async def service_round(
        self, service: str, instance_id: str, now_ms: int, stale_before_ms: int
    ) -> list[str]:
        """Announce ``instance_id`` as running ``service``; drop stale members; list members."""
        key = self.keys.service_members(service)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {instance_id: now_ms})
            pipe.zremrangebyscore(key, "-inf", stale_before_ms)
            pipe.zrange(key, 0, -1)
            _, _, members = await pipe.execute()
        return [_s(m) for m in members]

    async def service_keys(self, service: str) -> tuple[int, dict[str, str]]:
        """A ``per_key`` service for operators: its member processes and each leased key's
        owner (instance id), read with ``ZCARD``, ``SCAN`` and ``MGET``."""
        lease_keys = [
            _s(k) async for k in self.redis.scan_iter(match=self.keys.service_lease(service, "*"))
        ]
        owners = await self.redis.mget(lease_keys) if lease_keys else []
        head = len(self.keys.service_lease(service, ""))
        pairs = sorted(zip(lease_keys, owners, strict=True))
        leased = {k[head:]: _s(o) for k, o in pairs if o is not None}
        return int(await self.redis.zcard(self.keys.service_members(service))), leased

    async def service_leave(self, service: str, instance_id: str) -> None:
        await self.redis.zrem(self.keys.service_members(service), instance_id)
