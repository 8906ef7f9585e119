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
from typing import Any

from arq.connections import ArqRedis
from arq.constants import expires_extra_ms

from worker import keys as K
from worker.clock import Clock, SystemClock, ms
from worker.store import Store


async def list_dead(redis: ArqRedis, keys: K.Keys, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` dead-lettered jobs, newest first, without their payloads."""
    out = []
    for job_id, rec in await Store(redis, keys).dead_records(limit):
        record = rec if rec is not None else {"job_id": job_id, "reason": "?"}
        record.pop("payload_b64", None)
        out.append(record)
    return out


async def retry_dead(redis: ArqRedis, keys: K.Keys, job_id: str, clock: Clock | None = None) -> str:
    """Re-queue one dead-lettered job; returns ``requeued``, ``live`` (an id in use),
    ``missing`` (not dead-lettered) or ``no payload`` (the job record had already expired)."""
    store = Store(redis, keys)
    rec = await store.dead_record(job_id)
    payload_b64 = rec.get("payload_b64") if rec else None
    if rec is not None and not payload_b64:
        return "no payload"
    payload = base64.b64decode(payload_b64) if payload_b64 else b""
    now = ms((clock or SystemClock()).time())
    result = await store.dead_retry(job_id, payload, expires_extra_ms, now)
    return {1: "requeued", 0: "live", -1: "missing"}[result]


async def purge_dead(redis: ArqRedis, keys: K.Keys) -> int:
    """Forget every dead-lettered job; returns how many there were."""
    return await Store(redis, keys).dead_purge()
