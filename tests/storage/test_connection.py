"""Connections: the URL forms (one server, Sentinel, Cluster), their settings and one-line
errors, secret masking, and a real Sentinel set and Cluster that fail over under a client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio.sentinel import SentinelManagedSSLConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from harness import CliRun
from harness.topology import Cluster, SentinelSet
from worker.client import Client
from worker.core.errors import ConfigError
from worker.core.logs import mask_text
from worker.core.redisurl import mask_url, parse_redis_url
from worker.settings import load_settings
from worker.storage.connection import SlotPool, connect_redis

# -- parsing ------------------------------------------------------------------------------------


def test_sentinel_url_parses_hosts_master_db_and_both_credentials() -> None:
    t = parse_redis_url(
        "redis+sentinel://app:p%40ss@s1:26380,s2,[::1]:26381/mymaster/3"
        "?sentinel_username=mon&sentinel_password=sp"
    )
    assert t.kind == "sentinel"
    assert t.nodes == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (t.service, t.db, t.username, t.password) == ("mymaster", 3, "app", "p@ss")
    assert (t.sentinel_username, t.sentinel_password, t.ssl) == ("mon", "sp", False)
    assert "p@ss" not in repr(t) and "sp" not in t.describe().split("?")[1]


def test_sentinel_credentials_from_settings() -> None:
    t = parse_redis_url(
        "redis+sentinel://h/m", sentinel_username="mon", sentinel_password="from-env"
    )
    assert (t.sentinel_username, t.sentinel_password, t.db) == ("mon", "from-env", 0)


def test_cluster_url_parses_seed_nodes() -> None:
    t = parse_redis_url("rediss+cluster://u:pw@n1:7000,n2/?ssl_cert_reqs=none")
    assert (t.kind, t.ssl, t.nodes) == ("cluster", True, (("n1", 7000), ("n2", 6379)))
    assert t.ssl_options == (("ssl_cert_reqs", "none"),)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("redis+sentinel://h1,h2", "name the Sentinel master"),
        ("redis+sentinel://h1:0/m", "the port must be a number in 1-65535"),
        ("redis+sentinel://h1:x/m", "the port must be a number in 1-65535"),
        ("redis+sentinel://h1,,h2/m", "a host is empty"),
        ("redis+sentinel://h1/m/zero", "only a database number may follow"),
        ("redis+sentinel://h1/m?db=1", "unknown query argument 'db'"),
        ("redis+sentinel://h1/m?ssl_cert_reqs=none", "ssl_* arguments need TLS"),
        ("redis+sentinel://h1/m a", "master name 'm a'"),
        ("redis+cluster://h1/2", "only database 0"),
        ("redis+cluster://h1?sentinel_password=x", "belong to redis+sentinel"),
        ("redis+sentinel://u:pa#ss@h1/m", "'#' must be percent-encoded"),
        ("redis+sentinal://h1/m", "scheme 'redis+sentinal' is not supported"),
    ],
)
def test_bad_ha_urls_are_one_line_errors_naming_the_variable(url: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_redis_url(url, "WORKER_REDIS_URL_FILE")
    text = str(err.value)
    assert text.startswith("WORKER_REDIS_URL_FILE: ") and "\n" not in text
    assert fragment in text, text


def test_sentinel_password_in_url_and_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="set it in one place"):
        parse_redis_url("redis+sentinel://h/m?sentinel_password=a", sentinel_password="b")


def test_masking_covers_the_new_forms() -> None:
    url = "redis+sentinel://app:s3cret@h1:26379,h2/m/0?sentinel_password=t0p&x=1"
    assert mask_url(url) == "redis+sentinel://app:***@h1:26379,h2/m/0?sentinel_password=***&x=1"
    line = f"cannot reach {url} (password=abc, sentinel_password='q')"
    masked = mask_text(line)
    for secret in ("s3cret", "t0p", "abc", "'q'"):
        assert secret not in masked, masked
    assert "s3cret" not in mask_text("rediss+cluster://u:s3cret@n1:7000")


# -- settings -----------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_wait_replicas_auto_is_one_with_sentinel_only(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WORKER_REDIS_URL", "redis+sentinel://h1,h2,h3/mymaster")
    s = load_settings()
    assert s.wait_replicas() == 1 and s.replication().timeout_ms == 500
    clean_env.setenv("WORKER_REDIS_URL", "redis://h/0")
    assert load_settings().wait_replicas() == 0
    clean_env.setenv("WORKER_REDIS_WAIT_REPLICAS", "2")
    assert load_settings().replication().replicas == 2
    clean_env.setenv("WORKER_REDIS_URL", "redis+sentinel://h1/m")
    clean_env.setenv("WORKER_REDIS_WAIT_REPLICAS", "0")
    assert load_settings().wait_replicas() == 0


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"WORKER_REDIS_URL": "redis+cluster://n1:7000", "WORKER_KEY_PREFIX": "shop:"},
            "WORKER_KEY_PREFIX: 'shop:' has no hash tag; with a redis+cluster:// URL",
        ),
        (
            {"WORKER_REDIS_URL": "redis://h/0", "WORKER_SENTINEL_PASSWORD": "x"},
            "not a redis+sentinel:// URL",
        ),
        ({"WORKER_SENTINEL_PASSWORD": "x"}, "without a redis+sentinel:// WORKER_REDIS_URL"),
        (
            {"WORKER_REDIS_URL": "redis+sentinel://h/m", "WORKER_REDIS_WAIT_TIMEOUT_S": "3"},
            "WORKER_REDIS_WAIT_TIMEOUT_S must be below half of WORKER_LEADER_RENEW_DEADLINE_S",
        ),
        (
            {"WORKER_REDIS_URL": "redis://h/0", "WORKER_REDIS_WAIT_REPLICAS": "many"},
            "WORKER_REDIS_WAIT_REPLICAS",
        ),
    ],
)
def test_ha_settings_errors(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], fragment: str
) -> None:
    for k, v in env.items():
        clean_env.setenv(k, v)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_url_file_carries_the_sentinel_password_and_it_is_masked(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    f = tmp_path / "url"
    f.write_text("redis+sentinel://app:pw@h1,h2/m/0?sentinel_password=sp\n")
    clean_env.setenv("WORKER_REDIS_URL_FILE", str(f))
    clean_env.setenv("WORKER_KEY_PREFIX", "{shop}:")
    s = load_settings()
    target = s.redis_target()
    assert target is not None and target.sentinel_password == "sp" and target.password == "pw"
    shown = str(s.redacted())
    assert "sp&" not in shown and ":pw@" not in shown and "=sp" not in shown


def test_env_sentinel_password_is_redacted(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WORKER_REDIS_URL", "redis+sentinel://h1/m")
    clean_env.setenv("WORKER_SENTINEL_PASSWORD", "hunter2")
    s = load_settings()
    assert s.redacted()["sentinel_password"] == "***"
    target = s.redis_target()
    assert target is not None and target.sentinel_password == "hunter2"


def test_bad_sentinel_url_exits_2_with_one_line(cli: CliRun) -> None:
    proc = cli(
        "run",
        "--role",
        "consumer",
        env={"WORKER_REDIS_URL": "redis+sentinel://u:hunter2@h1:99999/m"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker: error: WORKER_REDIS_URL: ")
    assert "hunter2" not in proc.stderr


async def test_tls_reaches_data_nodes_and_sentinels() -> None:
    r = connect_redis(
        "rediss+sentinel://h1:1,h2:2/m?ssl_cert_reqs=none",
        queue_name="q",
    )
    try:
        pool = r.connection_pool
        assert issubclass(pool.connection_class, SentinelManagedSSLConnection)
        assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
        sentinels = pool.sentinel_manager.sentinels  # type: ignore[attr-defined]
        assert [s.connection_pool.connection_kwargs["ssl_cert_reqs"] for s in sentinels] == [
            "none",
            "none",
        ]
    finally:
        await r.aclose(close_connection_pool=True)


def test_every_pool_packs_commands_in_c_into_the_same_bytes() -> None:
    """Every pool's connections pack with hiredis (as redis-py's synchronous client does): the
    bytes are redis-py's own packer's, and what it refuses (a bool) is refused alike."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from worker.storage.packing import Packing, packing

    for url in ("redis://h:1/0", "unix:///tmp/r.sock", "rediss+sentinel://h1:1/m"):
        r = connect_redis(url, queue_name="q")
        assert issubclass(r.connection_pool.connection_class, Packing), url
    args = ("EVALSHA", "ab" * 20, 2, "k\u00e9y", b"\x00\xffbin", -7, 1.5, 2**70, memoryview(b"mv"))
    fast = packing(Connection)(host="h")
    packed = fast.pack_command(*args)
    assert b"".join(packed) == b"".join(Connection(host="h").pack_command(*args))
    assert b"".join(fast.pack_command("CONFIG GET", "x")).startswith(b"*3\r\n")
    # the one-word name packed in one call, and the types only the serializer converts
    for more in [args[:-1], ("SET", "k", bytearray(b"ba")), ("GET", memoryview(b"k"))]:
        assert b"".join(fast.pack_command(*more)) == b"".join(
            Connection(host="h").pack_command(*more)
        ), more
    with pytest.raises(DataError):
        fast.pack_command("SET", "k", True)


