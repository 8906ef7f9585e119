"""Log masking: no Redis password reaches a log line, in any field, format or traceback."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from harness import client_call, wait_until
from worker.core import logs
from worker.core.logs import configure_logging

SECRET = "s3cr3t-Pw"


@pytest.fixture(params=["json", "console"])
def logged(request: pytest.FixtureRequest) -> Iterator[io.StringIO]:
    """Logging configured to a StringIO, in both formats; restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stream = io.StringIO()
    configure_logging("DEBUG", request.param, stream=stream, role="all", instance="t")
    try:
        yield stream
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()
        structlog.contextvars.clear_contextvars()


URLS = [
    f"redis://user:{SECRET}@host:6379/0",
    f"redis://user:p@{SECRET}@host:6379/0",  # a password containing @
    f"redis://:{SECRET}@x@host/0",
    f"redis://host:6379/0?password={SECRET}",  # redis-py also takes ?password=
    f"unix:///run/redis.sock?db=0&password={SECRET}",
    f"rediss://:{SECRET}/x@host/0",  # an unencoded /
]


@pytest.mark.parametrize("url", URLS)
def test_url_values_are_masked(logged: io.StringIO, url: str) -> None:
    log = structlog.get_logger("t")
    log.info("connecting", redis=url)
    log.info(f"connecting to {url} now")  # in the event text itself
    log.info("nested", where={"urls": [url]}, pair=(1, url))
    logging.getLogger("redis").warning("stdlib line about %s", url)
    out = logged.getvalue()
    assert SECRET not in out, out
    assert out.count("***") >= 5, out
    if out.startswith("{"):  # JSON: masking must not break a line
        for line in out.splitlines():
            assert json.loads(line)["level"] in ("info", "warning"), line


def test_exception_text_and_traceback_are_masked(logged: io.StringIO) -> None:
    log = structlog.get_logger("t")
    try:
        raise ConnectionError(f"Error connecting to redis://app:p@{SECRET}@redis:6379/0.")
    except ConnectionError as exc:
        log.exception("component failed", error=str(exc))
        log.error("as value", error=exc)
        logging.getLogger("arq").exception("stdlib traceback")
    out = logged.getvalue()
    assert "Traceback" in out and "ConnectionError" in out
    assert SECRET not in out, out
    assert "redis://app:***@redis:6379/0" in out


def test_password_argument_outside_a_url(logged: io.StringIO) -> None:
    structlog.get_logger("t").info(f"retrying with password={SECRET}&db=0")
    assert SECRET not in logged.getvalue()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("no secrets here", "no secrets here"),
        (f"url redis://u:{SECRET}@h:1/0 done", "url redis://u:***@h:1/0 done"),
        (f"'redis://:{SECRET}@h/0'", "'redis://:***@h/0'"),
        (
            f"a redis://:{SECRET}@h/0, b rediss://:{SECRET}@h2/1",
            "a redis://:***@h/0, b rediss://:***@h2/1",
        ),
        (f"kwargs password='{SECRET}', db=0", "kwargs password=***, db=0"),
        (f'kwargs password="{SECRET}" db=0', "kwargs password=*** db=0"),
        (f'{{"m": "password=\\"{SECRET}\\" x"}}', '{"m": "password=*** x"}'),
        ('{"u": "redis://h/0?password=***", "a": 1}', '{"u": "redis://h/0?password=***", "a": 1}'),
        ("url='redis://:***@h/0?password=***' x=1", "url='redis://:***@h/0?password=***' x=1"),
        ("redis://host:6379/0 ok", "redis://host:6379/0 ok"),
    ],
)
def test_mask_text(text: str, expected: str) -> None:
    assert logs.mask_text(text) == expected


#: What a job's exception text may carry to a terminal: a title (OSC 0), a screen clear, a
#: clipboard write (OSC 52) and a right-to-left override.
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u202eevil"


def test_the_console_format_escapes_a_jobs_traceback(spawn: Any, redis_url: str) -> None:
    """A real worker logging in the readable format: the failing job's exception text and
    traceback reach its log with every control character shown as an escape."""
    proc = spawn("all", name="c1", env={"WORKER_LOG_FORMAT": "console"})
    client_call(redis_url, spawn.prefix, "enqueue", "fail", HOSTILE)
    wait_until(lambda: "fails on purpose" in proc.log(), 30, what="the job's failure logged")
    raw = proc.log_path.read_bytes()
    assert b"fails on purpose: \\x1b]0;owned\\x07\\x1b[2J" in raw, raw[-3000:]
    for seq in (b"\x1b]", b"\x1b[2J", b"\x07", "\u202e".encode()):
        assert seq not in raw, (seq, raw[-3000:])
