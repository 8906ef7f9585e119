"""``--processes N``: the supervisor's restart and stop policy on a fake clock with fake children,
then real parents with real children against the real server (assertions on Redis ledgers)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import ROOT, CliRun, Spawn, WorkerProc, free_ports, wait_until
from harness.fakes import RecordingBackoff
from harness.probes import instance_records
from harness.procs import repo_env
from tests.system.test_faults import (
    assert_each_tick_once,
    lock_epoch,
    stop_between_jobs,
    tick_ledger,
    wait_ticks_settled,
)
from worker.core.clock import FakeClock
from worker.core.component import Backoff
from worker.core.errors import ConfigError
from worker.runtime.processes import Launcher, Supervisor, exit_status
from worker.settings import load_settings

# -- fakes ------------------------------------------------------------------------------------


@dataclass
class FakeChild:
    """A child that exits ``run_s`` after its start (never, if None) with ``code``, and
    ``stop_s`` after a signal (never, if None) with ``stop_code``."""

    pid: int
    clock: FakeClock
    run_s: float | None = None
    code: int = 1
    stop_s: float | None = 0.0
    stop_code: int = 0
    started: float = 0.0
    signals: list[int] = field(default_factory=list)
    exit_at: float | None = None
    exit_code: int | None = None

    def __post_init__(self) -> None:
        self.started = self.clock.monotonic()
        if self.run_s is not None:
            self.exit_at, self.exit_code = self.started + self.run_s, self.code

    def poll(self) -> int | None:
        if self.exit_at is not None and self.clock.monotonic() >= self.exit_at:
            return self.exit_code
        return None

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if self.poll() is None and self.stop_s is not None:
            at = self.clock.monotonic() + self.stop_s
            if self.exit_at is None or at < self.exit_at:
                self.exit_at, self.exit_code = at, self.stop_code


class Spawner:
    """The injected spawn function: ``plan(index, run)`` gives each start's behaviour."""

    def __init__(self, clock: FakeClock, plan: Any = None) -> None:
        self.clock = clock
        self.plan = plan or (lambda index, run: {})
        self.starts: dict[int, list[float]] = {}
        self.children: dict[int, list[FakeChild]] = {}
        self.pids = iter(range(1000, 100_000))

    def __call__(self, index: int) -> FakeChild:
        runs = self.starts.setdefault(index, [])
        child = FakeChild(next(self.pids), self.clock, **self.plan(index, len(runs)))
        runs.append(self.clock.monotonic())
        self.children.setdefault(index, []).append(child)
        return child

    def current(self, index: int) -> FakeChild:
        return self.children[index][-1]


SLACK = 0.1 + 3 * 0.05 + 1e-6  # one poll_s, three fake-clock steps: how late a restart may be


def supervisor(clock: FakeClock, spawner: Spawner, count: int = 3) -> Supervisor:
    return Supervisor(
        spawner,
        count,
        clock=clock,
        backoff=lambda: RecordingBackoff(base_s=0.5, cap_s=30.0),
        poll_s=0.1,
    )


async def started(sup: Supervisor, clock: FakeClock) -> asyncio.Task[int]:
    task = asyncio.ensure_future(sup.run())
    await clock.run_for(0.2, step=0.05)
    return task


# -- the policy on a fake clock ---------------------------------------------------------------


def test_exit_status_of_a_signal_death() -> None:
    assert exit_status(0) == 0
    assert exit_status(70) == 70
    assert exit_status(-signal.SIGKILL) == 137


async def test_a_child_crashing_at_once_backs_off_to_the_cap_and_never_spins() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, lambda index, run: {"run_s": 0.0} if index == 1 else {})
    sup = supervisor(clock, spawner)
    task = await started(sup, clock)
    await clock.run_for(300, step=0.05)

    assert [len(spawner.starts[i]) for i in (0, 2)] == [1, 1]  # the others are left alone
    starts = spawner.starts[1]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    ceilings = sup.slots[1].backoff.ceilings  # type: ignore[attr-defined]
    assert ceilings[:8] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    for gap, ceiling in zip(gaps, ceilings, strict=False):
        # jittered down to half; late by at most one poll (0.1 s) to see the exit plus the
        # fake clock's 0.05 s steps rounding up the poll and the backoff sleep
        assert ceiling / 2 - 1e-6 <= gap <= ceiling + SLACK, (gap, ceiling)
    # 300 s of an instantly crashing child: ~0.5+1+2+4+8+16 = 31.5 s to reach the cap, then one
    # start per 15-30 s, so at most about 7 + 270 / 15 = 25 starts, never hundreds
    assert 12 <= len(starts) <= 25, len(starts)
    assert sup.restarts == len(starts) - 1
    sup.request_stop()
    await clock.run_for(1, step=0.05)
    assert await task == 1  # its last run crashed with 1


