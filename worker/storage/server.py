"""Questions about the Redis server itself, asked before or beside any store: is it up, does
it evict keys, which replicas does it have, may this user touch a key."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import ResponseError

from worker.core.durability import attached_replicas
from worker.storage.base import _s


async def ping(redis: Any, timeout_s: float | None = None) -> None:
    """``PING`` (at most ``timeout_s`` when given); raises what the connection raised."""
    if timeout_s is None:
        await redis.ping()
    else:
        await asyncio.wait_for(redis.ping(), timeout=timeout_s)


async def read_eviction_policy(redis: Any) -> tuple[str | None, str]:
    """``(policy, source)``: from ``CONFIG GET`` or, where CONFIG is not permitted (managed
    Redis, an ACL user without it), from ``INFO memory``. ``(None, reason)`` if neither is."""
    try:
        found = await redis.config_get("maxmemory-policy")
        for key, value in found.items():
            if _s(key) == "maxmemory-policy":
                return _s(value), "CONFIG GET"
    except ResponseError:
        pass  # NOPERM / unknown command: try INFO
    try:
        info = await redis.info("memory")
    except ResponseError as exc:
        return None, f"neither CONFIG GET nor INFO is permitted ({exc})"
    policy = info.get("maxmemory_policy")
    if policy is None:
        return None, "INFO memory has no maxmemory_policy field"
    return _s(policy), "INFO memory"


async def replication_info(redis: Any) -> dict[str, Any]:
    """``INFO replication`` (raises :class:`ResponseError` where it is not permitted)."""
    info: dict[str, Any] = await redis.info("replication")
    return info


async def touch(redis: Any, key: str) -> None:
    """``EXISTS key``: raises :class:`~redis.exceptions.NoPermissionError` when the Redis
    user may not use ``key``."""
    await redis.exists(key)


async def read_attached(redis: Any) -> int | None:
    """Replicas attached to the primary, as the WAIT policy counts them (``None``: unreadable)."""
    try:
        return attached_replicas(await replication_info(redis))
    except ResponseError:
        return None


async def read_slot_owners(redis: Any) -> list[tuple[int, int, str]]:
    """``(first slot, last slot, "host:port" of the primary)`` per slot range of a Redis
    Cluster (``CLUSTER SLOTS``); empty where the server is not a cluster node or may not say."""
    try:
        layout = await redis.execute_command("CLUSTER", "SLOTS")
    except ResponseError:
        return []  # cluster support disabled, or not permitted
    out = []
    for entry in layout or []:
        host, port = entry[2][0], entry[2][1]
        out.append((int(entry[0]), int(entry[1]), f"{_s(host) or '?'}:{int(port)}"))
    return out
