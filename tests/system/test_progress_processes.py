"""Health means progress, with real processes: a stalled service fails ``/healthz`` within its
SLA, a failing dependency check fails ``/readyz`` only, a failing periodic job shows its last
failure in ``status --json``; ``doctor`` passes on a healthy 2-process cluster and fails with
the right lines on a stale instance, an evicting Redis and no leader."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import redis as redis_sync

from harness import FAST_ENV, CliRun, Spawn, wait_until
from harness.ports import free_port

pytestmark = pytest.mark.timeout(180)


def probe(port: int, path: str) -> tuple[int | None, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except OSError as exc:
        return None, str(exc)


def cli_env(redis_url: str, prefix: str, app: str, **extra: str) -> dict[str, str]:
    return {
        **FAST_ENV,
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": app,
        **extra,
    }


@pytest.mark.slow
def test_progress_readiness_and_periodic_failures(
    spawn: Spawn, cli: CliRun, rsync: redis_sync.Redis, redis_url: str
) -> None:
    port = free_port()
    app = "harness.apps.progress:app"
    proc = spawn("all", name="p1", app=app, env={"WORKER_HEALTH_PORT": str(port)})
    prefix = spawn.prefix  # type: ignore[attr-defined]

    def switch(name: str, on: bool) -> None:
        key = f"{prefix}progress:{name}"
        rsync.set(key, 1) if on else rsync.delete(key)

    def status_is(path: str, code: int) -> Any:
        assert proc.alive(), proc.log()
        got, body = probe(port, path)
        return body if got == code else None

    wait_until(lambda: status_is("/readyz", 200), 30, what="ready (the check passed once)")
    assert probe(port, "/healthz")[0] == 200

    # a dependency down: unready, still live
    switch("down", True)
    body = wait_until(lambda: status_is("/readyz", 503), 10, what="unready")
    assert body["unready"] == ["check dependency: ConnectionError"], body
    assert probe(port, "/healthz")[0] == 200
    _, status = probe(port, "/status")
    check = status["components"]["health-checks"]["checks"]["dependency"]
    assert check["state"] == "failing" and check["error"] == "ConnectionError"
    switch("down", False)
    wait_until(lambda: status_is("/readyz", 200), 10, what="ready again")

    # a periodic job failing: its last failure in status --json; stale after max_staleness
    # (2 s): reported in the probes' bodies, failing neither
    switch("fail", True)
    env = cli_env(redis_url, prefix, app)

    def last_failure() -> Any:
        out = cli("status", "--json", env=env)
        assert out.returncode == 0, out.stderr
        (flaky,) = json.loads(out.stdout)["periodic"]
        return flaky if flaky["last_failure"] else None

    flaky = wait_until(last_failure, 20, interval=0.5, what="a recorded failure")
    failure = flaky["last_failure"]
    assert failure["error"] == "ValueError" and failure["instance"].startswith("p1-")
    assert failure["tick"] and failure["at"] and flaky["failing_since"]
    body = wait_until(lambda: status_is("/healthz", 200)["warnings"], 15, what="stale warning")
    assert body == [w for w in body if w.startswith("periodic flaky: stale")], body
    assert probe(port, "/readyz")[0] == 200  # stale jobs never unready a leader
    switch("fail", False)
    flaky = wait_until(
        lambda: (f := last_failure()) and f["last_success"] and not f["stale"] and f,
        20,
        interval=0.5,
        what="a success after the failures",
    )
    assert flaky["failing_since"] is None
    assert flaky["last_failure"]["error"] == "ValueError"  # the failure stays on record

    # one per_key loop stops yielding: the service is overdue, the key named
    switch("stall:k1", True)
    started = time.monotonic()
    body = wait_until(lambda: status_is("/healthz", 503), 10, interval=0.05, what="overdue")
    assert time.monotonic() - started < 1.5 + 1.0, "503 within the SLA (+ probe slack)"
    assert body["overdue"] == ["service:boxes"], body
    _, status = probe(port, "/status")
    assert status["components"]["service:boxes"]["overdue_parts"] == ["k1"]
    switch("stall:k1", False)
    wait_until(lambda: status_is("/healthz", 200), 10, what="live again")

    # the per_process service stops calling ctx.alive()
    switch("stall", True)
    started = time.monotonic()
    body = wait_until(lambda: status_is("/healthz", 503), 10, interval=0.05, what="overdue")
    assert time.monotonic() - started < 1.5 + 1.0, "503 within the SLA (+ probe slack)"
    assert body["overdue"] == ["service:stall"], body
    assert proc.alive()


def doctor(cli: CliRun, env: dict[str, str], *args: str) -> tuple[int, str]:
    out = cli("doctor", *args, env=env)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout


def failed_lines(text: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("✗")]


@pytest.mark.slow
def test_doctor_on_a_real_cluster(
    spawn: Spawn, cli: CliRun, rsync: redis_sync.Redis, redis_url: str
) -> None:
    # a long orphan bound: a dead instance stays registered (not reaped) for the checks to see
    env = {"WORKER_ORPHAN_STALE_S": "60"}
    leader = spawn("leader", name="l1", env=env)
    consumer = spawn("consumer", name="c1", env=env)
    cenv = cli_env(redis_url, spawn.prefix, "harness.apps.ledger:app", **env)  # type: ignore[attr-defined]

    def passes() -> str | None:
        for p in (leader, consumer):
            assert p.alive(), p.log()
        code, text = doctor(cli, cenv)
        return text if code == 0 else None

    text = wait_until(passes, 40, interval=0.5, what="doctor passing on a healthy cluster")
    assert failed_lines(text) == [] and "✓ leader" in text and "l1 leads" in text
    assert "✓ heartbeats         2 instances heartbeating (1 consumer, 1 leader)" in text
    code, out = doctor(cli, cenv, "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["failed"] == []

    # an evicting Redis (the workers checked it only at start)
    policy = rsync.config_get("maxmemory-policy")["maxmemory-policy"]
    rsync.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, text = doctor(cli, cenv)
        assert code == 1 and failed_lines(text) == ["eviction"], text
        assert "maxmemory-policy is allkeys-lru" in text
    finally:
        rsync.config_set("maxmemory-policy", policy)

    # a stale instance: the consumer is killed, its registration stays
    consumer.signal(signal.SIGKILL)
    consumer.proc.wait(10)

    def stale() -> str | None:
        code, text = doctor(cli, cenv)
        return text if code == 1 and "heartbeats" in failed_lines(text) else None

    text = wait_until(stale, 20, interval=0.5, what="the dead consumer reported")
    assert "c1 (c1-" in text or "(c1-" in text, text
    assert "1 of 2 registered instances stopped heartbeating" in text

    # no leader: the leader is killed; its lock expires after the TTL
    leader.signal(signal.SIGKILL)
    leader.proc.wait(10)

    def leaderless() -> str | None:
        code, text = doctor(cli, cenv)
        # first "held, but nobody reports leading"; then, once it expired, "no leader"
        return text if code == 1 and "✗ leader             no leader" in text else None

    text = wait_until(leaderless, 20, interval=0.5, what="no leader reported")
    assert "leader" in failed_lines(text)
    code, out = doctor(cli, cenv, "--json")
    assert code == 1 and {"leader", "heartbeats"} <= set(json.loads(out)["failed"])
