"""The HTTP listeners and the command line against a hostile neighbour, on real processes:
DNS rebinding (a foreign ``Host``), slowloris and connection floods on
the health server, a token header that is not UTF-8, token guessing, ``--no-auth`` off
loopback, escape sequences stored in Redis and printed to a terminal, and secrets in URLs and
command lines."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import ROOT, Spawn, WorkerProc, wait_until
from harness.ports import free_port
from harness.procs import repo_env
from worker.storage import keys as K

pytestmark = pytest.mark.slow

TOKEN = "hardening-token-0123456789"


def _http(
    port: int, path: str, *, host: str | None = None, head: bytes = b"", source: str = ""
) -> tuple[int, str]:
    """One raw HTTP/1.1 GET (``host``: the Host header, default ``127.0.0.1:<port>``;
    ``source``: the local address it comes from, any of 127.0.0.0/8); ``(status, whole
    answer)``."""
    host_line = f"Host: {host if host is not None else f'127.0.0.1:{port}'}\r\n".encode()
    request = b"GET " + path.encode() + b" HTTP/1.1\r\n" + host_line + head
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(request + b"Connection: close\r\n\r\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks).decode("latin-1")
    return int(answer.split(" ", 2)[1]), answer


def _console(spawn: Spawn, **env: str) -> tuple[WorkerProc, int]:
    """A real ``python -m worker web`` on a free port, configured by ``env``."""
    port = free_port()
    web = spawn("all", name=f"web-{port}", command="web", env={"WORKER_WEB_PORT": str(port), **env})
    wait_until(lambda: "console listening" in web.log() or not web.alive(), 60, what="console")
    assert web.alive(), web.log()
    return web, port


def _worker(spawn: Spawn, **env: str) -> tuple[WorkerProc, int]:
    """A real ``python -m worker run --role all`` serving its probes on a free port."""
    port = free_port()
    proc = spawn("all", name=f"w-{port}", env={"WORKER_HEALTH_PORT": str(port), **env})

    def up() -> bool:
        try:
            return _http(port, "/healthz")[0] == 200
        except OSError:
            return False

    wait_until(up, 60, what="the health server")
    return proc, port


# -- DNS rebinding: the Host header ---------------------------------------------------------------


def test_a_foreign_host_header_is_refused_by_the_console_and_the_health_server(
    spawn: Spawn,
) -> None:
    """A page on evil.example whose name resolves to 127.0.0.1 sends ``Host: evil.example``:
    both servers refuse it (421) on what holds data, and serve IPs, localhost and the
    configured names."""
    web, port = _console(spawn, WORKER_WEB_AUTH="false", WORKER_WEB_ALLOWED_HOSTS="ops.example")
    assert _http(port, "/api/dead")[0] == 200
    assert _http(port, "/api/dead", host=f"localhost:{port}")[0] == 200
    assert _http(port, "/api/dead", host="ops.example")[0] == 200
    status, answer = _http(port, "/api/dead", host=f"evil.example:{port}")
    assert status == 421, answer
    assert "Content-Security-Policy" in answer and "job_id" not in answer
    assert "unknown Host header" in web.log()

    _, health = _worker(spawn)
    assert _http(health, "/status")[0] == 200
    assert _http(health, "/status", host=f"[::1]:{health}")[0] == 200
    status, answer = _http(health, "/status", host=f"evil.example:{health}")
    assert status == 421 and "instance" not in answer, answer
    # the probes and the scrape hold no such data: a Service-name scrape works by default
    assert _http(health, "/metrics", host=f"worker-metrics.prod.svc:{health}")[0] == 200
    assert _http(health, "/healthz", host=f"evil.example:{health}")[0] == 200


def test_no_auth_off_loopback_needs_to_be_asked_for_by_name(
    cli: Any, spawn: Spawn, redis_url: str
) -> None:
    env = {"WORKER_REDIS_URL": redis_url, "WORKER_APP": "harness.apps.ledger:app"}
    out = cli("web", "--no-auth", "--host", "0.0.0.0", "--port", "0", env=env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--allow-remote-no-auth" in out.stderr
    _, port = _console(
        spawn, WORKER_WEB_AUTH="false", WORKER_WEB_HOST="0.0.0.0",
        WORKER_WEB_ALLOW_REMOTE_NO_AUTH="true",
    )  # fmt: skip
    assert _http(port, "/api/overview")[0] == 200


# -- the token ------------------------------------------------------------------------------------


def test_a_token_header_that_is_not_utf8_is_a_401_with_the_security_headers(
    spawn: Spawn,
) -> None:
    _, port = _console(spawn, WORKER_WEB_TOKEN=TOKEN)
    for raw in (b"X-Worker-Token: \xff\xfe\xe9tok\r\n", b"Authorization: Bearer \xc3\x28zz\r\n"):
        status, answer = _http(port, "/api/overview", head=raw)
        assert status == 401, answer
        assert "Content-Security-Policy" in answer and "Traceback" not in answer


def test_wrong_tokens_are_logged_without_the_token_and_held_off_but_never_the_right_one(
    spawn: Spawn,
) -> None:
    web, port = _console(spawn, WORKER_WEB_TOKEN=TOKEN)
    wrong = [f"guess-{n:04d}-abcdefghijkl" for n in range(12)]
    codes = [
        _http(port, "/api/overview", head=f"X-Worker-Token: {g}\r\n".encode())[0] for g in wrong
    ]
    assert codes[:10] == [401] * 10 and 429 in codes[10:], codes
    status, answer = _http(port, "/api/overview", head=f"X-Worker-Token: {wrong[0]}\r\n".encode())
    assert status == 429 and re.search(r"Retry-After: \d+", answer), answer
    # the same address, held off for its guesses: the right token passes at once
    assert _http(port, "/api/overview", head=f"X-Worker-Token: {TOKEN}\r\n".encode())[0] == 200
    log = web.log()
    assert 10 <= log.count('"console token refused"') <= 12, log
    assert not any(g in log for g in wrong) and TOKEN not in log
    assert '"client": "127.0.0.1"' in log


def test_guesses_from_rotating_addresses_share_one_budget(spawn: Spawn) -> None:
    """300 wrong tokens, each from another address of 127.0.0.0/8 and with
    another ``X-Forwarded-For`` (a guesser rotating addresses), while an operator polls with
    the right token from the address the guesses started from: at most the burst plus one a
    second are answered 401, the rest 429, and every one of the operator's requests is 200."""
    _, port = _console(spawn, WORKER_WEB_TOKEN=TOKEN)
    right = f"X-Worker-Token: {TOKEN}\r\n".encode()
    codes, operator = [], []
    started = time.monotonic()
    for n in range(300):
        source = f"127.0.{n // 250}.{2 + n % 250}"
        guess = f"X-Worker-Token: guess-{n:04d}-abcdefghijkl\r\nX-Forwarded-For: 10.0.{n}.1\r\n"
        codes.append(_http(port, "/api/overview", head=guess.encode(), source=source)[0])
        if n % 30 == 0:
            operator.append(_http(port, "/api/overview", head=right, source="127.0.0.2")[0])
    took = time.monotonic() - started
    answered = codes.count(401)
    assert set(codes) <= {401, 429}, codes
    assert answered <= 10 + took + 1, (answered, took)
    assert codes.count(429) >= 300 - 10 - took - 1
    assert operator == [200] * 10, operator
    print(f"300 rotating guesses in {took:.1f} s: {answered} answered 401, the rest 429")


