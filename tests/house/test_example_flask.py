"""The Flask example (examples/flask) for real: its app served by werkzeug's threaded server
(each request on its own thread, all sharing one ``SyncClient``), a real worker process running
``reports:app`` (a plain ``def`` task and an async one), one real server, driven over HTTP."""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
from werkzeug.serving import BaseWSGIServer, make_server

from harness import ROOT, Spawn, wait_until
from worker import SyncClient

EXAMPLE = ROOT / "examples" / "flask"


class Served:
    def __init__(self, server: BaseWSGIServer) -> None:
        self.base = f"http://127.0.0.1:{server.server_port}"

    def call(self, method: str, path: str) -> tuple[int, Any]:
        req = urllib.request.Request(
            self.base + path, method=method, data=b"" if method == "POST" else None
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None


@pytest.fixture
def web(
    redis_url: str, spawn: Spawn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Served]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setenv("REPORTS_DB", str(tmp_path / "reports.sqlite3"))
    module = importlib.import_module("web")
    client = SyncClient.connect(redis_url, app=module.reports.app, key_prefix=spawn.prefix)  # type: ignore[attr-defined]
    server = make_server("127.0.0.1", 0, module.create_app(client), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Served(server)
    finally:
        server.shutdown()
        thread.join(10)
        client.close()
        for name in ("web", "reports"):
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_a_request_leads_to_the_plain_def_job_running(
    web: Served, spawn: Spawn, rsync: redis_sync.Redis, tmp_path: Path
) -> None:
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXAMPLE)]),
        "REPORTS_DB": str(tmp_path / "reports.sqlite3"),
    }
    proc = spawn("all", app="reports:app", env=env)
    prefix = spawn.prefix  # type: ignore[attr-defined]
    assert web.call("GET", "/reports/7") == (404, None)
    # several request threads at once through the one SyncClient: one job per user
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda u: web.call("POST", f"/reports/{u}"), [7, 7, 8, 8, 9, 9]))
    assert all(code == 200 for code, _ in answers), answers
    assert sorted(b["new"] for _, b in answers) == [False] * 3 + [True] * 3
    job_id = answers[0][1]["job_id"]
    assert job_id == f"{prefix}unique:report:7"

    def complete(job_id: str) -> Any:
        code, body = web.call("GET", f"/jobs/{job_id}")
        assert code == 200, body
        return body if body["status"] == "complete" else None

    done = wait_until(lambda: complete(job_id), timeout=30, what=f"the report job\n{proc.log()}")
    assert done == {
        "job_id": job_id, "status": "complete", "success": True,
        "result": {"user_id": 7, "lines": 3},
    }  # fmt: skip
    code, body = web.call("GET", "/reports/7")
    assert code == 200 and body["report"].splitlines()[-1] == "month 3: 21 orders"
    # the plain def task enqueued the async one from its thread
    notified = f"{prefix}reports:notified"
    wait_until(lambda: rsync.hlen(notified) == 3, timeout=30, what="the notices")
    assert web.call("GET", "/jobs/no-such-job") == (404, None)
    assert proc.terminate() == 0, proc.log()
