"""Probing what real worker processes did: their health server over HTTP, the instance records
they write, the edge-case app's ledger (on a second server), raw job records put as a foreign
producer would, and a problem problem_report that reads like a measurement."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis as redis_sync

from harness.arqfmt import expires_extra_ms
from harness.procs import Spawn, WorkerProc
from harness.waiting import wait_until
from worker.core.serializer import get_serializer, job_payload
from worker.storage import keys as K


def led_key(prefix: str, name: str) -> str:
    return f"{prefix}edge:{name}"


def led_hash(lsync: redis_sync.Redis, prefix: str, name: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in lsync.hgetall(led_key(prefix, name)).items()}


def led_total(lsync: redis_sync.Redis, prefix: str, name: str) -> int:
    return sum(led_hash(lsync, prefix, name).values())


def instance_records(r: redis_sync.Redis, prefix: str) -> list[dict[str, Any]]:
    keys = K.Keys(prefix)
    ids = [i.decode() for i in r.zrange(keys.instances, 0, -1)]
    raw = r.mget([keys.instance(i) for i in ids]) if ids else []
    return [json.loads(x) for x in raw if x]


def record_of(r: redis_sync.Redis, prefix: str, name: str) -> dict[str, Any] | None:
    return next((rec for rec in instance_records(r, prefix) if rec.get("name") == name), None)


def enqueue_jobs(
    r: redis_sync.Redis, prefix: str, function: str, args: Sequence[tuple[Any, ...]]
) -> list[str]:
    """Enqueue jobs exactly as arq lays them out (job record + queue entry), pipelined."""
    serialize, _ = get_serializer("msgpack")
    queue = K.Keys(prefix).queue
    now = int(time.time() * 1000)
    ids: list[str] = []
    for chunk in range(0, len(args), 1000):
        pipe = r.pipeline(transaction=False)
        for a in args[chunk : chunk + 1000]:
            jid = uuid.uuid4().hex
            pipe.set(K.ARQ_JOB + jid, job_payload(function, a, {}, now, serialize), px=86_400_000)
            pipe.zadd(queue, {jid: now})
            ids.append(jid)
        pipe.execute()
    return ids


def put_raw_job(r: redis_sync.Redis, prefix: str, job_id: str, payload: bytes) -> None:
    """A job record written by someone else (another client, an attacker, a bug)."""
    now = int(time.time() * 1000)
    with r.pipeline(transaction=True) as pipe:
        pipe.set(K.ARQ_JOB + job_id, payload, px=expires_extra_ms)
        pipe.zadd(K.Keys(prefix).queue, {job_id: now})
        pipe.execute()


def dead_records(r: redis_sync.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    """Dead-lettered job id -> its record (payload left out)."""
    keys = K.Keys(prefix)
    ids = [i.decode() for i in r.zrange(keys.dead, 0, -1)]
    out: dict[str, dict[str, Any]] = {}
    for jid in ids:
        raw = r.hget(keys.dead_jobs, jid)
        rec = json.loads(raw) if raw else {}
        rec.pop("payload_b64", None)
        out[jid] = rec
    return out


def http_get(port: int, path: str, timeout: float = 3.0) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return None, str(exc)


def start_consumers(
    spawn: Spawn, r: redis_sync.Redis, names: Sequence[str], app: str, env: dict[str, str]
) -> list[WorkerProc]:
    """A consumer process per name (``app``, ``env``), once every one has registered (its
    instance id starts with its name)."""
    procs = [spawn("consumer", name=n, app=app, env=env) for n in names]
    keys = K.Keys(spawn.prefix)  # type: ignore[attr-defined]

    def registered() -> bool:
        live = [m.decode() for m in r.zrange(keys.instances, 0, -1)]
        return all(any(m.startswith(f"{n}-") for m in live) for n in names)

    wait_until(registered, 30, what=f"{list(names)} to register")
    return procs


def wait_ready(proc: WorkerProc, port: int, timeout: float = 45) -> None:
    def check() -> bool:
        assert proc.alive(), f"{proc.name} exited early:\n{proc.log()[-3000:]}"
        return http_get(port, "/readyz")[0] == 200

    wait_until(check, timeout, what=f"{proc.name} /readyz 200")


def consumer_restarts(port: int) -> int | None:
    code, body = http_get(port, "/status")
    if code != 200:
        return None
    return int(json.loads(body)["components"]["consumer"]["restarts"])


def rss_mb(pid: int) -> tuple[float, float]:
    """``(VmRSS, VmHWM)`` of a process in MB (HWM: the peak RSS so far)."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def problem_report(title: str, problems: list[str], figures: dict[str, Any]) -> str:
    lines = [f"{title}: {len(problems)} problem(s)", *[f"  - {p}" for p in problems]]
    lines += ["  measured:", *[f"    {k}: {v}" for k, v in figures.items()]]
    return "\n".join(lines)


async def hold_running(
    r: Any, keys: K.Keys, queued_at_ms: int, *job_ids: str, token: str = "me/1"
) -> None:
    """Jobs as a claim by instance ``me`` leaves them (async client): queued record,
    in-progress marker, in the holds set."""
    for jid in job_ids:
        await r.zadd(keys.queue, {jid: queued_at_ms})
        await r.set(K.ARQ_JOB + jid, b"p")
        await r.set(K.ARQ_IN_PROGRESS + jid, token)
        await r.sadd(keys.holds("me"), jid)
