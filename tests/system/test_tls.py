"""``rediss://`` with a username and password: a worker process runs through TLS and ACL auth.

The embedded valkey-server is built without TLS, so the test puts a TLS-terminating proxy
(Python's ``ssl`` module, a throwaway CA from ``trustme``) in front of the real server and
creates an ACL user on it. The worker verifies the proxy's certificate against that CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis as redis_sync
import trustme

from harness import CliRun, Spawn, wait_until
from harness.realredis import RealRedis

pytestmark = pytest.mark.slow

PASSWORD = "s3cret-Pa55/word"


class TLSProxy:
    """Accepts TLS on 127.0.0.1:<port> and forwards plaintext to the real server."""

    def __init__(self, upstream_port: int, context: ssl.SSLContext) -> None:
        self.upstream_port = upstream_port
        self.context = context
        self.loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, sock=self._sock, ssl=self.context)
        )
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()
            self.loop.run_until_complete(server.wait_closed())
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@contextlib.contextmanager
def tls_proxy(upstream_port: int, tmp_path: Path, *names: str) -> Iterator[tuple[int, Path]]:
    """A TLS proxy to ``upstream_port`` whose certificate (from a throwaway CA) names
    ``names``: ``(its port, the CA file)``."""
    ca = trustme.CA()
    cert = ca.issue_cert(*names)
    ca_path = tmp_path / f"ca-{'-'.join(names)}.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    proxy = TLSProxy(upstream_port, ctx)
    proxy.start()
    try:
        yield proxy.port, ca_path
    finally:
        proxy.stop()


@pytest.fixture
def tls_url(real_redis: RealRedis, redis_url: str, tmp_path: Path) -> Iterator[str]:
    admin = redis_sync.Redis.from_url(redis_url)
    admin.acl_setuser(
        "jobs",
        enabled=True,
        passwords=[f"+{PASSWORD}"],
        commands=["+@all"],
        keys=["*"],
        channels=["*"],
    )
    try:
        with tls_proxy(real_redis.port, tmp_path, "127.0.0.1", "localhost") as (port, ca_path):
            yield (
                f"rediss://jobs:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/0"
                f"?ssl_ca_certs={ca_path}"
            )
    finally:
        admin.acl_deluser("jobs")
        admin.close()


def test_worker_runs_over_tls_with_acl_user_and_never_logs_the_password(
    spawn: Spawn, tls_url: str, rsync: redis_sync.Redis
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    leader = spawn("leader", name="tls-leader", env={"WORKER_REDIS_URL": tls_url})
    wait_until(
        lambda: len(rsync.hgetall(f"{prefix}ledger:ticks")) >= 2,
        timeout=30,
        what="ticks executed through the TLS proxy",
    )
    assert rsync.get(f"{prefix}leader") is not None
    # The connection is really authenticated as the ACL user.
    clients = rsync.client_list()
    assert any(c.get("user") == "jobs" for c in clients), clients
    leader.terminate()
    log = leader.log()
    assert PASSWORD not in log and quote(PASSWORD, safe="") not in log
    assert "jobs:***@" in log  # the URL is logged, masked


def test_wrong_password_exits_2_with_one_line(spawn: Spawn, tls_url: str) -> None:
    bad = tls_url.replace(quote(PASSWORD, safe=""), "Nope-9x")
    proc = spawn(
        "consumer",
        name="bad-auth",
        env={"WORKER_REDIS_URL": bad, "WORKER_REDIS_CONNECT_TIMEOUT_S": "1"},
    )
    assert proc.proc.wait(30) == 2
    lines = [ln for ln in proc.log().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "WORKER_REDIS_URL" in lines[0] and "Nope-9x" not in lines[0]


# -- the certificate must name the host (item 9) ------------------------------------------------


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}",
        "rediss+sentinel://127.0.0.1:{port}/mymaster?ssl_ca_certs={ca}",
        "rediss+cluster://127.0.0.1:{port}?ssl_ca_certs={ca}",
    ],
    ids=["rediss", "rediss+sentinel", "rediss+cluster"],
)
def test_a_certificate_for_another_name_is_refused_in_one_line(
    real_redis: RealRedis, tmp_path: Path, cli: CliRun, url: str
) -> None:
    """A certificate from the trusted CA, issued for another name: refused at the handshake
    (redis-py 5 accepted it for rediss://; the Sentinel and Cluster forms could not check at
    all). With the right name the handshake passes (the Sentinel and Cluster forms then find
    a plain server where they expected a Sentinel or a cluster node: a different error); with
    ``ssl_check_hostname=false`` the wrong name is accepted again, on request."""
    env = {"WORKER_REDIS_CONNECT_TIMEOUT_S": "1", "WORKER_KEY_PREFIX": "{tls}:"}
    with tls_proxy(real_redis.port, tmp_path, "redis.other.example") as (port, ca):
        wrong = url.format(port=port, ca=ca)
        out = cli("status", env={**env, "WORKER_REDIS_URL": wrong}, timeout=60)
        assert out.returncode != 0
        line = one_line(out)
        assert "CERTIFICATE_VERIFY_FAILED" in line and "mismatch" in line, line
        opted_out = cli(
            "status",
            env={**env, "WORKER_REDIS_URL": wrong + "&ssl_check_hostname=false"},
            timeout=60,
        )
        assert "CERTIFICATE_VERIFY_FAILED" not in opted_out.stdout + opted_out.stderr
    with tls_proxy(real_redis.port, tmp_path, "127.0.0.1") as (port, ca):
        right = cli("status", env={**env, "WORKER_REDIS_URL": url.format(port=port, ca=ca)})
        assert "CERTIFICATE_VERIFY_FAILED" not in right.stdout + right.stderr
        if url.startswith("rediss://"):
            assert right.returncode == 0, right.stderr
    if url.startswith("rediss://"):
        assert opted_out.returncode == 0, opted_out.stderr
