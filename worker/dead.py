"""The dead-letter set: list jobs arq gave up on, put them back on the queue, or purge them.

The consumer sets aside a job it cannot run (malformed payload, unknown function, retries
exhausted, expired) with its raw payload and the reason (see :mod:`worker.consumer`). Nothing
is lost: after fixing the cause (deploying the missing function, say), re-queue it::

    python -m worker dead                 # list
    python -m worker dead --retry JOB_ID  # re-queue one (same id, tries start over)
    python -m worker dead --retry-all
    python -m worker dead --purge         # forget them all
"""

from __future__ import annotations

import base64
import json
from typing import Any

from arq.connections import ArqRedis
from arq.constants import expires_extra_ms

from worker import keys as K
from worker.clock import Clock, SystemClock, ms


async def list_dead(redis: ArqRedis, keys: K.Keys, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` dead-lettered jobs, newest first, without their payloads."""
    ids = await redis.zrevrange(keys.dead, 0, limit - 1)
    if not ids:
        return []
    raw = await redis.hmget(keys.dead_jobs, ids)
    out = []
    for job_id, rec in zip(ids, raw, strict=True):
        record = json.loads(rec) if rec else {"job_id": job_id.decode(), "reason": "?"}
        record.pop("payload_b64", None)
        out.append(record)
    return out


async def retry_dead(redis: ArqRedis, keys: K.Keys, job_id: str, clock: Clock | None = None) -> str:
    """Re-queue one dead-lettered job; returns ``requeued``, ``live`` (an id in use),
    ``missing`` (not dead-lettered) or ``no payload`` (the job record had already expired)."""
    rec = await redis.hget(keys.dead_jobs, job_id)
    payload_b64 = json.loads(rec).get("payload_b64") if rec else None
    if rec is not None and not payload_b64:
        return "no payload"
    payload = base64.b64decode(payload_b64) if payload_b64 else b""
    now = ms((clock or SystemClock()).time())
    script = redis.register_script(K.DEAD_RETRY)
    result = await script(
        keys=[keys.queue, keys.dead, keys.dead_jobs],
        args=[job_id, payload, K.ARQ_JOB, K.ARQ_RESULT, K.ARQ_RETRY, expires_extra_ms, now],
    )
    return {1: "requeued", 0: "live", -1: "missing"}[int(result)]


async def purge_dead(redis: ArqRedis, keys: K.Keys) -> int:
    """Forget every dead-lettered job; returns how many there were."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.zcard(keys.dead)
        pipe.delete(keys.dead, keys.dead_jobs)
        count, _ = await pipe.execute()
    return int(count)
