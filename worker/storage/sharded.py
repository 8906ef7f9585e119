"""The stores of an app's queue shards (``WORKER_QUEUE_SHARDS``) as one: which shard a job id
or routing key meets, and the consumer's per-job operations spread over the shards they
concern. Sends no command itself: every call is one shard :class:`Store`'s.

Shard 0 is home (every singleton key lives there); a job id names its shard by its prefix
(:func:`worker.core.ids.shard_index`). With one shard every method is the home store's own call,
without grouping: the unsharded hot path costs nothing more.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Sequence

from redis.asyncio import Redis

from worker.core.ids import shard_index
from worker.storage.jobs import DEFAULT_RETENTION, Finish, FinishOutcome, Retention
from worker.storage.keys import DEFAULT_QUEUE
from worker.storage.shards import shard_of
from worker.storage.store import Store

__all__ = ["Shards"]


class Shards:
    """The shard stores of one app, home first (see the module docstring)."""

    def __init__(self, stores: Sequence[Store]) -> None:
        if not stores:
            raise ValueError("at least the home store")
        self.stores: tuple[Store, ...] = tuple(stores)
        self.home = self.stores[0]
        self.n = len(self.stores)
        self.prefixes = tuple(s.keys.prefix for s in self.stores)
        self._turn = itertools.count()

    def with_clients(self, clients: Sequence[Redis]) -> Shards:
        """The same shards over other connections, one per shard, home first."""
        return Shards([s.with_redis(c) for s, c in zip(self.stores, clients, strict=True)])

    # -- routing ------------------------------------------------------------------------------
    def of(self, job_id: str) -> Store:
        """The store of the shard ``job_id`` lives in (home for an id of no shard)."""
        if self.n == 1:
            return self.home
        return self.stores[shard_index(job_id, self.prefixes)]

    def for_key(self, key: str) -> Store:
        """The store a routing key (a unique key, a ``shard_key``) always meets."""
        return self.stores[shard_of(key, self.n)]

    def next(self) -> Store:
        """The store a job without a routing key goes to: the shards in turn."""
        if self.n == 1:
            return self.home
        return self.stores[next(self._turn) % self.n]

    def rotation(self) -> tuple[Store, ...]:
        """Every store, starting one further at each call: a claim round that fills up on the
        first shard it reads does not starve the others."""
        if self.n == 1:
            return self.stores
        i = next(self._turn) % self.n
        return self.stores[i:] + self.stores[:i]

    def channels(self) -> list[str]:
        """Every shard's wake-up channel (pub/sub channels are cluster-wide)."""
        return [s.keys.wake for s in self.stores]

    def group(self, job_ids: Iterable[str]) -> list[tuple[Store, list[str]]]:
        """``job_ids`` by shard, in shard order (only shards with some)."""
        if self.n == 1:
            ids = list(job_ids)
            return [(self.home, ids)] if ids else []
        by: dict[int, list[str]] = {}
        for job_id in job_ids:
            by.setdefault(shard_index(job_id, self.prefixes), []).append(job_id)
        return [(self.stores[i], by[i]) for i in sorted(by)]

    async def running_ids(self) -> list[tuple[str, str]]:
        """``(job id, instance id)`` held in every shard's holds sets of the instances with a
        heartbeat (registered in home), sorted by job id (what the jobs listing pages by)."""
        if self.n == 1:
            return await self.home.running_ids()
        ids = [i for i, _, _ in await self.home.instances()]
        held = [await s.running_ids(ids) for s in self.stores]
        return sorted(pair for part in held for pair in part)

    # -- the consumer's per-job operations, over the shards they concern -----------------------
    async def queue_head(self, queues: Sequence[str] = (DEFAULT_QUEUE,)) -> int | None:
        """The earliest due time over every shard's ``queues`` (the shards that answer: one
        whose master is failing over is left out; only when none answers does it raise)."""
        if self.n == 1:
            return await self.home.queue_head(queues)
        heads = await asyncio.gather(
            *(s.queue_head(queues) for s in self.stores), return_exceptions=True
        )
        if all(isinstance(h, BaseException) for h in heads):
            raise next(h for h in heads if isinstance(h, BaseException))
        found = [h for h in heads if isinstance(h, int)]
        return min(found) if found else None

    async def fair_waiting(self, queues: Sequence[str]) -> bool:
        """Whether a shard's fair ``queues`` hold jobs not moved yet (``fair.FAIR_MOVE``)."""
        for store in self.stores:
            if await store.fair_waiting(queues):
                return True
        return False

    async def finish(
        self,
        instance_id: str,
        runs: Sequence[Finish],
        *,
        now_ms: int,
        resend: bool = False,
        retention: Retention = DEFAULT_RETENTION,
    ) -> FinishOutcome:
        """Each run's end written into its own shard (one ``FINISH`` per shard concerned)."""
        if self.n == 1:
            return await self.home.finish(
                instance_id, runs, now_ms=now_ms, resend=resend, retention=retention
            )
        by: dict[int, list[Finish]] = {}
        for f in runs:
            by.setdefault(shard_index(f.job_id, self.prefixes), []).append(f)
        outs = await asyncio.gather(
            *(
                self.stores[i].finish(
                    instance_id, part, now_ms=now_ms, resend=resend, retention=retention
                )
                for i, part in by.items()
            )
        )
        return FinishOutcome(
            sum(o.done for o in outs),
            sum(o.retried for o in outs),
            sum(o.refused for o in outs),
            all(o.replicated for o in outs),
        )

    async def claim_check(self, job_ids: Sequence[str]) -> tuple[list[str | None], list[str]]:
        """:meth:`Store.claim_check` of each shard's ids, the tokens in ``job_ids``' order."""
        if self.n == 1:
            return await self.home.claim_check(job_ids)
        groups = self.group(job_ids)
        outs = await asyncio.gather(*(s.claim_check(ids) for s, ids in groups))
        tokens: dict[str, str | None] = {}
        aborts: list[str] = []
        for (_, ids), (toks, asked) in zip(groups, outs, strict=True):
            tokens.update(zip(ids, toks, strict=True))
            aborts += asked
        return [tokens[j] for j in job_ids], aborts

    async def abort_requests(self, job_ids: Sequence[str]) -> list[str]:
        if self.n == 1:
            return await self.home.abort_requests(job_ids)
        outs = await asyncio.gather(*(s.abort_requests(ids) for s, ids in self.group(job_ids)))
        return [j for out in outs for j in out]

    async def release_own(
        self,
        instance_id: str,
        known: Iterable[str],
        now_ms: int,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
    ) -> tuple[int, bool]:
        """:meth:`Store.release_own` on every shard (a lost claim reply may be any shard's):
        ``(released, complete)``. A shard that cannot be reached (its master failing over) is
        skipped and ``complete`` is false: the caller stays in doubt and asks again (the lost
        reply may be that very shard's, its jobs parked until their markers expire otherwise);
        only when no shard answers does it raise."""
        keep = list(known)
        if self.n == 1:
            return await self.home.release_own(instance_id, keep, now_ms, queues), True
        outs = await asyncio.gather(
            *(s.release_own(instance_id, keep, now_ms, queues) for s in self.stores),
            return_exceptions=True,
        )
        done = [o for o in outs if isinstance(o, int)]
        if not done:
            raise next(o for o in outs if isinstance(o, BaseException))
        return sum(done), len(done) == len(outs)
