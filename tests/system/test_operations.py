"""Operating real processes: graceful SIGTERM, probes, metrics, ``status``, ``health``,
orphan recovery after SIGKILL, and secrets kept out of every surface."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import redis as redis_sync
from prometheus_client.parser import text_string_to_metric_families

from harness import ROOT, CliRun, Spawn, ledger, wait_until
from harness.apps.ledger import app as ledger_app
from harness.ports import free_port
from harness.probes import http_get, wait_ready
from harness.procs import repo_env
from worker.client import Client
from worker.storage import keys as K

pytestmark = pytest.mark.timeout(120)


# -- helpers --------------------------------------------------------------------------------------


def enqueue(url: str, prefix: str, function: str, *args: Any) -> str:
    async def go() -> str | None:
        client = await Client.connect(url, app=ledger_app, key_prefix=prefix)
        try:
            return await client.enqueue(function, *args)
        finally:
            await client.close()

    job_id = asyncio.run(go())
    assert job_id is not None
    return job_id


def instance_id(r: redis_sync.Redis, prefix: str, name: str) -> str | None:
    for m in r.zrange(K.Keys(prefix).instances, 0, -1):
        if m.decode().startswith(f"{name}-"):
            return str(m.decode())
    return None


def instance_record(r: redis_sync.Redis, prefix: str, name: str) -> dict[str, Any] | None:
    iid = instance_id(r, prefix, name)
    raw = r.get(K.Keys(prefix).instance(iid)) if iid else None
    return json.loads(raw) if raw else None


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


# -- graceful shutdown ----------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_drains_in_flight_job_and_releases_lock(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    port = free_port()
    leader = spawn(
        "leader",
        name="l1",
        env={
            "WORKER_HEALTH_PORT": str(port),
            "WORKER_LEADER_TTL_S": "10",  # so a released lock cannot be mistaken for expiry
            "WORKER_DRAIN_DELAY_S": "0.5",
        },
    )
    wait_ready(leader, port)
    wait_until(lambda: rsync.get(keys.leader), 20, what="the leader lock")
    assert http_get(port, "/healthz")[0] == 200
    job_id = enqueue(redis_url, prefix, "slow_job", 3)
    wait_until(lambda: ledger(rsync, prefix, "slow-started").get(job_id) == 1, 20, what="job start")
    ttl_ms = rsync.pttl(keys.leader)
    assert ttl_ms > 7000, ttl_ms
    iid = instance_id(rsync, prefix, "l1")
    assert iid is not None

    signalled = time.monotonic()
    leader.signal(signal.SIGTERM)
    ready_codes: list[int | None] = []
    while True:
        code = http_get(port, "/readyz")[0]
        ready_codes.append(code)
        if code != 200:
            break
        assert time.monotonic() - signalled < 1.0, "/readyz still 200 a second after SIGTERM"
        time.sleep(0.02)
    assert ready_codes[-1] == 503, ready_codes

    # while the in-flight job finishes: not ready, but live (the kubelet must not kill us)
    lock_gone_after: float | None = None
    health_codes: list[int | None] = []
    while leader.alive():
        r_code, h_code = http_get(port, "/readyz")[0], http_get(port, "/healthz")[0]
        if r_code is None or h_code is None:
            break  # the health server stops last, just before exit
        assert r_code == 503
        health_codes.append(h_code)
        if lock_gone_after is None and not rsync.exists(keys.leader):
            lock_gone_after = time.monotonic() - signalled
        time.sleep(0.05)
    assert health_codes and set(health_codes) == {200}, health_codes
    assert len(health_codes) >= 5, "the drain ended too soon to observe the probes"

    assert leader.proc.wait(30) == 0, leader.log()
    if lock_gone_after is None:
        lock_gone_after = time.monotonic() - signalled
    assert not rsync.exists(keys.leader)
    assert lock_gone_after < ttl_ms / 1000 - 3, f"lock gone only after {lock_gone_after:.1f}s"
    assert ledger(rsync, prefix, "slow-started") == {job_id: 1}
    assert ledger(rsync, prefix, "slow-done") == {job_id: 1}, "the in-flight job was cut off"
    # deregistered on the way out
    assert rsync.zscore(keys.instances, iid) is None
    assert not rsync.exists(keys.instance(iid))
    assert not rsync.exists(keys.arq_health(iid))


# -- metrics --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_metrics_move(spawn: Spawn, rsync: redis_sync.Redis, redis_url: str) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    port = free_port()
    leader = spawn("leader", name="l1", env={"WORKER_HEALTH_PORT": str(port)})
    wait_ready(leader, port)
    wait_until(lambda: ledger(rsync, prefix, "ticks"), 20, what="a first tick")
    time.sleep(0.5)

    code, text = http_get(port, "/metrics")
    assert code == 200
    first = metric_samples(text)
    asyncio.run(_schedule_items(redis_url, prefix, [f"m-{n}" for n in range(5)]))
    wait_until(lambda: len(ledger(rsync, prefix, "items")) == 5, 20, what="items handled")
    time.sleep(2.2)  # two more ticks
    code, text = http_get(port, "/metrics")
    assert code == 200
    second = metric_samples(text)

    assert sample(second, "worker_info", role="leader", worker_instance="l1", version="0.1.0") == 1
    assert sample(second, "worker_leader") == 1
    assert sample(second, "worker_leader_epoch") >= 1
    assert sample(second, "worker_ready") == 1
    for name, labels in [
        ("worker_periodic_ticks_total", {"periodic": "tick", "outcome": "enqueued"}),
        ("worker_jobs_total", {"task": "tick", "outcome": "success"}),
        ("worker_job_duration_seconds_count", {"task": "tick"}),
    ]:
        before, after = sample(first, name, **labels), sample(second, name, **labels)
        assert after >= before + 1, f"{name}{labels} did not move: {before} -> {after}"
    assert sample(second, "worker_poll_items_total", poller="items", outcome="dispatched") == 5
    assert sample(second, "worker_jobs_total", task="handle_item", outcome="success") == 5
    assert sample(second, "worker_leader_transitions_total", event="acquired") >= 1


async def _schedule_items(url: str, prefix: str, items: list[str]) -> None:
    client = await Client.connect(url, app=ledger_app, key_prefix=prefix)
    try:
        await client.poller("items").schedule_many(items)
    finally:
        await client.close()


# -- status ---------------------------------------------------------------------------------------


def run_on_tty(args: list[str], env: dict[str, str], timeout: float = 30) -> tuple[int, str]:
    """Run ``python -m worker ARGS`` with stdout on a pseudo-terminal (the human view)."""
    full = repo_env(**env)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", *args],
        env=full,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
        if proc.stderr is not None:
            proc.stderr.close()
    return code, b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.slow
def test_status_shows_cluster(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    spawn("leader", name="l1")
    wait_until(lambda: rsync.get(keys.leader), 20, what="l1 to lead")
    spawn("leader", name="l2")
    spawn("consumer", name="c1")

    def registered() -> bool:
        records = [instance_record(rsync, prefix, n) for n in ("l1", "l2", "c1")]
        return all(records) and bool(records[0] and records[0]["is_leader"])

    wait_until(registered, 30, what="three registered instances, l1 leading")
    wait_until(lambda: rsync.hget(keys.periodic_state, "tick"), 20, what="a periodic tick")
    epoch = int(rsync.get(keys.leader).decode().split(":", 1)[0])
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": prefix,
        "WORKER_APP": "harness.apps.ledger:app",
    }

    proc = cli("status", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    by_name = {i["name"]: i for i in data["instances"]}
    assert set(by_name) == {"l1", "l2", "c1"}
    assert all(i["alive"] for i in by_name.values())
    assert {n: i["role"] for n, i in by_name.items()} == {
        "l1": "leader",
        "l2": "leader",
        "c1": "consumer",
    }
    assert [n for n, i in by_name.items() if i["is_leader"]] == ["l1"]
    assert by_name["l1"]["epoch"] == epoch
    assert by_name["l2"]["epoch"] is None and by_name["c1"]["epoch"] is None
    assert "periodic" in by_name["l2"]["components"]  # a standby, ready to take over
    assert "periodic" not in by_name["c1"]["components"]
    leader = data["leader"]
    assert leader["held"] and leader["instance"] == "l1" and leader["epoch"] == epoch
    assert 0 < leader["ttl_remaining_s"] <= 3
    assert data["queue"]["name"] == keys.queue
    assert [p["name"] for p in data["periodic"]] == ["tick"]
    assert data["periodic"][0]["last_tick"] and data["periodic"][0]["next_tick"]
    assert [p["name"] for p in data["pollers"]] == ["items"]
    assert len(data["pollers"][0]["shards"]) == 3
    assert [(i["name"], i["done"]) for i in data["initializers"]] == [("seed", True)]
    assert data["dead_letters"] == 0

    # the same cluster as tables on a terminal
    code, text = run_on_tty(["status"], env)
    assert code == 0, text
    assert f"leader: l1  epoch {epoch}" in text, text
    rows = {line.split()[0]: line for line in text.splitlines() if line.split()}
    assert "leader" in rows["l1"] and f"yes (epoch {epoch})" in rows["l1"], text
    assert "leader" in rows["l2"] and "yes" not in rows["l2"], text
    assert "consumer" in rows["c1"] and "yes" not in rows["c1"], text
    assert "STALE" not in text
    assert "tick" in rows and "every 1s" in rows["tick"], text


# -- health command -------------------------------------------------------------------------------


@pytest.mark.slow
def test_health_command(spawn: Spawn, cli: CliRun) -> None:
    port = free_port()
    consumer = spawn("consumer", name="c1", env={"WORKER_HEALTH_PORT": str(port)})
    wait_ready(consumer, port)

    ok = cli("health", env={"WORKER_HEALTH_PORT": str(port)})
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["status"] == "ok"

    nobody = cli("health", env={"WORKER_HEALTH_PORT": str(free_port())})
    assert nobody.returncode == 1
    assert "Traceback" not in nobody.stderr

    assert consumer.terminate() == 0
    gone = cli("health", env={"WORKER_HEALTH_PORT": str(port)})
    assert gone.returncode == 1
    assert "Traceback" not in gone.stderr


# -- orphaned jobs --------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkilled_consumers_job_rerun_promptly(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    stale_s = 2.0  # WORKER_ORPHAN_STALE_S in FAST_ENV
    doomed = spawn("consumer", name="c1")
    wait_until(lambda: instance_id(rsync, prefix, "c1"), 30, what="c1 to register")
    job_id = enqueue(redis_url, prefix, "slow_job", 30)
    wait_until(lambda: ledger(rsync, prefix, "slow-started").get(job_id) == 1, 20, what="job start")
    c1 = instance_id(rsync, prefix, "c1")
    assert c1 is not None
    wait_until(lambda: rsync.sismember(keys.holds(c1), job_id), 10, what="c1 to publish its holds")
    # arq alone would wait for this key to expire before running the job again
    assert rsync.pttl(K.ARQ_IN_PROGRESS + job_id) > 60_000

    spawn("leader", name="l1")
    spawn("consumer", name="c2")
    wait_until(lambda: rsync.get(keys.leader), 30, what="a leader (it reaps orphans)")
    wait_until(lambda: instance_id(rsync, prefix, "c2"), 30, what="c2 to register")

    doomed.kill()
    killed = time.monotonic()
    wait_until(
        lambda: ledger(rsync, prefix, "slow-started").get(job_id) == 2,
        stale_s + 10,
        interval=0.05,
        what="the orphaned job to run again",
    )
    elapsed = time.monotonic() - killed
    assert elapsed < stale_s + 8, elapsed
    assert ledger(rsync, prefix, "slow-started") == {job_id: 2}
    # now held by a live process, and the dead one is forgotten
    wait_until(
        lambda: any(
            rsync.sismember(keys.holds(i), job_id)
            for i in (instance_id(rsync, prefix, "l1"), instance_id(rsync, prefix, "c2"))
            if i
        ),
        10,
        what="a live instance to hold the job",
    )
    assert rsync.zscore(keys.instances, c1) is None
    assert not rsync.exists(keys.holds(c1))


# -- secrets --------------------------------------------------------------------------------------

PASSWORD = "Sup3r-s3cret-pw-5f1e"
USER = "worker-test-user"


@pytest.fixture
def acl_user(rsync: redis_sync.Redis) -> Any:
    """An ACL user with a password on the shared server; removed afterwards."""
    rsync.acl_setuser(
        USER,
        enabled=True,
        passwords=[f"+{PASSWORD}"],
        keys=["*"],
        channels=["*"],
        categories=["+@all"],
    )
    try:
        yield USER
    finally:
        rsync.acl_deluser(USER)


@pytest.mark.slow
def test_password_never_shown(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun, acl_user: str
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    keys = K.Keys(prefix)
    kw = rsync.connection_pool.connection_kwargs
    secret_url = f"redis://{acl_user}:{PASSWORD}@{kw['host']}:{kw['port']}/0"
    port = free_port()
    leader = spawn(
        "leader",
        name="l1",
        env={
            "WORKER_REDIS_URL": secret_url,
            "WORKER_HEALTH_PORT": str(port),
            "WORKER_LOG_LEVEL": "DEBUG",
        },
    )
    wait_ready(leader, port)
    wait_until(lambda: rsync.get(keys.leader), 20, what="the leader lock (auth works)")
    wait_until(lambda: ledger(rsync, prefix, "ticks"), 20, what="a tick")
    started = next(e for e in leader.events() if e.get("event") == "worker starting")
    assert "***" in started["redis"]

    code, body = http_get(port, "/status")
    assert code == 200
    assert PASSWORD not in body
    assert "***" in json.loads(body)["settings"]["redis_url"]

    env = {"WORKER_KEY_PREFIX": prefix, "WORKER_APP": "harness.apps.ledger:app"}
    status = cli("status", "--json", env={**env, "WORKER_REDIS_URL": secret_url})
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["leader"]["held"]
    assert PASSWORD not in status.stdout + status.stderr

    # failures that print the URL mask it too
    wrong = "Wr0ng-pass-77aa"
    bad_auth = f"redis://{acl_user}:{wrong}@{kw['host']}:{kw['port']}/0"
    dead = f"redis://{acl_user}:{PASSWORD}@127.0.0.1:{free_port()}/0"
    for url, secret in [(bad_auth, wrong), (dead, PASSWORD)]:
        for args in (["status", "--json"], ["run", "--role", "consumer"]):
            proc = cli(
                *args,
                env={**env, "WORKER_REDIS_URL": url, "WORKER_REDIS_CONNECT_TIMEOUT_S": "1"},
            )
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert secret not in proc.stdout + proc.stderr, (args, proc.stderr)
    malformed = cli("plan", env={"WORKER_REDIS_URL": f"http://{acl_user}:{PASSWORD}@x/0"})
    assert malformed.returncode == 2
    assert PASSWORD not in malformed.stderr

    assert leader.terminate() == 0
    log = leader.log()
    assert len(log.splitlines()) > 5
    assert PASSWORD not in log


def test_another_apps_job_is_refused_by_retry_and_cancel(
    spawn: Spawn, rsync: redis_sync.Redis, redis_url: str, cli: CliRun
) -> None:
    """Two apps on one server without ACLs, prefixes A and B. arq's per-job
    keys (``arq:result:<id>`` …) are server-wide, so B's operator could name A's job: ``worker
    job ID --retry`` deleted A's result and queued the job in B ("ok"), ``--cancel`` of A's
    running job answered "asked its consumer to cancel it". Both are refused now, as "no such
    job in this app", and nothing of A changes."""
    a = spawn.prefix  # type: ignore[attr-defined]
    b = f"b{a}"
    spawn("all", name="a1", env={"WORKER_LOG_LEVEL": "WARNING"})
    failed = enqueue(redis_url, a, "fail", "x")
    wait_until(lambda: rsync.exists(f"arq:result:{failed}"), 30, what="A's job failed")
    running = enqueue(redis_url, a, "slow_job", 4)
    wait_until(lambda: rsync.hget(f"{a}ledger:slow-started", running), 30, what="A's job runs")
    result = rsync.dump(f"arq:result:{failed}")
    env_b = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_KEY_PREFIX": b,
        "WORKER_APP": "harness.apps.ledger:app",
    }
    retry = cli("job", failed, "--retry", env=env_b)
    cancel = cli("job", running, "--cancel", env=env_b)
    for out in (retry, cancel):
        assert out.returncode == 1, out.stdout + out.stderr
        assert "no such job in this app" in out.stdout, out.stdout
    assert rsync.dump(f"arq:result:{failed}") == result  # A's result untouched
    assert not rsync.exists(f"{b}queue") and not rsync.exists(f"{b}abort")
    wait_until(lambda: rsync.hget(f"{a}ledger:slow-done", running), 30, what="A's job ran on")
