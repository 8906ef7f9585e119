"""The command line's contract: bad input exits 2 with one line on stderr, never a traceback;
``--role all`` without a Redis URL runs on a private embedded server and stops cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harness import ROOT, CliRun, wait_until
from harness.ports import free_port
from harness.procs import repo_env

pytestmark = pytest.mark.timeout(120)


def assert_config_error(proc: subprocess.CompletedProcess[str], *mentions: str) -> str:
    """Exit code 2, exactly one line on stderr naming what is wrong, no traceback."""
    out = f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 2, out
    assert "Traceback" not in proc.stderr and "Traceback" not in (proc.stdout or ""), out
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, out
    line = lines[0]
    for m in mentions:
        assert m in line, out
    return line


def test_bogus_role_flag(cli: CliRun) -> None:
    proc = cli("run", "--role", "bogus", env={"WORKER_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert_config_error(proc, "WORKER_ROLE", "bogus")


def test_bogus_role_env(cli: CliRun) -> None:
    proc = cli("plan", env={"WORKER_ROLE": "bogus"})
    assert_config_error(proc, "WORKER_ROLE")


def test_unreachable_redis(cli: CliRun) -> None:
    port = free_port()
    started = time.monotonic()
    proc = cli(
        "run",
        "--role",
        "consumer",
        env={
            "WORKER_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "WORKER_REDIS_CONNECT_TIMEOUT_S": "1",
            "WORKER_APP": "harness.apps.ledger:app",
        },
    )
    # while it retries, a line a second says so (tests/system/test_startup_truth.py); then one error
    retrying = [ln for ln in proc.stderr.splitlines() if "Redis not reachable" in ln]
    assert 1 <= len(retrying) <= 2, proc.stderr
    proc.stderr = "".join(f"{ln}\n" for ln in proc.stderr.splitlines() if ln not in retrying)
    line = assert_config_error(proc, "WORKER_REDIS_URL", str(port))
    assert time.monotonic() - started < 30, line


def test_malformed_redis_url(cli: CliRun) -> None:
    proc = cli("run", "--role", "consumer", env={"WORKER_REDIS_URL": "http://x"})
    assert_config_error(proc, "WORKER_REDIS_URL", "http")


def test_unimportable_app(cli: CliRun) -> None:
    proc = cli(
        "run",
        "--role",
        "consumer",
        "--app",
        "no_such_package_xyz.jobs:app",
        env={"WORKER_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert_config_error(proc, "WORKER_APP", "no_such_package_xyz")


def test_app_attribute_missing(cli: CliRun) -> None:
    proc = cli("plan", "--app", "harness.apps.ledger:nope")
    assert_config_error(proc, "WORKER_APP", "nope")


def test_app_with_bad_cron(cli: CliRun, tmp_path: Path) -> None:
    (tmp_path / "badcron_app.py").write_text(
        textwrap.dedent(
            """
            from worker import App

            app = App("badcron")

            @app.periodic(cron="61 * * * *")
            async def every_61st_minute(ctx):
                pass
            """
        )
    )
    env = {
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        "WORKER_REDIS_URL": "redis://127.0.0.1:1/0",
        "WORKER_APP": "badcron_app:app",
    }
    assert_config_error(cli("run", "--role", "consumer", env=env), "cron", "61 * * * *")
    assert_config_error(cli("plan", "--role", "leader", env=env), "cron")


@pytest.mark.parametrize("role", ["leader", "consumer"])
def test_shared_role_without_redis_url(cli: CliRun, role: str) -> None:
    proc = cli("run", "--role", role, env={"WORKER_APP": "harness.apps.ledger:app"})
    assert_config_error(proc, "WORKER_REDIS_URL", role)


@pytest.mark.parametrize("value", ["zero", "0", "-3"])
def test_bad_concurrency(cli: CliRun, value: str) -> None:
    proc = cli(
        "run",
        "--role",
        "consumer",
        env={"WORKER_REDIS_URL": "redis://127.0.0.1:1/0", "WORKER_CONCURRENCY": value},
    )
    assert_config_error(proc, "WORKER_CONCURRENCY", value)


def test_bad_leader_timing_relation(cli: CliRun) -> None:
    proc = cli(
        "plan",
        env={"WORKER_LEADER_TTL_S": "2", "WORKER_LEADER_RENEW_DEADLINE_S": "6"},
    )
    assert_config_error(proc, "WORKER_LEADER_TTL_S")


def test_unknown_command(cli: CliRun) -> None:
    assert_config_error(cli("frobnicate"), "frobnicate")


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@pytest.mark.slow
def test_role_all_with_embedded_server(tmp_path: Path) -> None:
    """No WORKER_REDIS_URL + ``--role all``: a private server, the demo app, clean SIGTERM."""
    env = repo_env(
        WORKER_HEALTH_PORT="0",
        WORKER_DRAIN_DELAY_S="0",
        WORKER_LOG_FORMAT="json",
    )
    assert "WORKER_REDIS_URL" not in env
    log_path = tmp_path / "all.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "--role", "all"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        started = wait_until(
            lambda: (
                next((e for e in _events(log_path) if e.get("event") == "worker starting"), None)
                or (proc.poll() is not None and {"exited": proc.returncode})
            ),
            timeout=60,
            what="the start-up event",
        )
        assert "exited" not in started, log_path.read_text()
        assert started["role"] == "all"
        assert started["disabled"] == []
        assert {"consumer", "leader-election", "periodic"} <= set(started["enabled"])
        url = started["redis"]
        assert url.startswith("unix://"), url
        socket_path = url.removeprefix("unix://")
        assert os.path.exists(socket_path)
        time.sleep(1.0)  # let components start, so the shutdown below is a real one
        assert proc.poll() is None, log_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()
        assert "Traceback" not in log_path.read_text()
        assert not os.path.exists(socket_path), "the private server's socket outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# -- output into a closed pipe (``status | head -1``) ---------------------------------------------


def _first_line_then_close(args: list[str], env: dict[str, str]) -> tuple[str, int, str]:
    """Run ``python -m worker ARGS`` into a real pipe, read one line, close the pipe."""
    full = repo_env(**env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", *args],
        env=full,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline().decode()
    proc.stdout.close()
    code = proc.wait(60)
    with proc.stderr:
        return first, code, proc.stderr.read().decode()


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["dead", "--retry-all"]])
def test_closed_stdout_exits_quietly(redis_url: str, args: list[str]) -> None:
    import redis as redis_sync

    prefix = "pipe:"
    with redis_sync.Redis.from_url(redis_url) as r:
        # far more output than a pipe buffers (64 KiB), so the writer must hit the closed end
        r.zadd(f"{prefix}instances", {f"gone-instance-{n:05d}": n for n in range(3000)})
        r.zadd(f"{prefix}dead", {f"dead-job-{n:05d}": n for n in range(3000)})
        r.hset(
            f"{prefix}dead:jobs",
            mapping={
                f"dead-job-{n:05d}": json.dumps({"job_id": f"dead-job-{n:05d}", "reason": "x"})
                for n in range(3000)
            },
        )
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    first, code, stderr = _first_line_then_close(args, env)
    assert first.strip(), "no output at all"
    # quiet: at most the notes saying which Redis and app (printed before the output)
    assert all(line.startswith("worker: ") for line in stderr.splitlines()), stderr
    assert "error" not in stderr and "Traceback" not in stderr, stderr
    assert code == 1, (code, stderr)


def test_plan_into_a_closed_pipe(cli: CliRun) -> None:
    first, code, stderr = _first_line_then_close(["plan", "--role", "leader"], {})
    assert first.startswith("instance: ")
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert code in (0, 1)


# -- values that used to validate and then fail at run time ---------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "1e309"])
def test_non_finite_duration(cli: CliRun, value: str) -> None:
    env = {"WORKER_REDIS_URL": "redis://127.0.0.1:1/0", "WORKER_JOB_TIMEOUT_S": value}
    assert_config_error(cli("run", "--role", "consumer", env=env), "WORKER_JOB_TIMEOUT_S", "finite")


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:notaport/0",
        "redis://127.0.0.1:99999/0",
        "redis://127.0.0.1/0?db=x",
        "redis://:Zq7/Xk9@127.0.0.1/0",
        "redis://:Zq7#Xk9@127.0.0.1/0",
    ],
)
def test_malformed_redis_url_at_run(cli: CliRun, url: str) -> None:
    env = {"WORKER_REDIS_URL": url, "WORKER_APP": "harness.apps.ledger:app"}
    line = assert_config_error(cli("run", "--role", "consumer", env=env), "WORKER_REDIS_URL")
    assert "Zq7" not in line and "Xk9" not in line, line


def test_unknown_key_in_config_file_at_run(cli: CliRun, tmp_path: Path) -> None:
    cfg = tmp_path / "worker.toml"
    cfg.write_text("concurency = 5\n")
    line = assert_config_error(cli("plan", env={"WORKER_CONFIG_FILE": str(cfg)}))
    assert line.endswith(
        "WORKER_CONFIG_FILE: unknown setting 'concurency'; did you mean 'concurrency'?"
    )


def test_redis_url_from_a_file(cli: CliRun, redis_url: str, tmp_path: Path) -> None:
    url_file = tmp_path / "url"
    url_file.write_text(redis_url + "\n")  # as a Secret volume may hold it
    ok = cli("status", "--json", env={"WORKER_REDIS_URL_FILE": str(url_file)})
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["leader"] == {"held": False}

    missing = {
        "WORKER_REDIS_URL_FILE": str(tmp_path / "nope"),
        "WORKER_APP": "harness.apps.ledger:app",
    }
    assert_config_error(
        cli("run", "--role", "consumer", env=missing), "WORKER_REDIS_URL_FILE", "nope"
    )
    both = {"WORKER_REDIS_URL_FILE": str(url_file), "WORKER_REDIS_URL": redis_url}
    assert_config_error(cli("status", env=both), "WORKER_REDIS_URL", "WORKER_REDIS_URL_FILE")
