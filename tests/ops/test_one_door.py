"""One door for operator actions (real processes): what the command line does goes through
``actions.Operations`` like the console's buttons, so the console's activity log shows it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
import redis as redis_sync

from harness import CliRun, Spawn, client_call, free_port, wait_until

pytestmark = pytest.mark.slow

TOKEN = "one-door-token-0123456789"


def _overview(port: int) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/overview", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return dict(json.loads(resp.read()))


def test_cli_actions_show_in_the_consoles_activity_log(
    spawn: Spawn, cli: CliRun, redis_url: str, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="a1")
    port = free_port()
    web = spawn(
        "all",
        name="web",
        command="web",
        env={"WORKER_WEB_TOKEN": TOKEN, "WORKER_WEB_PORT": str(port)},
    )
    wait_until(lambda: "console listening" in web.log(), 30, what="the console")
    job_id = client_call(redis_url, prefix, "enqueue", "no_such_task")
    wait_until(lambda: rsync.zscore(f"{prefix}dead", job_id) is not None, 30, what="a dead letter")

    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    paused = cli("pause", "tick", env=env)
    assert paused.returncode == 0, paused.stderr
    retried = cli("dead", "--retry", job_id, env=env)
    assert retried.returncode == 0 and f"{job_id}: requeued" in retried.stdout, retried.stderr
    resumed = cli("resume", "tick", env=env)
    assert resumed.returncode == 0, resumed.stderr

    overview = _overview(port)
    audit = overview["audit"]
    assert [(a["action"], a["target"], a["via"]) for a in audit] == [
        ("resume", "periodic:tick", "cli"),
        ("requeue", job_id, "cli"),
        ("pause", "periodic:tick", "cli"),
    ], audit
    assert all(a["ok"] and "@" in a["who"] for a in audit)
    assert [p["paused"] for p in overview["cluster"]["periodic"]] == [False]
