"""The console's run-time schedules in a real browser (headless Chromium, as
:mod:`tests.web.test_web_browser`): listed beside the code schedules, created and edited through the
form, paused, resumed, run now and removed, each action in the audit log with who asked, and
refused without the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync

from harness import Spawn, wait_until
from tests.web.test_web_browser import (  # noqa: F401 (fixtures)
    Page,
    _audit,
    _instances,
    browser,
    browser_paths,
    start_console,
)

pytestmark = pytest.mark.slow


def _stored(r: redis_sync.Redis, prefix: str, name: str) -> dict[str, Any] | None:
    raw: Any = r.hget(f"{prefix}schedules", name)
    return None if raw is None else dict(json.loads(raw))


def _fill(page: Page, **fields: str) -> None:
    for name, value in fields.items():
        box = page.one(f'#schedule-form [name="{name}"]')
        box.clear()
        box.send_keys(value)


def test_the_console_creates_edits_pauses_runs_and_removes_a_schedule(
    spawn: Spawn,
    rsync: redis_sync.Redis,
    browser: Any,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    prefix = spawn.prefix  # type: ignore[attr-defined]
    spawn("all", name="w1", app="harness.apps.ledger:app", env={"WORKER_LOG_LEVEL": "WARNING"})
    url = start_console(spawn, "harness.apps.ledger:app")
    wait_until(lambda: len(_instances(rsync, prefix)) == 1, 30, what="the worker")

    page = Page(browser, url, tmp_path / "screens")
    browser.get(url)
    page.sign_in()
    page.tab("schedules")

    # -- create through the form: listed beside the code schedule ------------------------------
    _fill(page, name="acme", task="record", every="3600", args='["acme"]')
    page.click('#schedule-form button[data-action="schedule-save"]')
    wait_until(lambda: _stored(rsync, prefix, "acme"), 30, what="the stored schedule")
    spec = _stored(rsync, prefix, "acme")
    assert spec is not None
    assert (spec["task"], spec["every_s"], spec["args"]) == ("record", 3600.0, ["acme"])
    row = 'tr[data-schedule="acme"]'
    page.until(lambda: "every 3600s" in page.text(f"#runtime-schedules {row}"), "its row")
    assert page.rows("#periodic tbody tr", "data-periodic").keys() == {"tick"}

    # -- pause, resume -------------------------------------------------------------------------
    page.click(f'#runtime-schedules {row} button[data-action="schedule-pause"]')
    wait_until(lambda: rsync.sismember(f"{prefix}paused", "schedule:acme"), 30, what="paused")
    page.until(lambda: "paused" in page.text(f"#runtime-schedules {row} td.state"), "shown")
    page.shot("runtime-schedules")
    page.click(f'#runtime-schedules {row} button[data-action="schedule-resume"]')
    wait_until(lambda: not rsync.sismember(f"{prefix}paused", "schedule:acme"), 30, what="on")

    # -- run now: a job of the schedule's task and arguments ---------------------------------
    page.click(f'#runtime-schedules {row} button[data-action="schedule-trigger"]')
    trigger = wait_until(
        lambda: next((a for a in _audit(rsync, prefix) if a["action"] == "trigger"), None), 10
    )
    assert (trigger["target"], trigger["who"], trigger["via"], trigger["ok"]) == (
        "schedule:acme", "ada", "web", True,
    )  # fmt: skip
    job_id = trigger["message"].split("enqueued ", 1)[1]
    assert job_id.startswith(f"{prefix}schedule:acme:")
    wait_until(lambda: rsync.exists(f"arq:result:{job_id}"), 45, what="the triggered run")

    # -- edit: the form filled from the row, changed, saved as a new version -------------------
    page.click(f'#runtime-schedules {row} button[data-action="schedule-edit"]')
    name_box = '#schedule-form [name="name"]'
    page.until(lambda: page.one(name_box).get_attribute("value") == "acme", "the form filled")
    _fill(page, every="", cron="0 7 * * *", tz="Europe/Paris")
    page.click('#schedule-form button[data-action="schedule-save"]')
    wait_until(lambda: (_stored(rsync, prefix, "acme") or {}).get("cron"), 30, what="edited")
    edited = _stored(rsync, prefix, "acme")
    assert edited is not None
    assert (edited["cron"], edited["tz"], edited["every_s"], edited["args"]) == (
        "0 7 * * *", "Europe/Paris", None, ["acme"],
    )  # fmt: skip

    # -- a definition upsert refuses: nothing stored, the refusal recorded --------------------
    _fill(page, name="bad", task="no_such_task", cron="", every="60", tz="UTC")
    page.click('#schedule-form button[data-action="schedule-save"]')
    refused = wait_until(
        lambda: next((a for a in _audit(rsync, prefix) if a["target"] == "schedule:bad"), None), 10
    )
    assert refused["ok"] is False and _stored(rsync, prefix, "bad") is None

    # -- without the token: refused ----------------------------------------------------------
    assert page.post("api/schedules/remove", {"name": "acme"}, None) == 401
    assert _stored(rsync, prefix, "acme") is not None

    # -- remove (confirmed) ------------------------------------------------------------------
    page.click(f'#runtime-schedules {row} button[data-action="schedule-remove"]', confirm=True)
    wait_until(lambda: _stored(rsync, prefix, "acme") is None, 30, what="removed")
    page.until(lambda: not page.css(f"#runtime-schedules {row}"), "its row gone")
    actions = [(a["action"], a["target"], a["who"]) for a in reversed(_audit(rsync, prefix))]
    assert [a for a in actions if a[1] == "schedule:acme"] == [
        ("schedule", "schedule:acme", "ada"),
        ("pause", "schedule:acme", "ada"),
        ("resume", "schedule:acme", "ada"),
        ("trigger", "schedule:acme", "ada"),
        ("schedule", "schedule:acme", "ada"),
        ("unschedule", "schedule:acme", "ada"),
    ]