# -- a real Sentinel set ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet(password="data-pw", sentinel_password="sentinel-pw") as s:
        yield s


@pytest.mark.slow
async def test_client_from_env_follows_a_failover(
    sentinels: SentinelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", sentinels.url())
    monkeypatch.setenv("WORKER_SENTINEL_PASSWORD", "sentinel-pw")
    monkeypatch.setenv("WORKER_KEY_PREFIX", "conn:")
    client = await Client.from_env()
    try:
        assert client.store.replication.replicas == 1  # auto with Sentinel
        assert await client.enqueue("noop", unique_key="a") is not None
        before = sentinels.primary()
        after = sentinels.manual_failover()
        assert after is not before
        deadline = time.monotonic() + 20
        while True:  # the first command may meet the demoted primary: it reconnects
            try:
                assert await client.enqueue("noop", unique_key="a") is None  # replicated
                break
            except RedisConnectionError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        assert await client.enqueue("noop", unique_key="b") is not None
        with after.client() as direct:
            assert direct.exists(f"arq:job:{client.unique_job_id('b')}")
        sentinels.wait_replica(before, timeout=60)
    finally:
        await client.close()


@pytest.mark.slow
async def test_a_pool_leaves_a_primary_deposed_while_it_still_serves(
    sentinels: SentinelSet,
) -> None:
    """``SENTINEL FAILOVER`` deposes a primary that goes on serving until the Sentinels
    reconfigure it (10-20 s measured): a pooled connection that never fails stays on it, and
    every write it takes there is lost. The pool asks the Sentinels every second and moves:
    writes land on the new primary within a few seconds of the switch.

    Before (redis-py's pool alone): the writes went to the deposed primary until it was
    reconfigured (10.2 s after the switch in the run this test was written against)."""
    target = parse_redis_url(sentinels.url(), sentinel_password="sentinel-pw")
    r = connect_redis(target, queue_name="conn:queue")

    async def where() -> int:
        async with r.pipeline(transaction=False) as pipe:
            pipe.incr("conn:deposed")
            pipe.info("server")
            _, info = await pipe.execute()
        return int(info["tcp_port"])

    try:
        old = sentinels.primary()
        assert await where() == old.port
        new = sentinels.manual_failover()  # the old primary stays up, a master for now
        switched = time.monotonic()
        moved_after: float | None = None
        while time.monotonic() - switched < 20:
            try:
                port = await where()
            except (RedisConnectionError, ResponseError):
                port = None  # READONLY once reconfigured: the pool reconnects
            if port == new.port:
                moved_after = time.monotonic() - switched
                break
            await asyncio.sleep(0.1)
        print(f"writes on the new primary {moved_after}s after the switch")
        assert moved_after is not None and moved_after < 5.0, moved_after
        sentinels.wait_replica(old, timeout=60)
    finally:
        await r.aclose(close_connection_pool=True)


@pytest.mark.slow
async def test_cli_and_console_use_sentinel_and_follow_a_failover(
    sentinels: SentinelSet, cli: CliRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin commands and the operator console connect through the Sentinels (passwords
    for the Sentinels and for the data nodes), and the console keeps answering across a
    failover with the connection it opened at start."""
    from aiohttp.test_utils import TestClient, TestServer

    from harness.apps.ledger import app as ledger
    from worker.web import create_app

    env = {
        "WORKER_REDIS_URL": sentinels.url(),
        "WORKER_SENTINEL_PASSWORD": "sentinel-pw",
        "WORKER_KEY_PREFIX": "conn-admin:",
        "WORKER_APP": "harness.apps.ledger:app",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    client = await Client.from_env(app=ledger)
    try:
        await client.enqueue("record", "k")
        done = cli("status", "--json", env=env)
        assert done.returncode == 0, done.stderr
        assert "data-pw" not in done.stdout + done.stderr
        assert "sentinel-pw" not in done.stdout + done.stderr
        wrong = cli("status", env={**env, "WORKER_SENTINEL_PASSWORD": "nope"})
        assert wrong.returncode == 2 and "sentinel-pw" not in wrong.stderr
        console = create_app(client, ledger, token="t0ken", redis_url=sentinels.url())
        http: TestClient[Any, Any] = TestClient(TestServer(console))
        await http.start_server()
        try:
            auth = {"Authorization": "Bearer t0ken"}
            first = await http.get("/api/overview", headers=auth)
            assert first.status == 200 and "data-pw" not in await first.text()
            before = sentinels.primary()
            assert sentinels.manual_failover() is not before
            deadline = time.monotonic() + 20
            while (await http.get("/api/overview", headers=auth)).status != 200:
                assert time.monotonic() < deadline, "the console did not reconnect"
                await asyncio.sleep(0.2)
            done = cli("status", "--json", env=env)
            assert done.returncode == 0, done.stderr
            sentinels.wait_replica(before, timeout=60)
        finally:
            await http.close()
    finally:
        await client.close()


# -- a real cluster -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(masters=3, replicas=1) as c:
        yield c


@pytest.mark.slow
async def test_cluster_pool_serves_the_app_slot_and_follows_its_failover(
    cluster: Cluster,
) -> None:
    r = connect_redis(cluster.url(), queue_name="{conn}:queue", socket_timeout_s=5)
    try:
        slot = key_slot(b"{conn}:queue")
        assert isinstance(r.connection_pool, SlotPool) and r.connection_pool.slot == slot
        await r.set("{conn}:a", 1)
        async with r.pipeline(transaction=True) as pipe:  # MULTI/EXEC works as on one server
            pipe.incr("{conn}:a")
            pipe.get("{conn}:a")
            assert (await pipe.execute())[1] == b"2"
        foreign = next(
            f"k{i}"
            for i in range(1000)
            if cluster.owner(key_slot(f"k{i}".encode())) is not cluster.owner(slot)
        )
        with pytest.raises(ResponseError, match="outside the app's hash slot"):
            await r.get(foreign)
        assert await r.wait(1, 2000) == 1  # the replica has "{conn}:a" before the kill
        old = cluster.owner(slot)
        old.kill()
        started = time.monotonic()
        while True:
            try:
                assert int(await r.incr("{conn}:a")) == 3
                break
            except RedisConnectionError:
                assert time.monotonic() - started < 30
                await asyncio.sleep(0.1)
        assert cluster.owner(slot) is not old
    finally:
        await r.aclose(close_connection_pool=True)


async def test_a_client_without_a_connection_cap_serves_many_commands_at_once(
    redis_url: str,
) -> None:
    """``max_connections=None`` means no cap on every redis-py: 6 and later cap an async pool
    at 100 by default, which failed the 101st concurrent command (``MaxConnectionsError``;
    a consumer running more jobs than that at once failed the rest)."""
    r = connect_redis(redis_url, queue_name="cap:queue")
    try:
        replies = await asyncio.gather(*(r.blpop(["cap:none"], timeout=0.5) for _ in range(150)))
        assert replies == [None] * 150
    finally:
        await r.aclose(close_connection_pool=True)
