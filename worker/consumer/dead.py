"""Dead letters, whole: setting a job aside (bounded), listing page by page, re-queueing, purging.

A consumer sets aside a job it cannot run — expired, malformed or oversized payload, unknown
function, retries exhausted — with the reason and its payload, so nothing vanishes silently.
The set is bounded twice: at most ``WORKER_DEAD_LETTER_MAX`` entries (the oldest are dropped and
counted), and each entry keeps at most ``WORKER_DEAD_LETTER_PAYLOAD_BYTES`` of its payload plus
the full length and sha256 (a 50 MB hostile job costs a few KB here). A reason longer than
:data:`~worker.core.logs.TEXT_CHARS` is cut the same way (``reason_chars``, ``reason_sha256``).
Listings read ``<prefix>dead:index``, the records without their payloads, so a page costs
about what it returns. After fixing the cause
(deploying the missing function, say), re-queue it::

    python -m worker dead                       # list the newest page
    python -m worker dead --page 2              # and the next ones
    python -m worker dead --retry JOB_ID        # re-queue one (same id, tries start over)
    python -m worker dead --retry-all
    python -m worker dead --purge               # forget them all

A payload kept only in part (it was larger than the cap) cannot be re-queued.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import structlog

from worker.core import codec
from worker.core.clock import Clock, SystemClock, ms
from worker.core.logs import TEXT_CHARS, capped
from worker.core.metrics import Metrics
from worker.core.serializer import json_loads, msgpack_loads
from worker.storage import Shards, Store
from worker.storage.keys import DEFAULT_QUEUE

log = structlog.get_logger("worker.dead")

PAGE = 100


class DeadLetters:
    """The consumer's side: set a job aside with its reason and a bounded copy of its payload."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        instance_id: str,
        max_entries: int = 10_000,
        keep_bytes: int = 65_536,
        metrics: Metrics | None = None,
        shards: Shards | None = None,
    ) -> None:
        self.store = store
        #: a job is set aside in its own queue shard (``WORKER_QUEUE_SHARDS``): its payload is
        #: read there, and a retry puts it back there
        self.shards = shards or Shards([store])
        self.clock = clock
        self.instance_id = instance_id
        self.max_entries = max_entries
        self.keep_bytes = keep_bytes
        self.metrics = metrics

    async def set_aside(
        self,
        job_id: str,
        reason: str,
        kind: str,
        payload: bytes | None,
        size: int,
        queue: str = DEFAULT_QUEUE,
        *,
        task: str | None = None,
        tries: int | None = None,
    ) -> None:
        """Record ``job_id`` (``kind`` labels the metric). ``payload`` is the whole payload when
        it was read; otherwise ``size`` bytes are still in Redis and are digested in chunks.
        ``task`` and ``tries``: the job's function and try number, when known."""
        if payload is not None:
            digest, head = hashlib.sha256(payload).hexdigest(), payload[: self.keep_bytes]
        elif size > 0:
            digest, head = await self.shards.of(job_id).payload_digest(
                job_id, size, self.keep_bytes
            )
        else:
            digest, head = None, b""
        at_ms = ms(self.clock.time())
        record = {
            "job_id": job_id,
            "reason": capped(reason),
            "kind": kind,
            "queue": queue,
            "task": task,
            "tries": tries,
            "at_ms": at_ms,
            "instance": self.instance_id,
            "size": max(size, 0),
            "sha256": digest,
            "truncated": len(head) < max(size, 0),
            "payload_b64": base64.b64encode(head).decode() if head else None,
        }
        if task is None:
            record["task"] = task_of(head)
        if len(reason) > TEXT_CHARS:
            record["reason_chars"] = len(reason)
            record["reason_sha256"] = hashlib.sha256(
                reason.encode(errors="backslashreplace")
            ).hexdigest()
        dropped = await self.shards.of(job_id).add_dead(job_id, record, at_ms, self.max_entries)
        log.warning("job set aside in dead-letter set", job_id=job_id, reason=record["reason"])
        if self.metrics is not None:
            self.metrics.dead.labels(kind).inc()
            if dropped:
                self.metrics.dead_dropped.inc(dropped)


def task_of(payload: bytes) -> str | None:
    """The function name of an arq job payload, when it decodes as msgpack or JSON (never
    unpickled: a dead letter is hostile input), cut to 256 characters; else ``None``."""
    for loads in (msgpack_loads, json_loads):
        try:
            fn = codec.job_fields(loads(payload)).function if payload else None
        except Exception:
            continue
        return fn[:256] if isinstance(fn, str) else None
    return None


async def list_dead(store: Store, limit: int = PAGE, offset: int = 0) -> list[dict[str, Any]]:
    """Dead-lettered jobs newest first, ``limit`` from ``offset``, without their payloads."""
    out = []
    for job_id, rec in await store.dead_records(limit, offset):
        record = rec if rec is not None else {"job_id": job_id, "reason": "?"}
        record.pop("payload_b64", None)
        out.append(record)
    return out


async def all_dead_ids(store: Store) -> list[str]:
    """Every dead-lettered job id, newest first, read page by page."""
    ids: list[str] = []
    offset = 0
    while page := await store.dead_records(1000, offset):
        ids += [job_id for job_id, _ in page]
        offset += len(page)
    return ids


async def count_dead(store: Store) -> int:
    return await store.dead_count()


async def retry_dead(store: Store, job_id: str, clock: Clock | None = None) -> str:
    """Re-queue one dead-lettered job; returns ``requeued``, ``live`` (an id in use),
    ``missing`` (not dead-lettered), ``no payload`` (the job record had already expired) or
    ``truncated`` (only part of an oversized payload was kept). The re-queue honours the
    store's WAIT policy, as every enqueue (:class:`~worker.core.errors.NotReplicated`)."""
    rec = await store.dead_record(job_id)
    if rec is not None and rec.get("truncated"):
        return "truncated"
    payload_b64 = rec.get("payload_b64") if rec else None
    if rec is not None and not payload_b64:
        return "no payload"
    payload = base64.b64decode(payload_b64) if payload_b64 else b""
    now = ms((clock or SystemClock()).time())
    queue = str(rec.get("queue") or DEFAULT_QUEUE) if rec else DEFAULT_QUEUE
    result = await store.dead_retry(job_id, payload, codec.EXPIRES_EXTRA_MS, now, queue)
    return {1: "requeued", 0: "live", -1: "missing"}[result]


async def purge_dead(store: Store) -> int:
    """Forget every dead-lettered job; returns how many there were."""
    return await store.dead_purge()