async def test_the_backoff_resets_after_a_run_of_60_s() -> None:
    clock = FakeClock()
    runs = [0.0] * 5 + [61.0] + [0.0] * 3  # five crashes, one long run, crashes again

    def plan(index: int, run: int) -> dict[str, Any]:
        return {"run_s": runs[run] if run < len(runs) else None} if index == 0 else {}

    spawner = Spawner(clock, plan)
    sup = supervisor(clock, spawner, count=1)
    task = await started(sup, clock)
    await clock.run_for(200, step=0.05)
    ceilings = sup.slots[0].backoff.ceilings  # type: ignore[attr-defined]
    # five quick crashes climb 0.5 .. 8; the crash after 61 s up starts over at 0.5
    assert ceilings[:7] == [0.5, 1, 2, 4, 8, 0.5, 1]
    starts = spawner.starts[0]
    assert starts[6] - (starts[5] + 61) <= 0.5 + SLACK
    sup.request_stop()
    await clock.run_for(1, step=0.05)
    await task


async def test_stop_forwards_the_signal_waits_for_each_child_and_restarts_nothing() -> None:
    clock = FakeClock()

    def plan(index: int, run: int) -> dict[str, Any]:
        if index == 0:
            return {"run_s": 0.0 if run == 0 else None}  # crashed once: in backoff at stop?
        return {"stop_s": 5.0 if index == 2 else 0.5}  # child 2's shutdown takes 5 s

    spawner = Spawner(clock, plan)
    sup = supervisor(clock, spawner)
    task = await started(sup, clock)
    await clock.run_for(2, step=0.05)
    assert len(spawner.starts[0]) == 2  # restarted after its crash
    sup.request_stop(signal.SIGTERM)
    assert [spawner.current(i).signals for i in range(3)] == [[signal.SIGTERM]] * 3
    await clock.run_for(4, step=0.05)
    assert not task.done(), "returned before child 2 finished its shutdown"
    await clock.run_for(1.5, step=0.05)
    assert task.done()
    assert await task == 0  # every child's last run ended with 0
    assert [len(spawner.starts[i]) for i in range(3)] == [2, 1, 1]


async def test_a_crash_during_stop_is_not_restarted_and_the_first_failure_is_the_code() -> None:
    clock = FakeClock()
    codes = {0: 0, 1: 3, 2: -signal.SIGKILL}
    delays = {0: 0.3, 1: 1.0, 2: 2.0}

    def plan(index: int, run: int) -> dict[str, Any]:
        return {"stop_s": delays[index], "stop_code": codes[index]}

    spawner = Spawner(clock, plan)
    sup = supervisor(clock, spawner)
    task = await started(sup, clock)
    sup.request_stop(signal.SIGINT)
    await clock.run_for(3, step=0.05)
    assert await task == 3  # the first non-zero, in order of exit (then 137)
    assert all(len(spawner.starts[i]) == 1 for i in range(3))
    assert [spawner.current(i).signals for i in range(3)] == [[signal.SIGINT]] * 3


async def test_a_child_waiting_out_its_backoff_at_stop_is_not_started_and_counts() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, lambda index, run: {"run_s": 0.0, "code": 70} if index == 1 else {})
    sup = Supervisor(spawner, 2, clock=clock, backoff=lambda: Backoff(10.0, 30.0), poll_s=0.1)
    task = await started(sup, clock)
    assert sup.slots[1].restart_at is not None  # crashed, waits 5-10 s
    sup.request_stop()
    await clock.run_for(15, step=0.1)
    assert await task == 70
    assert len(spawner.starts[1]) == 1


