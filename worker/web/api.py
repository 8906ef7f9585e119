"""The console's JSON views: what the page shows, read from Redis only.

:func:`overview` is one document for every panel but the dead letters, from one read of the
cluster's read model (:func:`worker.ops.snapshot.read`, what ``status`` and ``doctor`` read): its
status view (:func:`worker.ops.status.view`), the doctor's verdict on it
(:func:`worker.ops.doctor.judge`,
at most every :data:`DOCTOR_EVERY_S`, the snapshot then read with the checks' part), per-minute
throughput per queue, leadership history and the operators' recent actions. Dead letters are
paged (:func:`dead_page`: records without their payloads, so a page costs about what it
returns), one at a time in detail (:func:`dead_detail`, payload preview cut to
:data:`PREVIEW_BYTES`, rendered in a thread and never past the cut, so a nested payload does not
block the console). Payloads are hostile input: they are decoded only with msgpack or JSON (never
unpickled) and returned as text for the page to show as text.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any

from worker.app import App
from worker.client import Client
from worker.core import codec
from worker.core.clock import ms
from worker.core.kindcolumns import cell_json
from worker.core.serializer import json_loads, msgpack_loads
from worker.duties import kinds
from worker.ops import doctor, snapshot, status
from worker.web.jsonout import standard_json as standard_json

#: How often the doctor's checklist runs for the banner (it reads more than the overview).
DOCTOR_EVERY_S = 5.0
#: Dead letters per page (largest page a client may ask for: :data:`MAX_PAGE`).
PAGE = 50
MAX_PAGE = 500
#: Payload bytes shown in a dead letter's detail.
PREVIEW_BYTES = 4096
#: Leadership changes and operator actions in the overview.
RECENT = 25
#: Minutes of throughput per queue.
MINUTES = 60


@dataclass
class ConsoleState:
    """What the console reads with: the workers' client and app, how to judge the cluster,
    and the doctor's last report."""

    client: Client
    app: App
    serializer: str = "msgpack"
    redis_url: str = ""  # masked
    limits: doctor.Limits = field(default_factory=doctor.Limits)
    _doctor: tuple[float, dict[str, Any]] | None = None

    def doctor_due(self) -> bool:
        """Whether the checklist is to run again (every :data:`DOCTOR_EVERY_S`)."""
        last = self._doctor
        return last is None or self.client.clock.monotonic() - last[0] >= DOCTOR_EVERY_S

    def doctor_report(self, snap: snapshot.ClusterSnapshot | None) -> dict[str, Any]:
        """The checklist's verdict on ``snap`` (read with the checks' part), else the last."""
        if snap is not None:
            report = doctor.judge(snap, self.app, self.limits)
            self._doctor = (self.client.clock.monotonic(), report.to_json())
        assert self._doctor is not None
        return self._doctor[1]


def _summed(
    each: list[dict[str, list[tuple[int, int, int]]]],
) -> dict[str, list[tuple[int, int, int]]]:
    """Per-queue throughput series of every shard, added minute by minute."""
    if len(each) == 1:
        return each[0]
    out: dict[str, list[tuple[int, int, int]]] = {}
    for queue in each[0]:
        minutes: dict[int, tuple[int, int]] = {}
        for series in each:
            for at, done, failed in series.get(queue, []):
                d, f = minutes.get(at, (0, 0))
                minutes[at] = (d + done, f + failed)
        out[queue] = [(at, d, f) for at, (d, f) in sorted(minutes.items())]
    return out


async def overview(state: ConsoleState) -> dict[str, Any]:
    """Every panel but the dead letters (see module docstring)."""
    client = state.client
    store = client.store
    judge = state.doctor_due()
    shards = client.shards.stores
    snap = await snapshot.read(store, state.app, client.clock, checks=judge, shards=shards)
    cluster = status.view(snap, state.app, allow_eviction=state.limits.allow_eviction)
    now_ms = ms(client.clock.time())  # after the read, which syncs a client's clock
    series = _summed([await s.throughput(state.app.queue_names(), now_ms, MINUTES) for s in shards])
    for q in cluster["queues"]:
        points = series.get(q["queue"], [])
        q["throughput"] = [[at, done, failed] for at, done, failed in points]
        q["done_last_hour"] = sum(p[1] for p in points)
        q["failed_last_hour"] = sum(p[2] for p in points)
    report = state.doctor_report(snap if judge else None)
    history = [
        {"epoch": h.epoch, "at_ms": h.at_ms, "reason": h.reason, "instance": h.instance}
        for h in await store.leader_history(RECENT)
    ]
    return {
        "now_ms": now_ms,
        "redis_url": state.redis_url,
        "banners": banners(cluster, report),
        "cluster": cluster,
        "duties": duty_tables(cluster, now_ms),
        "doctor": {
            "ok": report["ok"],
            "at": report["at"],
            "failed": report["failed"],
            "checks": [
                {"name": c["name"], "status": c["status"], "summary": c["summary"]}
                for c in report["checks"]
            ],
        },
        "history": history,
        "audit": await store.audit_log(RECENT),
    }


