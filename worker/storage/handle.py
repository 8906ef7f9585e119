"""A handle on one job by id (what ``Client.job`` returns): its status, its result record, its
result awaited. Reads arq's per-job keys, so it sees jobs arq's own client enqueued too; the
methods, values and errors are those of arq's ``Job``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from worker.core import codec
from worker.storage.replies import as_bytes

__all__ = ["Job", "ResultNotFound"]


class ResultNotFound(RuntimeError):
    """``Job.result()`` has nothing to wait for: no result kept and the job is not queued."""


class Job:
    """One job of ``queue`` (the queue's full key) on ``redis``."""

    __slots__ = ("_deserialize", "_queue_name", "_redis", "job_id")

    def __init__(
        self, job_id: str, redis: Redis, queue: str, deserialize: codec.Deserialize
    ) -> None:
        self.job_id = job_id
        self._redis = redis
        self._queue_name = queue
        self._deserialize = deserialize

    async def status(self) -> codec.JobStatus:
        """``complete``, ``in_progress``, ``deferred`` (due later), ``queued`` or
        ``not_found``."""
        async with self._redis.pipeline(transaction=True) as tr:
            tr.exists(codec.RESULT_KEY_PREFIX + self.job_id)
            tr.exists(codec.IN_PROGRESS_KEY_PREFIX + self.job_id)
            tr.zscore(self._queue_name, self.job_id)
            complete, in_progress, score = await tr.execute()
        if complete:
            return codec.JobStatus.complete
        if in_progress:
            return codec.JobStatus.in_progress
        if score:
            due_later = score > time.time() * 1000
            return codec.JobStatus.deferred if due_later else codec.JobStatus.queued
        return codec.JobStatus.not_found

    async def result_info(self) -> codec.JobResult | None:
        """The result record, without waiting (``None`` until the job ended, or once its
        result expired); a failed run's error is in it, not raised."""
        raw = await self._redis.get(codec.RESULT_KEY_PREFIX + self.job_id)
        return codec.decode_result(as_bytes(raw), self._deserialize) if raw else None

    async def info(self) -> codec.JobInfo | None:
        """The result record, else the job record (with its queue score), else ``None``."""
        info: codec.JobInfo | None = await self.result_info()
        if info is None:
            raw = await self._redis.get(codec.JOB_KEY_PREFIX + self.job_id)
            if raw:
                info = codec.decode_job(as_bytes(raw), self._deserialize)
        if info is not None:
            score = await self._redis.zscore(self._queue_name, self.job_id)
            info.score = None if score is None else int(score)
        return info

    async def result(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 (arq's Job.result signature)
        *,
        poll_delay: float = 0.5,
    ) -> Any:
        """Wait for the job's result: its return value, or its error raised
        (:class:`~worker.core.codec.SerializationError` when only its text was kept);
        :class:`ResultNotFound` when the job is neither kept nor queued; ``TimeoutError``
        after ``timeout`` seconds."""
        start = time.monotonic()
        while True:
            async with self._redis.pipeline(transaction=True) as tr:
                tr.get(codec.RESULT_KEY_PREFIX + self.job_id)
                tr.zscore(self._queue_name, self.job_id)
                raw, score = await tr.execute()
            if raw:
                return codec.raise_result(codec.decode_result(raw, self._deserialize))
            if score is None:
                raise ResultNotFound(
                    "Not waiting for job result because the job is not in queue. "
                    "Is the worker function configured to keep result?"
                )
            if timeout is not None and time.monotonic() - start > timeout:
                raise TimeoutError
            await asyncio.sleep(poll_delay)

    def __repr__(self) -> str:
        return f"<job {self.job_id}>"
