"""The console's dead-letter views cost about what they return: a page
is read without payloads, a payload's preview is bounded and rendered off the console's event
loop, a reason is capped (its length and sha256 kept).

Real ``python -m worker`` processes on a real server: a consumer sets the jobs aside for real,
then the console (``python -m worker web``) or the CLI reads them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis as redis_sync

from harness import CliRun, Spawn, WorkerProc, client_call, wait_until
from harness.ports import free_port
from harness.probes import put_raw_job, rss_mb
from tests.system.test_edges import good_record
from worker.storage import keys as K

pytestmark = pytest.mark.slow

TOKEN = "dead-bounds-tests-token-0123456789"
KB = 1024


def set_aside(spawn: Spawn, rsync: redis_sync.Redis, payloads: dict[str, bytes]) -> None:
    """Raw jobs of an unknown function, dead-lettered by a real consumer (then stopped)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn("all", name="consumer")
    for job_id, payload in payloads.items():
        put_raw_job(rsync, prefix, job_id, payload)
    wait_until(
        lambda: rsync.zcard(K.Keys(prefix).dead) == len(payloads), 60, what="the dead letters"
    )
    assert proc.terminate() == 0


def console(spawn: Spawn) -> tuple[WorkerProc, int]:
    port = free_port()
    web = spawn(
        "all",
        name="console",
        command="web",
        env={"WORKER_WEB_PORT": str(port), "WORKER_WEB_TOKEN": TOKEN},
    )
    wait_until(lambda: get(port, "/api/dead?size=1") is not None, 45, what="the console")
    return web, port


def get(port: int, path: str, timeout: float = 60) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def sent_bytes(rsync: redis_sync.Redis) -> int:
    """Bytes the server has sent to its clients so far (``INFO stats``)."""
    return int(rsync.info("stats")["total_net_output_bytes"])


def test_a_dead_letter_page_reads_without_the_payloads(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    """120 dead letters of 60 KB payloads each: a console page of 50 and the CLI's page of 100
    each make the server send less than 1 MB (the pages hold ~25 KB), and still name each
    job's function (read from the payload when it was set aside).

    Before: the console's page read 50 x 80 KB = ~4 MB, the CLI's ~8 MB, only to drop it."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    record = {**good_record(), "f": "no_such_task", "a": ["p" * (60 * KB)]}
    set_aside(spawn, rsync, {f"{prefix}d{i:03d}": msgpack.packb(record) for i in range(120)})
    _, port = console(spawn)

    before = sent_bytes(rsync)
    page = get(port, "/api/dead?page=1&size=50")
    web_sent = sent_bytes(rsync) - before
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix,
           "WORKER_APP": "harness.apps.ledger:app"}  # fmt: skip
    before = sent_bytes(rsync)
    listing = cli("dead", env=env)
    cli_sent = sent_bytes(rsync) - before

    figures = f"console page: {web_sent / KB:.0f} KB read; CLI page: {cli_sent / KB:.0f} KB read"
    assert listing.returncode == 0, listing.stderr
    assert page is not None and page["total"] == 120 and len(page["items"]) == 50, page
    assert all(r["task"] == "no_such_task" for r in page["items"]), page["items"][0]
    assert web_sent < KB * KB, figures
    assert cli_sent < KB * KB, figures


def nested(depth: int, leaves: int) -> bytes:
    """A job payload whose argument is ``leaves`` numbers ``depth`` lists deep."""
    inner: list[Any] = [7] * leaves
    for _ in range(depth):
        inner = [inner]
    return bytes(msgpack.packb({**good_record(), "f": "no_such_task", "a": inner}))


def test_a_nested_payload_preview_is_bounded_and_never_blocks_the_console(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    """A 60 KB payload nested 700 lists deep (~90 MB of indented JSON in full): its detail
    answers with a preview of at most 4096 characters, the console keeps answering other
    requests meanwhile (slowest < 1 s) and its memory peak grows by less than 40 MB.

    Before: the preview blocked the console ~3.5 s (every other request waited) and rendered
    the whole text first."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    job_id = f"{prefix}nested"
    payload = nested(700, 40_000)
    assert len(payload) < 64 * KB  # kept whole by the dead letter
    set_aside(spawn, rsync, {job_id: payload})
    web, port = console(spawn)
    time.sleep(0.5)
    _, peak_before = rss_mb(web.pid)

    result: dict[str, Any] = {}
    detail = threading.Thread(target=lambda: result.update(doc=get(port, f"/api/dead/{job_id}")))
    slowest = 0.0
    detail.start()
    while detail.is_alive():
        start = time.monotonic()
        assert get(port, "/api/dead?size=1", timeout=30) is not None
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.02)
    detail.join()
    _, peak_after = rss_mb(web.pid)

    figures = (
        f"slowest other request {slowest:.2f} s; peak RSS {peak_before:.0f} -> {peak_after:.0f} MB"
    )
    doc = result.get("doc")
    assert doc is not None and doc["preview"]["truncated"], doc
    assert len(doc["preview"]["text"]) <= 4096, figures
    assert slowest < 1.0, figures
    assert peak_after - peak_before < 40, figures


def test_a_huge_error_message_is_capped_with_its_length_and_hash(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    """A task that fails with a 5 MB message until set aside: the dead letter's reason, the
    consumer's log lines and the job's result each hold a few KB; the record keeps the full
    length and sha256 of the reason.

    Before: a 5 MB reason (and so a 5 MB record, 5 MB log lines and a 5 MB result)."""
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    chars = 5 * KB * KB
    proc = spawn("all", name="solo", app="harness.apps.hostile:app")
    job_id = client_call(redis_url, prefix, "enqueue", "loud", chars)
    wait_until(lambda: rsync.zscore(keys.dead, job_id) is not None, 60, what="the dead letter")
    time.sleep(1.0)
    record = json.loads(rsync.hget(keys.dead_jobs, job_id))
    full = f"RuntimeError: {'x' * chars} (after 2 tries)"
    longest_line = max(len(line) for line in Path(proc.log_path).read_text().splitlines())
    result_bytes = rsync.strlen(K.ARQ_RESULT + job_id)
    figures = (
        f"reason {len(record['reason'])} chars, record {rsync.hstrlen(keys.dead_jobs, job_id)} B,"
        f" longest log line {longest_line} B, result {result_bytes} B"
    )
    assert len(record["reason"]) < 4 * KB, figures
    assert record.get("reason_chars") == len(full), figures
    assert record.get("reason_sha256") == hashlib.sha256(full.encode()).hexdigest(), figures
    assert longest_line < 16 * KB, figures
    assert result_bytes < 16 * KB, figures