async def test_a_second_signal_is_forwarded_again() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, lambda index, run: {"stop_s": None})  # a slow ordered shutdown
    sup = supervisor(clock, spawner, count=2)
    task = await started(sup, clock)
    sup.request_stop(signal.SIGINT)
    await clock.run_for(1, step=0.05)
    assert not task.done()
    sup.request_stop(signal.SIGINT)
    assert [spawner.current(i).signals for i in range(2)] == [[signal.SIGINT] * 2] * 2
    for i in range(2):  # a worker exits at once on its second signal (code 1)
        spawner.current(i).exit_at, spawner.current(i).exit_code = clock.monotonic(), 1
    await clock.run_for(0.3, step=0.05)
    assert await task == 1


async def test_a_configuration_error_on_first_start_stops_everything() -> None:
    clock = FakeClock()
    spawner = Spawner(clock, lambda index, run: {"run_s": 0.1, "code": 2} if index == 1 else {})
    sup = supervisor(clock, spawner)
    task = await started(sup, clock)
    await clock.run_for(1, step=0.05)
    assert await task == 2
    assert [len(spawner.starts[i]) for i in range(3)] == [1, 1, 1]
    assert spawner.current(0).signals == [signal.SIGTERM]


async def test_exit_code_2_after_a_restart_is_restarted_like_any_crash() -> None:
    clock = FakeClock()

    def plan(index: int, run: int) -> dict[str, Any]:  # crash, then Redis unreachable, then up
        return {"run_s": 0.0, "code": [1, 2][run]} if run < 2 else {}

    spawner = Spawner(clock, plan)
    sup = supervisor(clock, spawner, count=1)
    task = await started(sup, clock)
    await clock.run_for(5, step=0.05)
    assert len(spawner.starts[0]) == 3
    assert not task.done()
    sup.request_stop()
    await clock.run_for(1, step=0.05)
    assert await task == 0


async def test_a_failed_fork_is_retried_with_backoff() -> None:
    clock = FakeClock()
    calls: list[float] = []

    def spawn(index: int) -> FakeChild:
        calls.append(clock.monotonic())
        if len(calls) < 3:
            raise OSError(11, "Resource temporarily unavailable")
        return FakeChild(1, clock)

    sup = Supervisor(spawn, 1, clock=clock, backoff=lambda: Backoff(0.5, 30.0), poll_s=0.1)
    task = await started(sup, clock)
    await clock.run_for(3, step=0.05)
    assert len(calls) == 3 and calls[1] > calls[0]
    sup.request_stop()
    await clock.run_for(0.5, step=0.05)
    assert await task == 0


# -- settings and the children's command lines --------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)


def test_children_names_ports_environment_and_no_recursion(clean_env: None) -> None:
    url = "redis://user:s3cret@redis:6379/0"
    s = load_settings(
        instance_name="web", processes=3, redis_url=url, app="harness.apps.ledger:app"
    )
    env = {"WORKER_PROCESSES": "3", "WORKER_REDIS_URL_FILE": "/run/url", "OTHER": "x"}
    launcher = Launcher(s, env, url)
    for i in range(3):
        cmd = launcher.command(i)
        assert cmd[:4] == [sys.executable, "-m", "worker", "run"]
        assert cmd[4:] == [*("--role", "all", "--instance-name", f"web-{i}"), "--app", s.app]
        assert not any("s3cret" in a for a in cmd), "the password must not be on a command line"
        child = launcher.env(i)
        assert child["WORKER_PROCESSES"] == "1"
        assert "WORKER_HEALTH_PORT" not in child  # the default: each takes a free port
        assert child["WORKER_REDIS_URL"] == url and child["WORKER_REDIS_URL_FILE"] == ""
        assert child["OTHER"] == "x"
    # a configured port: child i on port + i (strict)
    fixed = load_settings(processes=3, health_port=9100, redis_url=url)
    ports = [Launcher(fixed, {}, url).env(i)["WORKER_HEALTH_PORT"] for i in range(3)]
    assert ports == ["9100", "9101", "9102"]
    # a health port of 0 stays 0 for every child
    off = load_settings(processes=2, health_port=0, redis_url=url)
    assert [Launcher(off, {}, url).env(i)["WORKER_HEALTH_PORT"] for i in range(2)] == ["0", "0"]


