"""arq's functions the tests read records with, by their arq names and signatures, over the
framework's own codec (:mod:`worker.core.codec`): the suite runs without arq installed. The
byte-for-byte agreement with arq itself is tests/face/test_contract_arq.py's and
tests/core/test_serializer.py's (where arq is installed)."""

from __future__ import annotations

import importlib
import os
import pickle
from types import ModuleType
from typing import Any

from redis.asyncio import Redis

from worker.core import codec
from worker.core.codec import JobResult, JobStatus, SerializationError
from worker.core.retry import Retry
from worker.storage.handle import Job as _Job

__all__ = [
    "Job",
    "JobResult",
    "JobStatus",
    "Retry",
    "SerializationError",
    "deserialize_job",
    "deserialize_job_raw",
    "deserialize_result",
    "expires_extra_ms",
    "job_key_prefix",
    "require_arq",
    "serialize_job",
    "serialize_result",
]

expires_extra_ms = codec.EXPIRES_EXTRA_MS
job_key_prefix = codec.JOB_KEY_PREFIX


def Job(
    job_id: str,
    redis: Redis,
    _queue_name: str = codec.ARQ_DEFAULT_QUEUE,
    _deserializer: codec.Deserialize | None = None,
) -> _Job:
    return _Job(job_id, redis, _queue_name, _deserializer or pickle.loads)


def deserialize_job(raw: bytes, *, deserializer: codec.Deserialize) -> codec.JobInfo:
    return codec.decode_job(raw, deserializer)


def deserialize_job_raw(
    raw: bytes, *, deserializer: codec.Deserialize
) -> tuple[str, tuple[Any, ...], dict[str, Any], int, int]:
    f = codec.job_fields(deserializer(raw))
    return f.function, f.args, f.kwargs, f.job_try, f.enqueued


def deserialize_result(raw: bytes, *, deserializer: codec.Deserialize) -> JobResult:
    return codec.decode_result(raw, deserializer)


def serialize_job(
    function: str,
    args: Any,
    kwargs: dict[str, Any],
    job_try: int | None,
    enqueue_time_ms: int,
    *,
    serializer: codec.Serialize,
) -> bytes:
    return codec.encode_job(function, args, kwargs, enqueue_time_ms, serializer, job_try)


def serialize_result(*args: Any, serializer: codec.Serialize, **kwargs: Any) -> bytes | None:
    return codec.encode_result(*args, serializer=serializer, **kwargs)


def require_arq(*, module_level: bool = False) -> ModuleType:
    """arq itself (``pip install 'fenced-worker[arq]'``, which brings redis-py 5): the test
    (or with ``module_level`` the module) skips without it, and fails instead where
    ``WORKER_REQUIRE_ARQ=1`` (CI's arq environment, where these tests must run)."""
    try:
        for name in ("arq.connections", "arq.cron", "arq.jobs", "arq.worker"):
            importlib.import_module(name)
        return importlib.import_module("arq")
    except ImportError as exc:
        import pytest  # only here: bench/ loads this module without pytest

        why = f"arq is not installed ({exc}): pip install 'fenced-worker[arq]'"
        if os.environ.get("WORKER_REQUIRE_ARQ") == "1":
            pytest.fail(f"WORKER_REQUIRE_ARQ=1: {why}", pytrace=False)
        pytest.skip(why, allow_module_level=module_level)