def duty_tables(cluster: dict[str, Any], now_ms: int) -> list[dict[str, Any]]:
    """Each duty kind's table as its :class:`~worker.core.dutykinds.Kind` describes it (its
    ``columns``; a kind without is not shown): ``kind``, ``id`` (its ``status`` key),
    ``title``, ``headers``, ``empty`` (the text of no row), whether it pauses and runs one
    now, and its rows (``name``, ``paused``, ``cells``)."""
    return [
        {
            "kind": k.name,
            "id": k.status_key,
            "title": k.title,
            "headers": [c.header for c in k.columns],
            "empty": f"no {k.plural}",
            "pausable": k.pausable,
            "triggerable": k.trigger is not None,
            "rows": [
                {
                    "name": row["name"],
                    "paused": bool(row.get("paused")),
                    "cells": [cell_json(c, row, now_ms) for c in k.columns],
                }
                for row in cluster.get(k.status_key, [])
            ],
        }
        for k in kinds.KINDS
        if k.columns
    ]


def banners(cluster: dict[str, Any], report: dict[str, Any]) -> list[dict[str, str]]:
    """What the page shouts about: no leader, failing doctor checks."""
    out = []
    if not cluster["leader"]["held"]:
        out.append(
            {
                "level": "error",
                "text": "No leader holds the lock: the leader's duties ("
                + ", ".join(k.plural for k in kinds.KINDS if k.pausable)
                + ", singleton services) wait until a leader candidate takes it.",
            }
        )
    for check in report["checks"]:
        if check["status"] == "fail" and not (check["name"] == "leader" and out):
            out.append({"level": "error", "text": f"doctor: {check['name']}: {check['summary']}"})
    return out


async def dead_page(state: ConsoleState, page: int, size: int = PAGE) -> dict[str, Any]:
    """One page of dead letters, newest first, without payloads."""
    size = max(1, min(size, MAX_PAGE))
    store = state.client.store
    total = await store.dead_count()
    pages = max(1, math.ceil(total / size))
    page = max(1, min(page, pages))
    items = []
    for job_id, rec in await store.dead_records(size, (page - 1) * size):
        record: dict[str, Any] = rec if rec is not None else {"job_id": job_id, "reason": "?"}
        record.setdefault("task", None)
        items.append(record)
    now_ms = ms(state.client.clock.time())  # the server's clock, for the page's ages
    return {
        "now_ms": now_ms,
        "total": total,
        "page": page,
        "pages": pages,
        "size": size,
        "items": items,
    }


async def dead_detail(state: ConsoleState, job_id: str) -> dict[str, Any] | None:
    """One dead letter with a preview of its payload (text; cut to :data:`PREVIEW_BYTES`)."""
    record = await state.client.store.dead_record(job_id)
    if record is None:
        return None
    payload = _payload(record)
    record.pop("payload_b64", None)
    if not record.get("task"):
        record["task"] = _task_of(payload, state.serializer)
    record["preview"] = await asyncio.to_thread(preview, payload, state.serializer)
    return record


def _payload(record: dict[str, Any]) -> bytes:
    raw = record.get("payload_b64")
    if not isinstance(raw, str):
        return b""
    try:
        return base64.b64decode(raw)
    except ValueError:
        return b""


def _decode(payload: bytes, serializer: str) -> Any:
    """The payload decoded with msgpack or JSON (pickle is never loaded here); ``None`` when
    it does not decode (cut short, another format, hostile)."""
    loads = {"msgpack": msgpack_loads, "json": json_loads}.get(serializer)
    if loads is None or not payload:
        return None
    try:
        return loads(payload)
    except Exception:
        return None


def _task_of(payload: bytes, serializer: str) -> str | None:
    record = _decode(payload, serializer)
    fn = codec.job_fields(record).function if isinstance(record, dict) else None
    return fn[:256] if isinstance(fn, str) else None


def preview(payload: bytes, serializer: str, limit: int = PREVIEW_BYTES) -> dict[str, Any]:
    """A text preview of a payload: the decoded record as JSON when it decodes, else the
    bytes as text (undecodable bytes escaped); ``truncated`` when cut to ``limit``. The JSON is
    rendered piece by piece and only up to the cut (a 64 KB payload nested 700 deep would be
    ~80 MB of indented text)."""
    decoded = _decode(payload, serializer)
    if decoded is not None:
        encoder = json.JSONEncoder(indent=2, default=repr, ensure_ascii=False)
        try:
            text = "".join(_upto(encoder.iterencode(decoded), limit + 1))
            return {"format": serializer, "text": text[:limit], "truncated": len(text) > limit}
        except (RecursionError, ValueError):
            pass  # nested deeper than Python recurses: shown as bytes
    # a character is at most 4 bytes: more than 4 * limit bytes are more than limit characters
    head = payload[: 4 * limit + 4]
    text = head.decode("utf-8", errors="backslashreplace")
    more = len(text) > limit or len(head) < len(payload)
    return {"format": "raw", "text": text[:limit], "truncated": more}


def _upto(chunks: Any, limit: int) -> Any:
    """The chunks of ``chunks`` until they hold ``limit`` characters (then stop reading)."""
    total = 0
    for chunk in chunks:
        yield chunk
        total += len(chunk)
        if total >= limit:
            return
