"""The first hour of a new user, driven as they would drive it: real ``python -m worker``
processes, a real server, the command line and the HTTP probes.

- a second terminal runs ``status`` (and the ``web`` console) with no settings at all and
  finds the demo's embedded server; it says which, and fails with one line once the demo is
  gone;
- ``status`` describes the app the live instances run (not the default demo), warns when
  ``--app`` disagrees, and describes the last app when nothing runs;
- two local workers do not clash on the health port; ``health`` probes each, or the one named;
  ``/metrics`` carries no ``_created`` series;
- per-command help; ``trigger``, ``pause``, ``resume`` act on the running cluster;
- ``run --burst`` drains what is due and exits (1 if a job failed).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import FAST_ENV, ROOT, CliRun, Spawn, WorkerProc, client_call, wait_until
from harness.procs import repo_env

pytestmark = pytest.mark.slow


def _user_env(**extra: str) -> dict[str, str]:
    """A newcomer's environment: no WORKER_* variables (plus ``extra``)."""
    return repo_env(PYTHONUNBUFFERED="1", **extra)


def _events(proc: WorkerProc) -> list[dict[str, Any]]:
    return proc.events()


def test_a_second_terminal_finds_the_demo_by_itself(cli: CliRun, tmp_path: Path) -> None:
    demo = WorkerProc(
        [], _user_env(DEMO_CARDS="50", WORKER_LOG_FORMAT="json"), tmp_path / "demo.log", "demo"
    )
    try:
        wait_until(lambda: "export WORKER_REDIS_URL=" in demo.log(), 60, what="the start banner")
        url = re.search(r"export WORKER_REDIS_URL=(\S+)", demo.log())
        assert url is not None and url.group(1).startswith("unix://")
        wait_until(
            lambda: any(e.get("event") == "worker starting" for e in _events(demo)),
            60,
            what="start",
        )

        # no WORKER_REDIS_URL, no --app: the demo's server and the demo app, said on stderr
        proc = cli("status", "--json")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["described_app"] == "demo"
        assert [i["name"] for i in data["instances"] if i["alive"]] != []
        assert f"using the embedded Redis of the local worker (pid {demo.pid})" in proc.stderr
        assert url.group(1) in proc.stderr
        # the ready-to-paste line works as printed
        pasted = cli("status", "--json", env={"WORKER_REDIS_URL": url.group(1)})
        assert pasted.returncode == 0 and json.loads(pasted.stdout)["described_app"] == "demo"
        assert "embedded Redis" not in pasted.stderr
        # the console, the same way: no URL, no app
        token = "first-hour-token-0123456789"
        web = WorkerProc(
            ["web", "--port", "0"], _user_env(WORKER_WEB_TOKEN=token), tmp_path / "web.log", "web"
        )
        try:
            found = wait_until(
                lambda: re.search(r"worker console: (http://\S+)", web.log()), 60, what="console"
            )
            assert f"using the embedded Redis of the local worker (pid {demo.pid})" in web.log()
            request = urllib.request.Request(
                found.group(1) + "api/overview", headers={"X-Worker-Token": token}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                overview = json.load(response)
            assert overview["cluster"]["described_app"] == "demo"
        finally:
            web.close()

        demo.signal(signal.SIGINT)  # Ctrl-C
        assert demo.proc.wait(60) == 0
    finally:
        demo.close()
    gone = cli("status")
    assert gone.returncode == 2
    assert gone.stderr.count("\n") == 1 and "no local worker with an embedded server" in gone.stderr


def test_status_describes_the_running_app_not_the_default(
    spawn: Spawn, cli: CliRun, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    empty = cli("status", "--json", env=env)
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout)["periodic"] == []  # not the demo's nine jobs
    assert "no live instances and no app recorded" in empty.stderr

    leader = spawn("all", name="ledger-1")
    wait_until(lambda: "worker starting" in leader.log(), 60, what="start")

    proc = cli("status", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["described_app"] == "ledger"
    assert [p["name"] for p in data["periodic"]] == ["tick"]
    assert [p["name"] for p in data["pollers"]] == ["items"]
    assert [i["name"] for i in data["initializers"]] == ["seed"]
    assert "as declared by its 1 live instance" in proc.stderr

    other = cli("status", "--json", "--app", "worker.demo:app", env=env)
    assert other.returncode == 0, other.stderr
    assert json.loads(other.stdout)["described_app"] == "demo"
    assert "run 'ledger' (1); describing 'demo' as asked" in other.stderr

    doctor = cli("doctor", "--json", env=env)
    assert "this doctor loaded" not in doctor.stdout  # it checked the app that runs

    assert leader.terminate() == 0
    after = cli("status", "--json", env=env)
    assert json.loads(after.stdout)["described_app"] == "ledger"
    assert "no live instances; app 'ledger' as it last ran" in after.stderr


def _probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_two_local_workers_get_their_own_health_ports(
    spawn: Spawn, cli: CliRun, redis_url: str
) -> None:
    # the default port, not configured: as a newcomer runs two processes
    local: dict[str, str | None] = {"WORKER_HEALTH_PORT": None}
    first = spawn("all", name="first", env=local)
    second = spawn("consumer", name="second", env=local)
    ports: dict[str, int] = {}

    def bound() -> bool:
        for p in (first, second):
            for e in _events(p):
                if e.get("event") == "health server listening":
                    ports[p.name] = int(e["port"])
        return len(ports) == 2

    wait_until(bound, 60, what="both health servers")
    assert ports["first"] != ports["second"]
    moved = [p for p in (first, second) if "is in use (another local worker?)" in p.log()]
    assert len(moved) <= 2  # 8080 may be taken by something else on this machine too

    every = cli("health")
    assert every.returncode == 0, every.stderr
    assert every.stdout.count('"status": "ok"') == 2
    assert "first (pid" in every.stderr and "second (pid" in every.stderr

    one = cli("health", "--instance", "second")
    assert one.returncode == 0 and one.stdout.count('"status": "ok"') == 1

    status, body = _probe(f"http://127.0.0.1:{ports['second']}/metrics")
    assert status == 200 and "worker_jobs_total" in body
    assert "_created" not in body

    # the registry says where each one listens
    proc = cli(
        "status",
        "--json",
        env={"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": spawn.prefix},  # type: ignore[attr-defined]
    )
    by_name = {i["name"]: i for i in json.loads(proc.stdout)["instances"]}
    assert by_name["second"]["health_port"] == ports["second"]

    second.kill()
    gone = cli("health", "--instance", "second")
    assert gone.returncode == 1 and "no local worker named 'second'" in gone.stderr

    # a configured port is strict: taken -> exit 2, one line
    taken = spawn("consumer", name="third", env={"WORKER_HEALTH_PORT": str(ports["first"])})
    assert taken.proc.wait(60) == 2
    assert "WORKER_HEALTH_PORT" in taken.log() and "address already in use" in taken.log()


def test_every_command_has_its_own_help(cli: CliRun) -> None:
    top = cli("--help")
    assert top.returncode == 0
    for command in ("run", "plan", "status", "health", "doctor", "dead", "trigger", "pause"):
        assert f"    {command} " in top.stdout, command
    dead = cli("dead", "--help")
    assert "--purge" in dead.stdout and "--role" not in dead.stdout
    run = cli("run", "--help")
    assert "--burst" in run.stdout and "--health-port" in run.stdout and "--purge" not in run.stdout
    assert "Ctrl-C" in run.stdout
    bad = cli("dead", "--purge", "--retry-all")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not allowed" in bad.stderr
    assert bad.stderr.startswith("worker: error:")


def test_trigger_pause_and_resume_act_on_the_running_cluster(
    spawn: Spawn, cli: CliRun, redis_url: str, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": prefix}
    spawn("all", name="l1")
    ticks = f"{prefix}ledger:ticks"
    wait_until(lambda: rsync.hlen(ticks) >= 2, 60, what="ticks")

    paused = cli("pause", "tick", env=env)
    assert paused.returncode == 0, paused.stderr
    assert "periodic job 'tick' paused cluster-wide" in paused.stdout
    shown = json.loads(cli("status", "--json", env=env).stdout)
    assert [p["paused"] for p in shown["periodic"]] == [True]
    time.sleep(1.5)  # a tick enqueued just before the pause may still run
    before = rsync.hlen(ticks)
    time.sleep(3)
    assert rsync.hlen(ticks) == before, "ticks ran while paused"

    # trigger runs the paused job once now, off the schedule grid
    triggered = cli("trigger", "tick", env=env)
    assert triggered.returncode == 0, triggered.stderr
    found = re.search(r"enqueued \S+:periodic:tick:(\d+)", triggered.stdout)
    assert found is not None, triggered.stdout
    wait_until(lambda: rsync.hlen(ticks) == before + 1, 30, what="the triggered run")
    assert rsync.hget(ticks, found.group(1)) == b"1"

    resumed = cli("resume", "tick", env=env)
    assert resumed.returncode == 0 and "resumed" in resumed.stdout
    wait_until(lambda: rsync.hlen(ticks) >= before + 3, 30, what="ticks after resume")
    assert all(int(v) == 1 for v in rsync.hvals(ticks)), "a tick ran twice"

    unknown = cli("pause", "nope", env=env)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1
    assert (
        "no periodic job, poller or outbox relay 'nope'" in unknown.stderr
        and "tick" in unknown.stderr
    )


def _burst(redis_url: str, prefix: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **_user_env(**FAST_ENV),
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.ledger:app",
    }
    return subprocess.run(
        [sys.executable, "-m", "worker", "run", "--burst", *extra],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_burst_runs_what_is_due_and_exits(
    redis_url: str, rsync: redis_sync.Redis, spawn: Spawn
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    for i in range(50):
        client_call(redis_url, prefix, "enqueue", "record", f"k{i}")
    client_call(redis_url, prefix, "enqueue", "record", "later", defer_by=3600)
    done = _burst(redis_url, prefix)
    assert done.returncode == 0, done.stdout + done.stderr
    records = {k.decode(): int(v) for k, v in rsync.hgetall(f"{prefix}ledger:records").items()}
    assert records == {f"k{i}": 1 for i in range(50)}  # each once; the deferred one waits
    assert rsync.zcard(f"{prefix}queue") == 1

    client_call(redis_url, prefix, "enqueue", "fail", "x")
    client_call(redis_url, prefix, "enqueue", "record", "after-failure")
    failed = _burst(redis_url, prefix)
    assert failed.returncode == 1
    assert rsync.hget(f"{prefix}ledger:records", "after-failure") == b"1"

    leader = _burst(redis_url, prefix, "--role", "leader")
    assert leader.returncode == 2 and "--burst runs a consumer only" in leader.stderr