# -- slowloris and connection floods --------------------------------------------------------------


def test_the_health_server_bounds_connections_and_the_time_to_send_headers(
    spawn: Spawn,
) -> None:
    """300 clients that connect and never finish their headers: beyond the bound (100) the
    oldest are closed at once, the rest after the header deadline (5 s); a probe is served
    while they are held."""
    _, port = _worker(spawn)
    socks = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        socks.append(s)
    try:
        time.sleep(1.0)
        assert _closed(socks) >= 150, _closed(socks)  # over the bound: closed at once
        assert _http(port, "/healthz")[0] == 200  # the oldest slow one makes room for a probe
        started = time.monotonic()
        wait_until(lambda: _closed(socks) == len(socks), 30, what="every slow client closed")
        assert time.monotonic() - started < 25
        assert _http(port, "/healthz")[0] == 200
    finally:
        for s in socks:
            s.close()


def _closed(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server closed (EOF or reset)."""
    n = 0
    for s in socks:
        ready, _, _ = select.select([s], [], [], 0)
        if ready:
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    n += 1
            except OSError:
                n += 1
    return n


# -- the terminal ---------------------------------------------------------------------------------

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZWNobyBvd25lZA==\x07\x9b31m\u202etxt.exe"


def test_dead_prints_stored_escape_sequences_escaped_on_a_terminal(
    rsync: redis_sync.Redis, redis_url: str, key_prefix: str, tmp_path: Path
) -> None:
    """A dead letter whose id, reason and instance hold terminal escapes (retitle, clear,
    OSC 52 clipboard, C1 CSI, bidi override): ``dead`` on a TTY shows them as ``\\x1b``..."""
    keys, job_id = K.Keys(key_prefix), "j\x1b[2J1"
    record = {"job_id": job_id, "reason": f"ValueError: {HOSTILE}", "kind": "failed",
              "instance": "i\x1b]0;t\x07", "size": 3, "at_ms": 1}  # fmt: skip
    rsync.zadd(keys.dead, {job_id: 1})
    rsync.hset(keys.dead_jobs, job_id, json.dumps(record))
    out = _on_a_tty(["dead"], {"WORKER_REDIS_URL": redis_url, "WORKER_KEY_PREFIX": key_prefix})
    assert "dead-lettered jobs shown" in out, out
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
    assert "\\x1b]0;owned\\x07" in out and "\\u202e" in out, out


def _on_a_tty(args: list[str], env: dict[str, str]) -> str:
    """Run ``python -m worker ARGS`` with stdout on a pseudo-terminal; its output."""
    leader, follower = pty.openpty()
    full = repo_env(WORKER_APP="harness.apps.ledger:app", **env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", *args],
        env=full, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(leader)
        proc.wait(30)
    return b"".join(chunks).decode(errors="replace")


# -- secrets in URLs and command lines ------------------------------------------------------------


def test_url_secrets_are_masked_and_a_password_in_argv_is_warned_about(
    cli: Any, redis_url: str
) -> None:
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    env = {"WORKER_APP": "harness.apps.ledger:app", "WORKER_REDIS_CONNECT_TIMEOUT_S": "2"}
    key = cli("status", "--redis-url", f"rediss://127.0.0.1:{port}/0?ssl_password=k3y-s3cret",
              env=env)  # fmt: skip
    assert key.returncode == 2 and "ssl_password=***" in key.stderr, key.stderr
    assert "k3y-s3cret" not in key.stderr + key.stdout
    pw = cli("status", "--redis-url", f"redis://:pa55-s3cret@127.0.0.1:{port}/0", env=env)
    assert "pa55-s3cret" not in pw.stderr + pw.stdout
    assert "WORKER_REDIS_URL_FILE" in pw.stderr and "(ps)" in pw.stderr, pw.stderr
    plain = cli("status", "--redis-url", redis_url, env=env)
    assert plain.returncode == 0 and "warning" not in plain.stderr, plain.stderr
