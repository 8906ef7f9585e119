"""Unit tests of the door checks (worker/runtime/httpguard.py), the wrong-token budget
(worker/web/auth.py) and terminal escaping (worker/core/terminal.py); the real-process tests are in
tests/system/test_hardening.py."""

from __future__ import annotations

import pytest

from worker.core.logs import mask_text
from worker.core.terminal import safe
from worker.runtime.httpguard import allowed_hosts, host_allowed, parse_hosts
from worker.settings import mask_url
from worker.web.auth import FAILURES_PER_S, MAX_FAILURES, Failures


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("127.0.0.1:8080", True),
        ("10.1.2.3", True),
        ("[::1]:8090", True),
        ("localhost:8090", True),
        ("LOCALHOST.", True),
        ("app.localhost", True),
        ("ops.example:443", True),
        ("evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("", False),
        (None, True),  # HTTP/1.0 without Host: not a browser
    ],
)
def test_which_host_headers_are_served(header: str | None, ok: bool) -> None:
    assert host_allowed(header, allowed_hosts("ops.example", "0.0.0.0")) is ok


def test_configured_and_bound_names_and_the_wildcard() -> None:
    assert parse_hosts(" A.example:80, b.example. ,") == {"a.example", "b.example"}
    assert host_allowed("console.internal:8090", allowed_hosts("", "console.internal"))
    assert host_allowed("anything.example", parse_hosts("*"))


def test_wrong_tokens_draw_on_one_budget_for_every_address() -> None:
    now = [1000.0]
    failures = Failures(clock=lambda: now[0])
    assert [failures.take() for _ in range(MAX_FAILURES)] == [None] * MAX_FAILURES
    wait = failures.take()  # the burst is spent, whoever asks next
    assert wait is not None and 0 < wait <= 1 / FAILURES_PER_S
    assert failures.held == 1
    now[0] += 1 / FAILURES_PER_S
    assert failures.take() is None and failures.take() is not None  # one more a second
    now[0] += 3600
    assert [failures.take() for _ in range(MAX_FAILURES + 1)].count(None) == MAX_FAILURES


def test_control_characters_are_escaped_for_the_terminal() -> None:
    assert safe("a\x1b]0;t\x07b\tc\nd") == "a\\x1b]0;t\\x07b\tc\nd"
    assert safe("x\x9b2J\u202ey\x7f") == "x\\x9b2J\\u202ey\\x7f"
    assert safe("one\ntwo\tthree", one_line=True) == "one\\x0atwo\\x09three"
    assert safe("plain ünïcode ✓") == "plain ünïcode ✓"


def test_every_password_argument_of_a_url_is_masked() -> None:
    url = "rediss://u:pw@h:1/0?ssl_password=k&sentinel_password=s&ssl_keyfile=/k"
    assert mask_url(url) == (
        "rediss://u:***@h:1/0?ssl_password=***&sentinel_password=***&ssl_keyfile=/k"
    )
    assert mask_text("kwargs ssl_password='k' in text") == "kwargs ssl_password=*** in text"
