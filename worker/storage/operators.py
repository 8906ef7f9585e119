"""What operators read and edit on Redis: queue depths, throughput, pauses, the audit log."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.core import budget as B
from worker.core import malformed as M
from worker.storage import keys as K
from worker.storage.base import StoreBase, _object, _s, _score
from worker.storage.wake import MARKED
from worker.storage.wake import MEMBER as WAKE_MEMBER


@dataclass(frozen=True)
class TaskStats:
    """One task's finished runs (:meth:`OperatorOps.task_stats`): ``series`` per minute
    ``(minute start ms, done, failed)`` oldest first; ``buckets``: runs per run-time bucket
    (:data:`keys.TASK_BUCKETS_MS`, then one for longer runs) and ``run_ms``: their summed run
    time, both over the 10-minute slots the minutes overlap."""

    series: list[tuple[int, int, int]]
    buckets: list[int]
    run_ms: int

    @property
    def timed(self) -> int:
        """Runs counted in :attr:`buckets`."""
        return sum(self.buckets)

    def mean_ms(self) -> float | None:
        return self.run_ms / self.timed if self.timed else None

    def quantile_ms(self, q: float) -> float | None:
        """The upper bound (ms) of the bucket holding the ``q`` quantile of the run times
        (``inf``: longer than the last bound; ``None``: no runs)."""
        total = self.timed
        if not total:
            return None
        seen = 0
        for bound, count in zip((*K.TASK_BUCKETS_MS, math.inf), self.buckets, strict=True):
            seen += count
            if seen >= q * total:
                return float(bound)
        return math.inf


class OperatorOps(StoreBase):
    """What operators read and edit: queue depths, throughput, manifests, pauses, audit log."""

    async def write_manifest(self, app: str, manifest: str) -> None:
        """Record ``app``'s manifest (JSON) for admin commands (``<prefix>apps``)."""
        await self.redis.hset(self.keys.apps, app, manifest)

    async def manifests(self) -> dict[str, dict[str, Any]]:
        """Every recorded app manifest by app name (unreadable entries are skipped)."""
        out: dict[str, dict[str, Any]] = {}
        for name, raw in (await self.redis.hgetall(self.keys.apps)).items():
            try:
                data = B.json_record(raw)
            except ValueError as exc:
                M.skip("app manifest", self.keys.apps, _s(name), str(exc))
                continue
            if isinstance(data, dict):
                out[_s(name)] = data
        return out

    async def holds_sets(self) -> dict[str, int]:
        """Every holds set in Redis: instance id -> number of job ids in it (``SCAN``)."""
        found: dict[str, int] = {}
        async for key in self.redis.scan_iter(match=self.keys.holds_pattern, count=1000):
            owner = self.keys.holds_owner(_s(key))
            if owner is not None:
                found[owner] = int(await self.redis.scard(key))
        return found

    async def queue_depths(self, queues: Sequence[str], now_ms: int) -> list[tuple[int, int]]:
        """Per queue: ``(due and not claimed, all)`` (claimed jobs are parked in the future)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                key = self.keys.queue_of(q)
                pipe.zcount(key, "-inf", now_ms)
                pipe.zcard(key)
            raw = await pipe.execute()
        return [(int(raw[2 * i]), int(raw[2 * i + 1])) for i in range(len(queues))]

    async def queue_heads(self, keys: Sequence[str]) -> list[int | None]:
        """The earliest score (ms) of each sorted set, ``None`` where it is empty (or holds
        only entries scored ``+inf``: never due)."""
        if not keys:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.zrange(key, 0, 0, withscores=True)
            heads = await pipe.execute()
        return [
            _score(key, h[0][0], h[0][1]) if h else None for key, h in zip(keys, heads, strict=True)
        ]

    async def throughput(
        self, queues: Sequence[str], now_ms: int, minutes: int = 60
    ) -> dict[str, list[tuple[int, int, int]]]:
        """Per queue, the last ``minutes`` minutes up to ``now_ms``, oldest first: ``(minute
        start ms, done, failed)`` from the counters FINISH keeps (two hashes per queue)."""
        hour = now_ms // 3_600_000
        hours = range(hour - (minutes + 59) // 60, hour + 1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                for h in hours:
                    pipe.hgetall(self.keys.stats(q, h))
            raw = await pipe.execute()
        last = now_ms // 60_000
        out: dict[str, list[tuple[int, int, int]]] = {}
        for i, q in enumerate(queues):
            fields: dict[str, int] = {}
            for part in raw[i * len(hours) : (i + 1) * len(hours)]:
                fields.update({_s(k): M.count(v) or 0 for k, v in part.items()})
            out[q] = [
                (m * 60_000, fields.get(f"{m}:done", 0), fields.get(f"{m}:failed", 0))
                for m in range(last - minutes + 1, last + 1)
            ]
        return out

    async def task_stats(
        self, tasks: Sequence[str], now_ms: int, minutes: int = 60
    ) -> dict[str, TaskStats]:
        """Per task of ``tasks`` (the app's; any other field is ignored), its runs over the last
        ``minutes`` minutes up to ``now_ms`` from the counters FINISH keeps
        (:meth:`Keys.task_stats`: one hash per hour, two or three read): per minute done and
        failed, and the run times of the 10-minute slots overlapping those minutes."""
        hour = now_ms // 3_600_000
        hours = range(hour - (minutes + 59) // 60, hour + 1)
        async with self.redis.pipeline(transaction=False) as pipe:
            for h in hours:
                pipe.hgetall(self.keys.task_stats(h))
            raw = await pipe.execute()
        last = now_ms // 60_000
        first = last - minutes + 1
        slots = {f"s{s}" for s in range(first // K.TASK_SLOT_MIN, last // K.TASK_SLOT_MIN + 1)}
        known = set(tasks)
        counts: dict[tuple[str, str, str], int] = {}
        for h, part in zip(hours, raw, strict=True):
            for k, v in part.items():
                when, _, rest = _s(k).partition(":")
                task, _, kind = rest.rpartition(":")
                if task in known and (when in slots or when.isdigit()):
                    n = M.count(v)
                    if n is None:
                        M.skip("counter", self.keys.task_stats(h), _s(k), f"value {_s(v)[:40]}")
                        continue
                    counts[(when, task, kind)] = n
        out: dict[str, TaskStats] = {}
        for task in tasks:
            series = [
                (m * 60_000, counts.get((str(m), task, "d"), 0), counts.get((str(m), task, "f"), 0))
                for m in range(first, last + 1)
            ]
            buckets = [
                sum(counts.get((s, task, str(b)), 0) for s in slots)
                for b in range(1, len(K.TASK_BUCKETS_MS) + 2)
            ]
            run_ms = sum(counts.get((s, task, "ms"), 0) for s in slots)
            out[task] = TaskStats(series, buckets, run_ms)
        return out

    async def pause(self, duty: str) -> bool:
        """Pause ``periodic:<name>`` or ``poller:<name>`` cluster-wide; ``True`` if it was not."""
        return bool(await self.redis.sadd(self.keys.paused, duty))

    async def resume(self, duty: str) -> bool:
        return bool(await self.redis.srem(self.keys.paused, duty))

    async def resume_queue(self, entry: str, now_ms: int) -> bool:
        """Take a queue's entry (``queue:<name>``, ``queue:<name>:duty``, ``queue:*``) out of
        the paused set and announce ``now_ms`` as an enqueue does (the wake marker and the
        channel, see :meth:`~worker.storage.wake.WakeOps.announce`) and on the duty lanes'
        marker (which a consumer whose shared slots are all busy waits on), so a consumer claims
        its due jobs at once; ``True`` if it was paused."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.srem(self.keys.paused, entry)
            pipe.zadd(self.keys.wake_marker, {WAKE_MEMBER: now_ms}, lt=True)
            pipe.zadd(self.keys.wake_duty_marker, {WAKE_MEMBER: now_ms}, lt=True)
            pipe.publish(self.keys.wake, f"{MARKED}{now_ms}")
            removed, *_ = await pipe.execute()
        return bool(removed)

    async def paused(self) -> set[str]:
        return {_s(m) for m in await self.redis.smembers(self.keys.paused)}

    async def audit(self, entry: Mapping[str, Any], keep: int) -> None:
        """Append an operator's action (JSON) to the capped log, newest first."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(self.keys.audit, json.dumps(entry, default=str))
            pipe.ltrim(self.keys.audit, 0, keep - 1)
            await pipe.execute()

    async def audit_log(self, limit: int) -> list[dict[str, Any]]:
        """The most recent operator actions, newest first."""
        out = []
        for raw in await self.redis.lrange(self.keys.audit, 0, limit - 1):
            entry = _object(self.keys.audit, raw)
            if entry is not None:
                out.append(entry)
        return out
