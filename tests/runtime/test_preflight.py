"""Start-up checks: Redis must not evict keys, the health socket must be bindable, and what a
process shows on ``/status`` (no error texts unless asked)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from harness import CliRun, Spawn, ledger, wait_until
from harness.ports import free_port
from harness.probes import http_get, wait_ready
from harness.realredis import RealRedis
from tests.cli.test_cli import assert_config_error
from worker.core.errors import ConfigError
from worker.runtime.preflight import check_redis_contract
from worker.settings import Settings
from worker.storage.server import read_eviction_policy

pytestmark = pytest.mark.timeout(120)

APP = "harness.apps.ledger:app"
PASSWORD = "Pre-flight-pw-91c2"


@pytest.fixture(scope="module")
def evicting() -> Iterator[RealRedis]:
    """A dedicated server with ``maxmemory-policy allkeys-lru`` (the audit's setting)."""
    with RealRedis(extra_args=("--maxmemory-policy", "allkeys-lru")) as server:
        yield server


def _user_url(server_url: str, user: str) -> str:
    return server_url.replace("redis://", f"redis://{user}:{PASSWORD}@")


@pytest.fixture
def restricted_user(evicting: RealRedis) -> Iterator[Any]:
    """``make(name, *rules)``: an ACL user on the evicting server; removed afterwards."""
    made: list[str] = []
    admin = evicting.client()

    def make(name: str, *rules: str) -> str:
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", f">{PASSWORD}", *rules)
        made.append(name)
        return _user_url(evicting.url, name)

    yield make
    for name in made:
        admin.execute_command("ACL", "DELUSER", name)
    admin.close()


# -- the contract check against real servers ------------------------------------------------------


async def test_noeviction_passes(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await read_eviction_policy(client) == ("noeviction", "CONFIG GET")
        assert await check_redis_contract(client, Settings.model_construct()) == []
    finally:
        await client.aclose()


async def test_eviction_is_refused_unless_allowed(evicting: RealRedis) -> None:
    client = aioredis.Redis.from_url(evicting.url)
    try:
        with pytest.raises(ConfigError) as info:
            await check_redis_contract(client, Settings.model_construct())
        msg = str(info.value)
        assert "\n" not in msg
        assert "maxmemory-policy is 'allkeys-lru'" in msg and "'noeviction'" in msg
        assert "WORKER_ALLOW_EVICTION=true" in msg
        allowed = Settings.model_construct(allow_eviction=True)
        (warning,) = await check_redis_contract(client, allowed)
        assert "allkeys-lru" in warning and "WORKER_ALLOW_EVICTION" in warning
    finally:
        await client.aclose()


async def test_info_fallback_when_config_is_not_permitted(restricted_user: Any) -> None:
    url = restricted_user("no-config", "~*", "&*", "+@all", "-config")
    client = aioredis.Redis.from_url(url)
    try:
        assert await read_eviction_policy(client) == ("allkeys-lru", "INFO memory")
        with pytest.raises(ConfigError, match="allkeys-lru"):
            await check_redis_contract(client, Settings.model_construct())
    finally:
        await client.aclose()


async def test_unreadable_policy_warns_and_continues(restricted_user: Any) -> None:
    url = restricted_user("blind", "~*", "&*", "+@all", "-config", "-info")
    client = aioredis.Redis.from_url(url)
    try:
        (warning,) = await check_redis_contract(client, Settings.model_construct())
        assert "cannot read Redis maxmemory-policy" in warning and "noeviction" in warning
    finally:
        await client.aclose()


# -- real processes -------------------------------------------------------------------------------


def test_run_exits_2_on_an_evicting_redis(cli: CliRun, evicting: RealRedis) -> None:
    env = {"WORKER_REDIS_URL": evicting.url, "WORKER_APP": APP, "WORKER_HEALTH_PORT": "0"}
    for role in ("consumer", "all"):
        proc = cli("run", "--role", role, env=env, timeout=30)
        line = assert_config_error(proc, "maxmemory-policy", "'allkeys-lru'", "noeviction")
        assert line.startswith("worker: error: Redis maxmemory-policy is 'allkeys-lru'"), line
        assert "WORKER_ALLOW_EVICTION=true" in line


@pytest.mark.slow
def test_allow_eviction_runs_warns_and_status_shows_it(
    spawn: Spawn, cli: CliRun, evicting: RealRedis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    proc = spawn(
        "all", name="a1", env={"WORKER_REDIS_URL": evicting.url, "WORKER_ALLOW_EVICTION": "true"}
    )
    with evicting.client() as r:
        wait_until(lambda: ledger(r, prefix, "ticks"), 30, what="a tick on the evicting server")
    warning = next(
        e for e in proc.events() if e.get("level") == "warning" and "allkeys-lru" in e["event"]
    )
    assert "WORKER_ALLOW_EVICTION" in warning["event"]

    env = {"WORKER_REDIS_URL": evicting.url, "WORKER_KEY_PREFIX": prefix, "WORKER_APP": APP}
    st = cli("status", "--json", env={**env, "WORKER_ALLOW_EVICTION": "true"})
    assert st.returncode == 0, st.stderr
    redis_info = json.loads(st.stdout)["redis"]
    assert redis_info["maxmemory_policy"] == "allkeys-lru"
    assert redis_info["eviction_allowed"] is True
    assert "WORKER_ALLOW_EVICTION" in redis_info["verdict"]
    assert proc.terminate() == 0


# -- the health server's socket -------------------------------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_health_port_in_use_exits_2(cli: CliRun, redis_url: str, busy_port: int) -> None:
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_APP": APP, "WORKER_HEALTH_PORT": str(busy_port)}
    proc = cli("run", "--role", "all", env=env, timeout=30)
    line = assert_config_error(proc)
    assert line == (
        f"worker: error: WORKER_HEALTH_PORT: cannot listen on 127.0.0.1:{busy_port}: "
        "address already in use"
    )


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])
def test_unusable_health_host_exits_2(cli: CliRun, redis_url: str, host: str) -> None:
    env = {
        "WORKER_REDIS_URL": redis_url,
        "WORKER_APP": APP,
        "WORKER_HEALTH_HOST": host,
        "WORKER_HEALTH_PORT": str(free_port()),
    }
    proc = cli("run", "--role", "consumer", env=env, timeout=30)
    assert_config_error(proc, "WORKER_HEALTH_HOST", f"cannot listen on {host}:")


# -- /status ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("show", [False, True])
def test_status_shows_error_class_only_unless_asked(
    spawn: Spawn, rsync: redis_sync.Redis, show: bool
) -> None:
    port = free_port()
    env = {"LEDGER_CRASHY": "1", "WORKER_HEALTH_PORT": str(port)}
    if show:
        env["WORKER_STATUS_SHOW_ERRORS"] = "true"
    proc = spawn("consumer", name="c1", env=env)
    wait_ready(proc, port)

    def crashed() -> Any:
        code, body = http_get(port, "/status")
        comp = json.loads(body)["components"]["service:crashy"] if code == 200 else {}
        return comp.get("last_error") and (comp, body)

    comp, body = wait_until(crashed, 20, what="the crashy service to fail")
    if show:
        assert comp["last_error"] == "RuntimeError: crashy service always fails"
    else:
        assert comp["last_error"] == "RuntimeError"
        assert "crashy service always fails" not in body
    assert proc.terminate() == 0
