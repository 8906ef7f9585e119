"""A job's own records beside arq's: its last failure, its progress, the recent-ends indexes.

FINISH (:mod:`worker.storage.jobs`) writes the failure records and both indexes with the jobs'
ends; :meth:`RecordOps.set_progress` writes a run's progress; the rest reads them, each read
bounded (a page of an index, one ``MGET`` for a page of records).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from worker.core import malformed as M
from worker.storage.base import StoreBase, _object, _s
from worker.storage.replies import scored


class RecordOps(StoreBase):
    """Failure and progress records, and the recent failures / completions indexes."""

    async def failure(self, job_id: str) -> dict[str, Any] | None:
        """The last final failure of ``job_id`` (see :meth:`Keys.failure`), ``None`` when none
        is kept (or the record is malformed: logged once)."""
        key = self.keys.failure(job_id)
        return _object(key, await self.redis.get(key))

    async def failures_many(self, job_ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """:meth:`failure` of each of ``job_ids``, in order, in one ``MGET``."""
        if not job_ids:
            return []
        keys = [self.keys.failure(j) for j in job_ids]
        raws = await self.redis.mget(keys)
        return [_object(k, raw) for k, raw in zip(keys, raws, strict=True)]

    async def recent_failures(
        self, limit: int, before_ms: int | None = None
    ) -> list[tuple[str, int]]:
        """Up to ``limit`` recent final failures ``(job id, finished ms)``, newest first,
        finished before ``before_ms`` when given (the last page's oldest: the next page)."""
        return await self._recent(self.keys.failures, limit, before_ms)

    async def recent_done(self, limit: int, before_ms: int | None = None) -> list[tuple[str, int]]:
        """Up to ``limit`` recent successful runs ``(job id, finished ms)``, newest first, paged
        like :meth:`recent_failures`; a job whose result expired may still be listed (readers
        skip it)."""
        return await self._recent(self.keys.done, limit, before_ms)

    async def _recent(self, key: str, limit: int, before_ms: int | None) -> list[tuple[str, int]]:
        if limit <= 0:
            return []
        top = "+inf" if before_ms is None else f"({int(before_ms)}"
        rows = await self.redis.zrevrangebyscore(key, top, "-inf", 0, limit, withscores=True)
        out: list[tuple[str, int]] = []
        for member, score in scored(rows):
            at = M.time_ms(score)
            if at is None:
                M.skip("time in ms", key, _s(member), f"score {score}")
                continue
            out.append((_s(member), at))
        return out

    async def progress(self, job_id: str) -> dict[str, Any] | None:
        """A job's last reported progress ``{fraction, message, at_ms}``, ``None`` when none is
        kept (or the record is malformed: logged once)."""
        key = self.keys.progress(job_id)
        record = _object(key, await self.redis.get(key))
        if record is not None and not isinstance(record.get("fraction"), int | float):
            M.skip("progress record", key, key, "no numeric fraction")
            return None
        return record

    async def set_progress(
        self, job_id: str, fraction: float, message: str | None, at_ms: int, ttl_ms: int
    ) -> None:
        """Write a run's progress (one ``SET PX``)."""
        record = {"fraction": fraction, "message": message, "at_ms": at_ms}
        await self.redis.set(self.keys.progress(job_id), json.dumps(record), px=max(ttl_ms, 1))
