"""Queue shards (``WORKER_QUEUE_SHARDS``): the key prefix of each shard, chosen so that the
shards of one app land in different Redis Cluster hash-slot ranges (different masters of a
typical cluster), and the shard a job id or ``shard_key`` belongs to. Pure functions.

Shard 0 is the app's home: its prefix is ``WORKER_KEY_PREFIX`` itself, and every singleton
key (the lease, duty state, the registry, limits) lives there only. Shard ``i >= 1`` has the
prefix with the hash tag's content ``<tag>#<j>`` (``{shop}:`` -> ``{shop#5}:``), where ``j`` is
the smallest number whose slot falls in the ``(h + i) mod n``-th of ``n`` equal slot ranges,
``h`` being the home slot's range: a cluster of ``n`` masters made by ``redis-cli --cluster
create`` splits the slots into those very ranges, so each shard gets its own master (check
with ``worker status``, which names each shard's slot and node). ``#`` is not allowed in
``WORKER_KEY_PREFIX``, so no app's prefix can be another app's shard; an ACL covering an app
and its shards reads ``~{shop[}#]*``.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from worker.core.ids import hash_tag

__all__ = ["MAX_SHARDS", "shard_of", "shard_prefixes", "slot_of_prefix"]

#: Upper bound of ``WORKER_QUEUE_SHARDS``.
MAX_SHARDS = 64


def slot_of_prefix(prefix: str) -> int:
    """The Redis Cluster hash slot of every key under ``prefix`` (it must carry a hash tag)."""
    return int(key_slot(prefix.encode()))


@lru_cache(maxsize=64)
def shard_prefixes(prefix: str, n: int) -> tuple[str, ...]:
    """The key prefix of each of ``n`` shards, home first (``prefix`` itself).

    ``n == 1`` is the unsharded layout. ``n > 1`` needs a hash-tagged ``prefix``
    (``{shop}:``): ``ValueError`` otherwise.
    """
    if n < 1 or n > MAX_SHARDS:
        raise ValueError(f"queue shards must be 1..{MAX_SHARDS}, got {n}")
    if n == 1:
        return (prefix,)
    tag = hash_tag(prefix)
    if tag is None:
        raise ValueError(
            f"queue shards need a hash-tagged key prefix such as {{shop}}:, got {prefix!r}"
        )
    rest = prefix[len(tag) + 2 :]
    width = REDIS_CLUSTER_HASH_SLOTS / n
    home = int(slot_of_prefix(prefix) // width)
    out = [prefix]
    taken = {prefix}
    for i in range(1, n):
        j = 0
        while True:
            candidate = f"{{{tag}#{j}}}{rest}"
            if int(slot_of_prefix(candidate) // width) == (home + i) % n and candidate not in taken:
                break
            j += 1
        out.append(candidate)
        taken.add(candidate)
    return tuple(out)


def shard_of(key: str, n: int) -> int:
    """The shard (``0 .. n-1``) a job id or ``shard_key`` belongs to: a stable hash (CRC-32),
    the same in every process and version, so one id or key always meets the same shard."""
    if n == 1:
        return 0
    return zlib.crc32(key.encode()) % n