def test_a_url_from_a_file_is_read_by_each_child(
    clean_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "url"
    path.write_text("redis://redis:6379/0\n")
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(path))
    s = load_settings(processes=2)
    child = Launcher(s, dict(os.environ), s.redis_url).env(0)
    assert "WORKER_REDIS_URL" not in child
    assert child["WORKER_REDIS_URL_FILE"] == str(path)


def test_processes_settings_are_validated(clean_env: None) -> None:
    for bad in (0, 65):
        with pytest.raises(ConfigError, match=r"^--processes \(WORKER_PROCESSES\): invalid"):
            load_settings(processes=bad)
    with pytest.raises(ConfigError, match="WORKER_LEADER_ELECTION=static"):
        load_settings(processes=2, leader_election="static")
    assert load_settings(processes=2, leader_election="static", role="consumer").processes == 2
    with pytest.raises(ConfigError, match="65535"):
        load_settings(processes=4, health_port=65533)
    assert load_settings(processes=3, health_port=65533).processes == 3
    with pytest.raises(ConfigError, match="at most 126 characters"):
        load_settings(processes=10, instance_name="n" * 127)


def test_cli_processes_flag_bad_value_exits_2(cli: CliRun) -> None:
    proc = cli("run", "--processes", "0", env={"WORKER_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("worker: error: --processes (WORKER_PROCESSES): invalid value 0")


# -- real processes ---------------------------------------------------------------------------


def children(r: redis_sync.Redis, prefix: str) -> dict[str, dict[str, Any]]:
    """Live instance records by instance name."""
    return {rec["name"]: rec for rec in instance_records(r, prefix)}


def ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def start_three(spawn: Spawn, rsync: redis_sync.Redis, **env: str) -> tuple[WorkerProc, dict]:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    parent = spawn("all", name="multi", env={"WORKER_PROCESSES": "3", **env})
    names = {f"multi-{i}" for i in range(3)}
    recs = wait_until(
        lambda: (
            (set(children(rsync, prefix)) == names and children(rsync, prefix))
            or (not parent.alive() and pytest.fail(parent.log()[-3000:]))
        ),
        timeout=60,
        what="3 children registered",
    )
    for rec in recs.values():
        assert ppid(rec["pid"]) == parent.pid, "each instance is a child of the one parent"
    return parent, recs


@pytest.mark.slow
def test_three_processes_register_and_every_tick_runs_once(
    spawn: Spawn, rsync: redis_sync.Redis, cli: CliRun
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    base = free_ports(3)
    parent, recs = start_three(spawn, rsync, WORKER_HEALTH_PORT=str(base))
    assert rsync.zcard(f"{prefix}instances") == 3
    assert len({rec["pid"] for rec in recs.values()}) == 3

    # one health port per child: base + i
    for i in range(3):
        with urllib.request.urlopen(f"http://127.0.0.1:{base + i}/status", timeout=5) as resp:
            assert json.loads(resp.read())["instance_name"] == f"multi-{i}"
    health = cli("health", env={"WORKER_PROCESSES": "3", "WORKER_HEALTH_PORT": str(base)})
    assert health.returncode == 0, health.stderr
    assert health.stdout.count('"status": "ok"') == 3

    wait_until(lambda: tick_ledger(rsync, prefix), timeout=30, what="first tick")
    first = min(tick_ledger(rsync, prefix))
    leaders = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        leading = [r["name"] for r in instance_records(rsync, prefix) if r.get("is_leader")]
        assert len(leading) <= 1, f"two children report leading: {leading}"
        leaders.update(leading)
        time.sleep(0.25)
    assert len(leaders) == 1, leaders
    last = wait_ticks_settled(rsync, prefix, first)
    assert (last - first) // 1000 + 1 >= 9
    assert_each_tick_once(tick_ledger(rsync, prefix), first, last)
    assert parent.alive()
    assert "STARTED A PRIVATE EMBEDDED" not in parent.log()  # the test server was given


@pytest.mark.slow
def test_sigterm_to_the_parent_stops_every_child_in_order(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    parent, recs = start_three(spawn, rsync)
    wait_until(lambda: lock_epoch(rsync, prefix), what="a leader")
    wait_until(lambda: tick_ledger(rsync, prefix), timeout=30, what="first tick")
    assert parent.terminate(60) == 0, parent.log()[-3000:]
    assert all(gone(rec["pid"]) for rec in recs.values())
    assert not rsync.exists(f"{prefix}leader"), "the lease was not released"
    assert rsync.zcard(f"{prefix}instances") == 0, "instance records left behind"
    assert not instance_records(rsync, prefix)
    events = parent.events()
    stopped = [e for e in events if e.get("event") == "worker stopped"]
    assert sorted(e["instance"] for e in stopped) == sorted(recs)  # each ordered shutdown ran
    assert "Traceback" not in parent.log()


@pytest.mark.slow
def test_a_sigkilled_child_is_restarted_and_ticks_stay_once(
    spawn: Spawn, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    parent, _ = start_three(spawn, rsync)
    wait_until(lambda: len(tick_ledger(rsync, prefix)) >= 2, timeout=30, what="ticks")
    first = min(tick_ledger(rsync, prefix))
    epoch = wait_until(lambda: lock_epoch(rsync, prefix), what="a leader")
    victim = wait_until(
        lambda: next((r for r in instance_records(rsync, prefix) if r.get("is_leader")), None),
        what="the leading child's record",
    )
    stop_between_jobs(rsync, prefix, victim["pid"])  # not mid-job: see stop_between_jobs
    os.kill(victim["pid"], signal.SIGKILL)  # the leader: a takeover and a restart at once

    def replaced() -> bool:
        rec = children(rsync, prefix).get(victim["name"])
        return bool(rec) and rec["pid"] != victim["pid"] and rec["id"] != victim["id"]

    wait_until(replaced, timeout=30, what=f"{victim['name']} restarted")
    new = children(rsync, prefix)[victim["name"]]
    assert ppid(new["pid"]) == parent.pid
    wait_until(lambda: (lock_epoch(rsync, prefix) or 0) > epoch, timeout=20, what="takeover")
    time.sleep(3)
    last = wait_ticks_settled(rsync, prefix, first)
    assert (last - first) // 1000 + 1 >= 6
    assert_each_tick_once(tick_ledger(rsync, prefix), first, last)
    assert any(
        e.get("event") == "worker process exited unexpectedly; restarting" and e.get("code") == 137
        for e in parent.events()
    )
    # the killed run was replaced: it does not make the parent's exit code
    assert parent.terminate(60) == 0, parent.log()[-3000:]


@pytest.mark.slow
def test_children_exit_when_the_parent_is_sigkilled(spawn: Spawn, rsync: redis_sync.Redis) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    parent, recs = start_three(spawn, rsync)
    wait_until(lambda: lock_epoch(rsync, prefix), what="a leader")
    parent.kill()
    killed = time.monotonic()
    pids = [rec["pid"] for rec in recs.values()]
    wait_until(lambda: all(gone(p) for p in pids), timeout=15, what="children to exit")
    assert time.monotonic() - killed < 10
    # they got SIGTERM (the parent-death signal), so they shut down in order
    assert rsync.zcard(f"{prefix}instances") == 0
    assert not rsync.exists(f"{prefix}leader")


@pytest.mark.slow
def test_role_all_without_a_url_shares_one_embedded_server(tmp_path: Path) -> None:
    env = repo_env(
        WORKER_HEALTH_PORT="0",
        WORKER_DRAIN_DELAY_S="0",
        WORKER_LOG_FORMAT="json",
        WORKER_APP="harness.apps.minimal:app",
    )
    log_path = tmp_path / "parent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker", "--role", "all", "--processes", "2"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def events() -> list[dict[str, Any]]:
        out = []
        for line in log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    try:

        def both_started() -> list[dict[str, Any]] | None:
            if proc.poll() is not None:
                pytest.fail(log_path.read_text())
            starts = [e for e in events() if e.get("event") == "worker starting"]
            return starts if len(starts) == 2 else None

        starts = wait_until(both_started, timeout=60, what="both children started")
        banner = next(e for e in events() if "EMBEDDED" in str(e.get("event")))
        assert "for the 2 worker processes of this run" in banner["event"]
        urls = {e["redis"] for e in starts}
        assert urls == {banner["redis"]} and banner["redis"].startswith("unix://"), urls
        names = sorted(e["instance"] for e in starts)
        assert names == [f"{banner['instance']}-{i}" for i in range(2)]
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()
        assert not os.path.exists(banner["redis"].removeprefix("unix://"))
        assert "Traceback" not in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
